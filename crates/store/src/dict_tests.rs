//! Store dictionaries end to end: sampling, training, use on write, reads after reopening,
//! fsck, a damaged dictionary, and `dict=off`.

use redb::{ReadableDatabase, ReadableTable};

use crate::records::{DictRec, ExtentRec, InodeRec, MapRec};
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

/// Small text files: inline (under 2 KiB) and small extents.
fn file(i: u64) -> Vec<u8> {
    compfs_testdata::text(500 + (i as usize * 397) % 9000, i)
}

/// (inline data using a dictionary, extents using one) among the files of `inos`.
fn dict_users(s: &Store, inos: &[Ino]) -> (usize, usize) {
    let txn = s.inner.db.begin_read().unwrap();
    let map = txn.open_table(crate::meta::EXTMAP).unwrap();
    let ext = txn.open_table(crate::meta::EXTENTS).unwrap();
    let (mut inline, mut extents) = (0, 0);
    for &ino in inos {
        let rec = crate::read::inode_in(&txn, ino).unwrap();
        inline += rec.inline.iter().filter(|i| i.dict != 0).count();
        for r in map.range((ino, 0)..=(ino, u64::MAX)).unwrap() {
            let m = MapRec::decode(r.unwrap().1.value()).unwrap();
            let x = ExtentRec::decode(ext.get(m.extent).unwrap().unwrap().value()).unwrap();
            extents += usize::from(x.dict != 0);
        }
    }
    (inline, extents)
}

/// Writes 200 files, trains, writes 200 more: returns (store dir, files before, files after).
fn trained_store(t: &tempfile::TempDir) -> (std::path::PathBuf, Vec<Ino>, Vec<Ino>) {
    let dir = t.path().join("s");
    let s = Store::create_tuned(&dir, &CreateOptions::default(), tuning()).unwrap();
    // Files written alone (packs with the dictionary: dict_pack_tests.rs).
    s.set_pack(0);
    let before: Vec<Ino> = (0..200)
        .map(|i| put(&s, &format!("a{i}"), &file(i)))
        .collect();
    s.sync().unwrap();
    assert_eq!(s.current_dictionary(), None);
    assert_eq!(s.train_dictionary_now().unwrap(), Some(1));
    assert_eq!(s.current_dictionary(), Some(1));
    // Trained once: no second dictionary.
    assert_eq!(s.train_dictionary_now().unwrap(), None);
    let after: Vec<Ino> = (200..400)
        .map(|i| put(&s, &format!("b{i}"), &file(i)))
        .collect();
    s.sync().unwrap();
    assert_eq!(dict_users(&s, &before), (0, 0));
    let (inline, extents) = dict_users(&s, &after);
    assert!(inline > 20 && extents > 20, "{inline} {extents}");
    let u = s.usage(&[ROOT_INO]).unwrap();
    assert!(u.dict_bytes.disk > 0 && u.dict_bytes.disk < u.dict_bytes.uncompressed);
    s.close().unwrap();
    (dir, before, after)
}

#[test]
fn dictionary_is_trained_used_and_read_back() {
    let t = tempfile::tempdir().unwrap();
    let (dir, before, after) = trained_store(&t);
    let rep = fsck(&dir, false, &mut |_, _| {}).unwrap();
    assert!(rep.is_clean(), "{:#?}", rep.problems);
    // Reopened read-only, then for writing: the dictionary is loaded from the table.
    for ro in [true, false] {
        let o = OpenOptions {
            read_only: ro,
            ..OpenOptions::default()
        };
        let s = Store::open_tuned(&dir, &o, tuning()).unwrap();
        assert_eq!(s.current_dictionary(), (!ro).then_some(1));
        for (n, &ino) in before.iter().chain(&after).enumerate() {
            assert_eq!(read_all(&s, ino), file(n as u64), "file {n}");
        }
        s.close().unwrap();
    }
    // The dictionary helps: the same files written without it take more room.
    let s = Store::open_tuned(&dir, &OpenOptions::default(), tuning()).unwrap();
    let with = s.usage(&after).unwrap().total.disk;
    s.close().unwrap();
    let off = OpenOptions {
        dict: false,
        pack: 0,
        ..OpenOptions::default()
    };
    let s = Store::open_tuned(&dir, &off, tuning()).unwrap();
    assert_eq!(s.current_dictionary(), None);
    let again: Vec<Ino> = (200..400)
        .map(|i| put(&s, &format!("c{i}"), &file(i)))
        .collect();
    s.sync().unwrap();
    assert_eq!(dict_users(&s, &again), (0, 0));
    let without = s.usage(&again).unwrap().total.disk;
    assert!(with * 10 < without * 9, "with {with} without {without}");
    s.close().unwrap();
}

#[test]
fn damaged_dictionary_is_eio_for_its_users_only() {
    let t = tempfile::tempdir().unwrap();
    let (dir, before, after) = trained_store(&t);
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
    for (n, &ino) in before.iter().enumerate() {
        assert_eq!(read_all(&s, ino), file(n as u64));
    }
    let users: Vec<Ino> = after
        .iter()
        .copied()
        .filter(|&i| dict_users(&s, &[i]) != (0, 0))
        .collect();
    assert!(!users.is_empty());
    for ino in users {
        let size = s.getattr(ino).unwrap().size as usize;
        let mut v = vec![0u8; size];
        match s.read(ino, 0, &mut v) {
            Err(Error::Corrupt { detail, .. }) => {
                assert!(detail.contains("dictionary 1"), "{detail}")
            }
            r => panic!("inode {ino}: {r:?}"),
        }
    }
    s.close().unwrap();
}

#[test]
fn unknown_dictionary_is_reported_by_fsck() {
    let t = tempfile::tempdir().unwrap();
    let (dir, _, after) = trained_store(&t);
    {
        let db = crate::open::open_db(&dir).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut ino = txn.open_table(crate::meta::INODES).unwrap();
            // Point the inline data of every file using dictionary 1 at dictionary 9.
            for &i in &after {
                let mut rec = InodeRec::decode(ino.get(i).unwrap().unwrap().value()).unwrap();
                if let Some(x) = rec.inline.as_mut().filter(|x| x.dict == 1) {
                    x.dict = 9;
                    ino.insert(i, rec.encode().as_slice()).unwrap();
                }
            }
        }
        txn.commit().unwrap();
    }
    let rep = fsck(&dir, false, &mut |_, _| {}).unwrap();
    assert!(
        rep.problems
            .iter()
            .any(|p| p.message.contains("unknown dictionary 9")),
        "{:#?}",
        rep.problems
    );
}
