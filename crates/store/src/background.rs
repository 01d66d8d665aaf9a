//! The store's background threads: the periodic flusher (flush, durable commit, automatic GC),
//! the writeback thread of closed files and the segment syncer.

use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Duration;

use crate::store::{lock, Inner};
use crate::types::*;

/// The segment syncer: `fdatasync`s segments in the background while they are written (see
/// `Inner::mark_unsynced`).
pub(crate) fn segsync_loop(weak: Weak<Inner>, rx: std::sync::mpsc::Receiver<()>) {
    while rx.recv().is_ok() {
        let Some(inner) = weak.upgrade() else { return };
        inner.sync_segments_background();
    }
}

/// Flushes files queued by their last close (see `Inner::queue_writeback`), so that the
/// closing thread (a FUSE request) does not compress and commit.
pub(crate) fn writeback_loop(weak: Weak<Inner>, rx: std::sync::mpsc::Receiver<Ino>) {
    while let Ok(first) = rx.recv() {
        let Some(inner) = weak.upgrade() else { return };
        // Everything queued so far goes in one batch (one transaction).
        let mut batch = vec![first];
        while batch.len() < 256 {
            match rx.try_recv() {
                Ok(ino) => batch.push(ino),
                Err(_) => break,
            }
        }
        inner.writeback_batch(&batch);
    }
}

pub(crate) fn flusher_loop(weak: Weak<Inner>, rx: std::sync::mpsc::Receiver<()>, iv: Duration) {
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
        inner.trim_bufs();
        let due = lock(&inner.last_durable).elapsed() >= Duration::from_secs(5);
        if due {
            if let Err(e) = inner.commit_durable() {
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
