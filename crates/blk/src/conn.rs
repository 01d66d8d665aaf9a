//! One NBD connection served by several threads once the client keeps requests in flight.
//!
//! The connection's own thread (the primary) reads requests and answers them one at a time, as
//! [`crate::nbd::transmission`] does; a client with one request in flight never involves
//! another thread, so iodepth 1 costs no hand-off. When the primary finds another whole
//! request already received behind the one it took (the client pipelines, e.g. fio at
//! iodepth 32), it wakes a helper: helpers only ever take requests that are wholly in the
//! read buffer (they never block on the socket), answer them into a reply buffer of their own
//! and append it to the shared write buffer. Like nbdkit's parallel thread model, replies may
//! go out of order (NBD matches them by cookie), and each reply is appended whole.
//!
//! Replies are sent (the write buffer flushed) by whoever appends the last reply owed while no
//! further whole request is waiting, so the primary never sleeps on the socket with replies
//! unsent and a pipelining client gets them in few `sendto` calls.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::error::BlkError;
use crate::nbd::{
    answer, ok_reply, read_request, whole_request_buffered, Incoming, Pending, Session,
};
use crate::store::PageStore;

/// Helper threads per connection (besides the primary) unless set otherwise: two, less what
/// the machine cannot run beside the primary and the client. On this project's 2-core VM that
/// is none: fio and the primary already hold both cores, and helpers only add wake-ups and
/// lock hand-offs (4 KiB randwrite at iodepth 32, lz4: 197-222k IOPS with no helper, 170-189k
/// with one, 100-150k with two; docs/benchmarks-blk.md).
pub fn default_helpers() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    cpus.saturating_sub(2).min(2)
}

/// The most helper threads a connection gets before [`HELPERS`] is set.
pub const DEFAULT_HELPERS: usize = 2;

/// Helper threads per connection (`compfs blk serve --conn-threads N` sets N - 1).
pub static HELPERS: AtomicUsize = AtomicUsize::new(DEFAULT_HELPERS);

struct Shared<R, W> {
    reader: Mutex<R>,
    writer: Mutex<W>,
    /// Requests read whose replies are not yet in the write buffer.
    owed: AtomicUsize,
    /// After the last read, another whole request was already in the read buffer.
    more: AtomicBool,
    /// The session is over (end of stream, disconnect or error): helpers stop.
    done: AtomicBool,
    /// Helpers sleep here until `more` is set.
    wake: Condvar,
    wake_lock: Mutex<()>,
    /// The first error a helper met (the primary returns it).
    error: Mutex<Option<BlkError>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<R: Read + Pending, W: Write> Shared<R, W> {
    /// Reads one request under the reader lock (already held as `r`); counts its reply as
    /// owed and wakes a helper if another whole request follows.
    fn take(
        &self,
        r: &mut R,
        store: &PageStore,
        session: &Session,
        buf: &mut Vec<u8>,
    ) -> Result<Option<Incoming>, BlkError> {
        let next = read_request(r, store, session, buf)?;
        if next.is_some() {
            self.owed.fetch_add(1, Ordering::SeqCst);
        }
        let more = whole_request_buffered(r.pending());
        self.more.store(more, Ordering::SeqCst);
        if more {
            let _g = lock(&self.wake_lock);
            self.wake.notify_one();
        }
        Ok(next)
    }

    /// Answers into `out` and appends the reply to the write buffer; flushes it if this was
    /// the last reply owed and no whole request waits.
    fn reply(
        &self,
        store: &PageStore,
        session: &Session,
        incoming: Incoming,
        buf: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<(), BlkError> {
        if let Incoming::Write(req) = &incoming {
            // The only reply owed and nothing waiting behind it (one request in flight): reply
            // before compressing (`PageStore::write_early`).
            if self.owed.load(Ordering::SeqCst) == 1 && !self.more.load(Ordering::SeqCst) {
                let data = buf.get(..req.len as usize).unwrap_or_default();
                let ack = || {
                    let mut w = lock(&self.writer);
                    ok_reply(&mut *w, req.cookie).map_err(|e| BlkError::io("reply", e))?;
                    let left = self.owed.fetch_sub(1, Ordering::SeqCst) - 1;
                    if left == 0 && !self.more.load(Ordering::SeqCst) {
                        w.flush().map_err(|e| BlkError::io("reply", e))?;
                    }
                    Ok(())
                };
                if store.write_early(req.offset, data, ack)? {
                    return Ok(());
                }
            }
        }
        out.clear();
        let r = answer(out, store, session, incoming, buf);
        let mut w = lock(&self.writer);
        w.write_all(out).map_err(|e| BlkError::io("reply", e))?;
        let left = self.owed.fetch_sub(1, Ordering::SeqCst) - 1;
        if left == 0 && !self.more.load(Ordering::SeqCst) {
            w.flush().map_err(|e| BlkError::io("reply", e))?;
        }
        r
    }

    fn finish(&self) {
        self.done.store(true, Ordering::SeqCst);
        let _g = lock(&self.wake_lock);
        self.wake.notify_all();
    }
}

/// Serves the transmission phase with the primary on this thread and [`HELPERS`] helper
/// threads; `shutdown` unblocks the primary's socket read when a helper fails.
pub fn transmission_parallel<R, W>(
    r: R,
    w: W,
    store: &PageStore,
    session: &Session,
    shutdown: impl Fn() + Sync,
) -> Result<(), BlkError>
where
    R: Read + Pending + Send,
    W: Write + Send,
{
    let sh = Shared {
        reader: Mutex::new(r),
        writer: Mutex::new(w),
        owed: AtomicUsize::new(0),
        more: AtomicBool::new(false),
        done: AtomicBool::new(false),
        wake: Condvar::new(),
        wake_lock: Mutex::new(()),
        error: Mutex::new(None),
    };
    let result = std::thread::scope(|sc| {
        for _ in 0..HELPERS.load(Ordering::Relaxed) {
            let sh = &sh;
            let shutdown = &shutdown;
            let spawned = std::thread::Builder::new()
                .name("nbd-helper".into())
                .spawn_scoped(sc, move || {
                    let r = helper(sh, store, session).inspect_err(|_| sh.finish());
                    if let Err(e) = r {
                        lock(&sh.error).get_or_insert(e);
                    }
                    if sh.done.load(Ordering::SeqCst) {
                        // The session ended here (disconnect or error): unblock the
                        // primary's socket read.
                        sh.finish();
                        shutdown();
                    }
                });
            if spawned.is_err() {
                // Fewer helpers only means less parallelism.
                break;
            }
        }
        let r = primary(&sh, store, session);
        sh.finish();
        r
    });
    let flushed = lock(&sh.writer).flush();
    if let Some(e) = lock(&sh.error).take() {
        return Err(e);
    }
    result?;
    flushed.map_err(|e| BlkError::io("reply", e))
}

fn primary<R: Read + Pending, W: Write>(
    sh: &Shared<R, W>,
    store: &PageStore,
    session: &Session,
) -> Result<(), BlkError> {
    let (mut buf, mut out) = (Vec::new(), Vec::new());
    loop {
        if sh.done.load(Ordering::SeqCst) {
            return Ok(());
        }
        let next = {
            let mut r = lock(&sh.reader);
            sh.take(&mut r, store, session, &mut buf)?
        };
        match next {
            None => return Ok(()),
            Some(incoming) => sh.reply(store, session, incoming, &mut buf, &mut out)?,
        }
    }
}

fn helper<R: Read + Pending, W: Write>(
    sh: &Shared<R, W>,
    store: &PageStore,
    session: &Session,
) -> Result<(), BlkError> {
    let (mut buf, mut out) = (Vec::new(), Vec::new());
    loop {
        if sh.done.load(Ordering::SeqCst) {
            return Ok(());
        }
        if !sh.more.load(Ordering::SeqCst) {
            let g = lock(&sh.wake_lock);
            if !sh.more.load(Ordering::SeqCst) && !sh.done.load(Ordering::SeqCst) {
                // `more` and `done` are set before the wake-up is sent under this lock, so
                // none is missed; the timeout is only a safety net (the primary serves
                // everything meanwhile).
                let _ = sh.wake.wait_timeout(g, Duration::from_secs(1));
            }
            continue;
        }
        // Never wait behind the primary's socket read.
        let next = match sh.reader.try_lock() {
            Ok(mut r) => {
                if !whole_request_buffered(r.pending()) {
                    sh.more.store(false, Ordering::SeqCst);
                    continue;
                }
                sh.take(&mut r, store, session, &mut buf)?
            }
            Err(std::sync::TryLockError::Poisoned(p)) => {
                let mut r = p.into_inner();
                if !whole_request_buffered(r.pending()) {
                    continue;
                }
                sh.take(&mut r, store, session, &mut buf)?
            }
            Err(std::sync::TryLockError::WouldBlock) => {
                std::thread::yield_now();
                continue;
            }
        };
        match next {
            None => {
                sh.finish();
                return Ok(());
            }
            Some(incoming) => sh.reply(store, session, incoming, &mut buf, &mut out)?,
        }
    }
}
