//! The `fuser::Filesystem` implementation: each request becomes one store call, each store error
//! its errno ([`compfs_store::Error::errno`]). The only things decided here are FUSE-specific:
//! cache timeouts, init flags, the setgid-directory group rule (the store takes uid/gid as given),
//! and the read-only virtual xattrs that report usage and statistics.

use std::collections::{HashSet, VecDeque};
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use compfs_store::{
    Attr, DirEntry, Error, FileKind, Ino, RenameFlags as StoreRename, SetAttr, Store,
    TimeOrNow as StoreTime, Timestamp, XattrSet, ROOT_INO,
};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::{defrag, report};

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
        CompFs {
            store,
            corrupt_logged: Mutex::new(HashSet::new()),
            defrag: defrag::Answers::default(),
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

    /// Maps a store error to errno; corruption is logged once per (file, offset) with the path.
    /// A `compfs.defrag` request (see [`crate::defrag`]): permission, then the rewrite.
    fn defrag_request(&self, req: &Request, ino: Ino, value: &[u8]) -> Result<(), Errno> {
        let target = defrag::parse_request(value).map_err(|_| Errno::EINVAL)?;
        let attr = self.store.getattr(ino).map_err(|e| self.err(&e))?;
        let (caller, groups) = defrag::caller_of(req.pid());
        if !defrag::may_write(&attr, req.uid(), req.gid(), &groups) {
            return Err(Errno::EACCES);
        }
        if attr.kind == FileKind::Dir {
            return Err(Errno::EISDIR);
        }
        let r = self
            .store
            .defrag(ino, &target, &mut |r| self.defrag.put(ino, caller, *r))
            .map_err(|e| self.err(&e))?;
        self.defrag.put(ino, caller, r);
        Ok(())
    }

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

const CAPABILITY_XATTR: &[u8] = b"security.capability";

impl CompFs {
    /// Feeds the entries of `dir` from cookie `offset` on to `add` until it says the reply
    /// buffer is full (returns true) or the directory ends.
    fn fill_dir(
        &self,
        dir: Ino,
        mut offset: u64,
        mut add: impl FnMut(&DirEntry) -> Result<bool, Error>,
    ) -> Result<(), Error> {
        loop {
            let entries = self.store.readdir(dir, offset, READDIR_BATCH)?;
            if entries.is_empty() {
                return Ok(());
            }
            for e in &entries {
                if add(e)? {
                    return Ok(());
                }
                offset = e.offset;
            }
        }
    }

    /// What the kernel leaves to us under FUSE_HANDLE_KILLPRIV_V2 on write, truncate and chown:
    /// clear S_ISUID, clear S_ISGID when group-executable, drop file capabilities.
    fn kill_suidgid(&self, attr: &Attr) -> Result<Attr, Error> {
        if attr.kind != FileKind::File {
            return Ok(*attr);
        }
        let mut perm = attr.perm & !0o4000;
        if perm & 0o2010 == 0o2010 {
            perm &= !0o2000;
        }
        let mut out = *attr;
        if perm != attr.perm {
            let set = SetAttr {
                mode: Some(u32::from(perm)),
                ..SetAttr::default()
            };
            out = self.store.setattr(attr.ino, &set)?;
        }
        if self.store.getxattr(attr.ino, CAPABILITY_XATTR).is_ok() {
            match self.store.removexattr(attr.ino, CAPABILITY_XATTR) {
                Ok(()) | Err(Error::NoXattr) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}

/// Finds a path of an inode by walking the tree from the root (only used for the corruption
/// log line, so its cost does not matter). Gives up after visiting 1,000,000 entries.
pub fn path_of(store: &Store, target: Ino) -> Option<Vec<u8>> {
    if target == ROOT_INO {
        return Some(b"/".to_vec());
    }
    let mut queue: VecDeque<(Ino, Vec<u8>)> = VecDeque::from([(ROOT_INO, Vec::new())]);
    let mut budget = 1_000_000usize;
    while let Some((dir, path)) = queue.pop_front() {
        let mut offset = 0;
        loop {
            let entries = store.readdir(dir, offset, READDIR_BATCH).ok()?;
            if entries.is_empty() {
                break;
            }
            for e in entries {
                offset = e.offset;
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                budget = budget.checked_sub(1)?;
                let mut p = path.clone();
                p.push(b'/');
                p.extend_from_slice(&e.name);
                if e.ino == target {
                    return Some(p);
                }
                if e.kind == FileKind::Dir {
                    queue.push_back((e.ino, p));
                }
            }
        }
    }
    None
}

fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

fn kind_from_mode(mode: u32) -> Option<FileKind> {
    Some(match mode & libc::S_IFMT {
        libc::S_IFREG | 0 => FileKind::File,
        libc::S_IFDIR => FileKind::Dir,
        libc::S_IFLNK => FileKind::Symlink,
        libc::S_IFIFO => FileKind::Fifo,
        libc::S_IFSOCK => FileKind::Socket,
        libc::S_IFCHR => FileKind::CharDev,
        libc::S_IFBLK => FileKind::BlockDev,
        _ => return None,
    })
}

fn systime(t: Timestamp) -> SystemTime {
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::new(t.secs as u64, t.nsecs)
    } else {
        // secs is negative and nsecs counts forward from it.
        UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs())
            + Duration::from_nanos(t.nsecs.into())
    }
}

fn timestamp(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp {
            secs: d.as_secs() as i64,
            nsecs: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            let (secs, nsecs) = if d.subsec_nanos() == 0 {
                (-(d.as_secs() as i64), 0)
            } else {
                (-(d.as_secs() as i64) - 1, 1_000_000_000 - d.subsec_nanos())
            };
            Timestamp { secs, nsecs }
        }
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: systime(a.atime),
        mtime: systime(a.mtime),
        ctime: systime(a.ctime),
        crtime: systime(a.crtime),
        kind: kind(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
        flags: 0,
    }
}

fn name(n: &OsStr) -> &[u8] {
    n.as_bytes()
}

fn time_or_now(t: TimeOrNow) -> StoreTime {
    match t {
        TimeOrNow::Now => StoreTime::Now,
        TimeOrNow::SpecificTime(t) => StoreTime::Time(timestamp(t)),
    }
}

/// Replies to a getxattr/listxattr with the value or its size, as the protocol asks.
fn reply_xattr(reply: ReplyXattr, size: u32, value: &[u8]) {
    if size == 0 {
        match u32::try_from(value.len()) {
            Ok(n) => reply.size(n),
            Err(_) => reply.error(Errno::E2BIG),
        }
    } else if value.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(value);
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
            // We clear setuid/setgid bits ourselves (see `kill_suidgid`); in exchange the
            // kernel sets SB_NOSEC and stops sending a GETXATTR(security.capability) before
            // every write(2), a quarter of all requests when untarring.
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        let supported = wanted & config.capabilities();
        if let Err(missing) = config.add_capabilities(supported) {
            tracing::warn!("kernel refused FUSE capabilities {missing:?}");
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
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_or_now),
            mtime: mtime.map(time_or_now),
            ctime: ctime.map(timestamp),
        };
        // Under FUSE_HANDLE_KILLPRIV_V2 the kernel no longer turns these into mode changes:
        // chown of a non-directory always kills setuid/setgid (as Linux does); truncate does
        // when the caller is not privileged (root stands in for CAP_FSETID, which FUSE does
        // not pass on).
        let kill = mode.is_none()
            && (uid.is_some() || gid.is_some() || (size.is_some() && req.uid() != 0));
        let r = self.store.setattr(ino.0, &set).and_then(|a| {
            if kill {
                self.kill_suidgid(&a)
            } else {
                Ok(a)
            }
        });
        match r {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(self.err(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.store.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(self.err(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let Some(k) = kind_from_mode(mode) else {
            return reply.error(Errno::EINVAL);
        };
        if matches!(k, FileKind::Dir | FileKind::Symlink) {
            return reply.error(Errno::EINVAL);
        }
        let (uid, gid, perm) = self.owner_for(req, parent.0, (mode & 0o7777) as u16, false);
        self.entry(
            self.store.mknod(parent.0, name(n), k, perm, uid, gid, rdev),
            reply,
        )
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let (uid, gid, perm) = self.owner_for(req, parent.0, (mode & 0o7777) as u16, true);
        self.entry(self.store.mkdir(parent.0, name(n), perm, uid, gid), reply)
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
                Ok(n) => reply.data(&buf[..n.min(size)]),
                Err(e) => reply.error(self.err(&e)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            if let Err(e) = self
                .store
                .getattr(ino.0)
                .and_then(|a| self.kill_suidgid(&a))
            {
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

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.fill_dir(ino.0, offset, |e| {
            Ok(reply.add(
                INodeNo(e.ino),
                e.offset,
                kind(e.kind),
                OsStr::from_bytes(&e.name),
            ))
        });
        self.finish(r, reply)
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let r = self.fill_dir(ino.0, offset, |e| {
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
        });
        self.finish(r, reply)
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
        if report::is_virtual(name(n)) {
            return reply.error(Errno::EPERM);
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
        self.finish(self.store.removexattr(ino.0, name(n)), reply)
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let (uid, gid, perm) = self.owner_for(req, parent.0, (mode & 0o7777) as u16, false);
        let attr = match self
            .store
            .mknod(parent.0, name(n), FileKind::File, perm, uid, gid, 0)
        {
            Ok(a) => a,
            Err(e) => return reply.error(self.err(&e)),
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
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE;
        let r = match mode {
            0 => self.store.allocate(ino.0, offset, length, false),
            KEEP => self.store.allocate(ino.0, offset, length, true),
            m if m == PUNCH | KEEP => self.store.punch_hole(ino.0, offset, length),
            // Collapse/insert/zero range and unshare are not supported (as btrfs lacks
            // collapse/insert): say so rather than pretend.
            _ => return reply.error(Errno::EOPNOTSUPP),
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_including_before_the_epoch() {
        for t in [
            Timestamp { secs: 0, nsecs: 0 },
            Timestamp {
                secs: 1_700_000_000,
                nsecs: 123_456_789,
            },
            Timestamp {
                secs: -1,
                nsecs: 500_000_000,
            },
            Timestamp {
                secs: -100,
                nsecs: 0,
            },
        ] {
            assert_eq!(timestamp(systime(t)), t, "{t:?}");
        }
    }

    #[test]
    fn modes_map_to_kinds() {
        assert_eq!(kind_from_mode(libc::S_IFREG | 0o644), Some(FileKind::File));
        assert_eq!(kind_from_mode(0o644), Some(FileKind::File));
        assert_eq!(kind_from_mode(libc::S_IFIFO | 0o600), Some(FileKind::Fifo));
        assert_eq!(kind_from_mode(libc::S_IFBLK), Some(FileKind::BlockDev));
        assert_eq!(kind_from_mode(0o170000), None);
    }
}

/// The reply types that carry no data on success.
trait Finish {
    fn done(self);
    fn fail(self, e: Errno);
}

macro_rules! impl_finish {
    ($($t:ty),*) => {$(
        impl Finish for $t {
            fn done(self) {
                self.ok()
            }
            fn fail(self, e: Errno) {
                self.error(e)
            }
        }
    )*};
}

impl_finish!(ReplyEmpty, ReplyDirectory, ReplyDirectoryPlus);
