//! Corruption, bad input, and fault injection.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::type_complexity,
    clippy::map_entry
)]

mod common;
use common::*;

use std::sync::Arc;

use compfs_store::backend::{Fault, FaultBackend, FaultKind, FaultOp};
use compfs_store::*;

fn populated(dir: &std::path::Path) -> Vec<(Ino, Vec<u8>)> {
    let s = create(dir, 16384, tuning());
    let mut files = Vec::new();
    for i in 0..4u64 {
        let ino = mkfile(&s, ROOT_INO, &format!("f{i}"));
        let data = pattern(50_000 + i as usize * 1000, i);
        s.write(ino, 0, &data).unwrap();
        files.push((ino, data));
    }
    s.close().unwrap();
    files
}

#[test]
fn flipped_extent_byte_fails_only_that_extent_and_fsck_finds_it() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let files = populated(&dir);
    assert_clean(&dir);
    let victim = files[1].0;
    let exts = walk_segments(&dir);
    let (path, off, h) = exts
        .iter()
        .find(|(_, _, h)| h.ino == victim && h.file_offset == 16384)
        .unwrap()
        .clone();
    let mut data = std::fs::read(&path).unwrap();
    let at = off as usize + format::EXT_HEADER_LEN + h.stored_len as usize / 2;
    data[at] ^= 0x40;
    std::fs::write(&path, &data).unwrap();

    let s = open(&dir, tuning());
    for (ino, want) in &files {
        if *ino == victim {
            let mut buf = vec![0u8; 100];
            match s.read(*ino, 16384 + 10, &mut buf) {
                Err(Error::Corrupt {
                    ino,
                    offset,
                    seg_offset,
                    ..
                }) => {
                    assert_eq!(ino, victim);
                    assert_eq!(offset, 16384 + 10);
                    assert_eq!(seg_offset, off);
                }
                other => panic!("expected corruption error, got {other:?}"),
            }
            // Reads covering the whole damaged extent (decoded straight into the caller's
            // buffer, bypassing the cache) are checked too, alone and within a larger read.
            for (at, len) in [(16384u64, 16384usize), (0, 49152)] {
                let mut buf = vec![0u8; len];
                match s.read(*ino, at, &mut buf) {
                    Err(Error::Corrupt { seg_offset, .. }) => assert_eq!(seg_offset, off),
                    other => panic!("expected corruption error, got {other:?}"),
                }
            }
            // The rest of the file reads.
            let mut buf = vec![0u8; 16384];
            assert_eq!(s.read(*ino, 0, &mut buf).unwrap(), 16384);
            assert_eq!(&buf[..], &want[..16384]);
            let mut buf = vec![0u8; 1000];
            s.read(*ino, 40000, &mut buf).unwrap();
            assert_eq!(&buf[..], &want[40000..41000]);
            assert_eq!(
                Error::Corrupt {
                    ino: 0,
                    offset: 0,
                    segment: 0,
                    seg_offset: 0,
                    detail: String::new()
                }
                .errno(),
                libc_eio()
            );
        } else {
            assert_eq!(&read_all(&s, *ino).unwrap(), want);
        }
    }
    s.close().unwrap();
    let r = fsck_report(&dir, false);
    let errs: Vec<_> = r.problems.iter().filter(|p| !p.kind.is_info()).collect();
    assert_eq!(errs.len(), 1, "{:#?}", r.problems);
    assert_eq!(errs[0].kind, ProblemKind::CorruptExtent);
    assert_eq!(errs[0].ino, Some(victim));
    // Repair drops the bad reference; the file then reads with a hole there; fsck is clean.
    let r = fsck_report(&dir, true);
    assert_eq!(r.repaired(), 1, "{:#?}", r.problems);
    assert_eq!(r.unrepaired(), 0);
    assert_clean(&dir);
    let s = open(&dir, tuning());
    let got = read_all(&s, victim).unwrap();
    let want = &files[1].1;
    assert_eq!(&got[..16384], &want[..16384]);
    assert!(got[16384..32768].iter().all(|&b| b == 0));
    assert_eq!(&got[32768..], &want[32768..]);
    // A read into a dirty buffer: whole extents land directly, the hole is zeroed.
    let mut buf = vec![0xa5u8; want.len()];
    assert_eq!(s.read(victim, 0, &mut buf).unwrap(), want.len());
    assert_eq!(buf, got);
}

fn libc_eio() -> i32 {
    5
}

#[test]
fn damaged_extent_header_is_found() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let files = populated(&dir);
    let exts = walk_segments(&dir);
    let (path, off, h) = exts
        .iter()
        .find(|(_, _, h)| h.ino == files[2].0)
        .unwrap()
        .clone();
    let mut data = std::fs::read(&path).unwrap();
    data[off as usize + 9] ^= 1; // raw length
    std::fs::write(&path, &data).unwrap();
    let s = open(&dir, tuning());
    let mut buf = vec![0u8; 10];
    assert!(matches!(
        s.read(files[2].0, h.file_offset, &mut buf),
        Err(Error::Corrupt { .. })
    ));
    assert_eq!(read_all(&s, files[0].0).unwrap(), files[0].1);
    drop(s);
    let r = fsck_report(&dir, false);
    let errs: Vec<_> = r.problems.iter().filter(|p| !p.kind.is_info()).collect();
    assert_eq!(errs.len(), 1, "{:#?}", r.problems);
    assert_eq!(errs[0].ino, Some(files[2].0));
}

#[test]
fn superblock_damage_and_bad_input_give_one_clear_error_and_change_nothing() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    populated(&dir);
    let sbp = dir.join(format::SUPERBLOCK_FILE);
    let good = std::fs::read(&sbp).unwrap();

    let cases: Vec<(&str, Box<dyn Fn()>)> = vec![
        (
            "flipped byte",
            Box::new(|| {
                let mut b = good.clone();
                b[33] ^= 0x80;
                std::fs::write(&sbp, b).unwrap();
            }),
        ),
        (
            "truncated",
            Box::new(|| std::fs::write(&sbp, &good[..20]).unwrap()),
        ),
        (
            "future version",
            Box::new(|| {
                let mut sb = format::Superblock::decode(&good).unwrap();
                sb.version = 7;
                std::fs::write(&sbp, sb.encode()).unwrap();
            }),
        ),
        (
            "another program's superblock",
            Box::new(|| std::fs::write(&sbp, b"[section]\nkey=value\n").unwrap()),
        ),
    ];
    for (what, damage) in cases {
        damage();
        let before = snapshot(&dir);
        let e = Store::open(&dir, &OpenOptions::default())
            .err()
            .unwrap_or_else(|| panic!("{what}: opened"));
        let msg = e.to_string();
        match what {
            "future version" => assert!(
                matches!(e, Error::UnsupportedVersion { found: 7, .. }),
                "{msg}"
            ),
            "another program's superblock" => {
                assert!(matches!(e, Error::NotAStore { .. }), "{msg}")
            }
            _ => assert!(matches!(e, Error::BadSuperblock { .. }), "{what}: {msg}"),
        }
        assert!(!msg.contains('\n'));
        assert!(fsck(&dir, false, &mut |_, _| {}).is_err());
        assert!(!Store::is_store(&dir));
        assert_eq!(before, snapshot(&dir), "{what}: files changed");
        std::fs::write(&sbp, &good).unwrap();
    }
    // Metadata of another program.
    let mp = dir.join(format::META_FILE);
    let meta = std::fs::read(&mp).unwrap();
    std::fs::write(&mp, b"SQLite format 3\0 not really").unwrap();
    let before = snapshot(&dir);
    let e = Store::open(&dir, &OpenOptions::default()).err().unwrap();
    assert!(matches!(e, Error::NotAStore { .. }), "{e}");
    assert_eq!(before, snapshot(&dir));
    std::fs::write(&mp, meta).unwrap();
    // A directory that is no store, and a file.
    let other = t.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), b"hello").unwrap();
    let before = snapshot(&other);
    assert!(matches!(
        Store::open(&other, &OpenOptions::default()),
        Err(Error::NotAStore { .. })
    ));
    assert!(matches!(
        Store::create(&other, &CreateOptions::default()),
        Err(Error::AlreadyExists(_))
    ));
    assert_eq!(before, snapshot(&other));
    assert!(matches!(
        Store::open(&other.join("notes.txt"), &OpenOptions::default()),
        Err(Error::NotAStore { .. })
    ));
    // The intact store still opens and is clean.
    let s = open(&dir, tuning());
    s.close().unwrap();
    assert_clean(&dir);
}

#[test]
fn injected_faults_turn_read_only_and_lose_nothing_acknowledged() {
    let kinds = [
        (FaultOp::Write, FaultKind::Eio),
        (FaultOp::Write, FaultKind::NoSpace),
        (FaultOp::Write, FaultKind::Torn(100)),
        (FaultOp::Sync, FaultKind::Eio),
        (FaultOp::Create, FaultKind::NoSpace),
    ];
    for (n, (op, kind)) in kinds.into_iter().enumerate() {
        for nth in [0u64, 1, 3] {
            let t = tempfile::tempdir().unwrap();
            let dir = t.path().join("s");
            let fb = FaultBackend::new();
            let tun = Tuning {
                backend: Arc::new(fb.clone()),
                segment_size: 64 << 10,
                ..tuning()
            };
            let s = create(&dir, 4096, tun.clone());
            let a = s
                .mknod(ROOT_INO, b"a", FileKind::File, 0o644, 0, 0, 0)
                .unwrap();
            let durable = pattern(30_000, n as u64);
            s.write(a.ino, 0, &durable).unwrap();
            s.fsync(a.ino, false).unwrap();
            fb.arm(Fault {
                op,
                nth,
                kind,
                sticky: false,
            });
            let b = s
                .mknod(ROOT_INO, b"b", FileKind::File, 0o644, 0, 0, 0)
                .unwrap();
            let mut failed = None;
            for round in 0..40u64 {
                let r = s
                    // Incompressible, so that the writes fill segments at the same pace
                    // whatever the worth-it rule (the Create faults need new segments).
                    .write(b.ino, round * 9000, &random(9000, round))
                    .and_then(|_| s.write(a.ino, 0, b"overwrite").map(|_| ()))
                    .and_then(|_| s.fsync(b.ino, false));
                if let Err(e) = r {
                    failed = Some(e);
                    break;
                }
            }
            let e = failed.unwrap_or_else(|| panic!("{op:?} {kind:?} {nth}: fault never surfaced"));
            if kind == FaultKind::NoSpace {
                assert!(matches!(e, Error::NoSpace), "{e}");
            }
            assert!(fb.fired() > 0);
            assert!(matches!(s.write(a.ino, 0, b"x"), Err(Error::ReadOnly(_))));
            assert!(matches!(
                s.mkdir(ROOT_INO, b"d", 0o755, 0, 0),
                Err(Error::ReadOnly(_))
            ));
            assert!(s.stats().read_only);
            drop(s);
            fb.disarm();
            let s = open(&dir, tuning());
            let a = s.lookup(ROOT_INO, b"a").unwrap();
            let got = read_all(&s, a.ino).unwrap();
            // Either the fsync'd content or it with the unsynced overwrite.
            assert!(got == durable || (got[..9] == *b"overwrite" && got[9..] == durable[9..]));
            s.close().unwrap();
            assert_clean(&dir);
        }
    }
}

#[test]
fn fsck_finds_and_repairs_wrong_counts_and_dangling_entries() {
    use redb::{ReadableTable, TableDefinition};
    const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
    const STATS: TableDefinition<u8, &[u8]> = TableDefinition::new("stats");
    const DIRENTS: TableDefinition<(u64, &[u8]), &[u8]> = TableDefinition::new("dirents");
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let files = populated(&dir);
    {
        let db = redb::Database::open(dir.join(format::META_FILE)).unwrap();
        let txn = db.begin_write().unwrap();
        {
            // A wrong link count on one file.
            let mut inodes = txn.open_table(INODES).unwrap();
            let mut rec =
                format::InodeRec::decode(inodes.get(files[0].0).unwrap().unwrap().value()).unwrap();
            rec.nlink = 5;
            inodes.insert(files[0].0, rec.encode().as_slice()).unwrap();
            // Wrong statistics for zstd.
            let mut stats = txn.open_table(STATS).unwrap();
            let mut s = format::StatRec::decode(stats.get(3u8).unwrap().unwrap().value()).unwrap();
            s.disk += 1000;
            stats.insert(3u8, s.encode().as_slice()).unwrap();
            // A directory entry naming an inode that does not exist.
            let mut d = txn.open_table(DIRENTS).unwrap();
            let de = format::DirentRec {
                ino: 999_999,
                kind: FileKind::File,
                seq: 12345,
            };
            d.insert((ROOT_INO, &b"ghost"[..]), de.encode().as_slice())
                .unwrap();
        }
        txn.commit().unwrap();
    }
    let r = fsck_report(&dir, false);
    let mut kinds: Vec<ProblemKind> = r
        .problems
        .iter()
        .filter(|p| !p.kind.is_info())
        .map(|p| p.kind)
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        vec![
            ProblemKind::BadDirent,
            ProblemKind::WrongCount,
            ProblemKind::WrongCount
        ],
        "{:#?}",
        r.problems
    );
    let r = fsck_report(&dir, true);
    assert_eq!((r.repaired(), r.unrepaired()), (3, 0), "{:#?}", r.problems);
    assert_clean(&dir);
    let s = open(&dir, tuning());
    assert_eq!(s.getattr(files[0].0).unwrap().nlink, 1);
    assert!(matches!(s.lookup(ROOT_INO, b"ghost"), Err(Error::NotFound)));
    for (ino, want) in &files {
        assert_eq!(&read_all(&s, *ino).unwrap(), want);
    }
}

/// A segment read that fails (a bad sector under an extent) fails that read with EIO, never
/// returns other bytes, and changes nothing: the store stays writable and the same read
/// succeeds once the device answers again.
#[test]
fn a_failed_segment_read_is_eio_and_leaves_the_store_writable() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let files = populated(&dir);
    let fb = FaultBackend::new();
    let s = open(
        &dir,
        Tuning {
            backend: Arc::new(fb.clone()),
            ..tuning()
        },
    );
    let (ino, data) = &files[2];
    fb.arm(Fault {
        op: FaultOp::Read,
        nth: 0,
        kind: FaultKind::Eio,
        sticky: true,
    });
    let mut buf = vec![0u8; data.len()];
    let e = s.read(*ino, 0, &mut buf).unwrap_err();
    assert!(fb.fired() > 0, "failed without the fault: {e}");
    assert_eq!(e.errno(), libc::EIO, "{e}");
    // A device error, not damaged data: the extent itself is fine.
    assert!(matches!(e, Error::Io(_)), "reported as {e:?}");
    fb.disarm();
    assert!(!s.stats().read_only);
    assert_eq!(&read_all(&s, *ino).unwrap(), data);
    let n = mkfile(&s, ROOT_INO, "after");
    s.write(n, 0, b"still writable").unwrap();
    s.fsync(n, false).unwrap();
    s.close().unwrap();
    assert_clean(&dir);
}

/// Map records with length 0 or reaching past the end of their extent are reported as damaged
/// metadata (EIO) by every reader of the map, never computed with (`offset + len - 1`
/// underflows for length 0); fsck reports and drops them.
#[test]
fn map_records_of_length_zero_or_past_their_extent_are_errors() {
    use redb::{ReadableTable, TableDefinition};
    const EXTMAP: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("extent_map");
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let files = populated(&dir);
    let (a, b) = (files[0].0, files[1].0);
    {
        let db = redb::Database::open(dir.join(format::META_FILE)).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut map = txn.open_table(EXTMAP).unwrap();
            let m = format::MapRec::decode(map.get((a, 16384)).unwrap().unwrap().value()).unwrap();
            let empty = format::MapRec { len: 0, ..m };
            map.insert((a, 16384), empty.encode().as_slice()).unwrap();
            let m = format::MapRec::decode(map.get((b, 16384)).unwrap().unwrap().value()).unwrap();
            let past = format::MapRec {
                ext_offset: 100,
                ..m
            };
            map.insert((b, 16384), past.encode().as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let s = open(&dir, tuning());
    let mut buf = vec![0u8; 100];
    for r in [
        s.read(a, 16384, &mut buf).map(|_| ()),
        s.read(a, 0, &mut vec![0u8; 40000]).map(|_| ()),
        s.seek_data(a, 0).map(|_| ()),
        s.seek_hole(a, 0).map(|_| ()),
        s.recompress(a, None),
        s.usage(&[a]).map(|_| ()),
    ] {
        match r {
            Err(e @ Error::CorruptMetadata(_)) => assert_eq!(e.errno(), libc::EIO),
            other => panic!("expected damaged metadata, got {other:?}"),
        }
    }
    match s.read(b, 16384, &mut buf) {
        Err(Error::Corrupt { ino, detail, .. }) => {
            assert_eq!(ino, b);
            assert!(detail.contains("reaches past"), "{detail}");
        }
        other => panic!("expected a corruption error, got {other:?}"),
    }
    // The rest reads.
    for (ino, want) in &files[2..] {
        assert_eq!(&read_all(&s, *ino).unwrap(), want);
    }
    s.close().unwrap();
    let r = fsck_report(&dir, false);
    let bad: Vec<_> = r
        .problems
        .iter()
        .filter(|p| matches!(p.kind, ProblemKind::BadRecord | ProblemKind::BadMapEntry))
        .map(|p| (p.kind, p.ino))
        .collect();
    assert_eq!(
        bad,
        [
            (ProblemKind::BadRecord, Some(a)),
            (ProblemKind::BadMapEntry, Some(b))
        ],
        "{:#?}",
        r.problems
    );
    fsck_report(&dir, true);
    assert_clean(&dir);
}

/// Segment records with absurd lengths (damaged metadata) do not overflow the sums that
/// statistics and GC make of them (a debug build panicked, in the flusher thread for GC).
#[test]
fn absurd_segment_lengths_do_not_overflow() {
    use redb::{ReadableTable, TableDefinition};
    const SEGMENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("segments");
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let mut files = populated(&dir);
    {
        // A second session appends to a second segment.
        let s = open(&dir, tuning());
        let ino = mkfile(&s, ROOT_INO, "second");
        let data = pattern(30_000, 7);
        s.write(ino, 0, &data).unwrap();
        files.push((ino, data));
        s.close().unwrap();
    }
    {
        let db = redb::Database::open(dir.join(format::META_FILE)).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut segs = txn.open_table(SEGMENTS).unwrap();
            let ids: Vec<u64> = segs.iter().unwrap().map(|r| r.unwrap().0.value()).collect();
            assert!(ids.len() >= 2, "{ids:?}");
            let absurd = format::SegmentRec {
                len: u64::MAX,
                live: u64::MAX,
            };
            for id in ids {
                segs.insert(id, absurd.encode().as_slice()).unwrap();
            }
        }
        txn.commit().unwrap();
    }
    let s = open(&dir, tuning());
    let st = s.stats();
    assert_eq!((st.segment_bytes, st.live_bytes), (u64::MAX, u64::MAX));
    // Nothing looks like garbage, so GC moves nothing; it must not fail either.
    s.gc().unwrap();
    // Writing into a segment with an absurd record keeps the sums saturated.
    let n = mkfile(&s, ROOT_INO, "new");
    s.write(n, 0, &pattern(40_000, 9)).unwrap();
    s.fsync(n, false).unwrap();
    for (ino, want) in &files {
        assert_eq!(&read_all(&s, *ino).unwrap(), want);
    }
    s.close().unwrap();
    // fsck reports the records (the live bytes it recounts, the committed length past the
    // file's end) without overflowing either.
    let r = fsck_report(&dir, false);
    assert!(
        r.problems
            .iter()
            .all(|p| matches!(p.kind, ProblemKind::WrongCount | ProblemKind::MissingExtent)),
        "{:#?}",
        r.problems
    );
    assert!(r.problems.iter().any(|p| p.message.contains("live bytes")));
}
