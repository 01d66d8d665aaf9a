//! Shared harness of the FUSE integration tests: unique temp dirs, store creation, a mount guard
//! that always unmounts (even when the test panics), and small syscall helpers.
#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used)]

use std::ffi::CString;
use std::io::{BufRead, BufReader};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use compfs_store::{CodecSpec, CreateOptions, Mode, Store};

pub const BIN: &str = env!("CARGO_BIN_EXE_compfs");

/// Returns a reason to skip when FUSE mounting is impossible here (never the case in CI).
pub fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (CI runs these tests as root)".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse is missing".into());
    }
    if Command::new("fusermount3").arg("-V").output().is_err() {
        return Some("fusermount3 missing (scripts/deps.sh installs fuse3)".into());
    }
    None
}

#[macro_export]
macro_rules! require_fuse {
    () => {
        if let Some(r) = fs_common::skip_reason() {
            eprintln!("SKIPPED: {r}");
            return;
        }
    };
}

/// A unique temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let p = std::env::temp_dir().join(format!(
            "compfs-test-{tag}-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Creates a store in `dir` with the given default policy and extent size.
pub fn mkstore(dir: &Path, spec: &str, mode: Mode, extent: u32) {
    let opts = CreateOptions {
        extent_size: extent,
        compression: CodecSpec::parse(spec).unwrap().spec,
        mode,
        force: false,
    };
    Store::create(dir, &opts).unwrap().close().unwrap();
}

/// Is `mnt` a mount point right now?
pub fn is_mounted(mnt: &Path) -> bool {
    let canon = mnt.canonicalize().unwrap_or_else(|_| mnt.to_path_buf());
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = canon.to_string_lossy().replace(' ', "\\040");
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

/// A running `compfs mount --foreground` daemon; unmounts and reaps it on drop.
pub struct Mount {
    pub store: PathBuf,
    pub mnt: PathBuf,
    pub child: Option<Child>,
}

impl Mount {
    /// Mounts `store` on `mnt` with `-o opts` and waits until the mount is usable.
    pub fn new(store: &Path, mnt: &Path, opts: &str) -> Mount {
        Mount::with_args(store, mnt, opts, &[])
    }

    /// Like [`Mount::new`] with extra `compfs mount` arguments (e.g. `--log FILE`).
    pub fn with_args(store: &Path, mnt: &Path, opts: &str, extra: &[&str]) -> Mount {
        std::fs::create_dir_all(mnt).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.arg("mount")
            .arg(store)
            .arg(mnt)
            .arg("--foreground")
            .arg("--notify-ready");
        if !opts.is_empty() {
            cmd.arg("-o").arg(opts);
        }
        cmd.args(extra);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn compfs mount");
        let out = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line).unwrap();
        let m = Mount {
            store: store.to_path_buf(),
            mnt: mnt.to_path_buf(),
            child: Some(child),
        };
        assert_eq!(
            line.trim(),
            "ready",
            "mount of {} did not come up",
            store.display()
        );
        assert!(is_mounted(mnt), "{} not in mountinfo", mnt.display());
        m
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Clean unmount; waits for the daemon to close the store. Returns its exit status.
    pub fn unmount(mut self) -> std::process::ExitStatus {
        self.unmount_inner().expect("daemon already reaped")
    }

    fn unmount_inner(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while is_mounted(&self.mnt) {
            let ok = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.mnt)
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                break;
            }
            if Instant::now() > deadline {
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                return Some(st);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// kill -9 the daemon (crash test), then clear the dead mount.
    pub fn kill9(mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg("-z")
            .arg(&self.mnt)
            .stderr(Stdio::null())
            .status();
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.unmount_inner();
        }
    }
}

/// Runs the compfs binary; returns (success, stdout, stderr).
pub fn compfs(args: &[&str]) -> (bool, String, String) {
    let o = Command::new(BIN).args(args).output().unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

pub fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

pub fn getxattr(p: &Path, name: &str) -> Result<Vec<u8>, i32> {
    let (cp, cn) = (cstr(p), CString::new(name).unwrap());
    let mut buf = vec![0u8; 65536];
    // SAFETY: valid strings and buffer.
    let n =
        unsafe { libc::lgetxattr(cp.as_ptr(), cn.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(errno());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

pub fn setxattr(p: &Path, name: &str, v: &[u8], flags: i32) -> Result<(), i32> {
    let (cp, cn) = (cstr(p), CString::new(name).unwrap());
    // SAFETY: valid strings and value.
    let r = unsafe { libc::lsetxattr(cp.as_ptr(), cn.as_ptr(), v.as_ptr().cast(), v.len(), flags) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

/// Incompressible and compressible text-like bytes (the shared generators).
pub use compfs_testdata::{random as random_bytes, text as text_bytes};

/// Segment bytes written since the daemon started (`compfs.stats` on the root; reading it is
/// not foreground activity).
pub fn written(mnt: &Path) -> u64 {
    let rec = getxattr(mnt, "compfs.stats").unwrap();
    let s = String::from_utf8(rec).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("segment_bytes_written "))
        .unwrap()
        .parse()
        .unwrap()
}

/// `compfs defrag` of `file` on a mount to `compress-force=zstd:9`, run as the tool runs it
/// (the request, and the daemon's running figures polled meanwhile): the bytes examined in all,
/// and `bytes_examined` of each poll, in order.
pub fn defrag_to_zstd9_polling(file: &Path) -> (u64, Vec<u64>) {
    let plan = compfs_fs::defrag_run::plan(&[file.to_path_buf()], false).unwrap();
    let target = compfs_store::DefragTarget {
        spec: Some(CodecSpec::parse("zstd:9").unwrap().spec),
        level: None,
        force: true,
        extent_size: None,
    };
    let seen = std::sync::Mutex::new(Vec::new());
    let total = compfs_fs::defrag_run::run(
        plan,
        &target,
        &|r| seen.lock().unwrap().push(r.bytes_examined),
        &mut |e| panic!("{e}"),
    );
    (total.bytes_examined, seen.into_inner().unwrap())
}
