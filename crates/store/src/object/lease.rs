//! One writer per store in a bucket: the lease object `PREFIX/lease`.
//!
//! A read-write open takes the lease with a conditional PUT (`If-None-Match: *` when there is
//! none, `If-Match` on the e-tag of a released, expired or dead holder's lease), a thread renews
//! it every third of its timeout with `If-Match` on the e-tag of the last renewal, and a clean
//! close rewrites it as released (again with `If-Match`: S3's DELETE takes no condition that
//! every server honours, so the object stays, marked released). Every PUT and DELETE of the
//! store passes the [`Gate`] first: once the lease was lost (taken over) or could not be renewed
//! before its local deadline (a quarter of the timeout before the expiry the record announces,
//! a margin for clock skew and PUTs in flight), they fail with EIO, which latches the store
//! read-only. See docs/format.md, "The lease object", for every byte.

use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use object_store::UpdateVersion;

use super::remote::{CondPut, Remote};
use crate::error::{Error, Result};
use crate::records::{u16_at, u32_at, u64_at};

/// The lease's key below the prefix.
pub const LEASE_KEY: &str = "lease";
/// First bytes of a lease object.
pub const LEASE_MAGIC: [u8; 8] = *b"CFSLEASE";
/// Layout version of a lease object.
pub const LEASE_VERSION: u16 = 1;
/// Default lease timeout (`-o lease_timeout=SECS`).
pub const DEFAULT_LEASE_TIMEOUT: Duration = Duration::from_secs(60);
/// Bytes before the host name.
const FIXED: usize = 72;
/// Longest host name kept (longer ones are cut at a character boundary).
const MAX_HOST: usize = 255;

/// Whether a lease is held or was released by a clean close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    Held = 1,
    Released = 2,
}

/// The content of the lease object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    pub state: LeaseState,
    /// Process id of the holder (on its machine).
    pub pid: u32,
    /// Random id of the holding mount.
    pub mount_id: [u8; 16],
    /// `/proc/sys/kernel/random/boot_id` of the holder's machine (zero when unknown): a pid
    /// means something only within one boot.
    pub boot_id: [u8; 16],
    /// When the lease was taken (Unix milliseconds).
    pub taken_ms: u64,
    /// Until when the lease holds (Unix milliseconds) unless renewed.
    pub expires_ms: u64,
    /// The holder's lease timeout in milliseconds.
    pub timeout_ms: u32,
    /// Renewals since the lease was taken.
    pub renewals: u32,
    /// Host name of the holder (UTF-8, at most 255 bytes).
    pub host: String,
}

/// Why bytes are not a lease object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    #[error("{0} bytes: too short for a lease object")]
    TooShort(usize),
    #[error("not a lease object (bad magic)")]
    BadMagic,
    #[error("lease layout version {0} is not known to this compfs")]
    Version(u16),
    #[error("unknown lease state {0}")]
    State(u8),
    #[error("length {found} disagrees with the host name length (want {want})")]
    Length { found: usize, want: usize },
    #[error("checksum mismatch")]
    Checksum,
    #[error("host name is not UTF-8")]
    Host,
}

fn cut_host(h: &str) -> &str {
    let mut n = h.len().min(MAX_HOST);
    while !h.is_char_boundary(n) {
        n -= 1;
    }
    &h[..n]
}

impl LeaseRecord {
    pub fn encode(&self) -> Vec<u8> {
        let host = cut_host(&self.host).as_bytes();
        let mut b = Vec::with_capacity(FIXED + host.len() + 4);
        b.extend_from_slice(&LEASE_MAGIC);
        b.extend_from_slice(&LEASE_VERSION.to_le_bytes());
        b.push(self.state as u8);
        b.push(host.len() as u8);
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.extend_from_slice(&self.mount_id);
        b.extend_from_slice(&self.boot_id);
        b.extend_from_slice(&self.taken_ms.to_le_bytes());
        b.extend_from_slice(&self.expires_ms.to_le_bytes());
        b.extend_from_slice(&self.timeout_ms.to_le_bytes());
        b.extend_from_slice(&self.renewals.to_le_bytes());
        b.extend_from_slice(host);
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> std::result::Result<LeaseRecord, LeaseError> {
        if b.len() < FIXED + 4 {
            return Err(LeaseError::TooShort(b.len()));
        }
        if b[0..8] != LEASE_MAGIC {
            return Err(LeaseError::BadMagic);
        }
        let v = u16_at(b, 8);
        if v != LEASE_VERSION {
            return Err(LeaseError::Version(v));
        }
        let hl = b[11] as usize;
        let want = FIXED + hl + 4;
        if b.len() != want {
            return Err(LeaseError::Length {
                found: b.len(),
                want,
            });
        }
        if crc32c::crc32c(&b[..FIXED + hl]) != u32_at(b, FIXED + hl) {
            return Err(LeaseError::Checksum);
        }
        let state = match b[10] {
            1 => LeaseState::Held,
            2 => LeaseState::Released,
            s => return Err(LeaseError::State(s)),
        };
        let mut mount_id = [0u8; 16];
        mount_id.copy_from_slice(&b[16..32]);
        let mut boot_id = [0u8; 16];
        boot_id.copy_from_slice(&b[32..48]);
        let host = std::str::from_utf8(&b[FIXED..FIXED + hl])
            .map_err(|_| LeaseError::Host)?
            .to_string();
        Ok(LeaseRecord {
            state,
            pid: u32_at(b, 12),
            mount_id,
            boot_id,
            taken_ms: u64_at(b, 48),
            expires_ms: u64_at(b, 56),
            timeout_ms: u32_at(b, 64),
            renewals: u32_at(b, 68),
            host,
        })
    }

    /// `HOST (pid P, mount MOUNTID8)`.
    fn holder(&self) -> String {
        let id: String = self.mount_id[..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("{} (pid {}, mount {id})", self.host, self.pid)
    }
}

/// Now, in Unix milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// This machine's boot id (zero when it cannot be read).
pub fn boot_id() -> [u8; 16] {
    let mut out = [0u8; 16];
    let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") else {
        return out;
    };
    let hex: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    if hex.len() != 32 {
        return out;
    }
    for (i, pair) in hex.chunks(2).enumerate() {
        let d = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
        out[i] = d(pair[0]) << 4 | d(pair[1]);
    }
    out
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown-host".to_string())
}

/// Whether process `pid` of this machine runs.
fn pid_alive(pid: u32) -> bool {
    match rustix::process::Pid::from_raw(pid as i32) {
        None => false,
        Some(p) => match rustix::process::test_kill_process(p) {
            Ok(()) => true,
            // EPERM: it runs under another user.
            Err(e) => e != rustix::io::Errno::SRCH,
        },
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether the store may write to the bucket: every PUT and DELETE checks it.
#[derive(Debug)]
pub struct Gate {
    st: Mutex<GateState>,
}

#[derive(Debug)]
struct GateState {
    valid_until: Instant,
    lost: Option<String>,
}

impl Gate {
    fn new(valid_until: Instant) -> Gate {
        Gate {
            st: Mutex::new(GateState {
                valid_until,
                lost: None,
            }),
        }
    }

    /// Fails once the lease is lost or late; lateness is final.
    pub fn check(&self) -> io::Result<()> {
        let mut g = lock(&self.st);
        if g.lost.is_none() && Instant::now() >= g.valid_until {
            g.lost = Some(
                "its lease could not be renewed in time (the bucket unreachable?); another \
                 mount may take the store over once it expired"
                    .to_string(),
            );
        }
        match &g.lost {
            None => Ok(()),
            Some(why) => Err(io::Error::other(format!(
                "this mount no longer holds the store's lease: {why}"
            ))),
        }
    }

    /// Whether the lease is lost (or late).
    pub fn is_lost(&self) -> bool {
        self.check().is_err()
    }

    fn extend(&self, until: Instant) {
        let mut g = lock(&self.st);
        if g.lost.is_none() {
            g.valid_until = until;
        }
    }

    fn lose(&self, why: String) {
        let mut g = lock(&self.st);
        if g.lost.is_none() {
            g.lost = Some(why);
        }
    }
}

/// How a lease is taken.
#[derive(Debug, Clone, Copy)]
pub struct LeaseOptions {
    pub timeout: Duration,
    /// Take over an expired lease of another mount (`--force`). An unexpired one is refused
    /// regardless.
    pub force: bool,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            timeout: DEFAULT_LEASE_TIMEOUT,
            force: false,
        }
    }
}

struct Shared {
    remote: Arc<Remote>,
    gate: Arc<Gate>,
    /// Our record as last written, and its version in the bucket.
    cur: Mutex<(LeaseRecord, UpdateVersion)>,
    timeout: Duration,
    stop: Mutex<bool>,
    wake: Condvar,
}

/// A held lease: renewed by a thread until released (or dropped, which releases it).
pub struct Lease {
    sh: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    released: bool,
}

/// How long before the announced expiry the holder stops writing.
fn margin(timeout: Duration) -> Duration {
    timeout / 4
}

fn secs(ms: u64) -> String {
    format!("{:.0} s", ms as f64 / 1000.0)
}

/// Takes the lease of the store at `remote` (see the module doc), or says who holds it.
pub fn acquire(remote: Arc<Remote>, o: &LeaseOptions) -> Result<Lease> {
    let url = remote.url.to_string();
    let timeout_ms = o.timeout.as_millis().min(u32::MAX as u128) as u32;
    let my_boot = boot_id();
    let mount_id = crate::open::random_uuid()?;
    // A few rounds: a conditional PUT that loses a race re-reads the lease and decides anew.
    for _ in 0..4 {
        let over = match remote.get_versioned(LEASE_KEY)? {
            None => None,
            Some((bytes, ver)) => {
                let now = now_ms();
                match LeaseRecord::decode(&bytes) {
                    Err(e) if !o.force => {
                        return Err(Error::LeaseHeld(format!(
                            "store {url}: its lease object is damaged ({e}), so who holds the \
                             store is unknown: make sure no other mount of it runs, then add \
                             --force to replace the lease"
                        )))
                    }
                    Err(e) => {
                        tracing::warn!("compfs: store {url}: replacing a damaged lease ({e})");
                    }
                    Ok(r) if r.state == LeaseState::Released => {}
                    Ok(r) if r.boot_id == my_boot && my_boot != [0; 16] && !pid_alive(r.pid) => {
                        tracing::warn!(
                            "compfs: store {url}: taking over the lease of {}, a mount of this \
                             machine that ended without releasing it",
                            r.holder()
                        );
                    }
                    Ok(r) if now < r.expires_ms => {
                        return Err(Error::LeaseHeld(format!(
                            "store {url} is mounted read-write by {}, whose lease runs for \
                             another {} (renewed every {}): unmount it there first; --force \
                             takes over only a lease that expired",
                            r.holder(),
                            secs(r.expires_ms - now),
                            secs(u64::from(r.timeout_ms) / 3)
                        )))
                    }
                    Ok(r) if !o.force => {
                        return Err(Error::LeaseHeld(format!(
                            "store {url} was mounted read-write by {}, whose lease expired {} \
                             ago without being released (that mount crashed or lost the \
                             bucket): make sure it no longer runs, then add --force to take \
                             the store over",
                            r.holder(),
                            secs(now - r.expires_ms)
                        )))
                    }
                    Ok(r) => {
                        tracing::warn!(
                            "compfs: store {url}: --force: taking over the lease of {}, expired \
                             {} ago",
                            r.holder(),
                            secs(now - r.expires_ms)
                        );
                    }
                }
                Some(ver)
            }
        };
        let taken_ms = now_ms();
        let rec = LeaseRecord {
            state: LeaseState::Held,
            pid: std::process::id(),
            mount_id,
            boot_id: my_boot,
            taken_ms,
            expires_ms: taken_ms + u64::from(timeout_ms),
            timeout_ms,
            renewals: 0,
            host: host_name(),
        };
        let sent = Instant::now();
        let bytes = rec.encode();
        let ver = match remote.put_cond(LEASE_KEY, bytes.clone(), over)? {
            CondPut::Done(v) => v,
            CondPut::Conflict => match remote.get_versioned(LEASE_KEY)? {
                // Our own PUT, retried after it had landed.
                Some((b, v)) if b == bytes => v,
                _ => continue,
            },
        };
        // A server whose conditions are not atomic (s3s-fs) may let a racing PUT win after
        // ours: read it back.
        match remote.get_versioned(LEASE_KEY)? {
            Some((b, v)) if b == bytes && v.e_tag == ver.e_tag => {}
            _ => continue,
        }
        let gate = Arc::new(Gate::new(sent + o.timeout - margin(o.timeout)));
        let sh = Arc::new(Shared {
            remote,
            gate,
            cur: Mutex::new((rec, ver)),
            timeout: o.timeout,
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        let t = {
            let sh = sh.clone();
            std::thread::Builder::new()
                .name("compfs-lease".into())
                .spawn(move || renew_loop(&sh))?
        };
        return Ok(Lease {
            sh,
            thread: Some(t),
            released: false,
        });
    }
    Err(Error::LeaseHeld(format!(
        "store {url}: another mount took the lease while this one tried to: retry"
    )))
}

fn renew_loop(sh: &Shared) {
    let every = sh.timeout / 3;
    let mut next = Instant::now() + every;
    loop {
        {
            let mut stop = lock(&sh.stop);
            while !*stop {
                let now = Instant::now();
                if now >= next {
                    break;
                }
                stop = sh
                    .wake
                    .wait_timeout(stop, next - now)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
            if *stop {
                return;
            }
        }
        if sh.gate.is_lost() {
            tracing::error!(
                "compfs: store {}: this mount lost its lease; it refuses further writes",
                sh.remote.url
            );
            return;
        }
        match renew(sh, LeaseState::Held) {
            Ok(()) => next = Instant::now() + every,
            Err(e) => {
                tracing::warn!("compfs: store {}: lease renewal failed: {e}", sh.remote.url);
                next = Instant::now() + (every / 4).max(Duration::from_millis(100));
            }
        }
    }
}

/// Rewrites our lease (renewed, or released) with `If-Match` on its last version.
fn renew(sh: &Shared, state: LeaseState) -> io::Result<()> {
    let mut cur = lock(&sh.cur);
    let mut rec = cur.0.clone();
    rec.state = state;
    rec.renewals = rec.renewals.wrapping_add(1);
    let sent = Instant::now();
    let now = now_ms();
    rec.expires_ms = if state == LeaseState::Held {
        now + sh.timeout.as_millis() as u64
    } else {
        now
    };
    let bytes = rec.encode();
    let ver = match sh
        .remote
        .put_cond(LEASE_KEY, bytes.clone(), Some(cur.1.clone()))?
    {
        CondPut::Done(v) => v,
        CondPut::Conflict => match sh.remote.get_versioned(LEASE_KEY)? {
            Some((b, v)) if b == bytes => v,
            other => {
                let who = other
                    .and_then(|(b, _)| LeaseRecord::decode(&b).ok())
                    .map_or_else(|| "another mount".to_string(), |r| r.holder());
                let why = format!("{who} took the store over");
                tracing::error!("compfs: store {}: {why}", sh.remote.url);
                sh.gate.lose(why.clone());
                return Err(io::Error::other(why));
            }
        },
    };
    *cur = (rec, ver);
    if state == LeaseState::Held {
        sh.gate.extend(sent + sh.timeout - margin(sh.timeout));
    }
    Ok(())
}

impl Lease {
    /// The gate every write of the store passes.
    pub fn gate(&self) -> Arc<Gate> {
        self.sh.gate.clone()
    }

    /// The record as last written.
    pub fn record(&self) -> LeaseRecord {
        lock(&self.sh.cur).0.clone()
    }

    fn stop_thread(&mut self) {
        *lock(&self.sh.stop) = true;
        self.sh.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Stops renewing and marks the lease released (after the store's last write).
    pub fn release(mut self) -> io::Result<()> {
        self.release_inner()
    }

    fn release_inner(&mut self) -> io::Result<()> {
        self.stop_thread();
        if self.released {
            return Ok(());
        }
        self.released = true;
        if self.sh.gate.is_lost() {
            // Not ours any more (or late: someone may hold it now).
            return Ok(());
        }
        let r = renew(&self.sh, LeaseState::Released);
        self.sh.gate.lose("the lease was released".to_string());
        r
    }

    /// Stops renewing without releasing, as a crash would: the lease stays in the bucket
    /// until it expires (for tests of a lost writer).
    pub fn abandon(mut self) {
        self.stop_thread();
        self.sh.gate.lose("the lease was abandoned".to_string());
        self.released = true;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Err(e) = self.release_inner() {
            tracing::warn!(
                "compfs: store {}: cannot release the lease: {e}",
                self.sh.remote.url
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn rec() -> LeaseRecord {
        LeaseRecord {
            state: LeaseState::Held,
            pid: 4242,
            mount_id: [7; 16],
            boot_id: [9; 16],
            taken_ms: 1_700_000_000_000,
            expires_ms: 1_700_000_060_000,
            timeout_ms: 60_000,
            renewals: 3,
            host: "host-é".into(),
        }
    }

    #[test]
    fn records_round_trip_and_have_the_documented_length() {
        let r = rec();
        let b = r.encode();
        assert_eq!(b.len(), FIXED + r.host.len() + 4);
        assert_eq!(&b[..8], b"CFSLEASE");
        assert_eq!(LeaseRecord::decode(&b).unwrap(), r);
        let mut long = rec();
        long.host = "é".repeat(200);
        let d = LeaseRecord::decode(&long.encode()).unwrap();
        assert!(d.host.len() <= MAX_HOST && long.host.starts_with(&d.host));
    }

    #[test]
    fn malformed_records_are_typed_errors() {
        let b = rec().encode();
        for n in 0..b.len() {
            assert!(LeaseRecord::decode(&b[..n]).is_err(), "cut at {n}");
        }
        let mut x = b.clone();
        x.push(0);
        assert!(matches!(
            LeaseRecord::decode(&x),
            Err(LeaseError::Length { .. })
        ));
        for i in 0..b.len() {
            let mut x = b.clone();
            x[i] ^= 0x10;
            assert!(LeaseRecord::decode(&x).is_err(), "flip at {i}");
        }
        let mut x = b.clone();
        x[0] = b'X';
        assert_eq!(LeaseRecord::decode(&x), Err(LeaseError::BadMagic));
        // A wrong state with a good checksum.
        let mut x = b[..b.len() - 4].to_vec();
        x[10] = 9;
        let c = crc32c::crc32c(&x);
        x.extend_from_slice(&c.to_le_bytes());
        assert_eq!(LeaseRecord::decode(&x), Err(LeaseError::State(9)));
        assert!(LeaseRecord::decode(&[0xff; 4096]).is_err());
    }

    #[test]
    fn the_gate_closes_when_late_or_lost_for_good() {
        let g = Gate::new(Instant::now() + Duration::from_secs(60));
        assert!(g.check().is_ok());
        g.lose("x took it".into());
        assert!(g.check().unwrap_err().to_string().contains("x took it"));
        let g = Gate::new(Instant::now());
        assert!(g.check().is_err());
        g.extend(Instant::now() + Duration::from_secs(60));
        assert!(g.check().is_err(), "lateness is final");
    }

    #[test]
    fn this_process_is_alive_and_boot_id_reads() {
        assert!(pid_alive(std::process::id()));
        assert!(!pid_alive(0x7fff_fff0));
        assert_ne!(boot_id(), [0; 16]);
    }
}
