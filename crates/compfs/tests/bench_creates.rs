//! `compfs bench creates`: the create/stat/unlink phases on compfs, the null FUSE filesystem
//! and kernel btrfs; checks the JSON rows and the printed ratios, and that nothing is left
//! mounted. Needs root and FUSE (CI has both). Runs over /dev/fuse: turning the kernel's
//! `enable_uring` on here would change the transport of every other test's mounts.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod fs_common;

use fs_common::*;

#[test]
fn rows_for_compfs_the_fuse_floor_and_btrfs() {
    require_fuse!();
    let t = TempDir::new("creates");
    let json = t.path().join("rows.json");
    let work = t.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let (ok, out, err) = compfs(&[
        "bench",
        "creates",
        "--files",
        "300",
        "--rounds",
        "2",
        "--transport",
        "dev",
        "--json",
        json.to_str().unwrap(),
        "--workdir",
        work.to_str().unwrap(),
    ]);
    assert!(ok, "bench creates failed\nstdout:\n{out}\nstderr:\n{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["transport"], "dev");
    let rows = v["rows"].as_array().unwrap();
    let fs: Vec<&str> = rows.iter().map(|r| r["fs"].as_str().unwrap()).collect();
    assert_eq!(fs, ["compfs", "null", "btrfs", "compfs", "null", "btrfs"]);
    for r in rows {
        assert_eq!(r["files"], 300);
        for k in ["creates_per_s", "stats_per_s", "unlinks_per_s"] {
            assert!(r[k].as_f64().unwrap() > 0.0, "{k}: {r}");
        }
    }
    for line in ["compfs / btrfs", "null / btrfs", "compfs / null"] {
        assert!(out.contains(line), "no {line:?} in\n{out}");
    }
    // Nothing is left mounted or behind in the work directory.
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.contains(work.to_str().unwrap()), "{mounts}");
    let left: Vec<_> = std::fs::read_dir(&work).unwrap().collect();
    assert!(left.is_empty(), "left in the work directory: {left:?}");
}

#[test]
fn an_unknown_filesystem_is_one_clear_line() {
    let (ok, _out, err) = compfs(&["bench", "creates", "--fs", "compfs,ext9"]);
    assert!(!ok);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("ext9") && err.contains("known: compfs, null, btrfs"),
        "{err}"
    );
}
