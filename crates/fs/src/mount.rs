//! Mounting: open the store with the mount options, start a multithreaded FUSE session, serve
//! until unmounted (or SIGTERM/SIGINT/SIGHUP, which unmount), then close the store durably.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use compfs_store::{OpenOptions, Store};
use fuser::{Config, MountOption, Session, SessionACL};

use crate::adapter::CompFs;
use crate::options::{KernelFlag, MountOptions, UringOption};

/// Why a mount failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("cannot open store {}: {source}", path.display())]
    Store {
        path: PathBuf,
        #[source]
        source: compfs_store::Error,
    },
    #[error("mount point {}: {detail}", path.display())]
    MountPoint { path: PathBuf, detail: String },
    #[error("FUSE mount on {} with option `uring` failed: {source}", path.display())]
    Uring {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("FUSE mount on {} failed: {source} (is /dev/fuse present and fusermount3 installed? scripts/deps.sh installs fuse3)", path.display())]
    Fuse {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("FUSE session on {} ended with an error: {source}", path.display())]
    Session {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("closing the store after unmount failed: {0}")]
    Close(#[source] compfs_store::Error),
}

/// How long opening waits for a previous daemon of the same store to finish its final sync
/// (`umount` returns before the daemon has closed the store).
const IN_USE_WAIT: Duration = Duration::from_secs(15);

/// Opens a store, waiting a little while it is still held by a daemon that is shutting down.
pub fn open_store(dir: &Path, opts: &OpenOptions) -> Result<Store, compfs_store::Error> {
    let start = Instant::now();
    loop {
        match Store::open(dir, opts) {
            Err(compfs_store::Error::InUse(_)) if start.elapsed() < IN_USE_WAIT => {
                std::thread::sleep(Duration::from_millis(50));
            }
            r => return r,
        }
    }
}

/// The store options a mount asks for.
pub fn open_options(o: &MountOptions) -> OpenOptions {
    let mut oo = OpenOptions {
        read_only: o.read_only,
        policy: o.policy,
        cache_bytes: o.cache_bytes,
        min_saving: o.min_saving,
        background: o.background,
        dict: o.dict,
        pack_dict: o.pack_dict,
        pack: o.pack,
        ..OpenOptions::default()
    };
    if let Some(n) = o.workers {
        oo.threads = n;
    }
    oo
}

/// `fuse.compfs` in /proc/mounts. fuser passes `Subtype` only to fusermount3; when root mounts
/// directly with mount(2) it must go to the kernel as the `subtype=` option instead.
fn subtype_option() -> MountOption {
    if rustix::process::geteuid().is_root() {
        MountOption::CUSTOM("subtype=compfs".to_string())
    } else {
        MountOption::Subtype("compfs".to_string())
    }
}

/// The fuser configuration of a mount.
pub fn fuse_config(store_dir: &Path, o: &MountOptions) -> Config {
    let mut opts = vec![
        MountOption::FSName(format!("compfs:{}", store_dir.display())),
        subtype_option(),
        MountOption::DefaultPermissions,
        if o.read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    for f in &o.flags {
        if *f == KernelFlag::LazyTime && !root {
            // A user mount goes through fusermount3, which (3.14) refuses options it does not
            // know, lazytime among them: left out (the daemon does the same either way).
            continue;
        }
        opts.push(match f {
            KernelFlag::Dev => MountOption::Dev,
            KernelFlag::NoDev => MountOption::NoDev,
            KernelFlag::Suid => MountOption::Suid,
            KernelFlag::NoSuid => MountOption::NoSuid,
            KernelFlag::Exec => MountOption::Exec,
            KernelFlag::NoExec => MountOption::NoExec,
            KernelFlag::Atime => MountOption::Atime,
            KernelFlag::NoAtime => MountOption::NoAtime,
            KernelFlag::DirSync => MountOption::DirSync,
            KernelFlag::Sync => MountOption::Sync,
            // A generic superblock flag in the mount data: the kernel's option parser
            // (vfs_parse_sb_flag) takes it for every filesystem, FUSE included.
            KernelFlag::LazyTime => MountOption::CUSTOM("lazytime".to_string()),
        });
    }
    let mut cfg = Config::default();
    cfg.mount_options = opts;
    cfg.acl = if o.allow_other {
        SessionACL::All
    } else if o.allow_root {
        SessionACL::RootAndOwner
    } else {
        SessionACL::Owner
    };
    cfg.n_threads = Some(o.fuse_threads);
    cfg.clone_fd = true;
    cfg.uring = fuser::UringConfig {
        mode: match o.uring {
            UringOption::Auto => fuser::UringMode::Auto,
            UringOption::On => fuser::UringMode::Required,
            UringOption::Off => fuser::UringMode::Off,
        },
        queue_depth: o.uring_depth,
        hand_off: crate::ring::ring_hand_off,
        wake_here: crate::ring::ring_wake_here,
    };
    cfg
}

/// The FUSE module parameter that lets connections use io_uring (Linux 6.14+). The kernel
/// offers `FUSE_OVER_IO_URING` in INIT only while it is `Y`; it is read at mount time.
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether the kernel offers FUSE over io_uring to new mounts: `Some(true)`/`Some(false)` from
/// [`ENABLE_URING`], `None` when the kernel has no such parameter.
pub fn kernel_uring_enabled() -> Option<bool> {
    std::fs::read_to_string(ENABLE_URING)
        .ok()
        .map(|v| v.trim() == "Y")
}

/// Mount option `uring` (the ring or no mount): when run by root and the module parameter is
/// off, switches it on, with a log line, since the user asked for the ring by name. The
/// parameter is global (every FUSE mount made afterwards is offered the ring, and each daemon
/// decides for itself), so `uring=auto`, the default, never changes it.
fn enable_uring_if_asked(o: &MountOptions) {
    if o.uring != UringOption::On || kernel_uring_enabled() != Some(false) {
        return;
    }
    if !rustix::process::geteuid().is_root() {
        return;
    }
    match std::fs::write(ENABLE_URING, "Y\n") {
        Ok(()) => tracing::warn!(
            "mount option `uring`: set {ENABLE_URING} to Y (it was N); the kernel now offers \
             FUSE over io_uring to every new FUSE mount"
        ),
        Err(e) => tracing::warn!("mount option `uring`: cannot set {ENABLE_URING}: {e}"),
    }
}

/// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread and in every thread it starts later;
/// [`serve`] then waits for them on a dedicated thread and unmounts cleanly. Call it before
/// opening the store so the store's worker threads inherit the mask.
pub fn block_termination_signals() {
    // SAFETY: sigset_t is plain data initialised by sigemptyset; pthread_sigmask only reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

fn wait_for_termination_signal() -> i32 {
    // SAFETY: as above; sigwait writes the received signal into `sig`.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        let mut sig: libc::c_int = 0;
        if libc::sigwait(&set, &mut sig) != 0 {
            return 0;
        }
        sig
    }
}

/// Lazy unmount as a last resort (busy mount point on SIGTERM).
fn lazy_unmount(mountpoint: &Path) {
    let status = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(mountpoint)
        .stderr(std::process::Stdio::null())
        .status();
    if !matches!(status, Ok(s) if s.success()) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(mountpoint)
            .status();
    }
}

/// Checks that `mountpoint` is an existing directory, with a message for each way it is not.
pub fn check_mountpoint(mountpoint: &Path) -> Result<(), MountError> {
    let detail = match std::fs::metadata(mountpoint) {
        Ok(md) if md.is_dir() => return Ok(()),
        Ok(_) => "not a directory".to_string(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            "does not exist; create it with mkdir".to_string()
        }
        Err(e) => e.to_string(),
    };
    Err(MountError::MountPoint {
        path: mountpoint.to_path_buf(),
        detail,
    })
}

/// Mounts `store` at `mountpoint` and serves requests until the file system is unmounted.
/// `ready` runs once the kernel has completed the FUSE handshake (the mount is usable).
/// The store is synced and closed before returning.
pub fn serve(
    store: Store,
    store_dir: &Path,
    mountpoint: &Path,
    o: &MountOptions,
    ready: impl FnOnce(),
) -> Result<(), MountError> {
    check_mountpoint(mountpoint)?;
    // Held until the store is closed (dropped last): `compfs umount` waits for it, because
    // the kernel does not wait for a FUSE daemon when unmounting.
    let _serving = match compfs_store::ServeLock::acquire(store_dir) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!(
                "cannot lock {}: {e}; `compfs umount` will not wait for this mount",
                store_dir.display()
            );
            None
        }
    };
    let store = Arc::new(store);
    let fs = CompFs::new(store.clone())
        .with_atime(o.atime)
        .with_acl(o.acl);
    let cfg = fuse_config(store_dir, o);
    enable_uring_if_asked(o);
    let mut session = Session::new(fs, mountpoint, &cfg).map_err(|source| {
        let path = mountpoint.to_path_buf();
        if o.uring == UringOption::On && source.kind() == io::ErrorKind::Unsupported {
            MountError::Uring { path, source }
        } else {
            MountError::Fuse { path, source }
        }
    })?;
    let mut unmounter = session.unmount_callable();
    let mp = mountpoint.to_path_buf();
    // Detached: it either unmounts on a signal or is still waiting when the process exits.
    let _ = std::thread::Builder::new()
        .name("compfs-signals".into())
        .spawn(move || {
            let sig = wait_for_termination_signal();
            tracing::info!("signal {sig}: unmounting {}", mp.display());
            if unmounter.unmount().is_err() {
                lazy_unmount(&mp);
            }
        });
    if o.readahead > 0 {
        let (mp, ra) = (mountpoint.to_path_buf(), o.readahead);
        let _ = std::thread::Builder::new()
            .name("compfs-readahead".into())
            .spawn(move || match set_readahead(&mp, ra) {
                Ok(()) => tracing::debug!("readahead of {} set to {ra} bytes", mp.display()),
                Err(e) => tracing::info!(
                    "kept the kernel's readahead for {} ({e}); raising it needs root",
                    mp.display()
                ),
            });
    }
    ready();
    let run = session.run();
    // Every FUSE thread has ended, so this is the last reference unless a thread leaked.
    let closed = match Arc::try_unwrap(store) {
        Ok(store) => store.close(),
        Err(store) => store.sync(),
    };
    run.map_err(|source| MountError::Session {
        path: mountpoint.to_path_buf(),
        source,
    })?;
    closed.map_err(MountError::Close)
}

/// Sets the readahead of the mount at `mountpoint` through its backing device info in sysfs
/// (root only; FUSE itself can only lower the kernel's 128 KiB default). It first waits for a
/// `statfs` through the mount to return: the kernel applies the FUSE handshake's readahead
/// limit when the handshake completes, which would undo an earlier change.
fn set_readahead(mountpoint: &Path, bytes: u32) -> std::io::Result<()> {
    rustix::fs::statvfs(mountpoint)?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let dev = compfs_mount_device(&info, mountpoint)
        .ok_or_else(|| std::io::Error::other("the mount is not in /proc/self/mountinfo"))?;
    std::fs::write(
        format!("/sys/class/bdi/{dev}/read_ahead_kb"),
        format!("{}\n", bytes / 1024),
    )
}

/// Why `compfs umount` failed.
#[derive(Debug, thiserror::Error)]
pub enum UnmountError {
    #[error("{} is not a compfs mount point (see /proc/self/mountinfo)", .0.display())]
    NotMounted(PathBuf),
    #[error("cannot unmount {p}: it is busy; close the files and shells using it (`fuser -m {p}` lists them)", p = .0.display())]
    Busy(PathBuf),
    #[error("cannot unmount {}: {err}", path.display())]
    Unmount { path: PathBuf, err: io::Error },
    #[error("running fusermount3 (install the fuse3 package): {0}")]
    NoFusermount(io::Error),
    #[error("fusermount3 -u {} failed", .0.display())]
    Fusermount(PathBuf),
    #[error("waiting for store {}: {err}", store.display())]
    Wait { store: PathBuf, err: io::Error },
    #[error("unmounted {}, but its daemon still holds store {} after {secs} s; it may still be writing back", mountpoint.display(), store.display())]
    StillServing {
        mountpoint: PathBuf,
        store: PathBuf,
        secs: u64,
    },
}

/// Unmounts the compfs mount at `mountpoint`, then waits up to `timeout` until its daemon has
/// made everything durable and closed the store. Plain `umount` returns as soon as the kernel
/// detaches the mount: the kernel does not wait for a FUSE daemon (see
/// [`compfs_store::serve_lock`]), so the final flush and durable commit may still be running.
pub fn unmount_and_wait(mountpoint: &Path, timeout: Duration) -> Result<(), UnmountError> {
    let Some(store) = mounted_store(mountpoint) else {
        return Err(UnmountError::NotMounted(mountpoint.to_path_buf()));
    };
    if rustix::process::geteuid().is_root() {
        match rustix::mount::unmount(mountpoint, rustix::mount::UnmountFlags::empty()) {
            Ok(()) => {}
            Err(rustix::io::Errno::BUSY) => {
                return Err(UnmountError::Busy(mountpoint.to_path_buf()))
            }
            Err(e) => {
                return Err(UnmountError::Unmount {
                    path: mountpoint.to_path_buf(),
                    err: e.into(),
                })
            }
        }
    } else {
        let st = std::process::Command::new("fusermount3")
            .arg("-u")
            .arg(mountpoint)
            .status()
            .map_err(UnmountError::NoFusermount)?;
        if !st.success() {
            return Err(UnmountError::Fusermount(mountpoint.to_path_buf()));
        }
    }
    let closed =
        compfs_store::wait_until_released(&store, timeout).map_err(|err| UnmountError::Wait {
            store: store.clone(),
            err,
        })?;
    if !closed {
        return Err(UnmountError::StillServing {
            mountpoint: mountpoint.to_path_buf(),
            store,
            secs: timeout.as_secs(),
        });
    }
    Ok(())
}

/// The `mount(2)` flags of `mount -o remount,OPTS` for a mount whose `statvfs` flags are
/// `current`: what the options name changes, everything else stays (a remount replaces all
/// per-mount flags, so leaving out `nosuid` would switch setuid on). Other options are
/// ignored (they stay as mounted).
pub fn remount_flags(current: u64, opts: &[&str]) -> libc::c_ulong {
    let keep = [
        (libc::ST_RDONLY, libc::MS_RDONLY),
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_SYNCHRONOUS, libc::MS_SYNCHRONOUS),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ];
    let mut flags = libc::MS_REMOUNT;
    for (st, ms) in keep {
        if current & st != 0 {
            flags |= ms;
        }
    }
    for o in opts {
        let (set, clear) = match *o {
            "ro" => (libc::MS_RDONLY, 0),
            "rw" => (0, libc::MS_RDONLY),
            "nosuid" => (libc::MS_NOSUID, 0),
            "suid" => (0, libc::MS_NOSUID),
            "nodev" => (libc::MS_NODEV, 0),
            "dev" => (0, libc::MS_NODEV),
            "noexec" => (libc::MS_NOEXEC, 0),
            "exec" => (0, libc::MS_NOEXEC),
            "sync" => (libc::MS_SYNCHRONOUS, 0),
            "async" => (0, libc::MS_SYNCHRONOUS),
            "noatime" => (libc::MS_NOATIME, 0),
            "atime" => (0, libc::MS_NOATIME),
            "nodiratime" => (libc::MS_NODIRATIME, 0),
            "diratime" => (0, libc::MS_NODIRATIME),
            "relatime" => (libc::MS_RELATIME, libc::MS_STRICTATIME),
            "lazytime" => (libc::MS_LAZYTIME, 0),
            "nolazytime" => (0, libc::MS_LAZYTIME),
            "strictatime" => (libc::MS_STRICTATIME, libc::MS_RELATIME),
            // Everything else mount(8) passes along again (the FUSE options of the
            // superblock, user_id=, allow_other, and the options it recorded at mount time,
            // compress= included) stays as mounted: the daemon's options do not change.
            _ => (0, 0),
        };
        flags = (flags | set) & !clear;
    }
    flags
}

/// `mount -o remount,...` of the compfs mount at `mountpoint` (through `mount.fuse.compfs`):
/// changes ro/rw and the kernel's per-mount flags (compfs's own options stay as mounted).
/// Before going read-only everything is made
/// durable (fsync of the root is a store sync); the kernel then refuses every modifying call
/// with EROFS while open files stay readable. A store mounted `ro` was opened read-only: after
/// `remount,rw` its writes still fail with EROFS (unmount and mount it rw).
pub fn remount(mountpoint: &Path, lists: &[String]) -> Result<(), MountError> {
    let fail = |detail: String| MountError::MountPoint {
        path: mountpoint.to_path_buf(),
        detail,
    };
    if mounted_store(mountpoint).is_none() {
        return Err(fail("not a compfs mount".into()));
    }
    let opts: Vec<&str> = lists
        .iter()
        .flat_map(|l| l.split(','))
        .map(str::trim)
        .filter(|o| *o != "remount")
        .collect();
    let path = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| fail("path contains a NUL byte".into()))?;
    // SAFETY: statvfs is plain data filled by the call.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out pointer.
    if unsafe { libc::statvfs(path.as_ptr(), &mut sv) } != 0 {
        return Err(fail(format!("statvfs: {}", io::Error::last_os_error())));
    }
    let mut flags = remount_flags(sv.f_flag, &opts);
    // statvfs does not report lazytime, and a remount clears what it does not set: keep it
    // (as ext4 does) unless `nolazytime` is given. (mount(8) 2.38 passes neither `lazytime`
    // nor `nolazytime` to a helper: those come from other callers.)
    let lazy = std::fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|info| compfs_mount_super_has(&info, mountpoint, "lazytime"));
    if opts.contains(&"nolazytime") {
        flags &= !libc::MS_LAZYTIME;
    } else if lazy || opts.contains(&"lazytime") {
        flags |= libc::MS_LAZYTIME;
    }
    if flags & libc::MS_RDONLY != 0 {
        // Everything written so far becomes durable before the mount turns read-only.
        let root = std::fs::File::open(mountpoint).map_err(|e| fail(format!("open: {e}")))?;
        root.sync_all()
            .map_err(|e| fail(format!("sync before remount: {e}")))?;
    }
    // SAFETY: valid C string; a remount takes no source, type or data.
    let r = unsafe {
        libc::mount(
            std::ptr::null(),
            path.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(fail(format!("remount: {}", io::Error::last_os_error())));
    }
    Ok(())
}

/// The store served by the compfs mount at `mountpoint` (from the mount source `compfs:STORE`
/// in /proc/self/mountinfo), if it is one.
pub fn mounted_store(mountpoint: &Path) -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    compfs_mount_field(&info, mountpoint, |_, source| {
        let s = unescape_mountinfo(source);
        let s = s.strip_prefix(b"compfs:")?;
        Some(PathBuf::from(std::ffi::OsStr::from_bytes(s)))
    })
}

/// The device (`major:minor`) of the compfs mount at `path` in `mountinfo` text (the last one
/// when mounts are stacked).
fn compfs_mount_device(info: &str, path: &Path) -> Option<String> {
    compfs_mount_field(info, path, |dev, _| Some(dev.to_string()))
}

/// `pick(device, source)` of the last compfs mount at `path` in `mountinfo` text.
fn compfs_mount_field<T>(
    info: &str,
    path: &Path,
    pick: impl Fn(&str, &str) -> Option<T>,
) -> Option<T> {
    let canon = path.canonicalize().ok()?;
    let want = canon.as_os_str().as_encoded_bytes();
    info.lines().rev().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut f = left.split(' ');
        let dev = f.nth(2)?;
        let mp = unescape_mountinfo(f.nth(1)?);
        let mut r = right.split(' ');
        let fstype = r.next()?;
        let source = r.next()?;
        if fstype == "fuse.compfs" && mp == want {
            pick(dev, source)
        } else {
            None
        }
    })
}

/// Whether the superblock options of the compfs mount at `path` in `mountinfo` text name
/// `opt` (e.g. `lazytime`).
fn compfs_mount_super_has(info: &str, path: &Path, opt: &str) -> bool {
    let Ok(canon) = path.canonicalize() else {
        return false;
    };
    let want = canon.as_os_str().as_encoded_bytes();
    info.lines()
        .rev()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mp = unescape_mountinfo(left.split(' ').nth(4)?);
            let mut r = right.split(' ');
            let fstype = r.next()?;
            let sb_opts = r.nth(1)?;
            (fstype == "fuse.compfs" && mp == want).then(|| sb_opts.split(',').any(|o| o == opt))
        })
        .unwrap_or(false)
}

/// Is `path` currently a compfs FUSE mount point? Reads /proc/self/mountinfo.
pub fn is_compfs_mount(path: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|info| compfs_mount_device(&info, path).is_some())
}

/// Is the file system with device number `dev` (`st_dev`) a compfs mount?
pub fn is_on_compfs(dev: u64) -> bool {
    let want = format!("{}:{}", rustix::fs::major(dev), rustix::fs::minor(dev));
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|info| {
        info.lines().any(|l| {
            let Some((left, right)) = l.split_once(" - ") else {
                return false;
            };
            left.split(' ').nth(2) == Some(want.as_str())
                && right.split(' ').next() == Some("fuse.compfs")
        })
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_device_from_mountinfo() {
        let p = std::env::temp_dir().canonicalize().unwrap();
        let esc = p.display().to_string().replace(' ', "\\040");
        let info = format!(
            "36 35 98:0 / {esc} rw,noatime - ext4 /dev/x rw\n\
             40 36 0:52 / {esc} rw,nosuid - fuse.compfs /s rw,user_id=0\n\
             41 36 0:53 / /elsewhere rw - fuse.compfs /t rw\n"
        );
        assert_eq!(compfs_mount_device(&info, &p).as_deref(), Some("0:52"));
        assert_eq!(
            compfs_mount_field(&info, &p, |_, src| Some(src.to_string())).as_deref(),
            Some("/s")
        );
        assert_eq!(compfs_mount_device("garbage\n\n- -", &p), None);
        assert_eq!(
            compfs_mount_device(&info, Path::new("/nonexistent/x")),
            None
        );
    }

    #[test]
    fn mountinfo_unescape() {
        assert_eq!(unescape_mountinfo("/mnt/a\\040b"), b"/mnt/a b");
        assert_eq!(unescape_mountinfo("/x\\134y"), b"/x\\y");
        assert_eq!(unescape_mountinfo("/trail\\04"), b"/trail\\04");
        assert_eq!(unescape_mountinfo("/bad\\09x"), b"/bad\\09x");
    }

    #[test]
    fn config_reflects_options() {
        let o = MountOptions::parse(&["allow_other,ro,fuse_threads=2,noexec"]).unwrap();
        let c = fuse_config(Path::new("/s"), &o);
        assert_eq!(c.acl, SessionACL::All);
        assert_eq!(c.n_threads, Some(2));
        assert!(c.mount_options.contains(&MountOption::RO));
        assert!(c.mount_options.contains(&MountOption::NoExec));
        assert!(c.mount_options.contains(&MountOption::DefaultPermissions));
        assert!(c
            .mount_options
            .contains(&MountOption::FSName("compfs:/s".into())));
        let c = fuse_config(Path::new("/s"), &MountOptions::default());
        assert_eq!(c.acl, SessionACL::Owner);
        let oo = open_options(&MountOptions::parse(&["cache=1M,threads=3"]).unwrap());
        assert_eq!((oo.cache_bytes, oo.threads), (1 << 20, 3));
    }

    #[test]
    fn remount_keeps_the_flags_it_is_not_told_to_change() {
        let cur = libc::ST_NOSUID | libc::ST_NODEV | libc::ST_RELATIME;
        let f = remount_flags(cur, &["ro", "user_id=0", "compress=zstd"]);
        assert_eq!(
            f,
            libc::MS_REMOUNT
                | libc::MS_RDONLY
                | libc::MS_NOSUID
                | libc::MS_NODEV
                | libc::MS_RELATIME
        );
        let f = remount_flags(cur | libc::ST_RDONLY, &["rw", "dev"]);
        assert_eq!(f, libc::MS_REMOUNT | libc::MS_NOSUID | libc::MS_RELATIME);
        assert_eq!(remount_flags(0, &[]), libc::MS_REMOUNT);
    }
}
