//! Space reclamation: live extents of mostly-dead segments are copied to the active segment,
//! the copy is synced, the metadata is repointed in one durable transaction, and only then the
//! old segment file is deleted. Runs concurrently with reads (which hold the segment barrier)
//! and writes (whose segments stay pinned until their transaction commits).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use redb::ReadableTable;

use crate::error::Result;
use crate::meta::{self, dec};
use crate::records::{
    parse_segment_file_name, segment_file_name, ExtentRec, SegmentRec, EXT_HEADER_LEN,
};
use crate::store::{lock, Inner, Store};
use crate::types::GcReport;

impl Inner {
    fn segment_table(&self) -> Result<BTreeMap<u64, SegmentRec>> {
        let txn = self.read_txn()?;
        let t = txn.open_table(meta::SEGMENTS)?;
        let mut m = BTreeMap::new();
        for r in t.iter()? {
            let (k, v) = r?;
            m.insert(k.value(), dec(SegmentRec::decode(v.value()))?);
        }
        Ok(m)
    }

    fn segment_files(&self) -> Result<BTreeMap<u64, u64>> {
        let mut m = BTreeMap::new();
        for e in std::fs::read_dir(&self.seg_dir)? {
            let e = e?;
            if let Some(id) = e.file_name().to_str().and_then(parse_segment_file_name) {
                m.insert(id, e.metadata()?.len());
            }
        }
        Ok(m)
    }

    /// Whether garbage passed the automatic-GC threshold.
    pub(crate) fn gc_due(&self) -> bool {
        let Ok(segs) = self.segment_table() else {
            return false;
        };
        let active = lock(&self.seg).id;
        let (mut total, mut live) = (0u64, 0u64);
        for (id, s) in segs {
            if id != active {
                total = total.saturating_add(s.len);
                live = live.saturating_add(s.live);
            }
        }
        let garbage = total.saturating_sub(live);
        garbage >= self.tuning.gc_min_garbage
            && garbage as f64 > self.tuning.gc_garbage_ratio * total as f64
    }

    /// One GC pass over segments whose live fraction is at most `max_live`.
    pub(crate) fn gc(&self, max_live: f64) -> Result<GcReport> {
        self.check_writable()?;
        let _g = lock(&self.gc_lock);
        let mut rep = GcReport::default();
        let files = self.segment_files()?;
        rep.bytes_before = files.values().sum();
        let segs = self.segment_table()?;
        let (active, pinned) = {
            let mut w = lock(&self.seg);
            // Seal the active segment when it is itself mostly garbage (after overwrites);
            // the next append starts a new one.
            if let Some(s) = segs.get(&w.id) {
                let idle = !w.pins.contains_key(&w.id);
                if w.file.is_some() && idle && s.len > 0 && s.live as f64 <= max_live * s.len as f64
                {
                    w.file = None;
                    w.id = 0;
                }
            }
            (w.id, w.pins.keys().copied().collect::<Vec<_>>())
        };
        let busy = |id: u64| id == active || pinned.contains(&id);
        // Segment files no committed metadata knows (left by a crash before their first commit,
        // or by a crash between a GC commit and the file's deletion).
        for (&id, _) in files.iter() {
            if !segs.contains_key(&id) && !busy(id) && id < lock(&self.seg).next_id {
                rep.segments_examined += 1;
                self.delete_segment(id)?;
                rep.segments_freed += 1;
            }
        }
        for (&id, s) in segs.iter() {
            if busy(id) || s.len == 0 {
                continue;
            }
            if s.live as f64 > max_live * s.len as f64 {
                continue;
            }
            rep.segments_examined += 1;
            let (moved, bytes, freed) = self.compact_segment(id)?;
            rep.extents_moved += moved;
            rep.bytes_moved += bytes;
            if freed {
                rep.segments_freed += 1;
            }
        }
        rep.bytes_after = self.segment_files()?.values().sum();
        let c = &self.counters;
        c.gc_runs.fetch_add(1, Ordering::Relaxed);
        c.gc_moved.fetch_add(rep.bytes_moved, Ordering::Relaxed);
        c.gc_freed.fetch_add(rep.segments_freed, Ordering::Relaxed);
        Ok(rep)
    }

    fn delete_segment(&self, id: u64) -> Result<()> {
        let _b = self.seg_barrier.write().unwrap_or_else(|p| p.into_inner());
        lock(&self.seg_handles).remove(&id);
        match self
            .tuning
            .backend
            .remove(&self.seg_dir.join(segment_file_name(id)))
        {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        self.tuning.backend.sync_dir(&self.seg_dir)?;
        Ok(())
    }

    /// Moves the live extents of segment `victim`; deletes it when nothing live is left.
    fn compact_segment(&self, victim: u64) -> Result<(u64, u64, bool)> {
        let list: Vec<(u64, ExtentRec)> = {
            let txn = self.read_txn()?;
            let idx = txn.open_table(meta::SEG_EXTENTS)?;
            let ext = txn.open_table(meta::EXTENTS)?;
            let mut v = Vec::new();
            for r in idx.range((victim, 0)..=(victim, u64::MAX))? {
                let (_, id) = r?;
                let id = id.value();
                if let Some(x) = ext.get(id)? {
                    v.push((id, dec(ExtentRec::decode(x.value()))?));
                }
            }
            v
        };
        let mut moved = 0u64;
        let mut bytes = 0u64;
        // Copy in batches of about 8 MiB.
        let mut i = 0;
        while i < list.len() {
            let mut buf = Vec::new();
            let mut batch = Vec::new();
            while i < list.len() && buf.len() < 8 << 20 {
                let (id, xr) = list[i];
                i += 1;
                let mut raw = vec![0u8; EXT_HEADER_LEN + xr.stored_len as usize];
                {
                    let _b = self.seg_barrier.read().unwrap_or_else(|p| p.into_inner());
                    let f = self.seg_file(victim)?;
                    f.read_exact_at(&mut raw, xr.seg_offset)?;
                }
                let d = self.dict_for(xr.dict);
                if crate::read::verify_extent(id, &xr, &raw, crate::read::dict_ref(&d)).is_err() {
                    // A damaged extent stays where it is (fsck reports it); the segment stays.
                    tracing::warn!(
                        "compfs gc: extent {id} in segment {victim} is damaged; not moved"
                    );
                    continue;
                }
                batch.push((id, xr, buf.len() as u64));
                buf.extend_from_slice(&raw);
            }
            if batch.is_empty() {
                continue;
            }
            let (new_seg, f, base) = self.append(&buf).map_err(|e| self.fail(e))?;
            let r = f.sync_data().map_err(|e| self.fail(e.into()));
            let r = r.and_then(|_| {
                self.write(true, |w| {
                    for (id, old, rel) in &batch {
                        let Some(v) = w.extents()?.get(*id)? else {
                            continue;
                        };
                        let mut cur = dec(ExtentRec::decode(v.value()))?;
                        drop(v);
                        if cur.segment != victim || cur.seg_offset != old.seg_offset {
                            continue;
                        }
                        cur.segment = new_seg;
                        cur.seg_offset = base + rel;
                        w.extents_mut()?.insert(*id, cur.encode().as_slice())?;
                        w.seg_extents_mut()?.remove((victim, old.seg_offset))?;
                        w.seg_extents_mut()?
                            .insert((new_seg, cur.seg_offset), *id)?;
                        let mut vs = w.segment(victim)?;
                        vs.live = vs.live.saturating_sub(cur.footprint());
                        w.put_segment(victim, &vs)?;
                        let mut ns = w.segment(new_seg)?;
                        ns.live = ns.live.saturating_add(cur.footprint());
                        ns.len = ns.len.max(cur.seg_offset.saturating_add(cur.footprint()));
                        w.put_segment(new_seg, &ns)?;
                        moved += 1;
                        bytes += cur.footprint();
                    }
                    let mut ns = w.segment(new_seg)?;
                    ns.len = ns.len.max(base + buf.len() as u64);
                    w.put_segment(new_seg, &ns)?;
                    Ok(())
                })
            });
            self.unpin(new_seg);
            r?;
        }
        // Drop the segment when no live extent is left in it.
        let empty = {
            let txn = self.read_txn()?;
            let idx = txn.open_table(meta::SEG_EXTENTS)?;
            let mut left = idx.range((victim, 0)..=(victim, u64::MAX))?;
            left.next().is_none()
        };
        if !empty {
            return Ok((moved, bytes, false));
        }
        let dropped = self.write(true, |w| {
            if w.seg_extents()?
                .range((victim, 0)..=(victim, u64::MAX))?
                .next()
                .is_some()
            {
                return Ok(false);
            }
            w.segments_mut()?.remove(victim)?;
            Ok(true)
        })?;
        if dropped {
            self.delete_segment(victim)?;
        }
        Ok((moved, bytes, dropped))
    }
}

impl Store {
    /// On-demand compaction: rewrites every segment with at least 10% garbage.
    pub fn gc(&self) -> Result<GcReport> {
        self.inner.gc(0.9)
    }
}
