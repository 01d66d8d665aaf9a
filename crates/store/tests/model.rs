//! Model-based property test: random operation sequences against the store and a simple
//! in-memory model, comparing every file's contents and metadata after each step.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::type_complexity,
    clippy::map_entry
)]

mod common;
use common::*;

use std::collections::BTreeMap;

use compfs_store::*;
use proptest::prelude::*;

/// Name slots: (in subdirectory "d"?, name).
const SLOTS: [(bool, &[u8]); 6] = [
    (false, b"a"),
    (false, b"b"),
    (false, b"c"),
    (true, b"x"),
    (true, b"y"),
    (true, b"z"),
];

#[derive(Debug, Clone)]
enum Op {
    Create(usize),
    Write(usize, u64, usize, u64),
    Truncate(usize, u64),
    Punch(usize, u64, u64),
    Rename(usize, usize),
    Link(usize, usize),
    Unlink(usize),
    SetXattr(usize, u8),
    Read(usize, u64, usize),
    Fsync(usize),
    Sync,
    Reopen,
    UnlinkWhileOpen(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let slot = 0..SLOTS.len();
    prop_oneof![
        3 => slot.clone().prop_map(Op::Create),
        6 => (slot.clone(), 0..40_000u64, 1..20_000usize, any::<u64>()).prop_map(|(s, o, l, z)| Op::Write(s, o, l, z)),
        2 => (slot.clone(), 0..50_000u64).prop_map(|(s, n)| Op::Truncate(s, n)),
        2 => (slot.clone(), 0..40_000u64, 1..30_000u64).prop_map(|(s, o, l)| Op::Punch(s, o, l)),
        2 => (slot.clone(), slot.clone()).prop_map(|(a, b)| Op::Rename(a, b)),
        1 => (slot.clone(), slot.clone()).prop_map(|(a, b)| Op::Link(a, b)),
        2 => slot.clone().prop_map(Op::Unlink),
        1 => (slot.clone(), 0..4u8).prop_map(|(s, v)| Op::SetXattr(s, v)),
        3 => (slot.clone(), 0..50_000u64, 1..30_000usize).prop_map(|(s, o, l)| Op::Read(s, o, l)),
        1 => slot.clone().prop_map(Op::Fsync),
        1 => Just(Op::Sync),
        1 => Just(Op::Reopen),
        1 => slot.prop_map(Op::UnlinkWhileOpen),
    ]
}

#[derive(Debug, Clone, Default)]
struct MFile {
    data: Vec<u8>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    nlink: u32,
}

#[derive(Default)]
struct Model {
    files: BTreeMap<u64, MFile>,
    names: BTreeMap<usize, u64>,
    next: u64,
}

/// Data for a write: compressible, random, or zeros (holes), chosen by the seed.
fn data_for(len: usize, seed: u64) -> Vec<u8> {
    match seed % 4 {
        0 => random(len, seed),
        1 => vec![0; len],
        _ => pattern(len, seed),
    }
}

struct Sut {
    dir: std::path::PathBuf,
    store: Option<Store>,
    sub: Ino,
    inos: BTreeMap<u64, Ino>, // model id -> store inode
}

impl Sut {
    fn s(&self) -> &Store {
        self.store.as_ref().unwrap()
    }
    fn parent(&self, slot: usize) -> Ino {
        if SLOTS[slot].0 {
            self.sub
        } else {
            ROOT_INO
        }
    }
}

fn tun() -> Tuning {
    Tuning {
        segment_size: 64 << 10,
        flush_blocks: 4,
        inline_max: 2048,
        flush_interval: None,
        ..Tuning::default()
    }
}

fn check_all(sut: &Sut, m: &Model) {
    let s = sut.s();
    for (slot, (_, name)) in SLOTS.iter().enumerate() {
        let got = s.lookup(sut.parent(slot), name);
        match m.names.get(&slot) {
            None => assert!(matches!(got, Err(Error::NotFound)), "slot {slot}: {got:?}"),
            Some(id) => {
                let a = got.unwrap();
                assert_eq!(Some(&a.ino), sut.inos.get(id));
                let f = &m.files[id];
                assert_eq!(a.size, f.data.len() as u64, "slot {slot} size");
                assert_eq!(a.nlink, f.nlink, "slot {slot} nlink");
                assert_eq!(read_all(s, a.ino).unwrap(), f.data, "slot {slot} data");
                let mut names = s.listxattr(a.ino).unwrap();
                names.sort();
                assert_eq!(names, f.xattrs.keys().cloned().collect::<Vec<_>>());
            }
        }
    }
}

fn run(ops: Vec<Op>) {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let store = create(&dir, 4096, tun());
    let sub = store.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    let mut sut = Sut {
        dir: dir.clone(),
        store: Some(store),
        sub,
        inos: BTreeMap::new(),
    };
    let mut m = Model::default();
    for op in ops {
        let s = sut.s();
        match op {
            Op::Create(slot) => {
                let r = s.mknod(
                    sut.parent(slot),
                    SLOTS[slot].1,
                    FileKind::File,
                    0o644,
                    0,
                    0,
                    0,
                );
                if m.names.contains_key(&slot) {
                    assert!(matches!(r, Err(Error::Exists)));
                } else {
                    let a = r.unwrap();
                    m.next += 1;
                    m.files.insert(
                        m.next,
                        MFile {
                            nlink: 1,
                            ..Default::default()
                        },
                    );
                    m.names.insert(slot, m.next);
                    sut.inos.insert(m.next, a.ino);
                }
            }
            Op::Write(slot, off, len, seed) => {
                if let Some(id) = m.names.get(&slot) {
                    let data = data_for(len, seed);
                    assert_eq!(s.write(sut.inos[id], off, &data).unwrap(), len);
                    let f = m.files.get_mut(id).unwrap();
                    let end = off as usize + len;
                    if f.data.len() < end {
                        f.data.resize(end, 0);
                    }
                    f.data[off as usize..end].copy_from_slice(&data);
                }
            }
            Op::Truncate(slot, size) => {
                if let Some(id) = m.names.get(&slot) {
                    let a = s
                        .setattr(
                            sut.inos[id],
                            &SetAttr {
                                size: Some(size),
                                ..Default::default()
                            },
                        )
                        .unwrap();
                    assert_eq!(a.size, size);
                    m.files.get_mut(id).unwrap().data.resize(size as usize, 0);
                }
            }
            Op::Punch(slot, off, len) => {
                if let Some(id) = m.names.get(&slot) {
                    s.punch_hole(sut.inos[id], off, len).unwrap();
                    let f = m.files.get_mut(id).unwrap();
                    let end = ((off + len) as usize).min(f.data.len());
                    if (off as usize) < end {
                        f.data[off as usize..end].fill(0);
                    }
                }
            }
            Op::Rename(a, b) => {
                let r = s.rename(
                    sut.parent(a),
                    SLOTS[a].1,
                    sut.parent(b),
                    SLOTS[b].1,
                    RenameFlags::default(),
                );
                match m.names.get(&a).copied() {
                    None => assert!(matches!(r, Err(Error::NotFound))),
                    Some(src) => {
                        r.unwrap();
                        if a != b {
                            let dst = m.names.get(&b).copied();
                            if dst != Some(src) {
                                if let Some(d) = dst {
                                    let f = m.files.get_mut(&d).unwrap();
                                    f.nlink -= 1;
                                    if f.nlink == 0 {
                                        m.files.remove(&d);
                                    }
                                }
                                m.names.remove(&a);
                                m.names.insert(b, src);
                            }
                        }
                    }
                }
            }
            Op::Link(a, b) => {
                let Some(src) = m.names.get(&a).copied() else {
                    continue;
                };
                let r = s.link(sut.inos[&src], sut.parent(b), SLOTS[b].1);
                if m.names.contains_key(&b) {
                    assert!(matches!(r, Err(Error::Exists)));
                } else {
                    r.unwrap();
                    m.names.insert(b, src);
                    m.files.get_mut(&src).unwrap().nlink += 1;
                }
            }
            Op::Unlink(slot) => {
                let r = s.unlink(sut.parent(slot), SLOTS[slot].1);
                match m.names.remove(&slot) {
                    None => assert!(matches!(r, Err(Error::NotFound))),
                    Some(id) => {
                        r.unwrap();
                        let f = m.files.get_mut(&id).unwrap();
                        f.nlink -= 1;
                        if f.nlink == 0 {
                            m.files.remove(&id);
                            assert!(matches!(s.getattr(sut.inos[&id]), Err(Error::NotFound)));
                        }
                    }
                }
            }
            Op::UnlinkWhileOpen(slot) => {
                let Some(id) = m.names.get(&slot).copied() else {
                    continue;
                };
                let ino = sut.inos[&id];
                s.open_file(ino).unwrap();
                s.unlink(sut.parent(slot), SLOTS[slot].1).unwrap();
                m.names.remove(&slot);
                let f = m.files.get_mut(&id).unwrap();
                f.nlink -= 1;
                let want = f.data.clone();
                s.write(ino, want.len() as u64, b"more").unwrap();
                let got = read_all(s, ino).unwrap();
                assert_eq!(&got[..want.len()], &want[..]);
                assert_eq!(&got[want.len()..], b"more");
                f.data.extend_from_slice(b"more");
                s.release(ino).unwrap();
                if f.nlink == 0 {
                    m.files.remove(&id);
                    assert!(matches!(s.getattr(ino), Err(Error::NotFound)));
                }
            }
            Op::SetXattr(slot, v) => {
                if let Some(id) = m.names.get(&slot) {
                    let (name, val): (&[u8], &[u8]) = match v {
                        0 => (b"user.a", b"1"),
                        1 => (b"user.b", b"two"),
                        2 => (b"compfs.compression", b"lz4"),
                        _ => (b"compfs.compression", b"zlib:1"),
                    };
                    s.setxattr(sut.inos[id], name, val, XattrSet::Any).unwrap();
                    let norm = if name == b"compfs.compression" {
                        CodecSpec::parse(std::str::from_utf8(val).unwrap())
                            .unwrap()
                            .spec
                            .to_string()
                            .into_bytes()
                    } else {
                        val.to_vec()
                    };
                    m.files
                        .get_mut(id)
                        .unwrap()
                        .xattrs
                        .insert(name.to_vec(), norm);
                }
            }
            Op::Read(slot, off, len) => {
                if let Some(id) = m.names.get(&slot) {
                    let mut buf = vec![0xaa; len];
                    let n = s.read(sut.inos[id], off, &mut buf).unwrap();
                    let d = &m.files[id].data;
                    let want = if (off as usize) < d.len() {
                        &d[off as usize..(off as usize + len).min(d.len())]
                    } else {
                        &[][..]
                    };
                    assert_eq!(&buf[..n], want);
                }
            }
            Op::Fsync(slot) => {
                if let Some(id) = m.names.get(&slot) {
                    s.fsync(sut.inos[id], false).unwrap();
                }
            }
            Op::Sync => s.sync().unwrap(),
            Op::Reopen => {
                sut.store.take().unwrap().close().unwrap();
                sut.store = Some(open(&sut.dir, tun()));
            }
        }
        check_all(&sut, &m);
    }
    sut.store.take().unwrap().close().unwrap();
    assert_clean(&dir);
    // Statistics kept incrementally agree with a full usage scan.
    let s = open(&dir, tun());
    let u = s.usage(&[ROOT_INO]).unwrap();
    let st = s.stats();
    let disk: u64 = st.per_codec.values().map(|c| c.disk).sum();
    let refd: u64 = st.per_codec.values().map(|c| c.referenced).sum();
    assert_eq!(
        (disk, refd),
        (u.total.disk, u.total.referenced),
        "{st:?} {u:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, max_shrink_iters: 200, ..ProptestConfig::default() })]
    #[test]
    fn store_matches_model(ops in proptest::collection::vec(op(), 1..40)) {
        run(ops);
    }
}
