//! Namespace operations: lookup, attributes, creation, links, rename, directories, xattrs,
//! open/release. Each change runs in the held batch of metadata changes (see `txn`).

use std::sync::atomic::Ordering;

use compfs_codec::CodecSpec;
use redb::ReadableTable;

use crate::attrs::AttrPatch;
use crate::error::{Error, Result};
use crate::meta::{self, W};
use crate::records::InodeRec;
use crate::store::{lock, Inner, Store};
use crate::types::*;

fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(Error::InvalidArgument("invalid file name".into()));
    }
    Ok(())
}

fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

pub(crate) fn attr_of(ino: Ino, r: &InodeRec) -> Attr {
    let inline = r.inline.as_ref().map_or(0, |i| i.bytes.len() as u64);
    Attr {
        ino,
        kind: r.kind,
        perm: r.perm & 0o7777,
        nlink: r.nlink,
        uid: r.uid,
        gid: r.gid,
        rdev: r.rdev,
        size: r.size,
        blocks: r.disk_bytes.saturating_add(inline).div_ceil(512),
        atime: r.atime,
        mtime: r.mtime,
        ctime: r.ctime,
        crtime: r.crtime,
    }
}

fn resolve(t: &TimeOrNow, now: Timestamp) -> Timestamp {
    match t {
        TimeOrNow::Now => now,
        TimeOrNow::Time(t) => *t,
    }
}

impl Inner {
    /// Attributes with buffered size and times overlaid.
    pub(crate) fn attr(&self, ino: Ino) -> Result<Attr> {
        // The file state is locked before the metadata is read: a flush running meanwhile
        // (the writeback thread) commits the buffered size and drops the buffer under this
        // lock, so the record read is never older than the buffer seen. The patch is read
        // before the record: one retired meanwhile is in the record, and applying it again
        // is harmless.
        let f = self.existing_file(ino);
        let g = f.as_ref().map(|f| lock(f));
        let patch = lock(&self.patches).get(ino);
        let mut rec = self.inode(ino)?;
        if let Some(p) = patch {
            p.apply(&mut rec);
        }
        let mut a = attr_of(ino, &rec);
        let reserved = self.reserved_of(ino)?;
        if reserved > 0 {
            // Preallocated ranges count as allocated, as on a kernel filesystem.
            let inline = rec.inline.as_ref().map_or(0, |i| i.bytes.len() as u64);
            a.blocks = (rec.disk_bytes.saturating_add(inline))
                .saturating_add(reserved)
                .div_ceil(512);
        }
        if let Some(d) = g.as_ref().and_then(|g| g.dirty.as_ref()) {
            a.size = d.size;
            a.mtime = d.mtime;
            a.ctime = a.ctime.max(d.ctime);
        }
        Ok(a)
    }

    fn open_count(&self, ino: Ino) -> u32 {
        // Not the file's lock: this runs inside namespace transactions (see `Inner::opens`).
        lock(&self.opens).get(&ino).copied().unwrap_or(0)
    }

    /// Drops one link of `ino` inside `w`; frees it (or marks it orphan while open).
    fn drop_link(&self, w: &mut W<'_>, ino: Ino, rec: &mut InodeRec, now: Timestamp) -> Result<()> {
        let dir = rec.kind == FileKind::Dir;
        rec.nlink = if dir { 0 } else { rec.nlink.saturating_sub(1) };
        rec.ctime = now;
        if rec.nlink == 0 {
            if self.open_count(ino) > 0 {
                w.orphans_mut()?.insert(ino, ())?;
                w.put_inode(ino, rec)?;
            } else {
                w.free_inode(ino)?;
                self.discard(ino);
            }
        } else {
            w.put_inode(ino, rec)?;
        }
        Ok(())
    }

    /// Forgets buffered data of a freed inode.
    fn discard(&self, ino: Ino) {
        lock(&self.patches).remove(ino);
        if let Some(f) = self.existing_file(ino) {
            if let Ok(mut g) = f.try_lock() {
                if let Some(d) = g.dirty.take() {
                    self.dirty_bytes.fetch_sub(
                        (d.blocks.len() + d.flying.len()) * d.block as usize,
                        Ordering::Relaxed,
                    );
                }
            }
        }
    }

    /// Creates an inode and its entry in `parent`.
    #[allow(clippy::too_many_arguments)]
    fn create_node(
        &self,
        parent: Ino,
        name: &[u8],
        kind: FileKind,
        perm: u16,
        uid: u32,
        gid: u32,
        rdev: u32,
        target: Option<&[u8]>,
    ) -> Result<Attr> {
        self.check_writable()?;
        check_name(name)?;
        if is_dot(name) {
            return Err(Error::Exists);
        }
        self.write_batched(|w| {
            let mut p = w.inode(parent)?;
            if p.kind != FileKind::Dir {
                return Err(Error::NotDir);
            }
            if w.dirent(parent, name)?.is_some() {
                return Err(Error::Exists);
            }
            let ino = w.next(meta::NEXT_INO)?;
            let now = Timestamp::now();
            let rec = InodeRec {
                kind,
                perm: perm & 0o7777,
                nlink: if kind == FileKind::Dir { 2 } else { 1 },
                uid,
                gid,
                rdev,
                size: target.map_or(0, |t| t.len() as u64),
                atime: now,
                mtime: now,
                ctime: now,
                crtime: now,
                parent: if kind == FileKind::Dir { parent } else { 0 },
                next_seq: 0,
                disk_bytes: 0,
                inline: target
                    .map(|t| crate::records::Inline::new(0, 0, t.len() as u32, t.to_vec())),
            };
            w.put_inode(ino, &rec)?;
            if matches!(kind, FileKind::File | FileKind::Dir) {
                for prop in [
                    COMPRESSION_XATTR,
                    crate::BACKGROUND_XATTR,
                    EXTENT_SIZE_XATTR,
                ] {
                    let inherited = w.xattrs()?.get((parent, prop))?.map(|v| v.value().to_vec());
                    if let Some(v) = inherited {
                        w.xattrs_mut()?.insert((ino, prop), v.as_slice())?;
                    }
                }
            }
            w.add_dirent(parent, &mut p, name, ino, kind)?;
            if kind == FileKind::Dir {
                p.nlink += 1;
            }
            p.mtime = now;
            lock(&self.patches).clear_mtime(parent);
            p.ctime = now;
            w.put_inode(parent, &p)?;
            Ok(attr_of(ino, &rec))
        })
    }
}

impl Store {
    /// Looks up `name` in directory `parent`.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr> {
        if name.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        let ino = self.inner.with_meta(|m| {
            let p = m.inode(parent)?;
            if p.kind != FileKind::Dir {
                return Err(Error::NotDir);
            }
            if name == b"." {
                Ok(parent)
            } else if name == b".." {
                Ok(p.parent)
            } else {
                match m.dirent(parent, name)? {
                    Some(de) => Ok(de.ino),
                    None => Err(Error::NotFound),
                }
            }
        })?;
        self.inner.attr(ino)
    }

    /// Attributes of `ino` (buffered writes included).
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        self.inner.attr(ino)
    }

    /// Changes attributes; `size` truncates (down or up).
    pub fn setattr(&self, ino: Ino, set: &SetAttr) -> Result<Attr> {
        let inner = &self.inner;
        inner.check_writable()?;
        if let Some(size) = set.size {
            inner.with_file(ino, |st| inner.truncate_locked(ino, st, size))?;
            inner.maybe_forget(ino);
        }
        let other = set.mode.is_some()
            || set.uid.is_some()
            || set.gid.is_some()
            || set.atime.is_some()
            || set.mtime.is_some()
            || set.ctime.is_some();
        if other {
            // Held in memory and written by the next commit (see `attrs`): an untar sends
            // three or four of these per file.
            inner.with_file(ino, |st| {
                let now = Timestamp::now();
                let p = AttrPatch {
                    perm: set.mode.map(|m| (m & 0o7777) as u16),
                    uid: set.uid,
                    gid: set.gid,
                    atime: set.atime.as_ref().map(|t| resolve(t, now)),
                    mtime: set.mtime.as_ref().map(|t| resolve(t, now)),
                    ctime: Some(set.ctime.unwrap_or(now)),
                };
                // The inode must exist (a patch for a freed one would only be dropped later).
                inner.inode(ino)?;
                lock(&inner.patches).add(ino, &p);
                if let Some(d) = st.dirty.as_mut() {
                    if let Some(m) = p.mtime {
                        d.mtime = m;
                    }
                    d.ctime = d.ctime.max(p.ctime.unwrap_or(now));
                }
                Ok(())
            })?;
            inner.maybe_forget(ino);
        }
        inner.attr(ino)
    }

    /// Creates a regular file, FIFO, socket or device node.
    #[allow(clippy::too_many_arguments)]
    pub fn mknod(
        &self,
        parent: Ino,
        name: &[u8],
        kind: FileKind,
        perm: u16,
        uid: u32,
        gid: u32,
        rdev: u32,
    ) -> Result<Attr> {
        if matches!(kind, FileKind::Dir | FileKind::Symlink) {
            return Err(Error::InvalidArgument(
                "mknod cannot create directories or symlinks".into(),
            ));
        }
        self.inner
            .create_node(parent, name, kind, perm, uid, gid, rdev, None)
    }

    pub fn mkdir(&self, parent: Ino, name: &[u8], perm: u16, uid: u32, gid: u32) -> Result<Attr> {
        self.inner
            .create_node(parent, name, FileKind::Dir, perm, uid, gid, 0, None)
    }

    pub fn symlink(
        &self,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        if target.is_empty() || target.len() > 4095 {
            return Err(Error::InvalidArgument(
                "symlink target must be 1..4095 bytes".into(),
            ));
        }
        self.inner.create_node(
            parent,
            name,
            FileKind::Symlink,
            0o777,
            uid,
            gid,
            0,
            Some(target),
        )
    }

    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let r = self.inner.inode(ino)?;
        if r.kind != FileKind::Symlink {
            return Err(Error::InvalidArgument("not a symlink".into()));
        }
        match &r.inline {
            Some(i) => self.inner.inline_data(ino, i),
            None => Err(meta::corrupt(format!("symlink {ino} has no target"))),
        }
    }

    /// Adds a hard link `new_parent/new_name` to `ino`.
    pub fn link(&self, ino: Ino, new_parent: Ino, new_name: &[u8]) -> Result<Attr> {
        let inner = &self.inner;
        inner.check_writable()?;
        check_name(new_name)?;
        if is_dot(new_name) {
            return Err(Error::Exists);
        }
        inner.write_batched(|w| {
            let mut r = w.inode(ino)?;
            if r.kind == FileKind::Dir {
                return Err(Error::NotPermitted("hard links to directories".into()));
            }
            if r.nlink == 0 {
                return Err(Error::NotFound);
            }
            let mut p = w.inode(new_parent)?;
            if p.kind != FileKind::Dir {
                return Err(Error::NotDir);
            }
            if w.dirent(new_parent, new_name)?.is_some() {
                return Err(Error::Exists);
            }
            let now = Timestamp::now();
            w.add_dirent(new_parent, &mut p, new_name, ino, r.kind)?;
            p.mtime = now;
            lock(&inner.patches).clear_mtime(new_parent);
            p.ctime = now;
            w.put_inode(new_parent, &p)?;
            r.nlink += 1;
            r.ctime = now;
            w.put_inode(ino, &r)?;
            Ok(())
        })?;
        inner.attr(ino)
    }

    /// Removes a non-directory entry. The inode lives on while open.
    pub fn unlink(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.remove_entry(parent, name, false)
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.remove_entry(parent, name, true)
    }

    fn remove_entry(&self, parent: Ino, name: &[u8], dir: bool) -> Result<()> {
        let inner = &self.inner;
        inner.check_writable()?;
        if name.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        if name == b"." {
            return Err(Error::InvalidArgument("cannot remove '.'".into()));
        }
        if name == b".." {
            return Err(Error::NotEmpty);
        }
        inner.write_batched(|w| {
            let mut p = w.inode(parent)?;
            if p.kind != FileKind::Dir {
                return Err(Error::NotDir);
            }
            let de = w.dirent(parent, name)?.ok_or(Error::NotFound)?;
            let mut r = w.inode(de.ino)?;
            if dir {
                if r.kind != FileKind::Dir {
                    return Err(Error::NotDir);
                }
                if !w.dir_is_empty(de.ino)? {
                    return Err(Error::NotEmpty);
                }
            } else if r.kind == FileKind::Dir {
                return Err(Error::IsDir);
            }
            let now = Timestamp::now();
            w.remove_dirent(parent, name)?;
            if dir {
                p.nlink = p.nlink.saturating_sub(1);
            }
            p.mtime = now;
            lock(&inner.patches).clear_mtime(parent);
            p.ctime = now;
            w.put_inode(parent, &p)?;
            inner.drop_link(w, de.ino, &mut r, now)?;
            Ok(())
        })
    }

    /// Renames (with `RENAME_NOREPLACE` / `RENAME_EXCHANGE` semantics when flagged).
    pub fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        let inner = &self.inner;
        inner.check_writable()?;
        check_name(name)?;
        check_name(new_name)?;
        if is_dot(name) || is_dot(new_name) {
            return Err(Error::InvalidArgument("cannot rename '.' or '..'".into()));
        }
        if flags.noreplace && flags.exchange {
            return Err(Error::InvalidArgument(
                "RENAME_NOREPLACE with RENAME_EXCHANGE".into(),
            ));
        }
        inner.write_batched(|w| {
            let now = Timestamp::now();
            for d in [parent, new_parent] {
                if w.inode(d)?.kind != FileKind::Dir {
                    return Err(Error::NotDir);
                }
            }
            let src = w.dirent(parent, name)?.ok_or(Error::NotFound)?;
            let dst = w.dirent(new_parent, new_name)?;
            // A directory may not move below itself.
            let ancestor_of = |w: &W<'_>, a: Ino, mut d: Ino| -> Result<bool> {
                loop {
                    if d == a {
                        return Ok(true);
                    }
                    if d == ROOT_INO {
                        return Ok(false);
                    }
                    d = w.inode(d)?.parent;
                }
            };
            if flags.exchange {
                let dst = dst.ok_or(Error::NotFound)?;
                if src.ino == dst.ino {
                    return Ok(());
                }
                if (src.kind == FileKind::Dir && ancestor_of(w, src.ino, new_parent)?)
                    || (dst.kind == FileKind::Dir && ancestor_of(w, dst.ino, parent)?)
                {
                    return Err(Error::InvalidArgument(
                        "cannot move a directory below itself".into(),
                    ));
                }
                w.retarget_dirent(parent, name, dst.ino, dst.kind)?;
                w.retarget_dirent(new_parent, new_name, src.ino, src.kind)?;
                if parent != new_parent {
                    for (ino, kind, from, to) in [
                        (src.ino, src.kind, parent, new_parent),
                        (dst.ino, dst.kind, new_parent, parent),
                    ] {
                        if kind == FileKind::Dir {
                            let mut r = w.inode(ino)?;
                            r.parent = to;
                            r.ctime = now;
                            w.put_inode(ino, &r)?;
                            let mut f = w.inode(from)?;
                            f.nlink = f.nlink.saturating_sub(1);
                            w.put_inode(from, &f)?;
                            let mut t = w.inode(to)?;
                            t.nlink += 1;
                            w.put_inode(to, &t)?;
                        }
                    }
                }
                for (ino, _) in [(src.ino, 0), (dst.ino, 0)] {
                    let mut r = w.inode(ino)?;
                    r.ctime = now;
                    w.put_inode(ino, &r)?;
                }
            } else {
                if let Some(dst) = dst {
                    if flags.noreplace {
                        return Err(Error::Exists);
                    }
                    if dst.ino == src.ino {
                        // Both names are links to the same inode: nothing to do (POSIX).
                        return Ok(());
                    }
                    let mut dr = w.inode(dst.ino)?;
                    if src.kind == FileKind::Dir {
                        if dr.kind != FileKind::Dir {
                            return Err(Error::NotDir);
                        }
                        if !w.dir_is_empty(dst.ino)? {
                            return Err(Error::NotEmpty);
                        }
                    } else if dr.kind == FileKind::Dir {
                        return Err(Error::IsDir);
                    }
                    if src.kind == FileKind::Dir && ancestor_of(w, src.ino, new_parent)? {
                        return Err(Error::InvalidArgument(
                            "cannot move a directory below itself".into(),
                        ));
                    }
                    w.remove_dirent(new_parent, new_name)?;
                    if dr.kind == FileKind::Dir {
                        let mut np = w.inode(new_parent)?;
                        np.nlink = np.nlink.saturating_sub(1);
                        w.put_inode(new_parent, &np)?;
                    }
                    inner.drop_link(w, dst.ino, &mut dr, now)?;
                } else if src.kind == FileKind::Dir && ancestor_of(w, src.ino, new_parent)? {
                    return Err(Error::InvalidArgument(
                        "cannot move a directory below itself".into(),
                    ));
                }
                w.remove_dirent(parent, name)?;
                let mut np = w.inode(new_parent)?;
                w.add_dirent(new_parent, &mut np, new_name, src.ino, src.kind)?;
                if src.kind == FileKind::Dir && parent != new_parent {
                    np.nlink += 1;
                }
                np.mtime = now;
                lock(&inner.patches).clear_mtime(new_parent);
                np.ctime = now;
                w.put_inode(new_parent, &np)?;
                let mut r = w.inode(src.ino)?;
                if src.kind == FileKind::Dir {
                    r.parent = new_parent;
                }
                r.ctime = now;
                w.put_inode(src.ino, &r)?;
            }
            let mut p = w.inode(parent)?;
            if !flags.exchange && src.kind == FileKind::Dir && parent != new_parent {
                p.nlink = p.nlink.saturating_sub(1);
            }
            p.mtime = now;
            lock(&inner.patches).clear_mtime(parent);
            p.ctime = now;
            w.put_inode(parent, &p)?;
            Ok(())
        })
    }

    /// Lists a directory from cookie `offset` (0 = start), at most `max` entries, "." and ".."
    /// included. Cookies stay valid across concurrent changes.
    pub fn readdir(&self, dir: Ino, offset: u64, max: usize) -> Result<Vec<DirEntry>> {
        self.inner.with_meta(|m| {
            let d = m.inode(dir)?;
            if d.kind != FileKind::Dir {
                return Err(Error::NotDir);
            }
            let mut out = Vec::new();
            if offset == 0 && out.len() < max {
                out.push(DirEntry {
                    ino: dir,
                    kind: FileKind::Dir,
                    name: b".".to_vec(),
                    offset: 1,
                });
            }
            if offset <= 1 && out.len() < max {
                out.push(DirEntry {
                    ino: d.parent,
                    kind: FileKind::Dir,
                    name: b"..".to_vec(),
                    offset: 2,
                });
            }
            let from = offset.saturating_sub(2);
            for (seq, name, de) in m.dir_entries(dir, from, max - out.len())? {
                out.push(DirEntry {
                    ino: de.ino,
                    kind: de.kind,
                    name,
                    offset: seq + 3,
                });
            }
            Ok(out)
        })
    }

    /// The cookie past every entry `dir` holds now: an entry added or renamed later gets a
    /// cookie at or beyond it. A reader that stops there sees each entry at most once however
    /// entries are renamed meanwhile (as btrfs bounds readdir by the last index at opendir).
    pub fn dir_end_cookie(&self, dir: Ino) -> Result<u64> {
        let d = self.inner.inode(dir)?;
        if d.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        Ok(d.next_seq.saturating_add(3))
    }

    /// Counts an open handle (an unlinked inode lives while open). Named `open_file` because
    /// `Store::open` opens a store.
    pub fn open_file(&self, ino: Ino) -> Result<()> {
        self.inner.inode(ino)?;
        self.inner.with_file(ino, |st| {
            st.open += 1;
            *lock(&self.inner.opens).entry(ino).or_insert(0) += 1;
            Ok(())
        })
    }

    /// Drops an open handle; flushes buffered writes and frees an unlinked inode on the last one.
    pub fn release(&self, ino: Ino) -> Result<()> {
        let inner = &self.inner;
        let last = inner.with_file(ino, |st| {
            st.open = st.open.saturating_sub(1);
            {
                let mut o = lock(&inner.opens);
                if st.open == 0 {
                    o.remove(&ino);
                } else {
                    o.insert(ino, st.open);
                }
            }
            if st.open > 0 {
                return Ok(false);
            }
            let orphan = inner.with_meta(|m| m.is_orphan(ino))?;
            if orphan {
                if let Some(d) = st.dirty.take() {
                    inner.dirty_bytes.fetch_sub(
                        (d.blocks.len() + d.flying.len()) * d.block as usize,
                        Ordering::Relaxed,
                    );
                }
                if inner.check_writable().is_ok() {
                    inner.write_batched(|w| {
                        match w.free_inode(ino) {
                            Ok(()) | Err(Error::NotFound) => {}
                            Err(e) => return Err(e),
                        }
                        Ok(())
                    })?;
                }
            } else if st.dirty.is_some()
                && inner.check_writable().is_ok()
                && !inner.queue_writeback(ino, st)
            {
                inner.release_flush(ino, st)?;
            }
            Ok(true)
        })?;
        if last {
            inner.maybe_forget(ino);
        }
        Ok(())
    }

    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        self.inner.with_meta(|m| {
            m.inode(ino)?;
            m.xattr(ino, name)?.ok_or(Error::NoXattr)
        })
    }

    /// Sets an xattr. `compfs.compression` and `compfs.background_compression` take a codec
    /// spec, `compfs.extent_size` a size from 4K to 1M (validated and normalised; empty clears
    /// it).
    pub fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], how: XattrSet) -> Result<()> {
        let inner = &self.inner;
        inner.check_writable()?;
        if name.is_empty() || name.len() > 255 {
            return Err(Error::InvalidArgument(
                "xattr name must be 1..255 bytes".into(),
            ));
        }
        if value.len() > 65536 {
            return Err(Error::InvalidArgument(
                "xattr value longer than 64 KiB".into(),
            ));
        }
        let mut value = value.to_vec();
        let mut clear = false;
        if name == COMPRESSION_XATTR || name == crate::BACKGROUND_XATTR {
            let s = std::str::from_utf8(&value)
                .map_err(|_| Error::InvalidArgument("compression value is not UTF-8".into()))?
                .trim()
                .trim_end_matches('\0')
                .to_string();
            if s.is_empty() {
                clear = true;
            } else {
                let p = CodecSpec::parse(&s).map_err(|e| Error::InvalidArgument(e.to_string()))?;
                value = p.spec.to_string().into_bytes();
            }
        } else if name == EXTENT_SIZE_XATTR {
            let s = std::str::from_utf8(&value)
                .map_err(|_| Error::InvalidArgument("extent size is not UTF-8".into()))?
                .trim_end_matches('\0')
                .trim()
                .to_string();
            if s.is_empty() {
                clear = true;
            } else {
                let n = parse_extent_size(&s).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "extent size '{s}': a power of two from 4K to 1M (4K, 32K, 128K, 1M, 65536)"
                    ))
                })?;
                value = format_extent_size(n).into_bytes();
            }
        }
        inner.write_batched(|w| {
            let mut r = w.inode(ino)?;
            let exists = w.xattrs()?.get((ino, name))?.is_some();
            match how {
                XattrSet::Create if exists => return Err(Error::Exists),
                XattrSet::Replace if !exists => return Err(Error::NoXattr),
                _ => {}
            }
            if clear {
                w.xattrs_mut()?.remove((ino, name))?;
            } else {
                w.xattrs_mut()?.insert((ino, name), value.as_slice())?;
            }
            r.ctime = Timestamp::now();
            w.put_inode(ino, &r)?;
            Ok(())
        })
    }

    pub fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        self.inner.with_meta(|m| {
            m.inode(ino)?;
            m.xattr_names(ino)
        })
    }

    pub fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<()> {
        let inner = &self.inner;
        inner.check_writable()?;
        inner.write_batched(|w| {
            let mut r = w.inode(ino)?;
            // Checked before the change (see `Inner::write_batched`).
            if w.xattrs()?.get((ino, name))?.is_none() {
                return Err(Error::NoXattr);
            }
            w.xattrs_mut()?.remove((ino, name))?;
            r.ctime = Timestamp::now();
            w.put_inode(ino, &r)?;
            Ok(())
        })
    }

    /// The `compfs.compression` property of `ino`.
    pub fn compression(&self, ino: Ino) -> Result<Option<CodecSpec>> {
        match self.getxattr(ino, COMPRESSION_XATTR) {
            Ok(v) => {
                let s = String::from_utf8_lossy(&v).to_string();
                Ok(CodecSpec::parse(&s).ok().map(|p| p.spec))
            }
            Err(Error::NoXattr) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Sets (or clears) the `compfs.compression` property of `ino`.
    pub fn set_compression(&self, ino: Ino, spec: Option<CodecSpec>) -> Result<()> {
        match spec {
            Some(s) => self.setxattr(
                ino,
                COMPRESSION_XATTR,
                s.to_string().as_bytes(),
                XattrSet::Any,
            ),
            None => match self.removexattr(ino, COMPRESSION_XATTR) {
                Ok(()) | Err(Error::NoXattr) => Ok(()),
                Err(e) => Err(e),
            },
        }
    }
}
