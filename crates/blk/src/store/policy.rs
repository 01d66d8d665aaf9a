//! The writeback budget (zram's `writeback_limit`, here in bytes per period), the writeback
//! batch size (zram's `writeback_batch_size`) and the built-in memory policy (`--policy`):
//! what zram users script with cron jobs writing to `idle`, `recompress` and `writeback`.
//!
//! One policy step ([`PageStore::policy_step`]):
//! 1. marks the pages not read or written for `idle_age` seconds idle (zram's `idle=SECS`);
//! 2. recompresses the idle pages with the secondary codecs (`--recomp-algo`);
//! 3. writes the coldest idle pages, those untouched for twice `idle_age`, oldest first, to
//!    the backing file, within the writeback budget and at most [`POLICY_WRITEBACK_MAX`] a
//!    step;
//! 4. compacts the pool.
//!
//! A reader or writer of a page clears its idle mark, so the working set stays compressed in
//! memory with the primary codec. When the working set moves onto pages the policy has
//! recompressed or written back, the first read of each stores it again with the primary
//! codec (`promoted`), so a page in use costs what it cost before the policy touched it.
//! Recompression and writeback hold a shard lock for one page (or one batch) at a time and
//! never while a codec or the file write runs.

use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::*;
use crate::error::BlkError;
use crate::pool::PAGE;

/// zram's default `writeback_batch_size`.
pub const DEFAULT_WRITEBACK_BATCH: usize = 32;
/// Largest `writeback_batch_size` accepted (a batch is decoded into one buffer).
pub const MAX_WRITEBACK_BATCH: usize = 4096;
/// Pages the policy writes back per step at most (the candidates are kept in a heap of this
/// size, so a step's memory is bounded whatever the device size).
pub const POLICY_WRITEBACK_MAX: usize = 4096;

/// The budget and batch size of writeback.
#[derive(Debug)]
pub(super) struct WbState {
    /// Bytes that may be written back per period (0: no limit).
    limit: u64,
    /// Seconds after which the budget refills to `limit` (0: it never refills, as zram's
    /// `writeback_limit` which the administrator tops up).
    period: u32,
    /// Pages left in the budget.
    left: u64,
    refilled_at: u32,
    batch: usize,
}

impl Default for WbState {
    fn default() -> WbState {
        WbState {
            limit: 0,
            period: 0,
            left: 0,
            refilled_at: 0,
            batch: DEFAULT_WRITEBACK_BATCH,
        }
    }
}

/// The writeback budget as `stat` reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WritebackLimit {
    /// Bytes per period (0: no limit).
    pub bytes: u64,
    /// Period in seconds (0: no refill).
    pub period: u32,
    /// Bytes left in the current period.
    pub left: u64,
    /// Pages per writeback batch.
    pub batch: usize,
}

impl WritebackLimit {
    /// The `writeback_limit` line of `stat`.
    pub fn line(&self) -> String {
        format!(
            "{} {} {} {}",
            self.bytes, self.period, self.left, self.batch
        )
    }
}

/// How the memory policy runs.
#[derive(Debug, Clone, Copy)]
pub struct PolicyConfig {
    /// Pages untouched this many seconds are idle: recompressed, and written back at twice it.
    pub idle_age: u32,
}

impl PolicyConfig {
    /// Time between steps: half the idle age, between 1 s and 60 s.
    pub fn interval(&self) -> Duration {
        Duration::from_secs(u64::from(self.idle_age / 2).clamp(1, 60))
    }
}

#[derive(Debug, Default)]
pub(super) struct PolicyCounters {
    promoted: AtomicU64,
    steps: AtomicU64,
    idle: AtomicU64,
    recompressed: AtomicU64,
    written: AtomicU64,
    compacted: AtomicU64,
}

/// What the policy did, for `stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicyStatus {
    pub steps: u64,
    /// Pages idle at the last step.
    pub idle: u64,
    /// Pages recompressed, in all.
    pub recompressed: u64,
    /// Pages written back, in all.
    pub written: u64,
    /// Pool pages freed by compaction, in all.
    pub compacted: u64,
    /// Pages read again after the policy recompressed or wrote them back, stored again with
    /// the primary codec, in all.
    pub promoted: u64,
}

impl PolicyCounters {
    pub(super) fn count_promoted(&self) {
        self.promoted.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether a page is stored off the fast path: with a secondary codec or in the backing file.
pub(super) fn demoted(e: &Entry) -> bool {
    match e {
        Entry::Obj { codec, .. } => *codec != RAW && codec_index(*codec) != 0,
        Entry::Backed { .. } => true,
        _ => false,
    }
}

impl PolicyStatus {
    /// The `policy` line of `stat`.
    pub fn line(&self) -> String {
        format!(
            "steps {} idle {} recompressed {} written {} compacted {} promoted {}",
            self.steps, self.idle, self.recompressed, self.written, self.compacted, self.promoted
        )
    }

    /// Parses [`PolicyStatus::line`] back.
    pub fn parse(s: &str) -> Option<PolicyStatus> {
        let w: Vec<&str> = s.split_whitespace().collect();
        let get = |k: &str| -> Option<u64> {
            let i = w.iter().position(|x| *x == k)?;
            w.get(i + 1)?.parse().ok()
        };
        Some(PolicyStatus {
            steps: get("steps")?,
            idle: get("idle")?,
            recompressed: get("recompressed")?,
            written: get("written")?,
            compacted: get("compacted")?,
            promoted: get("promoted").unwrap_or(0),
        })
    }
}

impl PageStore {
    /// Turns the memory policy on (a thread must call [`PageStore::policy_step`] every
    /// [`PolicyConfig::interval`]; `crate::server::spawn_policy_worker` does).
    pub fn with_policy(mut self, cfg: PolicyConfig) -> PageStore {
        self.policy_cfg = Some(cfg);
        self
    }

    /// The memory policy's settings, if it is on.
    pub fn policy_config(&self) -> Option<PolicyConfig> {
        self.policy_cfg
    }

    /// Sets the writeback budget: `bytes` per `period` seconds (bytes 0: no limit; period 0:
    /// the budget is `bytes` until set again). The budget starts full.
    pub fn set_writeback_limit(&self, bytes: u64, period: u32) {
        let now = self.now();
        let mut w = lock(&self.wb);
        w.limit = bytes;
        w.period = period;
        w.left = bytes / PAGE as u64;
        w.refilled_at = now;
    }

    /// Sets `writeback_batch_size` (1 to `MAX_WRITEBACK_BATCH`, 4096 pages).
    pub fn set_writeback_batch_size(&self, pages: usize) -> Result<(), BlkError> {
        if !(1..=MAX_WRITEBACK_BATCH).contains(&pages) {
            return Err(BlkError::Remote(format!(
                "writeback_batch_size must be 1 to {MAX_WRITEBACK_BATCH} pages"
            )));
        }
        lock(&self.wb).batch = pages;
        Ok(())
    }

    pub(super) fn writeback_batch_size(&self) -> usize {
        lock(&self.wb).batch
    }

    /// The writeback budget now.
    pub fn writeback_limit(&self) -> WritebackLimit {
        let now = self.now();
        let mut w = lock(&self.wb);
        refill(&mut w, now);
        WritebackLimit {
            bytes: w.limit,
            period: w.period,
            left: if w.limit == 0 {
                0
            } else {
                w.left * PAGE as u64
            },
            batch: w.batch,
        }
    }

    /// Takes up to `want` pages from the writeback budget; returns the pages granted.
    pub(super) fn take_budget(&self, want: u64) -> u64 {
        let now = self.now();
        let mut w = lock(&self.wb);
        if w.limit == 0 {
            return want;
        }
        refill(&mut w, now);
        let n = want.min(w.left);
        w.left -= n;
        n
    }

    /// Gives back budget taken but not used.
    pub(super) fn return_budget(&self, pages: u64) {
        let mut w = lock(&self.wb);
        if w.limit != 0 {
            w.left = (w.left + pages).min(w.limit / PAGE as u64);
        }
    }

    /// What the policy did so far.
    pub fn policy_status(&self) -> PolicyStatus {
        let c = &self.policy;
        PolicyStatus {
            steps: c.steps.load(Ordering::Relaxed),
            idle: c.idle.load(Ordering::Relaxed),
            recompressed: c.recompressed.load(Ordering::Relaxed),
            written: c.written.load(Ordering::Relaxed),
            compacted: c.compacted.load(Ordering::Relaxed),
            promoted: c.promoted.load(Ordering::Relaxed),
        }
    }

    /// One step of the memory policy (see the module documentation). Returns whether it
    /// changed anything (pages recompressed, written back or pool pages freed).
    pub fn policy_step(&self, cfg: &PolicyConfig) -> Result<bool, BlkError> {
        let c = &self.policy;
        let idle = self.mark_idle(Some(cfg.idle_age));
        c.idle.store(idle, Ordering::Relaxed);
        let mut changed = 0;
        if idle > 0 && self.codecs.len() > 1 {
            let n = self.recompress(PageKind::Idle, 0, 0)?;
            c.recompressed.fetch_add(n, Ordering::Relaxed);
            changed += n;
        }
        if idle > 0 && self.backing.is_some() {
            let n = self.writeback_coldest(cfg.idle_age.saturating_mul(2))?;
            c.written.fetch_add(n, Ordering::Relaxed);
            changed += n;
        }
        let freed = self.compact();
        c.compacted.fetch_add(freed, Ordering::Relaxed);
        c.steps.fetch_add(1, Ordering::Relaxed);
        Ok(changed + freed > 0)
    }

    /// Writes back the idle pages untouched for at least `age` seconds, oldest first, as
    /// many as the budget allows (at most [`POLICY_WRITEBACK_MAX`]). Returns pages written.
    fn writeback_coldest(&self, age: u32) -> Result<u64, BlkError> {
        let now = self.now();
        let room = {
            let w = self.writeback_limit();
            if w.bytes == 0 {
                POLICY_WRITEBACK_MAX
            } else {
                usize::try_from(w.left / PAGE as u64)
                    .unwrap_or(usize::MAX)
                    .min(POLICY_WRITEBACK_MAX)
            }
        };
        if room == 0 {
            return Ok(0);
        }
        // The `room` coldest candidates: a max-heap on access time, the newest popped.
        let mut heap: BinaryHeap<(u32, usize, usize)> = BinaryHeap::with_capacity(room + 1);
        for (s, shard) in self.shards.iter().enumerate() {
            let mut t = lock(shard);
            for (idx, e, at) in t.entries_mut() {
                if now.saturating_sub(at) < age || !Self::selected(PageKind::Idle, e) {
                    continue;
                }
                heap.push((at, s, idx));
                if heap.len() > room {
                    heap.pop();
                }
            }
        }
        let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); SHARDS];
        for (_, s, idx) in heap.into_sorted_vec() {
            by_shard[s].push(idx);
        }
        let mut written = 0;
        for (s, idxs) in by_shard.into_iter().enumerate() {
            if idxs.is_empty() {
                continue;
            }
            let (n, out_of_budget) =
                self.writeback_pages(PageKind::Idle, s, idxs.into_iter(), u64::MAX)?;
            written += n;
            if out_of_budget {
                break;
            }
        }
        Ok(written)
    }
}

fn refill(w: &mut WbState, now: u32) {
    if w.limit != 0 && w.period != 0 && now.saturating_sub(w.refilled_at) >= w.period {
        w.left = w.limit / PAGE as u64;
        w.refilled_at = now;
    }
}
