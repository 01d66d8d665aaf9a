//! Packed extents (issue 16): small files written together are compressed together into
//! shared extents; overwrites, truncation and unlinks of members, GC, defrag and fsck.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use compfs_store::*;

fn open_with(dir: &std::path::Path, pack: u32) -> Store {
    let o = OpenOptions {
        pack,
        ..OpenOptions::default()
    };
    Store::open_tuned(dir, &o, tuning()).unwrap()
}

fn new_store(dir: &std::path::Path, pack: u32) -> Store {
    create(dir, 131072, tuning()).close().unwrap();
    open_with(dir, pack)
}

/// Contents of small file `i`: text of 600 to 6,000 bytes, some below the inline limit.
fn content(i: usize) -> Vec<u8> {
    pattern(600 + (i * 937) % 5400, i as u64 + 1)
}

/// Writes `n` small files (not opened: they count as closed) and syncs; returns their inodes.
fn write_files(s: &Store, n: usize) -> Vec<Ino> {
    let inos: Vec<Ino> = (0..n)
        .map(|i| {
            let ino = mkfile(s, ROOT_INO, &format!("f{i}"));
            s.write(ino, 0, &content(i)).unwrap();
            ino
        })
        .collect();
    s.sync().unwrap();
    inos
}

fn check_all(s: &Store, inos: &[Ino], want: &dyn Fn(usize) -> Option<Vec<u8>>) {
    for (i, &ino) in inos.iter().enumerate() {
        if let Some(w) = want(i) {
            assert_eq!(read_all(s, ino).unwrap(), w, "file {i}");
        }
    }
}

/// 60 small files synced together take a few extents instead of one each, read back exactly
/// (also after a reopen), are charged a non-zero share each, store in fewer bytes than with
/// `pack=off`, and fsck finds nothing.
#[test]
fn small_files_written_together_share_packed_extents() {
    let t = tempfile::tempdir().unwrap();
    let n = 60;
    let mut disk = Vec::new();
    for pack in [DEFAULT_PACK, 0] {
        let dir = t.path().join(format!("p{pack}"));
        let s = new_store(&dir, pack);
        let inos = write_files(&s, n);
        let u = s.usage(&inos).unwrap();
        if pack > 0 {
            assert_eq!(u.inline, 0, "{u:?}");
            assert_eq!(u.refs, n as u64, "{u:?}");
            assert!(u.regular_extents <= 3, "{u:?}");
            for &ino in &inos {
                assert!(s.getattr(ino).unwrap().blocks > 0);
            }
        } else {
            assert_eq!(u.regular_extents + u.inline, n as u64, "{u:?}");
        }
        disk.push(u.total.disk);
        check_all(&s, &inos, &|i| Some(content(i)));
        s.close().unwrap();
        assert_clean(&dir);
        let s = open_with(&dir, pack);
        check_all(&s, &inos, &|i| Some(content(i)));
        s.close().unwrap();
    }
    assert!(disk[0] < disk[1], "packed {} vs alone {}", disk[0], disk[1]);
}

/// Members overwritten, truncated, extended and unlinked: each drops its reference, the rest
/// read back, GC moves the packs whole, and fsck is clean at every step; once every member is
/// gone the packs are freed.
#[test]
fn members_changed_and_unlinked_then_gc() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let s = new_store(&dir, DEFAULT_PACK);
    let n = 40;
    let inos = write_files(&s, n);
    let before = s.usage(&inos).unwrap();
    assert!(before.regular_extents < n as u64 / 4, "{before:?}");
    // 0: overwritten whole; 1: truncated; 2: extended past a block; 3..10: unlinked.
    let new0 = pattern(2000, 999);
    s.write(inos[0], 0, &new0).unwrap();
    s.setattr(
        inos[1],
        &SetAttr {
            size: Some(100),
            ..Default::default()
        },
    )
    .unwrap();
    let tail = pattern(200_000, 77);
    s.write(inos[2], content(2).len() as u64, &tail).unwrap();
    for i in 3..10 {
        s.unlink(ROOT_INO, format!("f{i}").as_bytes()).unwrap();
    }
    s.sync().unwrap();
    let want = |i: usize| -> Option<Vec<u8>> {
        match i {
            0 => Some(new0.clone()),
            1 => Some(content(1)[..100].to_vec()),
            2 => Some([content(2), tail.clone()].concat()),
            3..=9 => None,
            _ => Some(content(i)),
        }
    };
    check_all(&s, &inos, &want);
    s.gc().unwrap();
    check_all(&s, &inos, &want);
    s.close().unwrap();
    assert_clean(&dir);
    let s = open_with(&dir, DEFAULT_PACK);
    check_all(&s, &inos, &want);
    for i in (0..3).chain(10..n) {
        s.unlink(ROOT_INO, format!("f{i}").as_bytes()).unwrap();
    }
    s.sync().unwrap();
    s.gc().unwrap();
    let st = s.stats();
    assert_eq!(
        st.per_codec.values().map(|c| c.extents).sum::<u64>(),
        0,
        "{st:?}"
    );
    s.close().unwrap();
    assert_clean(&dir);
}

/// defrag leaves packs at their target alone, repacks members off target together (never one
/// extent per file), and a second identical run rewrites nothing.
#[test]
fn defrag_keeps_packs_and_a_second_run_rewrites_nothing() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let s = new_store(&dir, DEFAULT_PACK);
    let n = 50;
    let inos = write_files(&s, n);
    let run = |target: &DefragTarget| {
        let mut total = DefragReport::default();
        for &ino in &inos {
            total.add(&s.defrag(ino, target, &mut |_| {}).unwrap());
        }
        s.sync().unwrap();
        total
    };
    let same = run(&DefragTarget::default());
    assert_eq!(same.extents_rewritten, 0, "{same:?}");
    let z9 = DefragTarget {
        spec: Some(CodecSpec::parse("zstd:9").unwrap().spec),
        ..DefragTarget::default()
    };
    let first = run(&z9);
    assert!(first.extents_rewritten > 0, "{first:?}");
    let u = s.usage(&inos).unwrap();
    assert_eq!(u.refs, n as u64, "{u:?}");
    assert!(u.regular_extents <= 3, "unpacked: {u:?}");
    assert_eq!(u.per_level.keys().collect::<Vec<_>>(), ["zstd:9"], "{u:?}");
    let second = run(&z9);
    assert_eq!(second.extents_rewritten, 0, "{second:?}");
    assert_eq!(second.bytes_rewritten, 0, "{second:?}");
    check_all(&s, &inos, &|i| Some(content(i)));
    s.close().unwrap();
    assert_clean(&dir);
}

/// Files closed through the writeback thread end up in packs or alone, depending on timing;
/// either way every byte reads back and fsck is clean (no assertion on the number of packs).
#[test]
fn files_closed_in_a_row_read_back_whatever_the_batches() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let s = new_store(&dir, DEFAULT_PACK);
    let n = 120;
    let inos: Vec<Ino> = (0..n)
        .map(|i| {
            let ino = mkfile(&s, ROOT_INO, &format!("f{i}"));
            s.open_file(ino).unwrap();
            s.write(ino, 0, &content(i)).unwrap();
            s.release(ino).unwrap();
            ino
        })
        .collect();
    check_all(&s, &inos, &|i| Some(content(i)));
    s.sync().unwrap();
    check_all(&s, &inos, &|i| Some(content(i)));
    s.close().unwrap();
    assert_clean(&dir);
    let s = open_with(&dir, DEFAULT_PACK);
    check_all(&s, &inos, &|i| Some(content(i)));
    s.close().unwrap();
}
