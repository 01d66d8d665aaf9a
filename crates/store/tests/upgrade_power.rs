//! Power cuts during a format upgrade: the frozen version-1 and version-2 stores are opened
//! for writing (which upgrades them to the current version before anything else is written),
//! then a file is written and fsynced, while a [`PowerCut`] recorder takes images at about
//! every seam operation. Every image must pass fsck, open read-only as either the old or the
//! current version with every fixture file intact (nothing of the old store is lost at any
//! point of the upgrade), hold the new file once its fsync was acknowledged, and open for
//! writing (finishing the upgrade) with fsck clean after.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use compfs_store::backend::FaultBackend;
use compfs_store::powercut::{CutImage, PowerCut};
use compfs_store::*;

/// What a store holds, by path: file bytes, symlink targets (prefixed `->`), and xattrs.
type Tree = BTreeMap<String, Vec<u8>>;

fn tree(s: &Store) -> Tree {
    let mut out = Tree::new();
    let mut todo = vec![(ROOT_INO, String::new())];
    while let Some((dir, path)) = todo.pop() {
        for e in s.readdir(dir, 0, usize::MAX).unwrap() {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let p = format!("{path}/{}", String::from_utf8_lossy(&e.name));
            for x in s.listxattr(e.ino).unwrap() {
                let v = s.getxattr(e.ino, &x).unwrap();
                out.insert(format!("{p}@{}", String::from_utf8_lossy(&x)), v);
            }
            match e.kind {
                FileKind::Dir => todo.push((e.ino, p)),
                FileKind::File => {
                    out.insert(p, read_all(s, e.ino).unwrap());
                }
                FileKind::Symlink => {
                    let mut t = b"->".to_vec();
                    t.extend(s.readlink(e.ino).unwrap());
                    out.insert(p, t);
                }
                _ => {}
            }
        }
    }
    out
}

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn read_only() -> OpenOptions {
    OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    }
}

/// One run over fixture `name` (format `version`); returns the images checked.
fn run(name: &str, version: u32, seed: u64) -> usize {
    // In memory where there is /dev/shm: every image is fscked and opened twice, and the
    // store's fsyncs on a disk would make up most of the time.
    let shm = Path::new("/dev/shm");
    let t = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let dir = t.path().join("store");
    copy_dir(&fixture(name), &dir);
    let want = {
        let s = Store::open(&dir, &read_only()).unwrap();
        assert_eq!(s.superblock().version, version);
        let w = tree(&s);
        s.close().unwrap();
        w
    };
    assert!(want.len() >= 5, "{name}: {want:?}");
    let new_data = pattern(40_000, seed);
    let pc = PowerCut::new(&dir, &t.path().join("images"), seed, 1, 400).unwrap();
    let tuning = Tuning {
        backend: Arc::new(FaultBackend::with_power_cut(pc.clone())),
        meta_faults: Some(FaultBackend::with_power_cut(pc.clone())),
        flush_interval: None,
        ..Tuning::default()
    };
    let s = Store::open_tuned(&dir, &OpenOptions::default(), tuning).unwrap();
    assert_eq!(s.superblock().version, format::FORMAT_VERSION);
    let upgraded_at = pc.ops();
    let a = s
        .mknod(ROOT_INO, b"after-upgrade", FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    s.open_file(a.ino).unwrap();
    s.write(a.ino, 0, &new_data).unwrap();
    s.fsync(a.ino, false).unwrap();
    let acked_at = pc.ops();
    s.close().unwrap();
    pc.stop();
    let images = pc.images();
    assert!(
        images.iter().any(|i| i.op < upgraded_at),
        "{name}: no cut fell inside the upgrade ({upgraded_at} operations)"
    );
    for img in &images {
        check(name, version, img, &want, &new_data, acked_at);
    }
    images.len()
}

fn check(name: &str, version: u32, img: &CutImage, want: &Tree, new_data: &[u8], acked: u64) {
    let ctx = format!("{name} cut at op {} ({:?})", img.op, img.mode);
    let r = fsck(&img.dir, false, &mut |_, _| {}).unwrap();
    assert_eq!(r.errors(), 0, "{ctx}: fsck {:#?}", r.problems);
    let s = Store::open(&img.dir, &read_only()).unwrap();
    let v = s.superblock().version;
    assert!(
        v == version || v == format::FORMAT_VERSION,
        "{ctx}: version {v}"
    );
    let mut got = tree(&s);
    s.close().unwrap();
    let new = got.remove("/after-upgrade");
    for (k, w) in want {
        assert!(got.get(k) == Some(w), "{ctx}: {k} differs or is missing");
    }
    assert_eq!(got.len(), want.len(), "{ctx}: unexpected entries");
    match &new {
        Some(d) => assert!(
            d.is_empty() || d[..] == new_data[..],
            "{ctx}: after-upgrade holds {} bytes never written as a whole",
            d.len()
        ),
        None => assert!(img.op < acked, "{ctx}: the fsynced file is missing"),
    }
    if img.op >= acked {
        assert!(new.as_deref() == Some(new_data), "{ctx}: fsynced data lost");
    }
    // Opened for writing, the image finishes (or redoes) the upgrade and takes writes.
    let s = Store::open(&img.dir, &OpenOptions::default()).unwrap();
    assert_eq!(s.superblock().version, format::FORMAT_VERSION, "{ctx}");
    let b = s
        .mknod(ROOT_INO, b"later", FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    s.write(b.ino, 0, b"later").unwrap();
    s.close().unwrap();
    let r = fsck(&img.dir, false, &mut |_, _| {}).unwrap();
    assert_eq!(
        r.errors(),
        0,
        "{ctx}: fsck after reopening {:#?}",
        r.problems
    );
    let s = Store::open(&img.dir, &read_only()).unwrap();
    let mut got = tree(&s);
    s.close().unwrap();
    assert_eq!(
        got.remove("/later").as_deref(),
        Some(&b"later"[..]),
        "{ctx}"
    );
    got.remove("/after-upgrade");
    assert!(&got == want, "{ctx}: the fixture changed after reopening");
}

#[test]
fn power_cuts_during_the_upgrade_lose_nothing() {
    let mut n = 0;
    for (i, (name, version)) in [("v1", 1), ("v2", 2)].into_iter().enumerate() {
        n += run(name, version, 1 + i as u64);
    }
    println!("upgrade power cuts: {n} images checked");
    assert!(n >= 30, "only {n} images");
}
