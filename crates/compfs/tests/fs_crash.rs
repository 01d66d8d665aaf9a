//! Crash test at filesystem level: copy a tree in, kill -9 the daemon mid-copy, remount: files
//! fsync'd before the kill are intact and fsck is clean.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod fs_common;

use std::fs::{self, File};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use compfs_store::Mode;
use fs_common::*;

fn content(i: usize) -> Vec<u8> {
    let mut v = text_bytes(96 << 10, i as u64 + 1);
    v.extend_from_slice(&random_bytes(40 << 10, i as u64 + 1000));
    v
}

#[test]
fn kill9_mid_copy_keeps_fsynced_files() {
    require_fuse!();
    let t = TempDir::new("crash");
    let store = t.path().join("store");
    let mnt = t.path().join("mnt");
    mkstore(&store, "zstd:3", Mode::Heuristic, 128 << 10);
    let m = Mount::new(&store, &mnt, "compress=zstd:1");

    // Phase 1: files that are fsync'd (file and directory) before the crash.
    fs::create_dir_all(m.path("tree/durable")).unwrap();
    for i in 0..40 {
        let mut f = File::create(m.path(&format!("tree/durable/f{i}"))).unwrap();
        f.write_all(&content(i)).unwrap();
        f.sync_all().unwrap();
    }
    File::open(m.path("tree/durable"))
        .unwrap()
        .sync_all()
        .unwrap();

    // Phase 2: a copy in progress (no fsync), killed in the middle.
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicUsize::new(0));
    let writer = {
        let (dir, stop, written) = (m.path("tree/inflight"), stop.clone(), written.clone());
        std::thread::spawn(move || {
            if fs::create_dir_all(&dir).is_err() {
                return;
            }
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                if fs::write(dir.join(format!("g{i}")), content(i + 500)).is_err() {
                    return;
                }
                written.fetch_add(1, Ordering::SeqCst);
                i += 1;
            }
        })
    };
    while written.load(Ordering::SeqCst) < 30 {
        std::thread::sleep(Duration::from_millis(10));
    }
    m.kill9();
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();

    // The store is consistent and the durable files are intact.
    let report = compfs_store::fsck(&store, false, &mut |_, _| {}).unwrap();
    assert!(
        report.is_clean(),
        "fsck after kill -9: {:?}",
        report.problems
    );
    let m = Mount::new(&store, &mnt, "");
    for i in 0..40 {
        assert_eq!(
            fs::read(m.path(&format!("tree/durable/f{i}"))).unwrap(),
            content(i),
            "f{i}"
        );
    }
    // Whatever survived of the in-flight copy is readable and either complete or a prefix
    // that is all-or-nothing per extent — never garbage.
    if let Ok(rd) = fs::read_dir(m.path("tree/inflight")) {
        for e in rd {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let i: usize = name[1..].parse().unwrap();
            let got = fs::read(e.path()).unwrap();
            let want = content(i + 500);
            assert!(got.len() <= want.len(), "{name} grew");
            let same = got.iter().zip(&want).filter(|(a, b)| a == b).count();
            let zeros = got
                .iter()
                .zip(&want)
                .filter(|(a, b)| a != b && **a == 0)
                .count();
            assert_eq!(
                same + zeros,
                got.len(),
                "{name} holds bytes that were never written"
            );
        }
    }
    // New writes work after recovery.
    fs::write(m.path("after"), b"ok").unwrap();
    assert!(m.unmount().success());
    let report = compfs_store::fsck(&store, false, &mut |_, _| {}).unwrap();
    assert!(
        report.is_clean(),
        "fsck after remount: {:?}",
        report.problems
    );
}
