//! Background recompression: targets from the mount and the inherited property, the delay,
//! figures, remount, and the worker thread on its own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use compfs_store::*;

fn spec(s: &str) -> CodecSpec {
    CodecSpec::parse(s).unwrap().spec
}

fn bg(s: Option<&str>, delay_secs: u64) -> BackgroundPolicy {
    BackgroundPolicy {
        spec: s.map(spec),
        delay: Duration::from_secs(delay_secs),
    }
}

/// A store written with compress-force=zstd:1: a text file, an incompressible one, an inline
/// one, and a text file in directory `d`.
fn store_at_zstd1(dir: &Path, t: Tuning, p: BackgroundPolicy) -> (Store, Vec<(Ino, Vec<u8>)>) {
    let opts = CreateOptions {
        extent_size: 16384,
        compression: spec("zstd:1"),
        mode: Mode::Force,
        ..CreateOptions::default()
    };
    let s = Store::create_tuned(dir, &opts, t).unwrap();
    s.set_background(p);
    let d = s.mkdir(ROOT_INO, b"d", 0o755, 0, 0).map(|a| a.ino).unwrap();
    let files = [
        (ROOT_INO, "text", pattern(300_000, 1)),
        (ROOT_INO, "random", random(100_000, 2)),
        (
            ROOT_INO,
            "small",
            b"inline data, inline data, inline data".to_vec(),
        ),
        (d, "more", pattern(200_000, 3)),
    ];
    let mut out = Vec::new();
    for (parent, name, data) in files {
        let ino = mkfile(&s, parent, name);
        s.write(ino, 0, &data).unwrap();
        out.push((ino, data));
    }
    s.sync().unwrap();
    (s, out)
}

fn check(s: &Store, files: &[(Ino, Vec<u8>)]) {
    for (ino, want) in files {
        assert!(&read_all(s, *ino).unwrap() == want, "inode {ino} differs");
    }
}

fn levels(s: &Store, inos: &[Ino]) -> Vec<String> {
    s.usage(inos).unwrap().per_level.into_keys().collect()
}

/// The codec:level rows of `compfs usage` other than raw ("none": tails and blocks that the
/// codec does not shrink by a sector stay raw).
fn compressed_levels(s: &Store, inos: &[Ino]) -> Vec<String> {
    levels(s, inos)
        .into_iter()
        .filter(|l| l != "none")
        .collect()
}

#[test]
fn mount_target_rewrites_cold_files_once() {
    let dir = tempfile::tempdir().unwrap();
    let (s, files) = store_at_zstd1(&dir.path().join("s"), tuning(), bg(Some("zstd:9"), 0));
    let before = s.usage(&[ROOT_INO]).unwrap();
    assert!(before.per_level.contains_key("zstd:1"), "{before:?}");
    let st = s.background_pass().unwrap();
    assert_eq!(st.passes, 1);
    assert!(st.extents_done > 0 && st.bytes_done > 0, "{st:?}");
    assert!(st.bytes_saved > 0, "{st:?}");
    assert_eq!((st.extents_pending, st.files_pending), (0, 0), "{st:?}");
    assert_eq!(st, s.stats().background);
    let after = s.usage(&[ROOT_INO]).unwrap();
    assert!(!after.per_level.contains_key("zstd:1"), "{after:?}");
    assert!(after.per_level.contains_key("zstd:9"), "{after:?}");
    assert!(after.total.disk < before.total.disk);
    check(&s, &files);
    // A second pass finds nothing: the random file's raw extents were tried once.
    let again = s.background_pass().unwrap();
    assert_eq!(again.extents_done, st.extents_done, "{again:?}");
    assert_eq!(again.passes, 2);
    s.close().unwrap();
    assert_clean(&dir.path().join("s"));
}

#[test]
fn delay_keeps_recent_files_pending() {
    let dir = tempfile::tempdir().unwrap();
    let (s, files) = store_at_zstd1(&dir.path().join("s"), tuning(), bg(Some("zstd:9"), 3600));
    let st = s.background_pass().unwrap();
    assert_eq!(st.extents_done, 0, "{st:?}");
    assert_eq!(st.files_pending, 4, "{st:?}");
    assert!(
        st.extents_pending >= 4 && st.bytes_pending > 600_000,
        "{st:?}"
    );
    assert!(levels(&s, &[ROOT_INO]).contains(&"zstd:1".to_string()));
    check(&s, &files);
}

#[test]
fn property_is_validated_inherited_and_overrides_the_mount() {
    let dir = tempfile::tempdir().unwrap();
    let (s, files) = store_at_zstd1(&dir.path().join("s"), tuning(), bg(None, 0));
    let d = s.lookup(ROOT_INO, b"d").unwrap().ino;
    assert!(matches!(
        s.setxattr(d, BACKGROUND_XATTR, b"brotli", XattrSet::Any),
        Err(Error::InvalidArgument(_))
    ));
    s.setxattr(d, BACKGROUND_XATTR, b"zstd:7", XattrSet::Any)
        .unwrap();
    assert_eq!(s.background_compression(d).unwrap(), Some(spec("zstd:7")));
    // New files in d inherit it; the file written before keeps none.
    let newer = mkfile(&s, d, "newer");
    assert_eq!(
        s.background_compression(newer).unwrap(),
        Some(spec("zstd:7"))
    );
    let more = files[3].0;
    assert_eq!(s.background_compression(more).unwrap(), None);
    s.setxattr(more, BACKGROUND_XATTR, b"zstd:7", XattrSet::Any)
        .unwrap();
    // Without a mount target only `more` has work.
    let st = s.background_pass().unwrap();
    assert!(st.extents_done > 0, "{st:?}");
    assert_eq!(compressed_levels(&s, &[more]), ["zstd:7"]);
    assert!(levels(&s, &[files[0].0]).contains(&"zstd:1".to_string()));
    // The property wins over the mount's target; an empty value clears it.
    s.set_background(bg(Some("zstd:3"), 0));
    s.background_pass().unwrap();
    assert_eq!(compressed_levels(&s, &[more]), ["zstd:7"]);
    assert_eq!(compressed_levels(&s, &[files[0].0]), ["zstd:3"]);
    s.setxattr(more, BACKGROUND_XATTR, b"", XattrSet::Any)
        .unwrap();
    assert_eq!(s.background_compression(more).unwrap(), None);
    s.background_pass().unwrap();
    assert_eq!(compressed_levels(&s, &[more]), ["zstd:3"]);
    check(&s, &files);
}

#[test]
fn remount_recomputes_what_is_left() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s");
    let (s, files) = store_at_zstd1(&p, tuning(), bg(None, 0));
    // Half the work: only the file with the property.
    s.setxattr(files[0].0, BACKGROUND_XATTR, b"zstd:9", XattrSet::Any)
        .unwrap();
    s.background_pass().unwrap();
    s.close().unwrap();
    let opts = OpenOptions {
        background: bg(Some("zstd:9"), 3600),
        ..OpenOptions::default()
    };
    let s = Store::open_tuned(&p, &opts, tuning()).unwrap();
    assert_eq!(s.stats().background, BackgroundStats::default());
    let st = s.background_pass().unwrap();
    // The first file is done; the other three are pending (and not yet cold).
    assert_eq!(st.files_pending, 3, "{st:?}");
    assert_eq!(compressed_levels(&s, &[files[0].0]), ["zstd:9"]);
    s.set_background(bg(Some("zstd:9"), 0));
    let st = s.background_pass().unwrap();
    assert_eq!(st.files_pending, 0, "{st:?}");
    check(&s, &files);
    s.close().unwrap();
    assert_clean(&p);
}

#[test]
fn worker_thread_waits_while_busy_and_finishes_once_idle() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tuning {
        flush_interval: Some(Duration::from_millis(200)),
        ..tuning()
    };
    let (s, files) = store_at_zstd1(&dir.path().join("s"), t, bg(None, 0));
    let s = std::sync::Arc::new(s);
    // A reader keeps the store busy: the worker must not start.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (s, stop, ino) = (s.clone(), stop.clone(), files[0].0);
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                s.read(ino, 0, &mut buf).unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    s.set_background(bg(Some("zstd:9"), 0));
    std::thread::sleep(Duration::from_millis(1500));
    let st = s.stats().background;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    reader.join().unwrap();
    assert_eq!(
        st.extents_done, 0,
        "worked while the store was busy: {st:?}"
    );
    let start = Instant::now();
    loop {
        let st = s.stats().background;
        if st.passes > 0 && st.files_pending == 0 && st.extents_done > 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "background worker did not finish: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!levels(&s, &[ROOT_INO]).contains(&"zstd:1".to_string()));
    check(&s, &files);
}
