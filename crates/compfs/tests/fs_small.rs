//! Small files on a real mount (issue 16): the byte-granular worth-it rule and its
//! `worth_it=sector` option, compressed inline data and its own `inline` usage row, all read
//! back exactly after a remount; a version-2 store.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod fs_common;

use std::fs;

use compfs_store::Mode;
use fs_common::*;

/// (first line numbers, rows by name: disk, uncompressed) of `compfs usage -b PATH`.
fn usage(path: &std::path::Path) -> (String, Vec<(String, u64, u64)>) {
    let (ok, out, err) = compfs(&["usage", "-b", path.to_str().unwrap()]);
    assert!(ok, "compfs usage failed: {err}");
    let mut lines = out.lines();
    let head = lines.next().unwrap().to_string();
    let rows = lines
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].to_string(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
            )
        })
        .collect();
    (head, rows)
}

fn row(rows: &[(String, u64, u64)], name: &str) -> Option<(u64, u64)> {
    rows.iter().find(|r| r.0 == name).map(|r| (r.1, r.2))
}

#[test]
fn small_files_compress_byte_by_byte_and_inline() {
    require_fuse!();
    let t = TempDir::new("small");
    let store = t.path().join("store");
    let mnt = t.path().join("mnt");
    mkstore(&store, "zstd:3", Mode::Heuristic, 128 << 10);
    let mid = text_bytes(3000, 21); // above the inline limit, below two sectors
    let tiny = text_bytes(1800, 22); // inline
    {
        // Files stored alone (written in a row, they would share a packed extent otherwise:
        // tests/pack.rs in the store covers packs).
        let m = Mount::new(&store, &mnt, "compress=zstd:3,pack=off");
        fs::write(m.path("mid.txt"), &mid).unwrap();
        fs::write(m.path("tiny.txt"), &tiny).unwrap();
        let (head, rows) = usage(&m.path("mid.txt"));
        assert!(head.contains("1 regular extents"), "{head}");
        let (disk, raw) = row(&rows, "zstd").expect("mid.txt compressed");
        assert!(disk < raw && raw == 3000, "{rows:?}");
        let (head, rows) = usage(&m.path("tiny.txt"));
        assert!(head.ends_with("1 inline."), "{head}");
        let (disk, raw) = row(&rows, "inline").expect("an inline row");
        assert!(disk < raw && raw == 1800, "{rows:?}");
        assert_eq!(row(&rows, "zstd"), Some((disk, raw)));
        assert!(m.unmount().success());
    }
    // btrfs's sector rule on request: the same 3,000 bytes stay raw (one sector either way).
    {
        let m = Mount::new(&store, &mnt, "compress=zstd:3,worth_it=sector,pack=off");
        fs::write(m.path("mid2.txt"), &mid).unwrap();
        let (_, rows) = usage(&m.path("mid2.txt"));
        assert_eq!(row(&rows, "none"), Some((3000, 3000)), "{rows:?}");
        assert_eq!(row(&rows, "zstd"), None, "{rows:?}");
        assert_eq!(fs::read(m.path("mid.txt")).unwrap(), mid);
        assert!(m.unmount().success());
    }
    let (ok, _, err) = compfs(&["fsck", store.to_str().unwrap()]);
    assert!(ok, "{err}");
    let m = Mount::new(&store, &mnt, "ro");
    assert_eq!(fs::read(m.path("mid.txt")).unwrap(), mid);
    assert_eq!(fs::read(m.path("mid2.txt")).unwrap(), mid);
    assert_eq!(fs::read(m.path("tiny.txt")).unwrap(), tiny);
    assert!(m.unmount().success());
    let sb = fs::read(store.join("compfs.super")).unwrap();
    assert_eq!(
        u32::from_le_bytes(sb[8..12].try_into().unwrap()),
        compfs_store::format::FORMAT_VERSION
    );
    // A bad value of the option is refused in one line.
    let (ok, _, err) = compfs(&[
        "mount",
        "-o",
        "worth_it=4k",
        store.to_str().unwrap(),
        mnt.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("worth_it"), "{err}");
}
