//! The `fuser::Filesystem` implementation: each request becomes one store call, each store error
//! its errno ([`compfs_store::Error::errno`]). The only things decided here are FUSE-specific:
//! cache timeouts, init flags, the setgid-directory group rule (the store takes uid/gid as given),
//! what the kernel leaves to a FUSE daemon (the privilege bits, [`crate::privilege`]; atime,
//! [`crate::atime`]; POSIX ACLs kept in step with the mode and inherited, [`crate::acl`] and
//! `acls`; how far a directory read goes while entries are renamed), and the
//! read-only virtual xattrs that report usage and statistics.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use compfs_store::{
    Attr, Error, FileKind, Ino, RenameFlags as StoreRename, SetAttr, Store, TimeOrNow as StoreTime,
    Timestamp, XattrSet, ROOT_INO,
};
use fuser::{
    Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::acl;
use crate::atime::{AtimeMode, AtimePolicy};
use crate::privilege::Change;
use crate::{defrag, report};

mod acls;
mod convert;
mod defrag_req;
mod dirread;
mod killpriv;
mod path;

use convert::*;
pub use path::path_of;

/// How long the kernel may cache attributes and directory entries. All changes go through this
/// mount, so the kernel's caches are only stale if the store is changed behind its back, which
/// the store's lock prevents.
const TTL: Duration = Duration::from_secs(1);

/// Largest write the kernel sends (FUSE_MAX_PAGES lets it go beyond 128 KiB).
pub const MAX_WRITE: u32 = 1 << 20;

/// Kernel readahead window.
const MAX_READAHEAD: u32 = 1 << 20;

/// Entries fetched from the store per readdir batch.
const READDIR_BATCH: usize = 256;

/// The FUSE filesystem over a shared store.
pub struct CompFs {
    store: Arc<Store>,
    /// (inode, offset) pairs already logged as corrupt: one log line each.
    corrupt_logged: Mutex<HashSet<(Ino, u64)>>,
    /// Per open directory handle: the cookie its reads stop at ([`Store::dir_end_cookie`] at
    /// opendir, renewed when reading starts over at offset 0, as after rewinddir).
    dir_ends: Mutex<HashMap<u64, u64>>,
    next_dir_fh: AtomicU64,
    /// When reads, readdirs and readlinks update atime (mount options).
    atime: AtimePolicy,
    /// POSIX ACLs enforced (mount option `acl`, the default; see [`acls`]).
    acl: bool,
    /// Figures of `compfs.defrag` requests, for the requester to read back.
    defrag: defrag::Answers,
}

impl std::fmt::Debug for CompFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompFs").finish_non_exhaustive()
    }
}

impl CompFs {
    pub fn new(store: Arc<Store>) -> CompFs {
        crate::ring::set_ring_store(&store);
        CompFs {
            store,
            corrupt_logged: Mutex::new(HashSet::new()),
            dir_ends: Mutex::new(HashMap::new()),
            next_dir_fh: AtomicU64::new(1),
            atime: AtimePolicy::default(),
            acl: true,
            defrag: defrag::Answers::default(),
        }
    }

    /// Sets whether POSIX ACLs are supported (`acl`, the default) or refused (`noacl`).
    pub fn with_acl(mut self, acl: bool) -> CompFs {
        self.acl = acl;
        self
    }

    /// Sets the mount's atime rules (`relatime` by default).
    pub fn with_atime(mut self, atime: AtimePolicy) -> CompFs {
        self.atime = atime;
        self
    }

    /// An access of `ino` (READ, READDIR, READLINK: the kernel leaves atime to us, see
    /// [`crate::atime`]): stamps atime when the mount's rules say so. ctime stays. Never fails
    /// the access.
    fn accessed(&self, ino: Ino) {
        if self.atime.mode == AtimeMode::Never {
            return;
        }
        let Ok(a) = self.store.getattr(ino) else {
            return;
        };
        let now = Timestamp::now();
        if !self
            .atime
            .due(a.kind == FileKind::Dir, a.atime, a.mtime, a.ctime, now)
        {
            return;
        }
        let set = SetAttr {
            atime: Some(StoreTime::Time(now)),
            ctime: Some(a.ctime),
            ..SetAttr::default()
        };
        if let Err(e) = self.store.setattr(ino, &set) {
            if e.errno() != libc::EROFS {
                tracing::debug!("atime of inode {ino} not updated: {e}");
            }
        }
    }

    /// Replies to a request whose only result is success or a store error.
    fn finish<R: Finish>(&self, r: Result<(), Error>, reply: R) {
        match r {
            Ok(()) => reply.done(),
            Err(e) => reply.fail(self.err(&e)),
        }
    }

    /// Replies with the new or found entry `r`, or its error.
    fn entry(&self, r: Result<Attr, Error>, reply: ReplyEntry) {
        match r {
            Ok(a) => reply.entry(&TTL, &file_attr(&a), Generation(0)),
            Err(e) => reply.error(self.err(&e)),
        }
    }

    /// Replies with a new inode `r` after storing its ACLs `acls`.
    fn new_entry(
        &self,
        parent: Ino,
        n: &OsStr,
        r: Result<Attr, Error>,
        acls: &acl::Created,
        reply: ReplyEntry,
    ) {
        match r {
            Ok(a) => match self.store_new_acls(parent, name(n), a, acls) {
                Ok(a) => reply.entry(&TTL, &file_attr(&a), Generation(0)),
                Err(e) => reply.error(e),
            },
            Err(e) => reply.error(self.err(&e)),
        }
    }

    /// Maps a store error to errno; corruption is logged once per (file, offset) with the path.
    fn err(&self, e: &Error) -> Errno {
        if let Error::Corrupt {
            ino,
            offset,
            segment,
            seg_offset,
            detail,
        } = e
        {
            let first = match self.corrupt_logged.lock() {
                Ok(mut set) => set.insert((*ino, *offset)),
                Err(_) => true,
            };
            if first {
                let path = path_of(&self.store, *ino)
                    .map(|p| String::from_utf8_lossy(&p).into_owned())
                    .unwrap_or_else(|| "<unlinked>".to_string());
                tracing::error!(
                    "corrupt data in {path} (inode {ino}) at offset {offset}: segment {segment} \
                     offset {seg_offset}: {detail}; returning EIO"
                );
            }
        } else if e.errno() == libc::EIO {
            tracing::error!("I/O error from the store: {e}");
        }
        Errno::from_i32(e.errno())
    }

    /// uid/gid of a new inode: the caller's, except that a setgid directory passes its group on
    /// (and, to new directories, its setgid bit), as POSIX filesystems do.
    fn owner_for(&self, req: &Request, parent: Ino, perm: u16, is_dir: bool) -> (u32, u32, u16) {
        match self.store.getattr(parent) {
            Ok(p) if p.perm & 0o2000 != 0 => {
                let perm = if is_dir { perm | 0o2000 } else { perm };
                (req.uid(), p.gid, perm)
            }
            _ => (req.uid(), req.gid(), perm),
        }
    }
}

impl Filesystem for CompFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let wanted = InitFlags::FUSE_WRITEBACK_CACHE
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_BIG_WRITES
            // We clear setuid/setgid bits ourselves (see `crate::privilege`); in exchange the
            // kernel sets SB_NOSEC and stops sending a GETXATTR(security.capability) before
            // every write(2), a quarter of all requests when untarring.
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2
            // File handles (open_by_handle_at, NFS export) of inodes the kernel no longer
            // caches: it looks them up as "." (and their parents as ".."), see `lookup`.
            // Inode numbers are never reused, so generation 0 keeps handles unambiguous.
            | InitFlags::FUSE_EXPORT_SUPPORT;
        // POSIX ACLs: the kernel enforces them and no longer applies the umask (DONT_MASK);
        // default ACLs, the umask and keeping mode and ACL in step are ours (`acls`).
        let wanted = if self.acl {
            wanted | InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK
        } else {
            wanted
        };
        let supported = wanted & config.capabilities();
        if let Err(missing) = config.add_capabilities(supported) {
            tracing::warn!("kernel refused FUSE capabilities {missing:?}");
        }
        if self.acl && !supported.contains(InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK) {
            tracing::warn!("kernel lacks FUSE POSIX ACL support; mounting noacl");
            self.acl = false;
        }
        if !supported.contains(InitFlags::FUSE_WRITEBACK_CACHE) {
            tracing::warn!("kernel lacks FUSE writeback cache; writes will be slower");
        }
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_readahead(MAX_READAHEAD);
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        Ok(())
    }

    fn destroy(&mut self) {
        if let Err(e) = self.store.sync() {
            tracing::error!("final sync failed: {e}");
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEntry) {
        // "." of any inode, not only of directories: how the kernel resolves a file handle
        // (fuse_get_dentry) when the inode is not in its cache.
        if name(n) == b"." {
            return self.entry(self.store.getattr(parent.0), reply);
        }
        self.entry(self.store.lookup(parent.0, name(n)), reply)
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.store.getattr(ino.0) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(self.err(&e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_or_now),
            mtime: mtime.map(time_or_now),
            ctime: ctime.map(timestamp),
        };
        // Under FUSE_HANDLE_KILLPRIV_V2 the kernel leaves the privilege bits to us (fuser does
        // not pass FATTR_KILL_SUIDGID on, so the rules are applied from what the request is):
        // chown/chgrp, and truncate. A setattr of nothing but (perhaps) ctime is what is left
        // of a notify_change whose only business was ATTR_CTIME and ATTR_KILL_* (fuse_setattr
        // drops the kill bits): chown(f, -1, -1), or the privilege kill before an unprivileged
        // write or truncate, whose rules are the same for a caller without CAP_FSETID.
        let bare = mode.is_none() && size.is_none() && atime.is_none() && mtime.is_none();
        let chown = uid.is_some() || gid.is_some() || bare;
        if bare && set.ctime.is_none() {
            // Non-regular files: the kernel keeps no ctime of its own for them.
            set.ctime = Some(Timestamp::now());
        }
        let mut changes = Vec::new();
        if chown {
            changes.push(Change::Chown);
        }
        if size.is_some() {
            changes.push(Change::Modify);
        }
        let mut before = None;
        if mode.is_none() && !changes.is_empty() {
            match self.store.getattr(ino.0) {
                Ok(a) => {
                    let perm = self.killed_perm(req, &a, &changes, false);
                    if perm != a.perm {
                        set.mode = Some(u32::from(perm));
                    }
                    before = Some(a);
                }
                Err(e) => return reply.error(self.err(&e)),
            }
        }
        let r = self.store.setattr(ino.0, &set).and_then(|a| {
            if let Some(b) = &before {
                for &ch in &changes {
                    self.drop_capability(req, b, ch, false)?;
                }
            }
            Ok(a)
        });
        let a = match r {
            Ok(a) => a,
            Err(e) => return reply.error(self.err(&e)),
        };
        // chmod: the access ACL follows the new mode.
        if mode.is_some() {
            if let Err(e) = self.chmod_acl(a.ino, a.kind, a.perm) {
                return reply.error(e);
            }
        }
        reply.attr(&TTL, &file_attr(&a))
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.store.readlink(ino.0) {
            Ok(t) => {
                // Before the reply: the kernel refetches atime as soon as it has it.
                self.accessed(ino.0);
                reply.data(&t);
            }
            Err(e) => reply.error(self.err(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let Some(k) = kind_from_mode(mode) else {
            return reply.error(Errno::EINVAL);
        };
        if matches!(k, FileKind::Dir | FileKind::Symlink) {
            return reply.error(Errno::EINVAL);
        }
        let (uid, gid, acls) = match self.new_inode(req, parent.0, mode, umask, false) {
            Ok(o) => o,
            Err(e) => return reply.error(e),
        };
        let r = self
            .store
            .mknod(parent.0, name(n), k, acls.perm, uid, gid, rdev);
        self.new_entry(parent.0, n, r, &acls, reply)
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let (uid, gid, acls) = match self.new_inode(req, parent.0, mode, umask, true) {
            Ok(o) => o,
            Err(e) => return reply.error(e),
        };
        let r = self.store.mkdir(parent.0, name(n), acls.perm, uid, gid);
        self.new_entry(parent.0, n, r, &acls, reply)
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        self.finish(self.store.unlink(parent.0, name(n)), reply)
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        self.finish(self.store.rmdir(parent.0, name(n)), reply)
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let (uid, gid, _) = self.owner_for(req, parent.0, 0o777, false);
        self.entry(
            self.store.symlink(
                parent.0,
                name(link_name),
                target.as_os_str().as_bytes(),
                uid,
                gid,
            ),
            reply,
        )
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        n: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let known = RenameFlags::RENAME_NOREPLACE | RenameFlags::RENAME_EXCHANGE;
        if !known.contains(flags) {
            // RENAME_WHITEOUT is for overlayfs on top; compfs has no whiteouts.
            return reply.error(Errno::EINVAL);
        }
        let f = StoreRename {
            noreplace: flags.contains(RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(RenameFlags::RENAME_EXCHANGE),
        };
        self.finish(
            self.store
                .rename(parent.0, name(n), newparent.0, name(newname), f),
            reply,
        )
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.entry(self.store.link(ino.0, newparent.0, name(newname)), reply)
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.store.open_file(ino.0) {
            // Every change goes through this mount, so cached pages stay valid across opens.
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(self.err(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // One buffer per FUSE thread, reused: a fresh zeroed 1 MiB vector per request showed
        // as 7% memset in read profiles. The store writes every byte of the slice it is given
        // (holes as zeros), and only the `n` bytes it returns are sent.
        thread_local! {
            static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        READ_BUF.with(|cell| {
            let mut buf = cell.borrow_mut();
            let size = size as usize;
            if buf.len() < size {
                buf.resize(size, 0);
            }
            match self.store.read(ino.0, offset, &mut buf[..size]) {
                Ok(n) => {
                    self.accessed(ino.0);
                    reply.data(&buf[..n.min(size)]);
                }
                Err(e) => reply.error(self.err(&e)),
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // The kernel sets this flag when the writer lacks CAP_FSETID.
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            if let Err(e) = self.kill_privs(req, ino.0, Change::Modify, true) {
                return reply.error(self.err(&e));
            }
        }
        match self.store.write(ino.0, offset, data) {
            Ok(n) => match u32::try_from(n) {
                Ok(n) => reply.written(n),
                Err(_) => reply.error(Errno::EIO),
            },
            Err(e) => reply.error(self.err(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close() is not a durability point (fsync is); the kernel has already written back
        // the page cache of this file before sending FLUSH, and POSIX locks are the kernel's
        // (no getlk/setlk here). ENOSYS makes the kernel stop sending FLUSH on every close
        // (fc->no_flush): one round trip less per file, 8% of an untar's requests.
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.finish(self.store.release(ino.0), reply)
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.finish(self.store.fsync(ino.0, datasync), reply)
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // Counted like an open file, so that a directory removed or renamed over while open
        // lives on (nlink 0, fstat works) until closed.
        if let Err(e) = self.store.open_file(ino.0) {
            return reply.error(self.err(&e));
        }
        match self.store.dir_end_cookie(ino.0) {
            Ok(end) => {
                let fh = self.next_dir_fh.fetch_add(1, Ordering::Relaxed);
                match self.dir_ends.lock() {
                    Ok(mut g) => g.insert(fh, end),
                    Err(p) => p.into_inner().insert(fh, end),
                };
                reply.opened(FileHandle(fh), FopenFlags::empty())
            }
            Err(e) => {
                let _ = self.store.release(ino.0);
                reply.error(self.err(&e))
            }
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        match self.dir_ends.lock() {
            Ok(mut g) => g.remove(&fh.0),
            Err(p) => p.into_inner().remove(&fh.0),
        };
        self.finish(self.store.release(ino.0), reply)
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        self.serve_dir(ino.0, fh, offset, reply, |reply, e| {
            Ok(reply.add(
                INodeNo(e.ino),
                e.offset,
                kind(e.kind),
                OsStr::from_bytes(&e.name),
            ))
        })
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.serve_dir(ino.0, fh, offset, reply, |reply, e| {
            let attr = match self.store.getattr(e.ino) {
                Ok(a) => a,
                // Removed between readdir and getattr: skip it, as a later readdir would.
                Err(Error::NotFound) => return Ok(false),
                Err(err) => return Err(err),
            };
            Ok(reply.add(
                INodeNo(e.ino),
                e.offset,
                OsStr::from_bytes(&e.name),
                &TTL,
                &file_attr(&attr),
                Generation(0),
            ))
        })
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        // fsync of the mount's root directory makes the whole store durable, like syncfs(2)
        // on a kernel file system (FUSE does not forward syncfs, so `sync` alone cannot).
        let r = if ino.0 == ROOT_INO {
            self.store.sync()
        } else {
            self.store.fsync(ino.0, datasync)
        };
        self.finish(r, reply)
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.store.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize,
            ),
            Err(e) => reply.error(self.err(&e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        n: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        if name(n) == defrag::DEFRAG_XATTR.as_bytes() {
            return match self.defrag_request(req, ino.0, value) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            };
        }
        // `compfs sync --remote`: the metadata snapshot (after the upload queue of
        // `-o writeback`) goes to the bucket now, whatever the mount's options.
        if name(n) == report::REMOTE_XATTR.as_bytes() && ino.0 == ROOT_INO && value == b"upload" {
            let r = self.store.sync_remote();
            return self.finish(r, reply);
        }
        if report::is_virtual(name(n)) {
            return reply.error(Errno::EPERM);
        }
        if acl::is_acl_xattr(name(n)) {
            return match self.set_acl(req, ino.0, name(n), value) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            };
        }
        let how = match flags & (libc::XATTR_CREATE | libc::XATTR_REPLACE) {
            0 => XattrSet::Any,
            libc::XATTR_CREATE => XattrSet::Create,
            libc::XATTR_REPLACE => XattrSet::Replace,
            _ => return reply.error(Errno::EINVAL),
        };
        self.finish(self.store.setxattr(ino.0, name(n), value, how), reply)
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, n: &OsStr, size: u32, reply: ReplyXattr) {
        if !self.acl && acl::is_acl_xattr(name(n)) {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let value = if name(n) == defrag::DEFRAG_XATTR.as_bytes() {
            match self.defrag.get(ino.0, defrag::caller_of(req.pid()).0) {
                Some(r) => Ok(defrag::DefragRecord(r).encode()),
                None => Err(Error::NoXattr),
            }
        } else if report::is_virtual(name(n)) {
            report::virtual_xattr(&self.store, ino.0, name(n))
        } else {
            self.store.getxattr(ino.0, name(n))
        };
        match value {
            Ok(v) => reply_xattr(reply, size, &v),
            Err(e) => reply.error(self.err(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.store.listxattr(ino.0) {
            Ok(names) => {
                let mut buf = Vec::new();
                for n in names {
                    if !self.acl && acl::is_acl_xattr(&n) {
                        continue;
                    }
                    buf.extend_from_slice(&n);
                    buf.push(0);
                }
                reply_xattr(reply, size, &buf);
            }
            Err(e) => reply.error(self.err(&e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        if report::is_virtual(name(n)) || name(n) == defrag::DEFRAG_XATTR.as_bytes() {
            return reply.error(Errno::EPERM);
        }
        if acl::is_acl_xattr(name(n)) {
            return match self.remove_acl(ino.0, name(n)) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            };
        }
        self.finish(self.store.removexattr(ino.0, name(n)), reply)
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let (uid, gid, acls) = match self.new_inode(req, parent.0, mode, umask, false) {
            Ok(o) => o,
            Err(e) => return reply.error(e),
        };
        let attr = match self
            .store
            .mknod(parent.0, name(n), FileKind::File, acls.perm, uid, gid, 0)
        {
            Ok(a) => a,
            Err(e) => return reply.error(self.err(&e)),
        };
        let attr = match self.store_new_acls(parent.0, name(n), attr, &acls) {
            Ok(a) => a,
            Err(e) => return reply.error(e),
        };
        match self.store.open_file(attr.ino) {
            Ok(()) => reply.created(
                &TTL,
                &file_attr(&attr),
                Generation(0),
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(self.err(&e)),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE;
        const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;
        let ino = ino.0;
        let r = match mode {
            0 => self.store.allocate(ino, offset, length, false),
            KEEP => self.store.allocate(ino, offset, length, true),
            m if m == PUNCH | KEEP => self.store.punch_hole(ino, offset, length),
            // Zeroing is a hole punched, then the range preallocated again (ext4 leaves it
            // allocated, unwritten) and, without KEEP_SIZE, the size extended.
            ZERO => self
                .store
                .punch_hole(ino, offset, length)
                .and_then(|()| self.store.allocate(ino, offset, length, false)),
            m if m == ZERO | KEEP => self
                .store
                .punch_hole(ino, offset, length)
                .and_then(|()| self.store.allocate(ino, offset, length, true)),
            // Collapse/insert range and unshare are not supported (as btrfs lacks
            // collapse/insert): say so rather than pretend.
            _ => return reply.error(Errno::EOPNOTSUPP),
        };
        // The kernel does not flag fallocate for us: a caller without CAP_FSETID loses the
        // privilege bits, as on write (ext4_fallocate -> file_modified).
        let r = r.and_then(|()| self.kill_privs(req, ino, Change::Modify, false));
        self.finish(r, reply)
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let Ok(off) = u64::try_from(offset) else {
            return reply.error(Errno::ENXIO);
        };
        let r = match whence {
            libc::SEEK_DATA => self.store.seek_data(ino.0, off),
            libc::SEEK_HOLE => self.store.seek_hole(ino.0, off),
            // SEEK_SET/CUR/END are resolved by the kernel and never sent.
            _ => return reply.error(Errno::EINVAL),
        };
        match r.map(i64::try_from) {
            Ok(Ok(o)) => reply.offset(o),
            Ok(Err(_)) => reply.error(Errno::EOVERFLOW),
            Err(e) => reply.error(self.err(&e)),
        }
    }
}
