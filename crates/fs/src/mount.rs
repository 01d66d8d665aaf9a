//! Mounting: open the store with the mount options, start a multithreaded FUSE session, serve
//! until unmounted (or SIGTERM/SIGINT/SIGHUP, which unmount), then close the store durably.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use compfs_store::{OpenOptions, Store};
use fuser::{Config, MountOption, Session, SessionACL};

use crate::adapter::CompFs;
use crate::options::{KernelFlag, MountOptions};

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
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
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
    for f in &o.flags {
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
    cfg
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
    let md = std::fs::metadata(mountpoint).map_err(|e| MountError::MountPoint {
        path: mountpoint.to_path_buf(),
        detail: e.to_string(),
    })?;
    if !md.is_dir() {
        return Err(MountError::MountPoint {
            path: mountpoint.to_path_buf(),
            detail: "not a directory".to_string(),
        });
    }
    let store = Arc::new(store);
    let fs = CompFs::new(store.clone());
    let cfg = fuse_config(store_dir, o);
    let mut session = Session::new(fs, mountpoint, &cfg).map_err(|source| MountError::Fuse {
        path: mountpoint.to_path_buf(),
        source,
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

/// Is `path` currently a compfs FUSE mount point? Reads /proc/self/mountinfo.
pub fn is_compfs_mount(path: &Path) -> bool {
    let Ok(canon) = path.canonicalize() else {
        return false;
    };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    info.lines().any(|l| {
        let mut halves = l.splitn(2, " - ");
        let (Some(left), Some(right)) = (halves.next(), halves.next()) else {
            return false;
        };
        let mp = left.split(' ').nth(4).map(unescape_mountinfo);
        let fstype = right.split(' ').next();
        fstype == Some("fuse.compfs") && mp.as_deref() == Some(canon.as_os_str().as_encoded_bytes())
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
}
