//! `compfs mkfs`, `compfs fsck` (e2fsck exit codes) and `compfs gc` on real stores.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use compfs_store::{format, FileKind, OpenOptions, Store, ROOT_INO};

fn compfs(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_compfs"))
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}

fn text(n: usize) -> Vec<u8> {
    compfs_testdata::text(n, 1)
}

/// A unique temporary directory, removed on drop (also when the test fails).
struct TempDir(std::path::PathBuf);
impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let p = std::env::temp_dir().join(format!("compfs-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn mkfs_fsck_repair_gc_exit_codes() {
    let t = TempDir::new("store-cli");
    let dir = t.path().join("store");
    let d = dir.to_str().unwrap();
    let (code, out, _) = compfs(&["mkfs", d, "--extent-size", "64K", "--compress", "zstd:1"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("extent size 64K"), "{out}");
    let (code, _, err) = compfs(&["mkfs", d]);
    assert_eq!(code, 1);
    assert!(err.contains("--force") && err.lines().count() == 1, "{err}");
    let (code, _, err) = compfs(&["mkfs", d, "--extent-size", "3K", "--force"]);
    assert_eq!(code, 1, "{err}");

    {
        let s = Store::open(&dir, &OpenOptions::default()).unwrap();
        let f = s
            .mknod(ROOT_INO, b"a", FileKind::File, 0o644, 0, 0, 0)
            .unwrap();
        s.write(f.ino, 0, &text(300_000)).unwrap();
        s.close().unwrap();
    }
    assert_eq!(compfs(&["fsck", d]).0, 0);
    assert_eq!(compfs(&["gc", d]).0, 0);
    flip_one_extent(&dir);
    let (code, out, _) = compfs(&["fsck", d]);
    assert_eq!(code, 4, "{out}");
    assert!(out.contains("CorruptExtent"), "{out}");
    let (code, out, _) = compfs(&["fsck", d, "--repair"]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(compfs(&["fsck", d]).0, 0);
    let other = t.path().join("not-a-store");
    std::fs::create_dir(&other).unwrap();
    let (code, _, err) = compfs(&["fsck", other.to_str().unwrap()]);
    assert_eq!(code, 8);
    assert!(err.contains("not a compfs store"), "{err}");
}

fn flip_one_extent(dir: &Path) {
    let seg = std::fs::read_dir(dir.join(format::SEGMENT_DIR))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut data = std::fs::read(&seg).unwrap();
    let at = format::SEG_HEADER_LEN as usize + format::EXT_HEADER_LEN + 10;
    data[at] ^= 0xff;
    std::fs::write(&seg, data).unwrap();
}
