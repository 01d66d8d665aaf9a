//! Many writers and readers at once, with GC compacting concurrently: every file ends with the
//! content its writer produced, reads never see torn or foreign data, and fsck is clean.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use compfs_store::*;

#[test]
fn writers_readers_and_gc_at_once() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let tun = Tuning {
        segment_size: 128 << 10,
        flush_blocks: 4,
        flush_interval: Some(std::time::Duration::from_millis(20)),
        ..Tuning::default()
    };
    let s = Arc::new(create(&dir, 16384, tun.clone()));
    let stop = Arc::new(AtomicBool::new(false));
    let gc = {
        let (s, stop) = (s.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut runs = 0;
            while !stop.load(Ordering::Relaxed) {
                s.gc().unwrap();
                runs += 1;
            }
            runs
        })
    };
    let mut handles = Vec::new();
    for w in 0..4u64 {
        let s = s.clone();
        handles.push(std::thread::spawn(move || {
            let ino = mkfile(&s, ROOT_INO, &format!("w{w}"));
            let mut model = Vec::new();
            for round in 0..30u64 {
                // Overwrite the whole file with a new version, then check it while others run.
                let len = 20_000 + ((round * 7919 + w * 104729) % 120_000) as usize;
                let data = pattern(len, w * 1000 + round);
                s.write(ino, 0, &data).unwrap();
                s.setattr(
                    ino,
                    &SetAttr {
                        size: Some(len as u64),
                        ..Default::default()
                    },
                )
                .unwrap();
                model = data;
                let got = read_all(&s, ino).unwrap();
                assert_eq!(got, model, "writer {w} round {round}");
                if round % 5 == 0 {
                    s.fsync(ino, false).unwrap();
                }
            }
            (ino, model)
        }));
    }
    let results: Vec<(Ino, Vec<u8>)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    let runs = gc.join().unwrap();
    assert!(runs > 0);
    for (ino, want) in &results {
        assert_eq!(&read_all(&s, *ino).unwrap(), want);
    }
    let st = s.stats();
    assert!(st.gc_runs > 0);
    let s = Arc::try_unwrap(s).ok().unwrap();
    s.close().unwrap();
    assert_clean(&dir);
    // After a final GC the segments hold little more than the live data.
    let s = open(&dir, tuning());
    s.gc().unwrap();
    let st = s.stats();
    for (ino, want) in &results {
        assert_eq!(&read_all(&s, *ino).unwrap(), want);
    }
    assert!(
        st.segment_bytes <= st.live_bytes + st.live_bytes / 2 + (256 << 10),
        "{st:?}"
    );
    s.close().unwrap();
    assert_clean(&dir);
}

/// Small files closed in quick succession go to the writeback thread, which commits them in
/// batches; meanwhile other threads unlink some right after closing them (an unlink's
/// transaction reads open counts while a batch holds file locks and waits for redb's write
/// lock: this deadlocked before open counts left the file lock), reopen and extend others,
/// and read everything. Contents must match at every step and after reopening; fsck clean.
#[test]
fn small_files_written_back_in_batches_while_unlinked_and_extended() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let tun = Tuning {
        flush_interval: Some(std::time::Duration::from_millis(50)),
        ..Tuning::default()
    };
    let s = Arc::new(create(&dir, 128 << 10, tun.clone()));
    let mut handles = Vec::new();
    for w in 0..3u64 {
        let s = s.clone();
        handles.push(std::thread::spawn(move || {
            let mut kept = Vec::new();
            for i in 0..300u64 {
                let name = format!("w{w}-{i}");
                let len = ((i * 7919 + w * 104_729) % 20_000) as usize;
                let data = pattern(len, w * 1000 + i);
                let a = s
                    .mknod(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, 0, 0, 0)
                    .unwrap();
                s.open_file(a.ino).unwrap();
                s.write(a.ino, 0, &data).unwrap();
                s.release(a.ino).unwrap();
                if i % 7 == 3 {
                    s.unlink(ROOT_INO, name.as_bytes()).unwrap();
                    assert!(matches!(s.getattr(a.ino), Err(Error::NotFound)));
                    continue;
                }
                let mut want = data;
                if i % 5 == 1 {
                    s.open_file(a.ino).unwrap();
                    s.write(a.ino, want.len() as u64, b"appended").unwrap();
                    s.release(a.ino).unwrap();
                    want.extend_from_slice(b"appended");
                }
                assert_eq!(read_all(&s, a.ino).unwrap(), want, "{name}");
                kept.push((name, want));
            }
            kept
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.join().unwrap());
    }
    s.sync().unwrap();
    drop(s);
    let s = open(&dir, tun);
    for (name, want) in &all {
        let a = s.lookup(ROOT_INO, name.as_bytes()).unwrap();
        assert_eq!(&read_all(&s, a.ino).unwrap(), want, "{name} after reopen");
    }
    assert_eq!(
        s.readdir(ROOT_INO, 0, usize::MAX).unwrap().len(),
        all.len() + 2
    );
    drop(s);
    assert_clean(&dir);
}

/// A closed file whose last batches are still being compressed needs no flusher, `sync` or
/// later write to be committed: the writeback thread commits them as they complete, so the
/// buffers are free for the next file (the flusher is off here).
#[test]
fn closed_files_batches_are_committed_without_a_flush() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let s = create(&dir, 16384, tuning());
    let mut files = Vec::new();
    for f in 0..3u64 {
        let ino = mkfile(&s, ROOT_INO, &format!("f{f}"));
        s.open_file(ino).unwrap();
        let data = pattern(60 * 16384 + 123, f);
        for (i, c) in data.chunks(16384).enumerate() {
            s.write(ino, i as u64 * 16384, c).unwrap();
        }
        assert!(
            s.stats().dirty_bytes > 0,
            "file {f} all committed before its close"
        );
        s.release(ino).unwrap();
        files.push((ino, data));
    }
    let start = std::time::Instant::now();
    while s.stats().dirty_bytes > 0 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "{} bytes still buffered after the files were closed",
            s.stats().dirty_bytes
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    for (ino, data) in &files {
        assert_eq!(&read_all(&s, *ino).unwrap(), data);
    }
    s.close().unwrap();
    let s = open(&dir, tuning());
    for (ino, data) in &files {
        assert_eq!(&read_all(&s, *ino).unwrap(), data);
    }
    s.close().unwrap();
    assert_clean(&dir);
}
