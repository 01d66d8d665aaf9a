//! FUSE over io_uring (a compfs addition to fuser 0.18, see COMPFS-CHANGES.md).
//!
//! With `FUSE_OVER_IO_URING` agreed in INIT (Linux 6.14+, module parameter
//! `fuse.enable_uring=Y`), the kernel serves requests through one queue per possible CPU: a
//! request made by a task on CPU N goes to queue N, and is handed to userspace by completing an
//! `IORING_OP_URING_CMD` that the daemon thread of queue N submitted earlier. That thread is pinned
//! to CPU N here, so the requester and the daemon meet on one CPU, with no `read`/`write` pair on
//! `/dev/fuse` and no cross-CPU wake-up.
//!
//! The protocol, as implemented by the kernel (fs/fuse/dev_uring.c, include/uapi/linux/fuse.h):
//!
//! * Each ring entry is two buffers: a header ([`ReqHeader`]: `in_out` for `fuse_in_header` on the
//!   way in and `fuse_out_header` on the way out, `op_in` for the operation's first argument, and
//!   [`EntInOut`]) and a payload of at least the connection's largest payload
//!   (`max(FUSE_MIN_READ_BUFFER, max_write, max_pages * PAGE_SIZE)`).
//! * `FUSE_IO_URING_CMD_REGISTER` (SQE128, `addr` = the two iovecs, `len` = 2, command area =
//!   [`CmdReq`] with the queue id) makes an entry available. Only once every queue has one does
//!   the kernel switch its request queue over to the rings; until then, and for FORGET and
//!   INTERRUPT always, requests come through `/dev/fuse`. (New requests wait while the ring is
//!   being set up: `fuse_block_alloc`.)
//! * A completion with result 0 is a request: `fuse_in_header` in `in_out` (its `len` is still the
//!   full `/dev/fuse` length), the first argument in `op_in`, the rest (`payload_sz` bytes) in the
//!   payload. So the first argument is `len - 40 - payload_sz` bytes long.
//! * The reply goes back the same way (`fuse_out_header` in `in_out`, the rest in the payload,
//!   `payload_sz`), then `FUSE_IO_URING_CMD_COMMIT_AND_FETCH` with the request's `commit_id`
//!   commits it and makes the entry available again, in one submission.
//! * On unmount or abort the kernel completes every entry it holds with an error (`ENOTCONN`).
//!
//! Requests are rebuilt into the contiguous `/dev/fuse` layout and go through fuser's usual
//! parsing and dispatch; the reply sender of a ring request ([`RingReply`]) writes into the entry
//! and queues the commit. A reply made on the ring thread (the common case) is submitted with
//! the thread's next wait, batching it with the wait in one `io_uring_enter`; a reply made on any
//! other thread is submitted by that thread (the submission queue is behind a mutex).

use std::alloc::Layout;
use std::cell::Cell;
use std::io;
use std::io::IoSlice;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::error;
use log::info;
use log::warn;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::KernelConfig;
use crate::channel::Channel;
use crate::channel::ChannelSender;
use crate::ll;
use crate::ll::flags::init_flags::InitFlags;
use crate::ll::fuse_abi as abi;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// `FUSE_IO_URING_CMD_REGISTER` (include/uapi/linux/fuse.h `enum fuse_uring_cmd`).
const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`.
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `FUSE_MIN_READ_BUFFER`.
const MIN_READ_BUFFER: usize = 8192;
/// `sizeof(struct fuse_in_header)`.
const IN_HEADER: usize = size_of::<abi::fuse_in_header>();
/// `sizeof(struct fuse_out_header)`.
const OUT_HEADER: usize = size_of::<abi::fuse_out_header>();
/// `FUSE_URING_IN_OUT_HEADER_SZ` and `FUSE_URING_OP_IN_OUT_SZ`.
const HEADER_AREA: usize = 128;
/// The `user_data` of the wake-up NOP (entries use their index).
const WAKE: u64 = u64::MAX;

/// `struct fuse_uring_ent_in_out`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct EntInOut {
    flags: u64,
    /// The request's unique id on the way in; to be echoed by the commit.
    commit_id: u64,
    /// Bytes in the payload buffer, both ways.
    payload_sz: u32,
    padding: u32,
    reserved: u64,
}

/// `struct fuse_uring_req_header`.
#[repr(C)]
struct ReqHeader {
    in_out: [u8; HEADER_AREA],
    op_in: [u8; HEADER_AREA],
    ent: EntInOut,
}

/// `struct fuse_uring_cmd_req`, in the command area of a 128-byte SQE.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct CmdReq {
    flags: u64,
    commit_id: u64,
    qid: u16,
    padding: [u8; 6],
}

const _: () = assert!(size_of::<EntInOut>() == 32);
const _: () = assert!(size_of::<ReqHeader>() == 288);
const _: () = assert!(size_of::<CmdReq>() == 24);
const _: () = assert!(size_of::<squeue::Entry128>() == 128);

/// Whether a session uses FUSE over io_uring.
#[derive(Debug, Clone, Copy, Default, Eq, PartialEq)]
pub enum UringMode {
    /// Never: every request goes through `/dev/fuse` reads and writes.
    #[default]
    Off,
    /// When the kernel offers `FUSE_OVER_IO_URING` in INIT (module parameter `enable_uring`
    /// is Y) and the rings can be set up; otherwise `/dev/fuse`, with a log line saying why.
    Auto,
    /// Always: the session fails (and unmounts) if the kernel does not offer it or the rings
    /// cannot be set up.
    Required,
}

/// Which ring requests a ring thread hands to the helper threads instead of serving them
/// itself: called with the request's opcode and its arguments (the bytes after
/// `fuse_in_header`: the operation's header, then names or data). A ring thread serves the
/// requests of one CPU one after the other, so a request that may take long (a READ that
/// decompresses, an FSYNC that waits for a disk or a network, a filesystem-specific long
/// operation) holds up every other request of that CPU unless it is handed off; a hand-off
/// costs a wake-up of another thread, which is what the ring saves, so cheap requests stay.
pub type HandOff = fn(opcode: u32, args: &[u8]) -> bool;

/// The default [`HandOff`]: READs (a sequential reader's readahead puts all its READs on one
/// CPU's queue; served by that queue's thread alone they decompress on one core), FSYNC and
/// FSYNCDIR (they wait for the storage).
pub fn default_hand_off(opcode: u32, _args: &[u8]) -> bool {
    matches!(opcode, FUSE_READ | FUSE_FSYNC | FUSE_FSYNCDIR)
}

/// Whether a ring thread should commit its replies so that each requester is woken on the
/// ring thread's CPU, the one it made its request from: called before each batch of replies.
/// A ring thread is pinned to its queue's CPU, and the requester it answers ran there; but when
/// the reply wakes it, the ring thread is still running, so the scheduler puts the requester
/// on another CPU if one is idle, and its next request goes to that CPU's queue, whose reply
/// moves it back: each round trip then wakes an idle CPU, an inter-processor interrupt (and on
/// a VM, an exit). Committing while `SCHED_IDLE` makes the scheduler count the ring thread's
/// CPU as idle and wake the requester there (the patch that makes the kernel do this itself,
/// `wake_up_on_current_cpu` for ring requests, is not in Linux 6.18). The cost: until the
/// ring thread runs again and resumes its policy, any other runnable thread of its CPU goes
/// first, so with busy background threads (compression) it is slower: the filesystem says
/// when it is worth it. Ignored where the thread cannot leave `SCHED_IDLE` again.
pub type WakeHere = fn() -> bool;

/// The default [`WakeHere`]: never.
pub fn never_wake_here() -> bool {
    false
}

/// FUSE-over-io_uring settings of a session ([`crate::Config::uring`]).
#[derive(Debug, Clone, Copy)]
pub struct UringConfig {
    /// Whether to use it.
    pub mode: UringMode,
    /// Ring entries per queue (per CPU): how many requests from one CPU can be in the daemon
    /// at once. At least 1.
    pub queue_depth: u16,
    /// Which requests go to the helper threads ([`default_hand_off`] unless set).
    pub hand_off: HandOff,
    /// When replies should wake requesters on the ring thread's CPU ([`never_wake_here`]
    /// unless set).
    pub wake_here: WakeHere,
}

// `Config` compares its fields; two configs are equal when they pick the same function
// (compared by address, as `std::ptr::fn_addr_eq` does).
impl PartialEq for UringConfig {
    fn eq(&self, other: &Self) -> bool {
        self.mode == other.mode
            && self.queue_depth == other.queue_depth
            && std::ptr::fn_addr_eq(self.hand_off, other.hand_off)
            && std::ptr::fn_addr_eq(self.wake_here, other.wake_here)
    }
}

impl Eq for UringConfig {}

impl Default for UringConfig {
    fn default() -> Self {
        UringConfig {
            mode: UringMode::Off,
            queue_depth: 2,
            hand_off: default_hand_off,
            wake_here: never_wake_here,
        }
    }
}

/// Process-wide FUSE-over-io_uring figures ([`uring_stats`]).
#[derive(Debug, Clone, Default, Eq, PartialEq)]
pub struct UringStats {
    /// Queues whose entries the kernel accepted (one per possible CPU when the ring is in use).
    pub queues: u64,
    /// Requests served through the rings so far.
    pub requests: u64,
    /// Requests served per queue (= CPU), for the first [`STATS_QUEUES`] queues.
    pub per_queue: Vec<u64>,
    /// Of `requests`, those a ring thread handed to the helper threads ([`HandOff`]).
    pub handed_off: u64,
    /// Rounds of a ring thread's loop whose pending replies were committed as `SCHED_IDLE`, so
    /// as to wake their requesters on the ring thread's CPU ([`WakeHere`]).
    pub woken_here: u64,
}

/// Queues counted separately in [`UringStats::per_queue`].
pub const STATS_QUEUES: usize = 64;

static QUEUES_REGISTERED: AtomicU64 = AtomicU64::new(0);
static RING_REQUESTS: AtomicU64 = AtomicU64::new(0);
static HANDED_OFF: AtomicU64 = AtomicU64::new(0);
static WOKEN_HERE: AtomicU64 = AtomicU64::new(0);
static QUEUE_REQUESTS: [AtomicU64; STATS_QUEUES] = [const { AtomicU64::new(0) }; STATS_QUEUES];

/// The FUSE-over-io_uring figures of this process (all its sessions together).
pub fn uring_stats() -> UringStats {
    let per_queue: Vec<u64> = QUEUE_REQUESTS
        .iter()
        .map(|n| n.load(Ordering::Relaxed))
        .collect();
    let used = per_queue.iter().rposition(|n| *n > 0).map_or(0, |i| i + 1);
    UringStats {
        queues: QUEUES_REGISTERED.load(Ordering::Relaxed),
        requests: RING_REQUESTS.load(Ordering::Relaxed),
        per_queue: per_queue[..used].to_vec(),
        handed_off: HANDED_OFF.load(Ordering::Relaxed),
        woken_here: WOKEN_HERE.load(Ordering::Relaxed),
    }
}

thread_local! {
    /// The queue id of the ring thread running on this thread, if it is one.
    static RING_THREAD_QID: Cell<Option<u16>> = const { Cell::new(None) };
}

/// A zeroed, page-aligned heap buffer handed to the kernel by address.
#[derive(Debug)]
struct Buf {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Buf {
    fn new(len: usize) -> io::Result<Buf> {
        let layout = Layout::from_size_align(len.max(1), page_size::get())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| io::Error::new(io::ErrorKind::OutOfMemory, "ring buffer"))?;
        Ok(Buf { ptr, layout })
    }

    fn len(&self) -> usize {
        self.layout.size()
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated in `Buf::new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// One ring entry: its two buffers and the request it holds in userspace.
#[derive(Debug)]
struct Entry {
    header: Buf,
    payload: Buf,
    /// The iovecs of REGISTER (the kernel reads them while the SQE is issued).
    iov: Box<[libc::iovec; 2]>,
    /// `commit_id` of the request this entry holds in userspace; 0 when none (the kernel owns
    /// the buffers). The reply that swaps it to 0 is the one that commits.
    pending: AtomicU64,
}

/// One queue (one CPU): its io_uring, entries and state.
pub(crate) struct Queue {
    qid: u16,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    /// Serialises pushes onto the submission queue (replies may come from any thread).
    sq_lock: Mutex<()>,
    entries: Box<[Entry]>,
    /// The `/dev/fuse` connection the commands go to (kept open by this clone).
    ch: Channel,
    stop: AtomicBool,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("qid", &self.qid)
            .field("entries", &self.entries.len())
            .finish_non_exhaustive()
    }
}

// SAFETY: the raw buffers of an entry are written by the kernel only while it owns the entry
// (between a submitted REGISTER/COMMIT_AND_FETCH and its completion), read by the ring thread
// after the completion, and written by exactly one reply (the one that swaps `pending` to 0)
// before the commit is submitted. Access to the submission queue is serialised by `sq_lock`; the
// completion queue is only touched by the queue's ring thread.
unsafe impl Send for Queue {}
// SAFETY: as above.
unsafe impl Sync for Queue {}

/// The rings of a session, set up before the INIT reply agrees to use them.
#[derive(Debug)]
pub(crate) struct Rings {
    queues: Vec<Arc<Queue>>,
    hand_off: HandOff,
    wake_here: WakeHere,
}

/// The CPUs the kernel makes queues for: `num_possible_cpus()`, from
/// `/sys/devices/system/cpu/possible` (e.g. `0-3` or `0,2-5`).
fn possible_cpus() -> io::Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("cpu list {s:?}"));
    let mut n = 0usize;
    for part in s.trim().split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a, b),
            None => (part, part),
        };
        let a: usize = a.parse().map_err(|_| bad())?;
        let b: usize = b.parse().map_err(|_| bad())?;
        if b < a {
            return Err(bad());
        }
        n = n.max(b + 1);
    }
    if n == 0 {
        return Err(bad());
    }
    Ok(n)
}

/// The payload size the kernel requires of every entry (fs/fuse/dev_uring.c
/// `fuse_uring_create`), from what the INIT reply will say.
fn payload_size(config: &KernelConfig) -> usize {
    let page = page_size::get();
    let n = MIN_READ_BUFFER
        .max(config.max_write as usize)
        .max(usize::from(config.max_pages()) * page);
    n.div_ceil(page) * page
}

impl Rings {
    fn new(
        ch: &Channel,
        depth: u16,
        payload: usize,
        hand_off: HandOff,
        wake_here: WakeHere,
    ) -> io::Result<Rings> {
        let nr = possible_cpus()?;
        let depth = depth.max(1);
        let mut queues = Vec::with_capacity(nr);
        for qid in 0..nr {
            let qid = u16::try_from(qid)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too many CPUs"))?;
            // One SQE per entry plus the wake-up NOP; completions likewise.
            let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
                .build((u32::from(depth) + 1).next_power_of_two())?;
            let mut entries = Vec::with_capacity(usize::from(depth));
            for _ in 0..depth {
                let header = Buf::new(size_of::<ReqHeader>())?;
                let payload = Buf::new(payload)?;
                let iov = Box::new([
                    libc::iovec {
                        iov_base: header.ptr.as_ptr().cast(),
                        iov_len: size_of::<ReqHeader>(),
                    },
                    libc::iovec {
                        iov_base: payload.ptr.as_ptr().cast(),
                        iov_len: payload.len(),
                    },
                ]);
                entries.push(Entry {
                    header,
                    payload,
                    iov,
                    pending: AtomicU64::new(0),
                });
            }
            queues.push(Arc::new(Queue {
                qid,
                ring,
                sq_lock: Mutex::new(()),
                entries: entries.into_boxed_slice(),
                ch: ch.clone(),
                stop: AtomicBool::new(false),
            }));
        }
        Ok(Rings {
            queues,
            hand_off,
            wake_here,
        })
    }

    /// Starts one pinned thread per queue, serving requests through `se`'s filesystem.
    pub(crate) fn start<FS: Filesystem + Send + Sync + 'static>(
        self,
        make_loop: impl Fn(String) -> SessionEventLoop<FS>,
    ) -> io::Result<RingThreads> {
        let n_helpers = helper_count(self.queues.len());
        let mut threads = Vec::with_capacity(self.queues.len() + n_helpers);
        // The requests `hand_off` picks are served by a shared pool of helpers, so that the
        // reads a sequential reader's readahead puts on its CPU's queue are decompressed on
        // every core, and a long request does not hold up the other requests of its CPU
        // (see `HelperJob`).
        let (help_tx, help_rx) = std::sync::mpsc::channel::<HelperJob>();
        let help_rx = Arc::new(Mutex::new(help_rx));
        let mut helpers = Vec::with_capacity(n_helpers);
        for i in 0..n_helpers {
            let name = format!("fuser-ring-help-{i}");
            let se = make_loop(name.clone());
            let rx = help_rx.clone();
            match std::thread::Builder::new()
                .name(name)
                .spawn(move || serve_helper(&rx, &se))
            {
                Ok(t) => helpers.push(t),
                Err(e) => warn!("FUSE ring: no helper thread ({e}); requests served inline"),
            }
        }
        // Whether a ring thread may drop to SCHED_IDLE and come back (root, or RLIMIT_NICE);
        // without it, replies are never committed so as to wake requesters here.
        let wake_here = if sched_idle_reversible() {
            Some(self.wake_here)
        } else {
            info!(
                "FUSE ring: replies wake requesters wherever the scheduler puts them \
                 (this process cannot leave SCHED_IDLE again)"
            );
            None
        };
        let hand_off = self.hand_off;
        let helper_tx = (!helpers.is_empty()).then_some(help_tx);
        for q in &self.queues {
            let name = format!("fuser-ring-{}", q.qid);
            let se = make_loop(name.clone());
            let q2 = q.clone();
            let q_helpers = helper_tx.clone();
            let spawned = std::thread::Builder::new()
                .name(name)
                .spawn(move || q2.serve(&se, q_helpers, hand_off, wake_here));
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    // The queues without a thread would never be registered and the kernel
                    // would hold every request back: refuse the ring so that it falls back.
                    refuse_ring(q);
                    let rt = RingThreads {
                        queues: self.queues.clone(),
                        threads,
                    };
                    drop(helper_tx);
                    rt.stop();
                    for h in helpers {
                        let _ = h.join();
                    }
                    return Err(e);
                }
            }
        }
        // The helpers end once every ring thread ended (the last sender is gone): joined
        // after them.
        drop(helper_tx);
        threads.extend(helpers);
        Ok(RingThreads {
            queues: self.queues,
            threads,
        })
    }
}

/// Tells the kernel that this connection will not use the ring after all: a REGISTER it refuses
/// (queue id out of range) makes it clear `fc->io_uring` and release the requests it held back
/// for the ring (fs/fuse/dev_uring.c `fuse_uring_cmd`).
fn refuse_ring(q: &Queue) {
    let cmd = CmdReq {
        qid: u16::MAX,
        ..CmdReq::default()
    };
    let sqe = with_len(
        opcode::UringCmd80::new(types::Fd(q.ch.as_fd().as_raw_fd()), CMD_REGISTER)
            .cmd(cmd_bytes(&cmd))
            .addr(Some(q.entries[0].iov.as_ptr() as u64))
            .build()
            .user_data(WAKE),
        2,
    );
    q.push(&sqe);
    if let Err(e) = q.ring.submit() {
        error!("refusing the FUSE ring: {e}");
    }
}

/// The running ring threads of a session.
#[derive(Debug)]
pub(crate) struct RingThreads {
    queues: Vec<Arc<Queue>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl RingThreads {
    /// Stops the ring threads (after the `/dev/fuse` readers have ended, i.e. after unmount)
    /// and waits for them.
    pub(crate) fn stop(self) {
        for q in &self.queues {
            q.stop.store(true, Ordering::Release);
            q.push(&opcode::Nop::new().build().user_data(WAKE).into());
            if let Err(e) = q.ring.submit() {
                warn!("waking FUSE ring thread {}: {e}", q.qid);
            }
        }
        for t in self.threads {
            if t.join().is_err() {
                error!("a FUSE ring thread panicked");
            }
        }
    }
}

/// Sets `len` of a 128-byte SQE (io-uring's `UringCmd80` has no setter for it; REGISTER needs
/// it to be the iovec count).
fn with_len(e: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: `Entry128` is `#[repr(C)]`: the 64-byte `struct io_uring_sqe` followed by 64 bytes
    // of command, integers only, so every bit pattern is valid and the sizes match (checked
    // above). `len` is the u32 at byte 24 of `struct io_uring_sqe`.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
    raw[24..28].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

fn cmd_bytes(c: &CmdReq) -> [u8; 80] {
    let mut out = [0u8; 80];
    out[0..8].copy_from_slice(&c.flags.to_ne_bytes());
    out[8..16].copy_from_slice(&c.commit_id.to_ne_bytes());
    out[16..18].copy_from_slice(&c.qid.to_ne_bytes());
    out
}

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: u16) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes within it; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(usize::from(cpu), &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

impl Queue {
    /// Pushes one SQE (not yet submitted).
    fn push(&self, sqe: &squeue::Entry128) {
        let _g = self.sq_lock.lock();
        loop {
            // SAFETY: `sq_lock` is held, so this is the only submission queue handle; the SQE
            // points at buffers that live as long as the queue.
            let pushed = unsafe { self.ring.submission_shared().push(sqe).is_ok() };
            if pushed {
                return;
            }
            // Full (cannot happen: one SQE per entry plus one NOP): make room.
            if let Err(e) = self.ring.submit() {
                error!("FUSE ring {}: submit: {e}", self.qid);
                return;
            }
        }
    }

    fn register_sqe(&self, idx: usize) -> squeue::Entry128 {
        let cmd = CmdReq {
            qid: self.qid,
            ..CmdReq::default()
        };
        with_len(
            opcode::UringCmd80::new(types::Fd(self.ch.as_fd().as_raw_fd()), CMD_REGISTER)
                .cmd(cmd_bytes(&cmd))
                .addr(Some(self.entries[idx].iov.as_ptr() as u64))
                .build()
                .user_data(idx as u64),
            2,
        )
    }

    fn commit_sqe(&self, idx: usize, commit_id: u64) -> squeue::Entry128 {
        let cmd = CmdReq {
            commit_id,
            qid: self.qid,
            ..CmdReq::default()
        };
        opcode::UringCmd80::new(types::Fd(self.ch.as_fd().as_raw_fd()), CMD_COMMIT_AND_FETCH)
            .cmd(cmd_bytes(&cmd))
            .build()
            .user_data(idx as u64)
    }

    /// The ring thread: registers the entries, then serves their requests until every entry
    /// has been ended by the kernel (unmount) or the session stops the thread.
    fn serve<FS: Filesystem>(
        self: &Arc<Self>,
        se: &SessionEventLoop<FS>,
        helpers: Option<std::sync::mpsc::Sender<HelperJob>>,
        hand_off: HandOff,
        wake_here: Option<WakeHere>,
    ) {
        RING_THREAD_QID.with(|c| c.set(Some(self.qid)));
        if let Err(e) = pin_to(self.qid) {
            // An offline CPU: its queue still needs entries, served from wherever.
            info!("FUSE ring {}: not pinned: {e}", self.qid);
        }
        for idx in 0..self.entries.len() {
            self.push(&self.register_sqe(idx));
        }
        // A REGISTER the kernel accepts completes only with a request (or at teardown); one it
        // refuses completes at once with the error, handled below.
        let mut registered = match self.ring.submit() {
            Ok(_) => {
                QUEUES_REGISTERED.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) => {
                error!("FUSE ring {}: registering: {e}", self.qid);
                false
            }
        };
        if !registered {
            return;
        }
        let mut live = self.entries.len();
        let mut buf = RequestBuf::new(IN_HEADER + HEADER_AREA + self.entries[0].payload.len());
        let mut done: Vec<(u64, i32)> = Vec::with_capacity(self.entries.len() + 1);
        // Until when waking here is off, after this thread waited too long to run again.
        let mut back_off: Option<std::time::Instant> = None;
        // Whether this thread replied to a request since its last submit (READs and the other
        // handed-off requests are committed by the helpers).
        let mut replied = false;
        while live > 0 && !self.stop.load(Ordering::Acquire) {
            let backing_off = back_off.is_some_and(|t| std::time::Instant::now() < t);
            if std::mem::take(&mut replied) && !backing_off && wake_here.is_some_and(|f| f()) {
                // The replies are committed while this thread is SCHED_IDLE: the scheduler then
                // takes its CPU for idle (`sched_idle_cpu`) and wakes each requester here, on
                // the CPU it made its request from, instead of on the other, idle, CPU (an
                // inter-processor interrupt, and on a VM an exit; see `WakeHere`). The
                // requester preempts this thread, which resumes its normal policy when it
                // runs again.
                let t0 = std::time::Instant::now();
                set_policy(libc::SCHED_IDLE);
                let _ = self.ring.submit();
                set_policy(libc::SCHED_OTHER);
                WOKEN_HERE.fetch_add(1, Ordering::Relaxed);
                // Meanwhile every runnable normal thread of this CPU went first (a CPU hog
                // there would make each round trip wait for it): when that took long, the
                // next second's replies are committed the usual way.
                let waited = t0.elapsed();
                back_off = (waited > WAKE_HERE_MAX_WAIT)
                    .then(|| std::time::Instant::now() + WAKE_HERE_BACK_OFF);
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => {
                    error!("FUSE ring {}: io_uring_enter: {e}", self.qid);
                    break;
                }
            }
            done.clear();
            // SAFETY: only this thread takes the completion queue.
            unsafe {
                done.extend(
                    self.ring
                        .completion_shared()
                        .map(|c| (c.user_data(), c.result())),
                );
            }
            for &(ud, res) in &done {
                if ud == WAKE {
                    continue;
                }
                let Ok(idx) = usize::try_from(ud) else {
                    continue;
                };
                if idx >= self.entries.len() {
                    continue;
                }
                if res == 0 {
                    RING_REQUESTS.fetch_add(1, Ordering::Relaxed);
                    if let Some(n) = QUEUE_REQUESTS.get(usize::from(self.qid)) {
                        n.fetch_add(1, Ordering::Relaxed);
                    }
                    replied |= self.handle(idx, &mut buf, se, helpers.as_ref(), hand_off);
                    continue;
                }
                match -res {
                    libc::EAGAIN | libc::EINTR => {
                        // REGISTER before the kernel finished INIT: try again.
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        self.push(&self.register_sqe(idx));
                    }
                    libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV => {
                        debug!("FUSE ring {} entry {idx}: ended ({res})", self.qid);
                        live -= 1;
                    }
                    _ => {
                        let e = io::Error::from_raw_os_error(-res);
                        error!("FUSE ring {} entry {idx}: {e}; entry dropped", self.qid);
                        live -= 1;
                    }
                }
            }
        }
        if registered {
            registered = false;
            QUEUES_REGISTERED.fetch_sub(1, Ordering::Relaxed);
        }
        let _ = registered;
        debug!("FUSE ring {}: thread ends", self.qid);
    }

    /// Serves the request that entry `idx` holds: here (true: the reply is pushed for this
    /// thread's next submit) or by handing it to the helpers (false).
    fn handle<FS: Filesystem>(
        self: &Arc<Self>,
        idx: usize,
        buf: &mut RequestBuf,
        se: &SessionEventLoop<FS>,
        helpers: Option<&std::sync::mpsc::Sender<HelperJob>>,
        hand_off: HandOff,
    ) -> bool {
        let e = &self.entries[idx];
        let hp = e.header.ptr.as_ptr().cast::<ReqHeader>();
        // SAFETY: the kernel filled the header before completing the command, and owns it no
        // more until the commit; the reads are of plain integers.
        let (ent, in_h) = unsafe {
            let ent = std::ptr::addr_of!((*hp).ent).read_unaligned();
            let mut in_h = [0u8; IN_HEADER];
            std::ptr::copy_nonoverlapping(
                std::ptr::addr_of!((*hp).in_out).cast::<u8>(),
                in_h.as_mut_ptr(),
                IN_HEADER,
            );
            (ent, in_h)
        };
        let len = u32::from_ne_bytes([in_h[0], in_h[1], in_h[2], in_h[3]]) as usize;
        let unique = u64::from_ne_bytes([
            in_h[8], in_h[9], in_h[10], in_h[11], in_h[12], in_h[13], in_h[14], in_h[15],
        ]);
        let payload_sz = ent.payload_sz as usize;
        e.pending.store(ent.commit_id, Ordering::Release);
        let reply = RingReply(Arc::new(RingReplyInner {
            queue: self.clone(),
            idx,
            commit_id: ent.commit_id,
            ch: self.ch.sender(),
        }));
        let op_len = len
            .checked_sub(IN_HEADER + payload_sz)
            .filter(|n| *n <= HEADER_AREA && payload_sz <= e.payload.len());
        let Some(op_len) = op_len else {
            error!(
                "FUSE ring {}: request {unique}: length {len} does not fit payload {payload_sz}",
                self.qid
            );
            reply.send_error(unique, libc::EIO);
            return true;
        };
        let data = buf.as_mut(len);
        data[..IN_HEADER].copy_from_slice(&in_h);
        // SAFETY: as above; op_len <= 128 and payload_sz <= the payload buffer's size.
        unsafe {
            std::ptr::copy_nonoverlapping(
                std::ptr::addr_of!((*hp).op_in).cast::<u8>(),
                data[IN_HEADER..].as_mut_ptr(),
                op_len,
            );
            std::ptr::copy_nonoverlapping(
                e.payload.ptr.as_ptr(),
                data[IN_HEADER + op_len..].as_mut_ptr(),
                payload_sz,
            );
        }
        let opcode = u32::from_ne_bytes([in_h[4], in_h[5], in_h[6], in_h[7]]);
        if let Some(tx) = helpers {
            if hand_off(opcode, &data[IN_HEADER..len]) {
                let mut owned = RequestBuf::new(len);
                owned.as_mut(len).copy_from_slice(&data[..len]);
                let job = HelperJob {
                    buf: owned,
                    len,
                    reply: reply.clone(),
                };
                HANDED_OFF.fetch_add(1, Ordering::Relaxed);
                match tx.send(job) {
                    Ok(()) => return false,
                    // No helper left (they end only after the ring threads): served here.
                    Err(std::sync::mpsc::SendError(job)) => {
                        let HelperJob {
                            mut buf,
                            len,
                            reply,
                        } = job;
                        dispatch_ring(se, buf.as_mut(len), reply, unique);
                        return true;
                    }
                }
            }
        }
        dispatch_ring(se, &data[..len], reply, unique);
        true
    }
}

/// Longest a ring thread may take to get its CPU back after committing replies as
/// `SCHED_IDLE` (a round trip is ~20 µs) before it stops doing so for [`WAKE_HERE_BACK_OFF`].
const WAKE_HERE_MAX_WAIT: std::time::Duration = std::time::Duration::from_millis(1);
/// See [`WAKE_HERE_MAX_WAIT`].
const WAKE_HERE_BACK_OFF: std::time::Duration = std::time::Duration::from_secs(1);

/// Sets the calling thread's scheduling policy (`SCHED_OTHER` or `SCHED_IDLE`, priority 0).
fn set_policy(policy: i32) -> bool {
    let p = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain data; 0 is the calling thread.
    unsafe { libc::sched_setscheduler(0, policy, &p) == 0 }
}

/// Whether a thread of this process can switch to `SCHED_IDLE` and back (leaving it needs
/// `CAP_SYS_NICE` or an `RLIMIT_NICE` that allows nice 0). Tried on a short-lived thread of its
/// own, which ends either way: a ring thread that could not come back would stay `SCHED_IDLE`.
pub fn sched_idle_reversible() -> bool {
    std::thread::Builder::new()
        .name("fuser-ring-probe".into())
        .spawn(|| set_policy(libc::SCHED_IDLE) && set_policy(libc::SCHED_OTHER))
        .ok()
        .and_then(|t| t.join().ok())
        .unwrap_or(false)
}

/// Opcodes of include/uapi/linux/fuse.h that [`default_hand_off`] picks.
pub const FUSE_READ: u32 = 15;
/// `FUSE_FSYNC`.
pub const FUSE_FSYNC: u32 = 20;
/// `FUSE_FSYNCDIR`.
pub const FUSE_FSYNCDIR: u32 = 30;

/// Helper threads for `queues` ring queues: one per queue, so that every core can serve the
/// READs of one reader, and two more, so that long requests (one per helper) leave them free.
fn helper_count(queues: usize) -> usize {
    queues + 2
}

/// A request handed by a ring thread to the helpers: the request rebuilt in the `/dev/fuse`
/// layout, and the reply sender of its ring entry (a reply from another thread commits the
/// entry through the queue's submission lock).
struct HelperJob {
    buf: RequestBuf,
    len: usize,
    reply: RingReply,
}

/// A helper: serves handed-off requests from the shared queue until every ring thread has
/// ended.
fn serve_helper<FS: Filesystem>(
    rx: &Mutex<std::sync::mpsc::Receiver<HelperJob>>,
    se: &SessionEventLoop<FS>,
) {
    loop {
        let job = { rx.lock().recv() };
        let Ok(HelperJob {
            mut buf,
            len,
            reply,
        }) = job
        else {
            return;
        };
        let data = buf.as_mut(len);
        let unique = u64::from_ne_bytes([
            data[8], data[9], data[10], data[11], data[12], data[13], data[14], data[15],
        ]);
        dispatch_ring(se, data, reply, unique);
    }
}

/// Parses and dispatches one ring request (`data`, the `/dev/fuse` layout) to the filesystem.
fn dispatch_ring<FS: Filesystem>(
    se: &SessionEventLoop<FS>,
    data: &[u8],
    reply: RingReply,
    unique: u64,
) {
    match RequestWithSender::new_ring(se.ch.sender(), data, reply.clone()) {
        Some(req) => {
            if let Ok(ll::Operation::Destroy(_)) = req.request.operation() {
                req.reply::<crate::ReplyEmpty>().ok();
            } else {
                req.dispatch(se);
            }
        }
        None => reply.send_error(unique, libc::EIO),
    }
}

/// An 8-byte aligned buffer a request is rebuilt in (fuser's parser needs the alignment).
struct RequestBuf(Vec<u64>);

impl RequestBuf {
    fn new(len: usize) -> RequestBuf {
        RequestBuf(vec![0u64; len.div_ceil(8)])
    }

    fn as_mut(&mut self, len: usize) -> &mut [u8] {
        if self.0.len() * 8 < len {
            self.0.resize(len.div_ceil(8), 0);
        }
        // SAFETY: a u64 slice viewed as bytes, within its length.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<u8>(), len) }
    }
}

#[derive(Debug)]
struct RingReplyInner {
    queue: Arc<Queue>,
    idx: usize,
    commit_id: u64,
    /// The `/dev/fuse` connection, for passthrough backing files.
    ch: ChannelSender,
}

/// The reply sender of a request that came through a ring entry.
#[derive(Debug, Clone)]
pub(crate) struct RingReply(Arc<RingReplyInner>);

impl RingReply {
    pub(crate) fn channel(&self) -> &ChannelSender {
        &self.0.ch
    }

    /// Writes the reply (`fuse_out_header` then the arguments, as for `/dev/fuse`) into the
    /// entry and commits it. Only the first reply of a request does anything.
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let r = &*self.0;
        let q = &r.queue;
        let e = &q.entries[r.idx];
        if e.pending
            .compare_exchange(r.commit_id, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            debug!(
                "FUSE ring {}: second reply to {} ignored",
                q.qid, r.commit_id
            );
            return Ok(());
        }
        let total: usize = data.iter().map(|s| s.len()).sum();
        let hp = e.header.ptr.as_ptr().cast::<ReqHeader>();
        if total < OUT_HEADER || total - OUT_HEADER > e.payload.len() {
            let unique = self.unique_of(data);
            error!(
                "FUSE ring {}: reply of {total} bytes does not fit the entry",
                q.qid
            );
            self.write_error(unique, libc::EIO);
        } else {
            // SAFETY: this reply owns the entry's buffers (it swapped `pending`), the kernel
            // does not touch them until the commit below, and the sizes were checked.
            unsafe {
                let mut out = std::ptr::addr_of_mut!((*hp).in_out).cast::<u8>();
                let mut room = OUT_HEADER;
                let mut payload = e.payload.ptr.as_ptr();
                for s in data {
                    let mut s: &[u8] = s;
                    if room > 0 {
                        let n = room.min(s.len());
                        std::ptr::copy_nonoverlapping(s.as_ptr(), out, n);
                        out = out.add(n);
                        room -= n;
                        s = &s[n..];
                    }
                    std::ptr::copy_nonoverlapping(s.as_ptr(), payload, s.len());
                    payload = payload.add(s.len());
                }
                std::ptr::addr_of_mut!((*hp).ent.payload_sz).write((total - OUT_HEADER) as u32);
            }
        }
        self.commit();
        Ok(())
    }

    fn unique_of(&self, data: &[IoSlice<'_>]) -> u64 {
        let mut h = [0u8; OUT_HEADER];
        let mut n = 0;
        for s in data {
            let k = (OUT_HEADER - n).min(s.len());
            h[n..n + k].copy_from_slice(&s[..k]);
            n += k;
            if n == OUT_HEADER {
                break;
            }
        }
        u64::from_ne_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]])
    }

    /// Writes an error reply into the entry (which the caller owns).
    fn write_error(&self, unique: u64, errno: i32) {
        let e = &self.0.queue.entries[self.0.idx];
        let hp = e.header.ptr.as_ptr().cast::<ReqHeader>();
        let oh = abi::fuse_out_header {
            len: OUT_HEADER as u32,
            error: -errno,
            unique,
        };
        // SAFETY: see `send`; fuse_out_header is 16 bytes of integers.
        unsafe {
            std::ptr::copy_nonoverlapping(
                std::ptr::addr_of!(oh).cast::<u8>(),
                std::ptr::addr_of_mut!((*hp).in_out).cast::<u8>(),
                OUT_HEADER,
            );
            std::ptr::addr_of_mut!((*hp).ent.payload_sz).write(0);
        }
    }

    /// Replies `errno` to a request that could not be dispatched.
    fn send_error(&self, unique: u64, errno: i32) {
        let e = &self.0.queue.entries[self.0.idx];
        if e.pending
            .compare_exchange(self.0.commit_id, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.write_error(unique, errno);
            self.commit();
        }
    }

    /// Queues COMMIT_AND_FETCH; submits it unless this is the queue's ring thread (which
    /// submits with its next wait).
    fn commit(&self) {
        let r = &*self.0;
        let q = &r.queue;
        q.push(&q.commit_sqe(r.idx, r.commit_id));
        if RING_THREAD_QID.with(Cell::get) != Some(q.qid) {
            let _g = q.sq_lock.lock();
            if let Err(e) = q.ring.submit() {
                error!("FUSE ring {}: submit: {e}", q.qid);
            }
        }
    }
}

/// INIT: decides whether this session uses the rings, sets them up if so (before the reply, so
/// that a failure can still fall back) and asks for `FUSE_OVER_IO_URING`.
pub(crate) fn offer(
    uring: &UringConfig,
    kernel: InitFlags,
    config: &mut KernelConfig,
    ch: &Channel,
) -> io::Result<Option<Rings>> {
    if uring.mode == UringMode::Off {
        return Ok(None);
    }
    let fail = |msg: String| -> io::Result<Option<Rings>> {
        if uring.mode == UringMode::Required {
            Err(io::Error::new(io::ErrorKind::Unsupported, msg))
        } else {
            info!("{msg}; serving through /dev/fuse");
            Ok(None)
        }
    };
    if !kernel.contains(InitFlags::FUSE_OVER_IO_URING) {
        return fail(
            "the kernel does not offer FUSE over io_uring (Linux 6.14+ with \
             /sys/module/fuse/parameters/enable_uring set to Y)"
                .into(),
        );
    }
    let rings = match Rings::new(
        ch,
        uring.queue_depth,
        payload_size(config),
        uring.hand_off,
        uring.wake_here,
    ) {
        Ok(r) => r,
        Err(e) => return fail(format!("cannot set up the FUSE io_uring queues: {e}")),
    };
    if config
        .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
        .is_err()
    {
        return fail("FUSE_OVER_IO_URING refused".into());
    }
    info!(
        "FUSE over io_uring: {} queues x {} entries of {} KiB",
        rings.queues.len(),
        uring.queue_depth.max(1),
        payload_size(config) / 1024
    );
    Ok(Some(rings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_sqe_len_is_set() {
        let e = with_len(
            opcode::UringCmd80::new(types::Fd(3), CMD_REGISTER)
                .addr(Some(0x1000))
                .build(),
            2,
        );
        // SAFETY: see `with_len`.
        let raw: [u8; 128] = unsafe { std::mem::transmute(e) };
        assert_eq!(u32::from_ne_bytes([raw[24], raw[25], raw[26], raw[27]]), 2);
        assert_eq!(raw[0], io_uring::opcode::UringCmd80::CODE);
    }
}
