//! `mount -t fuse.compfs STORE MNT -o ...`, fstab entries, and `umount`, through the
//! `mount.fuse.compfs` helper (a link to the compfs binary), plus the detaching `compfs mount`.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod fs_common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use compfs_store::Mode;
use fs_common::*;

/// Installs /sbin/mount.fuse.compfs -> the compfs binary under test for the guard's lifetime
/// (mount(8) only looks in /sbin, /sbin/fs.d and /sbin/fs).
struct Helper {
    /// What the link pointed to before (restored on drop), or None if we created it.
    previous: Option<PathBuf>,
    installed: bool,
}

const HELPER: &str = "/sbin/mount.fuse.compfs";

impl Helper {
    fn install() -> Option<Helper> {
        let p = Path::new(HELPER);
        let previous = match fs::read_link(p) {
            Ok(target) if target == Path::new(BIN) => {
                return Some(Helper {
                    previous: None,
                    installed: false,
                })
            }
            // A link to another compfs build (e.g. left by an interrupted run): borrow it.
            Ok(target) => Some(target),
            Err(_) if p.exists() => {
                eprintln!("SKIPPED: {HELPER} exists and is not a symlink");
                return None;
            }
            Err(_) => None,
        };
        let _ = fs::remove_file(p);
        std::os::unix::fs::symlink(BIN, p).unwrap();
        Some(Helper {
            previous,
            installed: true,
        })
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        if self.installed {
            let _ = fs::remove_file(HELPER);
            if let Some(prev) = &self.previous {
                let _ = std::os::unix::fs::symlink(prev, HELPER);
            }
        }
    }
}

/// Unmounts with umount(8) and waits until the detached daemon has released the store.
fn umount_and_wait(mnt: &Path, store: &Path) {
    let st = Command::new("umount").arg(mnt).status().unwrap();
    assert!(st.success());
    assert!(!is_mounted(mnt));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let o = compfs_store::OpenOptions {
            read_only: true,
            ..Default::default()
        };
        match compfs_store::Store::open(store, &o) {
            Ok(s) => {
                s.close().unwrap();
                return;
            }
            Err(compfs_store::Error::InUse(_)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("store not reopenable after umount: {e}"),
        }
    }
}

/// Unmounts whatever is left if an assertion fails.
struct Cleanup<'a>(&'a Path);
impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if is_mounted(self.0) {
            let _ = Command::new("umount").arg("-l").arg(self.0).status();
        }
    }
}

#[test]
fn mount_t_fuse_compfs_fstab_and_umount() {
    require_fuse!();
    if Command::new("mount").arg("-V").output().is_err() {
        eprintln!("SKIPPED: mount(8) missing");
        return;
    }
    let Some(_helper) = Helper::install() else {
        return;
    };
    let t = TempDir::new("helper");
    let store = t.path().join("store");
    let mnt = t.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    mkstore(&store, "zstd:3", Mode::Heuristic, 128 << 10);
    let _c = Cleanup(&mnt);

    // mount -t fuse.compfs with btrfs options
    let o = Command::new("mount")
        .args(["-t", "fuse.compfs", "-o", "compress-force=zlib:1,noatime"])
        .arg(&store)
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "mount -t fuse.compfs: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(is_mounted(&mnt));
    let line = fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .find(|l| l.contains(mnt.to_str().unwrap()))
        .unwrap()
        .to_string();
    assert!(line.contains("fuse.compfs"), "{line}");
    assert!(
        line.starts_with(&format!(
            "compfs:{}",
            store.canonicalize().unwrap().display()
        )),
        "{line}"
    );
    let data = text_bytes(600 << 10, 5);
    fs::write(mnt.join("f"), &data).unwrap();
    let (ok, out, _) = compfs(&["usage", "-b", mnt.join("f").to_str().unwrap()]);
    assert!(ok && out.lines().any(|l| l.starts_with("zlib ")), "{out}");
    umount_and_wait(&mnt, &store);

    // fstab entry (mount -T uses an alternative fstab file)
    let fstab = t.path().join("fstab");
    fs::write(
        &fstab,
        format!(
            "{} {} fuse.compfs compress=lzo,noauto,cache=16M,lazytime 0 0\n",
            store.display(),
            mnt.display()
        ),
    )
    .unwrap();
    let o = Command::new("mount")
        .arg("-T")
        .arg(&fstab)
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "mount via fstab: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // everything written before umount is there
    assert_eq!(fs::read(mnt.join("f")).unwrap(), data);
    fs::write(mnt.join("g"), text_bytes(300 << 10, 6)).unwrap();
    let (ok, out, _) = compfs(&["usage", "-b", mnt.join("g").to_str().unwrap()]);
    assert!(ok && out.lines().any(|l| l.starts_with("lzo ")), "{out}");

    // mount -o remount,ro / remount,rw (issue 13): read-only refuses every change with EROFS,
    // an open file stays readable, the other flags (nosuid, nodev) stay
    let remount = |how: &str| {
        let o = Command::new("mount")
            .args(["-o", &format!("remount,{how}")])
            .arg(&mnt)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "mount -o remount,{how}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    let flags = |p: &Path| {
        let c = cstr(p);
        // SAFETY: statvfs is plain data; valid path.
        let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut sv) }, 0);
        sv.f_flag
    };
    let open_file = fs::File::open(mnt.join("f")).unwrap();
    // lazytime reaches the kernel (a superblock option, as on ext4) and stays over remounts
    let lazy = || {
        let canon = mnt.canonicalize().unwrap();
        let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line = info
            .lines()
            .rev()
            .find(|l| l.split(' ').nth(4) == canon.to_str())
            .unwrap()
            .to_string();
        let sb = line.split(" - ").nth(1).unwrap().split(' ').nth(2).unwrap();
        sb.split(',').any(|o| o == "lazytime")
    };
    assert!(lazy(), "lazytime not passed to the kernel");
    remount("ro");
    assert!(lazy(), "remount,ro lost lazytime");
    let f = flags(&mnt);
    assert_ne!(f & libc::ST_RDONLY, 0);
    assert_ne!(f & libc::ST_NOSUID, 0, "remount lost nosuid");
    assert_ne!(f & libc::ST_NODEV, 0, "remount lost nodev");
    let erofs = |r: std::io::Result<()>| {
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EROFS));
    };
    erofs(fs::write(mnt.join("new"), "x"));
    erofs(fs::write(mnt.join("f"), "x"));
    erofs(fs::remove_file(mnt.join("g")));
    erofs(fs::create_dir(mnt.join("d")));
    assert_eq!(std::io::Read::bytes(&open_file).count(), data.len());
    assert_eq!(fs::read(mnt.join("f")).unwrap(), data);
    remount("rw");
    assert_eq!(flags(&mnt) & libc::ST_RDONLY, 0);
    // (`remount,nolazytime` cannot be tested here: mount(8) does not pass it to the helper.)
    assert!(lazy(), "remount,rw lost lazytime");
    fs::write(mnt.join("new"), "x").unwrap();
    fs::remove_file(mnt.join("new")).unwrap();
    drop(open_file);
    umount_and_wait(&mnt, &store);

    // bad options fail the mount with a clear message and leave nothing mounted
    let o = Command::new("mount")
        .args(["-t", "fuse.compfs", "-o", "compress=brotli"])
        .arg(&store)
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("brotli"));
    assert!(!is_mounted(&mnt));

    // compfs mount without --foreground detaches once the mount is ready
    let (ok, _, err) = compfs(&[
        "mount",
        store.to_str().unwrap(),
        mnt.to_str().unwrap(),
        "-o",
        "compress=zstd:1",
    ]);
    assert!(ok, "{err}");
    assert!(is_mounted(&mnt));
    assert_eq!(fs::read(mnt.join("f")).unwrap(), data);
    umount_and_wait(&mnt, &store);
    // mounting a non-store fails clearly
    let (ok, _, err) = compfs(&["mount", mnt.to_str().unwrap(), mnt.to_str().unwrap()]);
    assert!(!ok && err.contains("not a compfs store"), "{err}");
}
