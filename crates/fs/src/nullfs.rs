//! A FUSE filesystem that keeps an empty-file namespace in memory and does nothing else: the
//! floor any FUSE daemon reaches for metadata operations on this kernel and transport.
//!
//! It is a measuring stick, not a filesystem to use (no data, nothing kept past unmount):
//! `compfs bench creates` runs it beside compfs and kernel btrfs, so that what compfs's own work
//! costs per create (the store's) is told apart from what FUSE costs any daemon (the kernel's
//! requests, their round trips, and the GETATTR of the directory that `default_permissions`
//! adds before each create once the previous create invalidated its attributes). It is mounted
//! the way compfs is: the same ring configuration (FUSE over io_uring, replies woken on the
//! ring thread's CPU as compfs does while its store is idle), `default_permissions`, FLUSH
//! answered ENOSYS, one-second entry and attribute timeouts.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyCreate, ReplyDirectory,
    ReplyEmpty, ReplyEntry, Request, Session,
};

const TTL: Duration = Duration::from_secs(1);
const ROOT: u64 = 1;

/// The namespace: every inode's attributes and every directory entry.
#[derive(Default)]
struct Tree {
    next_ino: u64,
    entries: HashMap<(u64, OsString), u64>,
    inodes: HashMap<u64, FileAttr>,
}

/// The null filesystem (see the module documentation).
pub struct NullFs {
    tree: Mutex<Tree>,
}

fn new_attr(ino: u64, kind: FileType, perm: u16, uid: u32, gid: u32) -> FileAttr {
    let now = SystemTime::now();
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind,
        perm,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid,
        gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl Default for NullFs {
    fn default() -> Self {
        NullFs::new()
    }
}

impl NullFs {
    /// An empty root directory owned by the calling user, mode 0755.
    pub fn new() -> NullFs {
        let uid = rustix::process::geteuid().as_raw();
        let gid = rustix::process::getegid().as_raw();
        let mut tree = Tree {
            next_ino: ROOT + 1,
            ..Tree::default()
        };
        tree.inodes
            .insert(ROOT, new_attr(ROOT, FileType::Directory, 0o755, uid, gid));
        NullFs {
            tree: Mutex::new(tree),
        }
    }

    fn tree(&self) -> MutexGuard<'_, Tree> {
        match self.tree.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    fn make(
        &self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        kind: FileType,
        mode: u32,
    ) -> Result<FileAttr, Errno> {
        let mut t = self.tree();
        match t.inodes.get(&parent) {
            Some(p) if p.kind == FileType::Directory => {}
            Some(_) => return Err(Errno::ENOTDIR),
            None => return Err(Errno::ENOENT),
        }
        let key = (parent, name.to_owned());
        if t.entries.contains_key(&key) {
            return Err(Errno::EEXIST);
        }
        let ino = t.next_ino;
        t.next_ino += 1;
        let a = new_attr(ino, kind, (mode & 0o7777) as u16, req.uid(), req.gid());
        t.entries.insert(key, ino);
        t.inodes.insert(ino, a);
        if let Some(p) = t.inodes.get_mut(&parent) {
            let now = SystemTime::now();
            p.mtime = now;
            p.ctime = now;
            if kind == FileType::Directory {
                p.nlink += 1;
            }
        }
        Ok(a)
    }

    fn remove(&self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let mut t = self.tree();
        let key = (parent, name.to_owned());
        let ino = *t.entries.get(&key).ok_or(Errno::ENOENT)?;
        let kind = t.inodes.get(&ino).map(|a| a.kind);
        match (kind, dir) {
            (Some(FileType::Directory), false) => return Err(Errno::EISDIR),
            (Some(k), true) if k != FileType::Directory => return Err(Errno::ENOTDIR),
            _ => {}
        }
        if dir && t.entries.keys().any(|(p, _)| *p == ino) {
            return Err(Errno::ENOTEMPTY);
        }
        t.entries.remove(&key);
        t.inodes.remove(&ino);
        if let Some(p) = t.inodes.get_mut(&parent) {
            let now = SystemTime::now();
            p.mtime = now;
            p.ctime = now;
            if dir {
                p.nlink -= 1;
            }
        }
        Ok(())
    }
}

impl Filesystem for NullFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let t = self.tree();
        let found = t
            .entries
            .get(&(parent.0, name.to_owned()))
            .and_then(|ino| t.inodes.get(ino));
        match found {
            Some(a) => reply.entry(&TTL, a, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.tree().inodes.get(&ino.0) {
            Some(a) => reply.attr(&TTL, a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        match self.make(req, parent.0, name, FileType::Directory, mode & !umask) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        match self.make(req, parent.0, name, FileType::RegularFile, mode & !umask) {
            Ok(a) => reply.created(
                &TTL,
                &a,
                Generation(0),
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.remove(parent.0, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.remove(parent.0, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let t = self.tree();
        let mut names: Vec<(&OsString, u64)> = t
            .entries
            .iter()
            .filter(|((p, _), _)| *p == ino.0)
            .map(|((_, n), i)| (n, *i))
            .collect();
        names.sort();
        for (i, (name, child)) in names.into_iter().enumerate().skip(offset as usize) {
            let kind = t
                .inodes
                .get(&child)
                .map_or(FileType::RegularFile, |a| a.kind);
            if reply.add(INodeNo(child), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // As compfs: no FLUSH on every close.
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }
}

fn always_wake_here() -> bool {
    true
}

/// Mounts a [`NullFs`] on `mountpoint`, served by background threads until the returned
/// session is unmounted (`umount_and_join`) or dropped. `uring`: FUSE over io_uring required
/// (as `compfs mount -o uring`), else `/dev/fuse`.
pub fn mount_null(mountpoint: &Path, uring: bool) -> io::Result<BackgroundSession> {
    let mut cfg = Config::default();
    cfg.mount_options = vec![
        MountOption::FSName("compfs-null".into()),
        MountOption::Subtype("compfs-null".into()),
        MountOption::DefaultPermissions,
        MountOption::RW,
    ];
    cfg.clone_fd = true;
    cfg.uring = fuser::UringConfig {
        mode: if uring {
            fuser::UringMode::Required
        } else {
            fuser::UringMode::Off
        },
        hand_off: fuser::default_hand_off,
        wake_here: always_wake_here,
        ..fuser::UringConfig::default()
    };
    Session::new(NullFs::new(), mountpoint, &cfg)?.spawn()
}
