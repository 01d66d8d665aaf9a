//! Segments: the appender of the active segment, pins that keep GC off segments with
//! uncommitted extents, read handles, and the set of segments with unsynced bytes.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::backend::SegFile;
use crate::error::{Error, Result};
use crate::records::{segment_file_name, SegmentHeader, FORMAT_VERSION, SEG_HEADER_LEN};
use crate::store::{lock, Inner};

/// The segment being appended to, and segments with appended but uncommitted extents.
pub(crate) struct SegWriter {
    pub id: u64,
    pub file: Option<Arc<dyn SegFile>>,
    pub end: u64,
    pub next_id: u64,
    pub pins: HashMap<u64, u32>,
}

/// Appended bytes after which the segment syncer is woken.
const SEGSYNC_BYTES: u64 = 8 << 20;

impl Inner {
    /// Notes that segment `id` has appended bytes not yet synced.
    pub(crate) fn mark_unsynced(&self, id: u64, f: Arc<dyn SegFile>, bytes: u64) {
        {
            let mut u = lock(&self.unsynced.files);
            let e = u.entry(id).or_insert((f, 0));
            e.1 += 1;
        }
        // Every few MiB, have the segment syncer write them out in the background, so that
        // the next durable commit (fsync, sync, unmount) finds little left to sync.
        let n = self.unsynced_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if n >= SEGSYNC_BYTES {
            self.unsynced_bytes.store(0, Ordering::Relaxed);
            if let Some(tx) = lock(&self.segsync).as_ref() {
                let _ = tx.try_send(());
            }
        }
    }

    /// One pass of the segment syncer: `fdatasync`s every segment with unsynced bytes without
    /// holding any lock, then forgets those that took no append meanwhile.
    pub(crate) fn sync_segments_background(&self) {
        let files: Vec<(u64, Arc<dyn SegFile>, u64)> = lock(&self.unsynced.files)
            .iter()
            .map(|(&id, (f, g))| (id, f.clone(), *g))
            .collect();
        for (id, f, gen) in files {
            if let Err(e) = f.sync_data() {
                // Noted in `unsynced` (a watched file): the next durable commit fails and
                // latches read-only (a second fdatasync could succeed with the bytes lost).
                tracing::warn!("compfs background sync of segment {id} failed: {e}");
                continue;
            }
            let mut u = lock(&self.unsynced.files);
            if u.get(&id).is_some_and(|(_, g)| *g == gen) {
                u.remove(&id);
            }
        }
    }

    /// `fdatasync`s every segment with unsynced appended bytes.
    /// Fails if any segment sync failed before (its bytes may be lost).
    pub(crate) fn sync_segments(&self) -> Result<()> {
        self.unsynced
            .sync_all()
            .map_err(|e| self.fail(Error::from_io(e)))
    }

    /// A read handle of segment `id`. Call with `seg_barrier` read-locked.
    pub(crate) fn seg_file(&self, id: u64) -> Result<Arc<dyn SegFile>> {
        if let Some(f) = lock(&self.seg_handles).get(&id) {
            return Ok(f.clone());
        }
        {
            let w = lock(&self.seg);
            if w.id == id {
                if let Some(f) = &w.file {
                    return Ok(f.clone());
                }
            }
        }
        let f = self
            .tuning
            .backend
            .open(&self.seg_dir.join(segment_file_name(id)), false)?;
        let mut h = lock(&self.seg_handles);
        if h.len() > 256 {
            h.clear();
        }
        h.insert(id, f.clone());
        Ok(f)
    }

    /// Appends encoded extents (each a header followed by its bytes, concatenated in `buf`) to
    /// the active segment, starting a new one when it is full. Returns the segment, its file and
    /// the offset of `buf`; the segment stays pinned (GC leaves it alone) until `unpin`.
    pub(crate) fn append(&self, buf: &[u8]) -> Result<(u64, Arc<dyn SegFile>, u64)> {
        self.append_parts(&[buf])
    }

    /// [`Inner::append`] of the concatenation of `parts`, written with one vectored write.
    pub(crate) fn append_parts(&self, parts: &[&[u8]]) -> Result<(u64, Arc<dyn SegFile>, u64)> {
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let mut w = lock(&self.seg);
        let need_new = match &w.file {
            None => true,
            Some(_) => w.end > SEG_HEADER_LEN && w.end + len > self.sb.segment_size,
        };
        if need_new {
            let id = w.next_id;
            w.next_id += 1;
            let path = self.seg_dir.join(segment_file_name(id));
            let f = self.tuning.backend.create(&path).map_err(Error::from_io)?;
            let h = SegmentHeader {
                version: FORMAT_VERSION,
                uuid: self.sb.uuid,
                id,
            };
            f.write_all_at(&h.encode(), 0).map_err(Error::from_io)?;
            f.sync_data().map_err(Error::from_io)?;
            self.tuning
                .backend
                .sync_dir(&self.seg_dir)
                .map_err(Error::from_io)?;
            w.id = id;
            w.file = Some(f);
            w.end = SEG_HEADER_LEN;
        }
        let (id, off) = (w.id, w.end);
        let Some(f) = w.file.clone() else {
            return Err(Error::Io(std::io::Error::other("no active segment")));
        };
        *w.pins.entry(id).or_insert(0) += 1;
        // Reserve the range before writing so concurrent appenders never overlap.
        w.end += len;
        drop(w);
        let res = match parts {
            [one] => f.write_all_at(one, off),
            _ => f.write_parts_at(parts, off),
        };
        if let Err(e) = res {
            self.unpin(id);
            return Err(Error::from_io(e));
        }
        self.counters.seg_written.fetch_add(len, Ordering::Relaxed);
        Ok((id, f, off))
    }

    pub(crate) fn unpin(&self, id: u64) {
        let mut w = lock(&self.seg);
        if let Some(n) = w.pins.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                w.pins.remove(&id);
            }
        }
    }
}
