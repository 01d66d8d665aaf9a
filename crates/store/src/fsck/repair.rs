//! The safe repairs a check found, applied in one transaction.

use std::path::Path;

use redb::{Database, ReadableTable};

use super::Fixes;
use crate::error::{Error, Result};
use crate::meta::W;
use crate::records::{segment_file_name, ExtentRec, SEGMENT_DIR};

pub(super) fn apply(dir: &Path, db: &Database, fx: &Fixes) -> Result<()> {
    let txn = db.begin_write()?;
    {
        let mut w = W::open(&txn)?;
        for (d, name) in &fx.remove_dirents {
            w.dirents_mut()?.remove((*d, name.as_slice()))?;
        }
        for k in &fx.remove_index {
            w.dirindex_mut()?.remove(*k)?;
        }
        for (ino, off) in &fx.remove_map {
            w.extmap_mut()?.remove((*ino, *off))?;
        }
        for (ino, start) in &fx.remove_prealloc {
            w.prealloc_mut()?.remove((*ino, *start))?;
        }
        for id in &fx.remove_extents {
            let removed = w
                .extents_mut()?
                .remove(*id)?
                .map(|v| ExtentRec::decode(v.value()));
            if let Some(Ok(x)) = removed {
                w.seg_extents_mut()?.remove((x.segment, x.seg_offset))?;
            }
        }
        for ino in &fx.free_inodes {
            // Remove what the inode owns directly; counts are recomputed by the next pass.
            let owned: Vec<u64> = w
                .extmap()?
                .range((*ino, 0)..=(*ino, u64::MAX))?
                .map(|r| r.map(|(k, _)| k.value().1))
                .collect::<std::result::Result<_, _>>()?;
            for off in owned {
                w.extmap_mut()?.remove((*ino, off))?;
            }
            let names: Vec<Vec<u8>> = w
                .xattrs()?
                .range((*ino, &[][..])..(*ino + 1, &[][..]))?
                .map(|r| r.map(|(k, _)| k.value().1.to_vec()))
                .collect::<std::result::Result<_, _>>()?;
            for n in names {
                w.xattrs_mut()?.remove((*ino, n.as_slice()))?;
            }
            w.orphans_mut()?.remove(*ino)?;
            w.inodes_mut()?.remove(*ino)?;
        }
        for (ino, n) in &fx.set_nlink {
            if let Ok(mut r) = w.inode(*ino) {
                r.nlink = *n;
                w.put_inode(*ino, &r)?;
            }
        }
        for ino in &fx.drop_inline {
            // As a corrupt extent loses its map entries: the file keeps its size and the
            // range reads as zeros; the statistics are settled by the next pass.
            if let Ok(mut r) = w.inode(*ino) {
                r.inline = None;
                w.put_inode(*ino, &r)?;
            }
        }
        for (ino, d) in &fx.set_disk {
            if let Ok(mut r) = w.inode(*ino) {
                r.disk_bytes = *d;
                w.put_inode(*ino, &r)?;
            }
        }
        for (id, n) in &fx.set_refs {
            if let Ok(mut x) = w.extent(*id) {
                x.refs = *n;
                w.extents_mut()?.insert(*id, x.encode().as_slice())?;
            }
        }
        for (id, s) in &fx.set_segments {
            match s {
                Some(s) => w.put_segment(*id, s)?,
                None => {
                    w.segments_mut()?.remove(*id)?;
                }
            }
        }
        for (k, s) in &fx.set_stats {
            match s {
                Some(s) => {
                    w.stats_mut()?.insert(*k, s.encode().as_slice())?;
                }
                None => {
                    w.stats_mut()?.remove(*k)?;
                }
            }
        }
        for (name, v) in &fx.counters {
            w.meta_mut()?.insert(*name, v.to_le_bytes().as_slice())?;
        }
    }
    txn.commit()?;
    for id in &fx.delete_files {
        let p = dir.join(SEGMENT_DIR).join(segment_file_name(*id));
        match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(Error::Io(e)),
            _ => {}
        }
    }
    Ok(())
}
