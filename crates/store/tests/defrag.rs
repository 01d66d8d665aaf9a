//! `Store::defrag`: recompression to a codec and level, skipping what is already there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use compfs_store::*;

fn spec(s: &str) -> CodecSpec {
    CodecSpec::parse(s).unwrap().spec
}

fn z(level: i32) -> DefragTarget {
    DefragTarget {
        spec: Some(spec(&format!("zstd:{level}"))),
        level: None,
        force: false,
        extent_size: None,
    }
}

/// A store written at zstd:1 holding a compressible file, an incompressible one, a mixed one
/// (compressible blocks after a random one), and an inline file.
fn store_at_zstd1() -> (tempfile::TempDir, Store, Vec<(Ino, Vec<u8>)>) {
    let dir = tempfile::tempdir().unwrap();
    let opts = CreateOptions {
        extent_size: 16384,
        compression: spec("zstd:1"),
        ..CreateOptions::default()
    };
    let s = Store::create(&dir.path().join("s"), &opts).unwrap();
    let mut mixed = random(40_000, 7);
    mixed.extend(pattern(200_000, 8));
    let files = [
        ("text", pattern(300_000, 1)),
        ("random", random(100_000, 2)),
        ("mixed", mixed),
        ("small", b"inline data, inline data, inline data".to_vec()),
    ];
    let mut out = Vec::new();
    for (name, data) in files {
        let a = s
            .mknod(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, 0, 0, 0)
            .unwrap();
        s.write(a.ino, 0, &data).unwrap();
        out.push((a.ino, data));
    }
    s.sync().unwrap();
    (dir, s, out)
}

fn defrag_all(s: &Store, files: &[(Ino, Vec<u8>)], t: &DefragTarget) -> DefragReport {
    let mut total = DefragReport::default();
    for (ino, _) in files {
        let mut last = DefragReport::default();
        let r = s.defrag(*ino, t, &mut |p| last = *p).unwrap();
        assert_eq!(last.bytes_examined, r.bytes_examined, "final progress call");
        total.add(&r);
    }
    total
}

#[test]
fn second_identical_run_rewrites_nothing_and_data_is_identical() {
    let (_d, s, files) = store_at_zstd1();
    let before = s.usage(&[ROOT_INO]).unwrap();
    assert!(before.per_level.contains_key("zstd:1"), "{before:?}");
    let r = defrag_all(&s, &files, &z(9));
    assert_eq!(r.files, 4);
    assert!(r.extents_rewritten > 0, "{r:?}");
    assert_eq!(r.extents_examined, r.extents_rewritten + r.extents_skipped);
    // Raw random extents stay raw: the heuristic (or the codec) would not shrink them.
    assert!(r.extents_skipped > 0, "{r:?}");
    assert!(r.disk_after <= r.disk_before, "{r:?}");
    for (ino, want) in &files {
        assert_eq!(&read_all(&s, *ino).unwrap(), want);
    }
    let after = s.usage(&[ROOT_INO]).unwrap();
    assert!(!after.per_level.contains_key("zstd:1"), "{after:?}");
    assert!(after.per_level.contains_key("zstd:9"), "{after:?}");
    assert_eq!(after.total.referenced, before.total.referenced);
    // Second identical run: nothing rewritten, nothing changes on disk.
    let seg = s.stats().segment_bytes_written;
    let r2 = defrag_all(&s, &files, &z(9));
    assert_eq!(r2.extents_rewritten, 0, "{r2:?}");
    assert_eq!(r2.bytes_rewritten, 0);
    assert_eq!(r2.extents_examined, r2.extents_skipped);
    assert_eq!(r2.disk_before, r2.disk_after);
    assert_eq!(s.stats().segment_bytes_written, seg);
    // Same with --force: raw extents are tried and still not rewritten.
    let forced = DefragTarget {
        force: true,
        ..z(9)
    };
    assert_eq!(defrag_all(&s, &files, &forced).extents_rewritten, 0);
    // A different level rewrites again; --nocomp stores everything raw, then skips.
    assert!(defrag_all(&s, &files, &z(3)).extents_rewritten > 0);
    let raw = DefragTarget {
        spec: Some(CodecSpec::none()),
        level: None,
        force: false,
        extent_size: None,
    };
    assert!(defrag_all(&s, &files, &raw).extents_rewritten > 0);
    assert_eq!(defrag_all(&s, &files, &raw).extents_rewritten, 0);
    let u = s.usage(&[ROOT_INO]).unwrap();
    assert_eq!(
        u.per_level.keys().collect::<Vec<_>>(),
        vec!["none"],
        "{u:?}"
    );
    for (ino, want) in &files {
        assert_eq!(&read_all(&s, *ino).unwrap(), want);
    }
}

#[test]
fn level_alone_applies_to_the_files_own_codec_and_survives_reopen() {
    let (d, s, files) = store_at_zstd1();
    let t = DefragTarget {
        spec: None,
        level: Some(7),
        force: false,
        extent_size: None,
    };
    assert!(defrag_all(&s, &files, &t).extents_rewritten > 0);
    s.close().unwrap();
    let s = Store::open(&d.path().join("s"), &OpenOptions::default()).unwrap();
    let u = s.usage(&[ROOT_INO]).unwrap();
    assert!(u.per_level.contains_key("zstd:7"), "{u:?}");
    assert!(!u.per_level.contains_key("zstd:1"), "{u:?}");
    assert_eq!(defrag_all(&s, &files, &t).extents_rewritten, 0);
    for (ino, want) in &files {
        assert_eq!(&read_all(&s, *ino).unwrap(), want);
    }
}

#[test]
fn gc_reclaims_the_old_extents() {
    let (d, s, files) = store_at_zstd1();
    defrag_all(&s, &files, &z(9));
    s.sync().unwrap();
    let st = s.stats();
    assert!(
        st.segment_bytes > st.live_bytes,
        "old extents are garbage: {st:?}"
    );
    let g = s.gc().unwrap();
    assert!(
        g.segments_freed >= 1 && g.bytes_after < g.bytes_before,
        "{g:?}"
    );
    let st = s.stats();
    // What is left besides live extents is segment headers (one segment now).
    let garbage = st.segment_bytes - st.live_bytes;
    assert!(
        garbage <= format::SEG_HEADER_LEN,
        "{garbage} bytes not reclaimed: {st:?}"
    );
    s.close().unwrap();
    let r = fsck(&d.path().join("s"), false, &mut |_, _| {}).unwrap();
    assert!(r.is_clean(), "{:#?}", r.problems);
    let s = Store::open(&d.path().join("s"), &OpenOptions::default()).unwrap();
    for (ino, want) in &files {
        assert_eq!(&read_all(&s, *ino).unwrap(), want);
    }
}

#[test]
fn directories_are_refused() {
    let (_d, s, _) = store_at_zstd1();
    let dir = s.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap();
    assert!(s.defrag(dir.ino, &z(9), &mut |_| {}).is_err());
}

/// Writes (inside the file and past its end) while defrag runs over and over: every write is
/// kept (a block changed between defrag's read and its commit is left as the writer made it),
/// and the store stays consistent.
#[test]
fn writes_during_defrag_are_kept() {
    let (d, s, _) = store_at_zstd1();
    let f = s
        .mknod(ROOT_INO, b"busy", FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    let mut model = pattern(1 << 20, 42);
    s.write(f.ino, 0, &model).unwrap();
    s.sync().unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    let targets = [z(9), z(1), z(5)];
    let runs = std::thread::scope(|sc| {
        let defragger = sc.spawn(|| {
            let mut n = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) || n < 3 {
                s.defrag(f.ino, &targets[n % 3], &mut |_| {}).unwrap();
                n += 1;
            }
            n
        });
        let mut x = 7u64;
        for i in 0..400u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = 1 + (x % 40_000) as usize;
            let off = ((x >> 20) % (model.len() as u64 + 20_000)) as usize;
            let buf = pattern(len, 1000 + i);
            if model.len() < off + len {
                model.resize(off + len, 0);
            }
            model[off..off + len].copy_from_slice(&buf);
            s.write(f.ino, off as u64, &buf).unwrap();
            if i % 50 == 0 {
                s.fsync(f.ino, false).unwrap();
            }
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        defragger.join().unwrap()
    });
    assert!(runs >= 3);
    assert!(read_all(&s, f.ino).unwrap() == model);
    // A final run finds only the level it was last asked for or what the writes used.
    s.defrag(f.ino, &z(9), &mut |_| {}).unwrap();
    assert_eq!(
        s.defrag(f.ino, &z(9), &mut |_| {})
            .unwrap()
            .extents_rewritten,
        0
    );
    assert!(read_all(&s, f.ino).unwrap() == model);
    s.close().unwrap();
    let r = fsck(&d.path().join("s"), false, &mut |_, _| {}).unwrap();
    assert!(r.is_clean(), "{:#?}", r.problems);
    let s = Store::open(&d.path().join("s"), &OpenOptions::default()).unwrap();
    let f = s.lookup(ROOT_INO, b"busy").unwrap();
    assert!(read_all(&s, f.ino).unwrap() == model);
}
