//! FUSE over io_uring with replies made on other threads than the ring threads (fuser allows a
//! reply to be sent from anywhere; compfs itself replies inline): a small in-process
//! filesystem hands every READ and GETXATTR to a worker thread that replies, and readers pinned
//! to each CPU check every byte. Root only (it mounts); the kernel must offer the ring.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsStr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyEntry, ReplyOpen, ReplyXattr,
    Request, Session, SessionACL, UringConfig, UringMode,
};

const FILE_LEN: u64 = 3 << 20;
const TTL: Duration = Duration::from_secs(60);

fn byte_at(off: u64) -> u8 {
    (off.wrapping_mul(2_654_435_761) >> 13) as u8
}

enum Job {
    Read(u64, u32, ReplyData),
    Xattr(u32, ReplyXattr),
}

/// Root directory with one file `data` of [`FILE_LEN`] bytes; reads and xattrs are answered
/// by a worker thread.
struct Deferred {
    jobs: Mutex<mpsc::Sender<Job>>,
}

fn attr(ino: u64) -> FileAttr {
    let (kind, perm, size) = if ino == 1 {
        (FileType::Directory, 0o755, 0)
    } else {
        (FileType::RegularFile, 0o644, FILE_LEN)
    };
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size / 512,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind,
        perm,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl Filesystem for Deferred {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent.0 == 1 && name == "data" {
            reply.entry(&TTL, &attr(2), Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino.0 <= 2 {
            reply.attr(&TTL, &attr(ino.0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // Every read reaches the daemon.
        reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _ = self
            .jobs
            .lock()
            .unwrap()
            .send(Job::Read(offset, size, reply));
    }

    fn getxattr(&self, _req: &Request, _ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if name == "user.n" {
            let _ = self.jobs.lock().unwrap().send(Job::Xattr(size, reply));
        } else {
            reply.error(Errno::ENODATA);
        }
    }
}

fn worker(rx: mpsc::Receiver<Job>) {
    for job in rx {
        match job {
            Job::Read(off, size, reply) => {
                let end = (off + u64::from(size)).min(FILE_LEN);
                let data: Vec<u8> = (off.min(end)..end).map(byte_at).collect();
                reply.data(&data);
            }
            Job::Xattr(0, reply) => reply.size(5),
            Job::Xattr(_, reply) => reply.data(b"value"),
        }
    }
}

fn pin_to(cpu: usize) {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set)
        .unwrap_or_else(|e| panic!("pin to CPU {cpu}: {e}"));
}

fn cpus(path: &str) -> Vec<usize> {
    let s = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    for part in s.trim().split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        out.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap());
    }
    out
}

fn reader(path: PathBuf, cpu: usize, seed: u64) {
    pin_to(cpu);
    let f = std::fs::File::open(&path).unwrap();
    let mut x = seed;
    for _ in 0..200 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let off = (x >> 20) % FILE_LEN;
        let len = [1usize, 4096, 70_000, 1 << 20][(x >> 8) as usize % 4];
        let mut buf = vec![0u8; len];
        let n = f.read_at(&mut buf, off).unwrap();
        assert_eq!(n as u64, (FILE_LEN - off).min(len as u64));
        for (k, b) in buf[..n].iter().enumerate() {
            assert_eq!(*b, byte_at(off + k as u64), "byte {} of read at {off}", k);
        }
        let v = xattr_get(&path, "user.n");
        assert_eq!(v, b"value");
    }
}

fn xattr_get(p: &Path, name: &str) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let cp = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let cn = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 64];
    // SAFETY: valid strings and buffer.
    let n = unsafe { libc::getxattr(cp.as_ptr(), cn.as_ptr(), buf.as_mut_ptr().cast(), 64) };
    assert!(n >= 0, "getxattr: {}", std::io::Error::last_os_error());
    buf.truncate(n as usize);
    buf
}

#[test]
fn replies_from_other_threads_go_through_the_ring() {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: not root (CI runs these tests as root)");
        return;
    }
    let param = Path::new("/sys/module/fuse/parameters/enable_uring");
    assert!(param.exists(), "this kernel has no FUSE over io_uring");
    if std::fs::read_to_string(param).unwrap().trim() != "Y" {
        // As `compfs mount -o uring` does for root.
        std::fs::write(param, "Y\n").unwrap();
    }
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let mnt = std::env::temp_dir().join(format!(
        "compfs-uring-deferred-{}-{nanos}",
        std::process::id()
    ));
    std::fs::create_dir_all(&mnt).unwrap();
    let (tx, rx) = mpsc::channel();
    let w = std::thread::spawn(move || worker(rx));
    let mut cfg = Config::default();
    cfg.mount_options = vec![MountOption::FSName("uring-deferred".into())];
    cfg.acl = SessionACL::Owner;
    cfg.n_threads = Some(1);
    cfg.uring = UringConfig {
        mode: UringMode::Required,
        queue_depth: 2,
        ..UringConfig::default()
    };
    let before = fuser::uring_stats().requests;
    let fs = Deferred {
        jobs: Mutex::new(tx),
    };
    let session = Session::new(fs, &mnt, &cfg).expect("mount with the ring required");
    let bg = session.spawn().unwrap();
    // A reply lost on the way to the ring would hang the readers: fail instead.
    let (done_tx, done_rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        if done_rx.recv_timeout(Duration::from_secs(120)).is_err() {
            eprintln!("readers still waiting after 120 s: a reply was lost");
            std::process::abort();
        }
    });
    let online = cpus("/sys/devices/system/cpu/online");
    let readers: Vec<_> = online
        .iter()
        .enumerate()
        .map(|(i, &cpu)| {
            let p = mnt.join("data");
            std::thread::spawn(move || reader(p, cpu, i as u64 + 1))
        })
        .collect();
    let mut failed = None;
    for r in readers {
        if let Err(e) = r.join() {
            failed = Some(e);
        }
    }
    let _ = done_tx.send(());
    let st = fuser::uring_stats();
    bg.umount_and_join().unwrap();
    w.join().unwrap();
    let _ = std::fs::remove_dir(&mnt);
    if let Some(e) = failed {
        std::panic::resume_unwind(e);
    }
    let served = st.requests - before;
    assert!(
        served >= 400 * online.len() as u64,
        "only {served} requests through the rings: {st:?}"
    );
    for cpu in online {
        assert!(st.per_queue.get(cpu).copied().unwrap_or(0) > 100, "{st:?}");
    }
}
