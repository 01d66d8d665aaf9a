//! Attribute changes (`chmod`, `chown`, `utimens`) held in memory and written with the next
//! metadata transaction.
//!
//! An untar sends three or four `setattr` requests per file; one redb transaction each was
//! most of the daemon's work in that benchmark. A change is acknowledged once it is in this
//! table; readers see it overlaid on the stored inode, and every commit writes all pending
//! patches in the same transaction (so a durable commit, `fsync` or `sync` included, makes
//! them durable, like a kernel filesystem writing back dirty inodes). Until then a crash
//! loses them, as it loses any change not followed by `fsync`.
//!
//! A patch holds absolute values, so applying it again is harmless. The one field other
//! operations also set is `mtime` (writes, truncation, and directory changes set it to now):
//! they clear the patch's `mtime`, so a stale value never overrides a newer one. `ctime` is
//! applied as the later of the two.

use std::collections::HashMap;

use redb::ReadableTable;

use crate::error::Result;
use crate::meta::{dec, INODES};
use crate::records::InodeRec;
use crate::types::{Ino, Timestamp};

/// Pending attribute values of one inode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct AttrPatch {
    pub perm: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime: Option<Timestamp>,
    pub mtime: Option<Timestamp>,
    pub ctime: Option<Timestamp>,
}

impl AttrPatch {
    /// Lays the patch over an inode record (what a commit writes, and what readers see).
    pub(crate) fn apply(&self, r: &mut InodeRec) {
        if let Some(p) = self.perm {
            r.perm = p;
        }
        if let Some(u) = self.uid {
            r.uid = u;
        }
        if let Some(g) = self.gid {
            r.gid = g;
        }
        if let Some(t) = self.atime {
            r.atime = t;
        }
        if let Some(t) = self.mtime {
            r.mtime = t;
        }
        if let Some(t) = self.ctime {
            r.ctime = r.ctime.max(t);
        }
    }

    /// Lays `newer` over this patch.
    pub(crate) fn merge(&mut self, newer: &AttrPatch) {
        self.perm = newer.perm.or(self.perm);
        self.uid = newer.uid.or(self.uid);
        self.gid = newer.gid.or(self.gid);
        self.atime = newer.atime.or(self.atime);
        self.mtime = newer.mtime.or(self.mtime);
        self.ctime = match (self.ctime, newer.ctime) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => b.or(a),
        };
    }
}

/// Pending patches by inode, each with the generation of its last change.
#[derive(Debug, Default)]
pub(crate) struct Patches {
    map: HashMap<Ino, (AttrPatch, u64)>,
    gen: u64,
}

impl Patches {
    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub(crate) fn get(&self, ino: Ino) -> Option<AttrPatch> {
        self.map.get(&ino).map(|(p, _)| *p)
    }

    pub(crate) fn add(&mut self, ino: Ino, p: &AttrPatch) {
        self.gen += 1;
        let e = self.map.entry(ino).or_insert((AttrPatch::default(), 0));
        e.0.merge(p);
        e.1 = self.gen;
    }

    pub(crate) fn remove(&mut self, ino: Ino) {
        self.map.remove(&ino);
    }

    /// Another operation set `ino`'s mtime: the pending one is older.
    pub(crate) fn clear_mtime(&mut self, ino: Ino) {
        if let Some((p, _)) = self.map.get_mut(&ino) {
            p.mtime = None;
        }
    }

    /// A copy of every pending patch with its generation.
    pub(crate) fn snapshot(&self) -> Vec<(Ino, AttrPatch, u64)> {
        self.map.iter().map(|(&i, &(p, g))| (i, p, g)).collect()
    }

    /// Forgets the patches of `written` that did not change since they were written.
    pub(crate) fn retire(&mut self, written: &[(Ino, AttrPatch, u64)]) {
        for (ino, _, gen) in written {
            if self.map.get(ino).is_some_and(|(_, g)| g == gen) {
                self.map.remove(ino);
            }
        }
    }
}

/// Writes `pending` into `txn` (only the inode table is opened: this runs in every commit
/// while patches are pending); inodes freed meanwhile are skipped.
pub(crate) fn write_patches(
    txn: &redb::WriteTransaction,
    pending: &[(Ino, AttrPatch, u64)],
) -> Result<()> {
    let mut t = txn.open_table(INODES)?;
    for (ino, p, _) in pending {
        let mut r = match t.get(*ino)? {
            Some(v) => dec(InodeRec::decode(v.value()))?,
            None => continue,
        };
        p.apply(&mut r);
        t.insert(*ino, r.encode().as_slice())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: i64) -> Timestamp {
        Timestamp { secs: s, nsecs: 0 }
    }

    #[test]
    fn merge_keeps_newest_values_and_latest_ctime() {
        let mut a = AttrPatch {
            perm: Some(0o644),
            mtime: Some(ts(5)),
            ctime: Some(ts(9)),
            ..Default::default()
        };
        a.merge(&AttrPatch {
            uid: Some(7),
            mtime: Some(ts(3)),
            ctime: Some(ts(8)),
            ..Default::default()
        });
        assert_eq!(a.perm, Some(0o644));
        assert_eq!(a.uid, Some(7));
        assert_eq!(a.mtime, Some(ts(3)));
        assert_eq!(a.ctime, Some(ts(9)));
    }

    #[test]
    fn retire_keeps_patches_changed_after_the_snapshot() {
        let mut ps = Patches::default();
        ps.add(
            1,
            &AttrPatch {
                perm: Some(0o600),
                ..Default::default()
            },
        );
        ps.add(
            2,
            &AttrPatch {
                uid: Some(3),
                ..Default::default()
            },
        );
        let snap = ps.snapshot();
        ps.add(
            2,
            &AttrPatch {
                gid: Some(4),
                ..Default::default()
            },
        );
        ps.retire(&snap);
        assert_eq!(ps.get(1), None);
        assert_eq!(
            ps.get(2),
            Some(AttrPatch {
                uid: Some(3),
                gid: Some(4),
                ..Default::default()
            })
        );
        ps.clear_mtime(2);
        assert!(!ps.is_empty());
        ps.remove(2);
        assert!(ps.is_empty());
    }
}
