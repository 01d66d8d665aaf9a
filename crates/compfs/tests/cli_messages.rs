//! The messages a new user meets first: each names the real problem in one line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fs_common;

use std::path::{Path, PathBuf};
use std::process::Command;

use compfs_store::Mode;
use fs_common::{compfs, is_mounted, mkstore, TempDir, BIN};

/// A mount made by `compfs mount` without --foreground (the detached daemon), cleared on drop
/// even when the test fails.
struct Detached(PathBuf);

impl Drop for Detached {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let _ = Command::new(BIN)
                .args(["umount", "--timeout", "30"])
                .arg(&self.0)
                .status();
        }
        if is_mounted(&self.0) {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&self.0)
                .status();
        }
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_missing_mount_point_is_reported_as_missing() {
    let t = TempDir::new("msg-mnt");
    let store = t.path().join("store");
    mkstore(&store, "zstd:1", Mode::Heuristic, 128 << 10);
    let missing = t.path().join("no-such-dir");
    let (ok, _, err) = compfs(&["mount", s(&store), s(&missing)]);
    assert!(!ok);
    assert!(err.contains("does not exist"), "{err}");
    assert!(!err.contains("not a directory"), "{err}");
    let file = t.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let (ok, _, err) = compfs(&["mount", s(&store), s(&file)]);
    assert!(!ok);
    assert!(err.contains("not a directory"), "{err}");
}

#[test]
fn negative_sizes_get_one_clear_line() {
    let (ok, _, err) = compfs(&["blk", "serve", "--size", "-5G"]);
    assert!(!ok);
    assert_eq!(
        err.trim(),
        "compfs: bad size '-5G': a size cannot be negative"
    );
    let t = TempDir::new("msg-size");
    let store = t.path().join("store");
    let (ok, _, err) = compfs(&["mkfs", s(&store), "--extent-size", "-64K"]);
    assert!(!ok);
    assert!(err.contains("a size cannot be negative"), "{err}");
    assert!(!err.contains("unexpected argument"), "{err}");
}

#[test]
fn usage_of_a_plain_directory_names_that_directory() {
    let t = TempDir::new("msg-usage");
    let dir = t.path().join("plain");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub").join("inner-file"), b"data").unwrap();
    let (ok, _, err) = compfs(&["usage", s(&dir)]);
    assert!(!ok);
    assert!(
        err.contains(&format!("{} is not on a mounted compfs", dir.display())),
        "{err}"
    );
    assert!(!err.contains("inner-file"), "{err}");
    // An empty directory is no different.
    let empty = t.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let (ok, _, err) = compfs(&["usage", s(&empty)]);
    assert!(!ok);
    assert!(err.contains("is not on a mounted compfs"), "{err}");
}

#[test]
fn level_warning_once_and_tools_on_a_mounted_store_say_unmount_first() {
    require_fuse!();
    let t = TempDir::new("msg-mounted");
    let store = t.path().join("store");
    let mnt = t.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    mkstore(&store, "zstd:1", Mode::Heuristic, 128 << 10);
    let log = t.path().join("daemon.log");
    let _guard = Detached(mnt.clone());
    let (ok, _, err) = compfs(&[
        "mount",
        s(&store),
        s(&mnt),
        "-o",
        "compress=zstd:25",
        "--log",
        s(&log),
    ]);
    assert!(ok, "{err}");
    assert!(is_mounted(&mnt));
    assert_eq!(
        err.matches("level 25").count(),
        1,
        "warned more than once: {err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    for tool in ["fsck", "gc"] {
        let (ok, _, err) = compfs(&[tool, s(&store)]);
        assert!(!ok, "{tool} ran on a mounted store");
        assert!(err.contains("unmount it first"), "{tool}: {err}");
    }
    let (ok, _, err) = compfs(&["umount", s(&mnt)]);
    assert!(ok, "{err}");
    assert!(!is_mounted(&mnt));
}
