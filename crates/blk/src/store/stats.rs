//! zram's statistics (`mm_stat`, `io_stat`, `bd_stat`) and the counters behind them.

use std::sync::atomic::{AtomicU64, Ordering};

use super::*;
use crate::pool::PAGE;

/// zram's `mm_stat`, `io_stat` and `bd_stat` figures plus what the summary needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub orig_data_size: u64,
    pub compr_data_size: u64,
    pub mem_used_total: u64,
    pub mem_limit: u64,
    pub mem_used_max: u64,
    pub same_pages: u64,
    pub pages_compacted: u64,
    pub huge_pages: u64,
    pub huge_pages_since: u64,
    pub failed_reads: u64,
    pub failed_writes: u64,
    pub invalid_io: u64,
    pub notify_free: u64,
    pub bd_count: u64,
    pub bd_reads: u64,
    pub bd_writes: u64,
    /// Size of the page table (fixed by the disk size, like zram's table, not in mem_used_total).
    pub table_bytes: u64,
    /// Device size in bytes.
    pub disksize: u64,
}

impl Stats {
    /// The `mm_stat` line in zram's field order and widths.
    pub fn mm_stat(&self) -> String {
        format!(
            "{:8} {:8} {:8} {:8} {:8} {:8} {:8} {:8} {:8}",
            self.orig_data_size,
            self.compr_data_size,
            self.mem_used_total,
            self.mem_limit,
            self.mem_used_max,
            self.same_pages,
            self.pages_compacted,
            self.huge_pages,
            self.huge_pages_since
        )
    }

    /// The `io_stat` line in zram's field order.
    pub fn io_stat(&self) -> String {
        format!(
            "{:8} {:8} {:8} {:8}",
            self.failed_reads, self.failed_writes, self.invalid_io, self.notify_free
        )
    }

    /// The `bd_stat` line (pages) in zram's field order.
    pub fn bd_stat(&self) -> String {
        format!(
            "{:8} {:8} {:8}",
            self.bd_count, self.bd_reads, self.bd_writes
        )
    }

    /// Parses the three lines back (used by the control client and tests).
    pub fn parse(mm: &str, io: &str, bd: &str) -> Option<Stats> {
        let nums = |s: &str| -> Option<Vec<u64>> {
            s.split_whitespace().map(|w| w.parse().ok()).collect()
        };
        let (m, i, b) = (nums(mm)?, nums(io)?, nums(bd)?);
        if m.len() != 9 || i.len() != 4 || b.len() != 3 {
            return None;
        }
        Some(Stats {
            orig_data_size: m[0],
            compr_data_size: m[1],
            mem_used_total: m[2],
            mem_limit: m[3],
            mem_used_max: m[4],
            same_pages: m[5],
            pages_compacted: m[6],
            huge_pages: m[7],
            huge_pages_since: m[8],
            failed_reads: i[0],
            failed_writes: i[1],
            invalid_io: i[2],
            notify_free: i[3],
            bd_count: b[0],
            bd_reads: b[1],
            bd_writes: b[2],
            table_bytes: 0,
            disksize: 0,
        })
    }
}

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) pages_stored: AtomicU64,
    pub(super) compr_data_size: AtomicU64,
    pub(super) same_pages: AtomicU64,
    pub(super) huge_pages: AtomicU64,
    pub(super) huge_pages_since: AtomicU64,
    pub(super) failed_reads: AtomicU64,
    pub(super) failed_writes: AtomicU64,
    pub(super) invalid_io: AtomicU64,
    pub(super) notify_free: AtomicU64,
    pub(super) bd_count: AtomicU64,
    pub(super) bd_reads: AtomicU64,
    pub(super) bd_writes: AtomicU64,
}

pub(super) fn add(a: &AtomicU64, v: u64) {
    a.fetch_add(v, Ordering::Relaxed);
}

pub(super) fn sub(a: &AtomicU64, v: u64) {
    a.fetch_sub(v, Ordering::Relaxed);
}

pub(super) fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

impl PageStore {
    /// The statistics now.
    pub fn stats(&self) -> Stats {
        let c = &self.c;
        Stats {
            orig_data_size: get(&c.pages_stored) * PAGE as u64,
            compr_data_size: get(&c.compr_data_size),
            mem_used_total: self.pool.used_bytes() + self.dicts.as_ref().map_or(0, |d| d.bytes()),
            mem_limit: self.pool.limit(),
            mem_used_max: self.pool.max_bytes(),
            same_pages: get(&c.same_pages),
            pages_compacted: self.pool.pages_compacted(),
            huge_pages: get(&c.huge_pages),
            huge_pages_since: get(&c.huge_pages_since),
            failed_reads: get(&c.failed_reads),
            failed_writes: get(&c.failed_writes),
            invalid_io: get(&c.invalid_io),
            notify_free: get(&c.notify_free),
            bd_count: get(&c.bd_count),
            bd_reads: get(&c.bd_reads),
            bd_writes: get(&c.bd_writes),
            table_bytes: self.shards.iter().map(|s| lock(s).bytes()).sum(),
            disksize: self.cfg.size,
        }
    }
}
