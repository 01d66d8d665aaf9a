//! Background recompression on a FUSE mount: `background_compression=` and `background_delay=`,
//! the inherited `background_compression` property, the figures in `compfs stats`, a remount.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod fs_common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use compfs_store::Mode;
use fs_common::*;

fn tree() -> BTreeMap<&'static str, Vec<u8>> {
    BTreeMap::from([
        ("a/text", compfs_testdata::text(600 << 10, 1)),
        ("a/random", compfs_testdata::random(200 << 10, 2)),
        ("b/more", compfs_testdata::text(300 << 10, 3)),
        (
            "small",
            b"a small inline file, a small inline file".to_vec(),
        ),
    ])
}

fn check_tree(root: &Path, t: &BTreeMap<&str, Vec<u8>>) {
    for (p, v) in t {
        assert!(fs::read(root.join(p)).unwrap() == *v, "{p} differs");
    }
}

/// The figures of a `compfs stats` line such as `background pending       5 extents, ...`.
fn stats_numbers(mnt: &Path, prefix: &str) -> Vec<f64> {
    let (ok, out, err) = compfs(&["stats", mnt.to_str().unwrap()]);
    assert!(ok, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no '{prefix}' line in {out}"));
    line[prefix.len()..]
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|w| w.parse().ok())
        .collect()
}

/// Waits until the background worker finished a pass with nothing left pending.
fn wait_idle_done(mnt: &Path) -> Vec<f64> {
    let start = Instant::now();
    loop {
        let pending = stats_numbers(mnt, "background pending");
        let done = stats_numbers(mnt, "background done");
        // done: extents, MiB, MiB saved, passes
        if pending[0] == 0.0 && done[3] > 0.0 {
            return done;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "background recompression did not finish: pending {pending:?} done {done:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn usage_rows(p: &Path) -> Vec<String> {
    let (ok, out, err) = compfs(&["usage", "-b", p.to_str().unwrap()]);
    assert!(ok, "{err}");
    out.lines()
        .skip(2)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn mount_option_rewrites_cold_files_and_survives_a_remount() {
    require_fuse!();
    let t = TempDir::new("bg-mnt");
    let store = t.path().join("store");
    mkstore(&store, "zstd:1", Mode::Force, 128 << 10);
    let mnt = t.path().join("mnt");
    let opts = "compress-force=zstd:1,background_compression=zstd:9,background_delay=1";
    let files = tree();
    {
        let m = Mount::new(&store, &mnt, opts);
        for (p, v) in &files {
            let p = m.mnt.join(p);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, v).unwrap();
        }
        let before = usage_rows(&m.mnt);
        let done = wait_idle_done(&m.mnt);
        assert!(done[0] > 0.0, "nothing rewritten: {done:?}");
        let after = usage_rows(&m.mnt);
        assert!(before.contains(&"zstd:1".to_string()), "{before:?}");
        assert!(!after.contains(&"zstd:1".to_string()), "{after:?}");
        assert!(after.contains(&"zstd:9".to_string()), "{after:?}");
        check_tree(&m.mnt, &files);
        assert!(m.unmount().success());
    }
    // After a remount the worker finds nothing left (recomputed from the extents' levels).
    let m = Mount::new(&store, &mnt, opts);
    let start = Instant::now();
    while stats_numbers(&m.mnt, "background done")[3] == 0.0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no pass after remount"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(stats_numbers(&m.mnt, "background done")[0], 0.0);
    assert_eq!(stats_numbers(&m.mnt, "background pending")[0], 0.0);
    check_tree(&m.mnt, &files);
    assert!(m.unmount().success());
}

#[test]
fn property_is_inherited_and_used_without_the_mount_option() {
    require_fuse!();
    let t = TempDir::new("bg-prop");
    let store = t.path().join("store");
    mkstore(&store, "zstd:1", Mode::Force, 128 << 10);
    let m = Mount::new(&store, &t.path().join("mnt"), "background_delay=1");
    let d = m.path("d");
    let other = m.path("other");
    fs::create_dir(&d).unwrap();
    fs::create_dir(&other).unwrap();
    let ds = d.to_str().unwrap();
    let (ok, _, err) = compfs(&["property", "set", ds, "background_compression", "brotli"]);
    assert!(!ok && err.contains("background_compression"), "{err}");
    let (ok, _, err) = compfs(&["property", "set", ds, "background_compression", "zstd:7"]);
    assert!(ok, "{err}");
    let (_, out, _) = compfs(&["property", "get", ds, "background_compression"]);
    assert_eq!(out.trim(), "background_compression=zstd:7");
    assert_eq!(
        setxattr(&d, "compfs.background_compression", b"nonsense", 0),
        Err(libc::EINVAL)
    );
    let data = compfs_testdata::text(400 << 10, 5);
    fs::write(d.join("f"), &data).unwrap();
    fs::write(other.join("f"), &data).unwrap();
    assert_eq!(
        getxattr(&d.join("f"), "compfs.background_compression").unwrap(),
        b"zstd:7"
    );
    wait_idle_done(&m.mnt);
    assert!(usage_rows(&d).contains(&"zstd:7".to_string()));
    assert!(!usage_rows(&d).contains(&"zstd:1".to_string()));
    assert_eq!(
        usage_rows(&other)
            .into_iter()
            .filter(|r| r.contains(':'))
            .collect::<Vec<_>>(),
        vec!["zstd:1".to_string()]
    );
    assert!(fs::read(d.join("f")).unwrap() == data);
    assert!(m.unmount().success());
}

#[test]
fn kill9_during_background_work_loses_nothing_and_the_next_mount_finishes() {
    require_fuse!();
    let t = TempDir::new("bg-crash");
    let store = t.path().join("store");
    let mnt = t.path().join("mnt");
    mkstore(&store, "zstd:1", Mode::Force, 128 << 10);
    let files: Vec<(String, Vec<u8>)> = (0..24)
        .map(|i| {
            let mut v = compfs_testdata::text(640 << 10, i + 10);
            v.extend(compfs_testdata::random(64 << 10, i + 100));
            (format!("d{}/f{i}", i % 3), v)
        })
        .collect();
    {
        let m = Mount::new(&store, &mnt, "");
        for (p, v) in &files {
            fs::create_dir_all(m.mnt.join(p).parent().unwrap()).unwrap();
            fs::write(m.mnt.join(p), v).unwrap();
        }
        assert!(m.unmount().success());
    }
    let check = |root: &Path| {
        for (p, v) in &files {
            assert!(fs::read(root.join(p)).unwrap() == *v, "{p} differs");
        }
    };
    let opts = "background_compression=zstd:9,background_delay=0";
    let m = Mount::new(&store, &mnt, opts);
    // Kill the daemon once the worker has written its first extents.
    let deadline = Instant::now() + Duration::from_secs(60);
    while written(&m.mnt) == 0 {
        assert!(Instant::now() < deadline, "the worker wrote nothing");
        std::thread::sleep(Duration::from_millis(5));
    }
    m.kill9();
    let r = compfs_store::fsck(&store, false, &mut |_, _| {}).unwrap();
    assert!(r.is_clean(), "fsck after kill -9: {:?}", r.problems);
    {
        // The kill came before the end: extents are still at zstd:1 (those rewritten after the
        // last durable commit went back to their old extents, which were still referenced).
        let ro = compfs_store::OpenOptions {
            read_only: true,
            ..compfs_store::OpenOptions::default()
        };
        let s = compfs_store::Store::open(&store, &ro).unwrap();
        let u = s.usage(&[compfs_store::ROOT_INO]).unwrap();
        assert!(
            u.per_level.contains_key("zstd:1"),
            "not cut short: {:?}",
            u.per_level.keys()
        );
        s.close().unwrap();
    }
    let m = Mount::new(&store, &mnt, opts);
    check(&m.mnt);
    wait_idle_done(&m.mnt);
    let rows = usage_rows(&m.mnt);
    assert!(!rows.contains(&"zstd:1".to_string()), "{rows:?}");
    check(&m.mnt);
    assert!(m.unmount().success());
}
