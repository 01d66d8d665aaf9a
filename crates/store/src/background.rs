//! The store's background threads: the periodic flusher (flush, durable commit, automatic GC),
//! the writeback thread of closed files, the segment syncer and the background recompression
//! worker (`bgcomp`).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::Result;
use crate::store::{lock, Inner};
use crate::types::*;

/// The segment syncer: `fdatasync`s segments in the background while they are written (see
/// `Inner::mark_unsynced`).
pub(crate) fn segsync_loop(weak: Weak<Inner>, rx: std::sync::mpsc::Receiver<()>) {
    crate::bgcomp::mark_quiet();
    while rx.recv().is_ok() {
        let Some(inner) = weak.upgrade() else { return };
        inner.sync_segments_background();
    }
}

/// How long the writeback thread waits for more closed files to pack with the ones it has.
const PACK_GATHER: Duration = Duration::from_millis(10);

/// Flushes files queued by their last close (see `Inner::queue_writeback`), so that the
/// closing thread (a FUSE request) does not compress and commit.
fn writeback_loop(weak: Weak<Inner>, rx: std::sync::mpsc::Receiver<Ino>) {
    crate::bgcomp::mark_quiet();
    while let Ok(first) = rx.recv() {
        let Some(inner) = weak.upgrade() else { return };
        // Everything queued so far goes in one batch (one transaction). With packing on, the
        // batch also takes what is queued within `PACK_GATHER` (files closed in a row are
        // compressed together; a lone file waits that long at most).
        let mut batch = vec![first];
        let until = std::time::Instant::now() + PACK_GATHER;
        let gather = inner.pack_limit() > 0;
        while batch.len() < 256 {
            match rx.try_recv() {
                Ok(ino) => batch.push(ino),
                Err(std::sync::mpsc::TryRecvError::Empty) if gather => {
                    let now = std::time::Instant::now();
                    if now >= until {
                        break;
                    }
                    match rx.recv_timeout(until - now) {
                        Ok(ino) => batch.push(ino),
                        Err(_) => break,
                    }
                }
                Err(_) => break,
            }
        }
        inner.writeback_batch(&batch);
        // The batch may have completed the dictionary's samples: its training starts now
        // rather than at the flusher's next tick (files written meanwhile would miss it).
        inner.dict_maintain();
    }
}

fn flusher_loop(weak: Weak<Inner>, rx: std::sync::mpsc::Receiver<()>, iv: Duration) {
    crate::bgcomp::mark_quiet();
    loop {
        match rx.recv_timeout(iv) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        let Some(inner) = weak.upgrade() else { return };
        if inner.ro_flag.load(Ordering::SeqCst) {
            continue;
        }
        if let Err(e) = inner.flush_all(true) {
            tracing::error!("compfs background flush failed: {e}");
            continue;
        }
        inner.dict_maintain();
        inner.trim_bufs();
        // An idle batch of namespace changes gets committed (non-durably) here at the latest.
        if let Err(e) = inner.commit_held() {
            tracing::error!("compfs background commit failed: {e}");
            continue;
        }
        // A store in a bucket also commits when its metadata snapshot is due for upload
        // (`metadata_interval`), even if nothing changed locally since the last commit.
        let unseen = *lock(&inner.changed);
        let due = lock(&inner.last_durable).elapsed() >= Duration::from_secs(5)
            || inner
                .tuning
                .after_durable
                .as_ref()
                .is_some_and(|h| h.upload_due(unseen));
        if due {
            if let Err(e) = inner.commit_durable_periodic() {
                tracing::error!("compfs background commit failed: {e}");
                continue;
            }
        }
        if inner.gc_due() {
            if let Err(e) = inner.gc(inner.tuning.gc_garbage_ratio.max(0.5)) {
                tracing::warn!("compfs automatic GC failed: {e}");
            }
        }
    }
}

/// The background threads of a store opened for writing, stopped by [`Threads::stop`] before
/// the final flush. A read-only store has none.
pub(crate) struct Threads {
    flusher: Option<(std::sync::mpsc::Sender<()>, JoinHandle<()>)>,
    writeback: Option<JoinHandle<()>>,
    segsync: Option<JoinHandle<()>>,
    recompress: Option<(std::sync::mpsc::Sender<()>, JoinHandle<()>)>,
}

impl Threads {
    /// Starts the flusher (every `flush_interval`, if any), the writeback thread and the
    /// segment syncer; each holds a weak reference to the store and its queue's sender lives
    /// in [`Inner`] (the flusher's here).
    pub(crate) fn start(
        inner: &Arc<Inner>,
        flush_interval: Option<Duration>,
        read_only: bool,
    ) -> Result<Threads> {
        let flusher = match (flush_interval, read_only) {
            (Some(iv), false) => {
                let (tx, rx) = std::sync::mpsc::channel::<()>();
                let weak: Weak<Inner> = Arc::downgrade(inner);
                let h = std::thread::Builder::new()
                    .name("compfs-flush".into())
                    .spawn(move || flusher_loop(weak, rx, iv))?;
                Some((tx, h))
            }
            _ => None,
        };
        let writeback = if read_only {
            None
        } else {
            let (tx, rx) = std::sync::mpsc::channel::<Ino>();
            let weak: Weak<Inner> = Arc::downgrade(inner);
            let h = std::thread::Builder::new()
                .name("compfs-writeback".into())
                .spawn(move || writeback_loop(weak, rx))?;
            *lock(&inner.writeback) = Some(tx);
            Some(h)
        };
        let segsync = if read_only {
            None
        } else {
            let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1);
            let weak: Weak<Inner> = Arc::downgrade(inner);
            let h = std::thread::Builder::new()
                .name("compfs-segsync".into())
                .spawn(move || segsync_loop(weak, rx))?;
            *lock(&inner.segsync) = Some(tx);
            Some(h)
        };
        // Background recompression runs where the flusher does (a store opened for writing
        // with background threads; tests without them call `Store::background_pass`).
        let recompress = match &flusher {
            Some(_) => {
                let (tx, rx) = std::sync::mpsc::channel::<()>();
                let weak: Weak<Inner> = Arc::downgrade(inner);
                let h = std::thread::Builder::new()
                    .name("compfs-bgcomp".into())
                    .spawn(move || crate::bgcomp::worker_loop(weak, rx))?;
                Some((tx, h))
            }
            None => None,
        };
        Ok(Threads {
            flusher,
            writeback,
            segsync,
            recompress,
        })
    }

    /// Stops the threads: each finishes what it is doing and exits once its queue closes.
    pub(crate) fn stop(&mut self, inner: &Inner) {
        inner.bg.stop.store(true, Ordering::SeqCst);
        inner.dicts.join_training();
        if let Some((tx, h)) = self.recompress.take() {
            drop(tx);
            let _ = h.join();
        }
        if let Some((tx, h)) = self.flusher.take() {
            drop(tx);
            let _ = h.join();
        }
        lock(&inner.writeback).take();
        if let Some(h) = self.writeback.take() {
            let _ = h.join();
        }
        lock(&inner.segsync).take();
        if let Some(h) = self.segsync.take() {
            let _ = h.join();
        }
    }
}
