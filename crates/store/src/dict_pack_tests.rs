//! Packed extents compressed with the store's dictionary: bytes read back (also after a
//! reopen), fsck, GC moving such packs, a damaged dictionary, `defrag` moving packs written
//! before the training onto the dictionary (as packs), and `dict=nopack`.

use std::collections::BTreeSet;

use redb::{ReadableDatabase, ReadableTable};

use crate::records::{DictRec, ExtentRec, MapRec};
use crate::*;

fn tuning() -> Tuning {
    Tuning {
        flush_interval: None,
        ..Tuning::default()
    }
}

fn put(s: &Store, name: &str, data: &[u8]) -> Ino {
    let a = s
        .mknod(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    s.write(a.ino, 0, data).unwrap();
    a.ino
}

fn read_all(s: &Store, ino: Ino) -> Vec<u8> {
    let size = s.getattr(ino).unwrap().size as usize;
    let mut v = vec![0u8; size];
    let n = s.read(ino, 0, &mut v).unwrap();
    v.truncate(n);
    v
}

/// Boilerplate that starts files, as licence headers start source files: three of them, each
/// in many files, so the trained dictionary holds them and a pack's first copy of each costs
/// less with it.
fn header(k: u64) -> Vec<u8> {
    compfs_testdata::text(1500, 1000 + k)
}

/// Small file `i`: a header and its own text (0.8 to 6.8 KB in all).
fn file(i: u64) -> Vec<u8> {
    let mut v = header(i % 3);
    v.extend(compfs_testdata::text(300 + (i as usize * 397) % 5000, i));
    v
}

/// The extents `inos` reference: (extent id, owner inode, dictionary id).
fn extents_of(s: &Store, inos: &[Ino]) -> BTreeSet<(u64, Ino, u16)> {
    let txn = s.inner.db.begin_read().unwrap();
    let map = txn.open_table(crate::meta::EXTMAP).unwrap();
    let ext = txn.open_table(crate::meta::EXTENTS).unwrap();
    let mut out = BTreeSet::new();
    for &ino in inos {
        let rec = crate::read::inode_in(&txn, ino).unwrap();
        assert!(rec.inline.is_none(), "inode {ino} is inline");
        for r in map.range((ino, 0)..=(ino, u64::MAX)).unwrap() {
            let m = MapRec::decode(r.unwrap().1.value()).unwrap();
            let x = ExtentRec::decode(ext.get(m.extent).unwrap().unwrap().value()).unwrap();
            out.insert((m.extent, x.ino, x.dict));
        }
    }
    out
}

/// Every extent of `inos` is a pack, each using dictionary `dict` (0: none).
fn all_packs_with(s: &Store, inos: &[Ino], dict: u16) -> bool {
    let x = extents_of(s, inos);
    !x.is_empty()
        && x.iter()
            .all(|&(_, owner, d)| owner == crate::pack::PACK_OWNER && d == dict)
}

fn check(s: &Store, files: &[(u64, Ino)]) {
    for &(i, ino) in files {
        assert_eq!(read_all(s, ino), file(i), "file {i}");
    }
}

fn clean(dir: &std::path::Path) {
    let rep = fsck(dir, false, &mut |_, _| {}).unwrap();
    assert!(rep.is_clean(), "{:#?}", rep.problems);
}

/// A store with packs: 150 files packed before the training (no dictionary), then 150 packed
/// with dictionary 1. Returns the store (open) and the two sets as (file number, inode).
/// Files as (file number, inode).
type Files = Vec<(u64, Ino)>;

fn packed_store(dir: &std::path::Path, opts: &OpenOptions) -> (Store, Files, Files) {
    Store::create_tuned(dir, &CreateOptions::default(), tuning())
        .unwrap()
        .close()
        .unwrap();
    let s = Store::open_tuned(dir, opts, tuning()).unwrap();
    let before: Vec<(u64, Ino)> = (0..150)
        .map(|i| (i, put(&s, &format!("a{i}"), &file(i))))
        .collect();
    s.sync().unwrap();
    let ids: Vec<Ino> = before.iter().map(|x| x.1).collect();
    assert!(all_packs_with(&s, &ids, 0), "{:?}", extents_of(&s, &ids));
    // The pack members were the samples.
    assert_eq!(s.train_dictionary_now().unwrap(), Some(1));
    let after: Vec<(u64, Ino)> = (150..300)
        .map(|i| (i, put(&s, &format!("b{i}"), &file(i))))
        .collect();
    s.sync().unwrap();
    (s, before, after)
}

fn inos(v: &[(u64, Ino)]) -> Vec<Ino> {
    v.iter().map(|x| x.1).collect()
}

/// Packs written once the store has a dictionary use it (they are smaller with it), read back
/// before and after a reopen, and fsck is clean; with `dict=nopack` they do not use it.
#[test]
fn packs_use_the_dictionary_and_read_back() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let (s, before, after) = packed_store(&dir, &OpenOptions::default());
    let a = inos(&after);
    assert!(all_packs_with(&s, &a, 1), "{:?}", extents_of(&s, &a));
    let n_packs = extents_of(&s, &a).len();
    assert!((2..=20).contains(&n_packs), "{n_packs} packs");
    let u = s.usage(&a).unwrap();
    assert_eq!(u.dict_bytes.uncompressed, u.total.uncompressed, "{u:?}");
    let with = u.total.disk;
    check(&s, &before);
    check(&s, &after);
    s.close().unwrap();
    clean(&dir);
    let s = Store::open_tuned(&dir, &OpenOptions::default(), tuning()).unwrap();
    check(&s, &before);
    check(&s, &after);
    // The same files written again with `dict=nopack`: packs without the dictionary, larger.
    s.close().unwrap();
    let nopack = OpenOptions {
        pack_dict: false,
        ..OpenOptions::default()
    };
    let s = Store::open_tuned(&dir, &nopack, tuning()).unwrap();
    assert_eq!(s.current_dictionary(), Some(1));
    let again: Vec<(u64, Ino)> = (150..300)
        .map(|i| (i, put(&s, &format!("c{i}"), &file(i))))
        .collect();
    s.sync().unwrap();
    let c = inos(&again);
    assert!(all_packs_with(&s, &c, 0), "{:?}", extents_of(&s, &c));
    let without = s.usage(&c).unwrap().total.disk;
    assert!(with < without, "with {with} without {without}");
    check(&s, &again);
    s.close().unwrap();
    clean(&dir);
}

/// GC moves packs that use the dictionary (the dictionary stays while they do): members
/// unlinked, a large file beside them deleted, then a GC pass that moves the packs; every
/// remaining file reads back, also after a reopen, and fsck is clean.
#[test]
fn gc_moves_dictionary_packs_and_keeps_the_dictionary() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let (s, before, after) = packed_store(&dir, &OpenOptions::default());
    // Garbage in the packs' segment: a large incompressible file written after them, deleted.
    put(
        &s,
        "junk",
        &compfs_testdata::generate(compfs_testdata::Kind::Random, 6 << 20, 5),
    );
    s.sync().unwrap();
    s.unlink(ROOT_INO, b"junk").unwrap();
    for &(i, _) in after.iter().filter(|x| x.0 % 2 == 0) {
        s.unlink(ROOT_INO, format!("b{i}").as_bytes()).unwrap();
    }
    s.sync().unwrap();
    let kept: Vec<(u64, Ino)> = after.iter().copied().filter(|x| x.0 % 2 == 1).collect();
    let k = inos(&kept);
    assert!(all_packs_with(&s, &k, 1));
    let old: BTreeSet<u64> = extents_of(&s, &k).iter().map(|x| x.0).collect();
    let rep = s.gc().unwrap();
    assert!(rep.extents_moved > 0, "{rep:?}");
    // Moved, not rewritten: the same extents, still on dictionary 1.
    let now: BTreeSet<u64> = extents_of(&s, &k).iter().map(|x| x.0).collect();
    assert_eq!(old, now);
    assert!(all_packs_with(&s, &k, 1));
    check(&s, &before);
    check(&s, &kept);
    s.close().unwrap();
    clean(&dir);
    let s = Store::open_tuned(&dir, &OpenOptions::default(), tuning()).unwrap();
    assert_eq!(s.current_dictionary(), Some(1));
    check(&s, &before);
    check(&s, &kept);
    s.close().unwrap();
}

/// A damaged dictionary makes the pack members that use it EIO (naming the dictionary), and
/// nothing else: the packs written before the training read back.
#[test]
fn damaged_dictionary_is_eio_for_its_packs_only() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let (s, before, after) = packed_store(&dir, &OpenOptions::default());
    assert!(all_packs_with(&s, &inos(&after), 1));
    s.close().unwrap();
    {
        let db = crate::open::open_db(&dir).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut tb = txn.open_table(crate::meta::DICTS).unwrap();
            let mut rec = DictRec::decode(tb.get(1).unwrap().unwrap().value()).unwrap();
            let n = rec.bytes.len();
            rec.bytes[n / 2] ^= 0x55;
            tb.insert(1, rec.encode().as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let rep = fsck(&dir, false, &mut |_, _| {}).unwrap();
    assert!(
        rep.problems
            .iter()
            .any(|p| p.message.contains("dictionary 1 is damaged")),
        "{:#?}",
        rep.problems
    );
    let o = OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    };
    let s = Store::open_tuned(&dir, &o, tuning()).unwrap();
    check(&s, &before);
    for &(i, ino) in &after {
        let mut v = vec![0u8; file(i).len()];
        match s.read(ino, 0, &mut v) {
            Err(Error::Corrupt { detail, .. }) => {
                assert!(detail.contains("dictionary 1"), "{detail}")
            }
            r => panic!("file {i}: {r:?}"),
        }
    }
    s.close().unwrap();
}

/// `defrag` moves packs written before the training onto the dictionary, as packs (a few
/// extents shared by the files, not one per file); a second run rewrites nothing; packs
/// already on the dictionary are left alone; `dict=nopack` leaves the old packs as they are.
#[test]
fn defrag_moves_packs_to_the_dictionary_and_a_second_run_rewrites_nothing() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let (s, before, after) = packed_store(&dir, &OpenOptions::default());
    let b = inos(&before);
    let a = inos(&after);
    let after_extents = extents_of(&s, &a);
    let run = |s: &Store, target: &DefragTarget| {
        let mut total = DefragReport::default();
        for &(_, ino) in before.iter().chain(&after) {
            total.add(&s.defrag(ino, target, &mut |_| {}).unwrap());
        }
        s.sync().unwrap();
        total
    };
    // dict=nopack: packs are at target whatever their dictionary.
    s.close().unwrap();
    let nopack = OpenOptions {
        pack_dict: false,
        ..OpenOptions::default()
    };
    let s = Store::open_tuned(&dir, &nopack, tuning()).unwrap();
    let old = extents_of(&s, &b);
    let r = run(&s, &DefragTarget::default());
    assert_eq!((r.extents_rewritten, r.bytes_rewritten), (0, 0), "{r:?}");
    assert_eq!(extents_of(&s, &b), old);
    s.close().unwrap();
    let s = Store::open_tuned(&dir, &OpenOptions::default(), tuning()).unwrap();
    let disk_before = s.usage(&b).unwrap().total.disk;
    let first = run(&s, &DefragTarget::default());
    assert!(first.extents_rewritten > 0, "{first:?}");
    assert!(all_packs_with(&s, &b, 1), "{:?}", extents_of(&s, &b));
    let moved = extents_of(&s, &b);
    assert!(
        moved.len() <= old.len() + 1,
        "{} packs, were {}",
        moved.len(),
        old.len()
    );
    assert!(s.usage(&b).unwrap().total.disk < disk_before);
    // The packs written with the dictionary were not touched.
    assert_eq!(extents_of(&s, &a), after_extents);
    let second = run(&s, &DefragTarget::default());
    assert_eq!(second.extents_rewritten, 0, "{second:?}");
    assert_eq!(second.bytes_rewritten, 0, "{second:?}");
    assert_eq!(extents_of(&s, &b), moved);
    check(&s, &before);
    check(&s, &after);
    s.close().unwrap();
    clean(&dir);
}

/// Background recompression counts packs off the current dictionary as pending and moves them
/// onto it, as packs (it runs `defrag`'s code); the packs already on it are left alone.
#[test]
fn background_recompression_moves_packs_to_the_dictionary() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let (s, before, after) = packed_store(&dir, &OpenOptions::default());
    let b = inos(&before);
    let a = inos(&after);
    let after_extents = extents_of(&s, &a);
    s.set_background(BackgroundPolicy {
        spec: Some(CodecSpec::parse("zstd:3").unwrap().spec),
        delay: std::time::Duration::ZERO,
    });
    let first = s.background_pass().unwrap();
    assert!(first.extents_done > 0, "{first:?}");
    s.sync().unwrap();
    assert!(all_packs_with(&s, &b, 1), "{:?}", extents_of(&s, &b));
    assert_eq!(extents_of(&s, &a), after_extents);
    check(&s, &before);
    check(&s, &after);
    s.close().unwrap();
    clean(&dir);
    // Reopened (the pass's memory of settled files is gone): nothing is pending any more.
    let s = Store::open_tuned(&dir, &OpenOptions::default(), tuning()).unwrap();
    s.set_background(BackgroundPolicy {
        spec: Some(CodecSpec::parse("zstd:3").unwrap().spec),
        delay: std::time::Duration::ZERO,
    });
    let again = s.background_pass().unwrap();
    assert_eq!(
        (again.files_pending, again.extents_done),
        (0, 0),
        "{again:?}"
    );
    s.close().unwrap();
}
