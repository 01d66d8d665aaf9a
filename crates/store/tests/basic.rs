//! Basic semantics of the store API.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::type_complexity,
    clippy::map_entry
)]

use compfs_store::*;

mod common;
use common::copy_dir;

fn new_store(ext: u32) -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s");
    let opts = CreateOptions {
        extent_size: ext,
        ..CreateOptions::default()
    };
    let s = Store::create(&p, &opts).unwrap();
    (dir, s)
}

use compfs_testdata::text as pattern;

fn read_all(s: &Store, ino: Ino) -> Vec<u8> {
    let size = s.getattr(ino).unwrap().size as usize;
    let mut buf = vec![0u8; size + 10];
    let n = s.read(ino, 0, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

#[test]
fn create_write_read_reopen() {
    let (dir, s) = new_store(16384);
    let p = dir.path().join("s");
    let f = s
        .mknod(ROOT_INO, b"a.txt", FileKind::File, 0o644, 1, 2, 0)
        .unwrap();
    assert_eq!(f.nlink, 1);
    let data = pattern(100_000, 1);
    assert_eq!(s.write(f.ino, 0, &data).unwrap(), data.len());
    assert_eq!(read_all(&s, f.ino), data);
    s.fsync(f.ino, false).unwrap();
    assert_eq!(read_all(&s, f.ino), data);
    // overwrite in the middle, unaligned
    s.write(f.ino, 5000, b"HELLO").unwrap();
    let mut want = data.clone();
    want[5000..5005].copy_from_slice(b"HELLO");
    assert_eq!(read_all(&s, f.ino), want);
    let d = s.mkdir(ROOT_INO, b"dir", 0o755, 0, 0).unwrap();
    s.symlink(d.ino, b"ln", b"../a.txt", 0, 0).unwrap();
    s.close().unwrap();
    let s = Store::open(&p, &OpenOptions::default()).unwrap();
    let a = s.lookup(ROOT_INO, b"a.txt").unwrap();
    assert_eq!(a.size, 100_000);
    assert_eq!((a.uid, a.gid, a.perm), (1, 2, 0o644));
    assert!(a.blocks > 0 && a.blocks * 512 < 100_000);
    assert_eq!(read_all(&s, a.ino), want);
    let l = s.lookup(d.ino, b"ln").unwrap();
    assert_eq!(s.readlink(l.ino).unwrap(), b"../a.txt");
    assert_eq!(s.lookup(d.ino, b"..").unwrap().ino, ROOT_INO);
    let names: Vec<Vec<u8>> = s
        .readdir(ROOT_INO, 0, 100)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(
        names,
        vec![
            b".".to_vec(),
            b"..".to_vec(),
            b"a.txt".to_vec(),
            b"dir".to_vec()
        ]
    );
}

#[test]
fn small_files_inline_and_holes() {
    let (_d, s) = new_store(4096);
    let f = s
        .mknod(ROOT_INO, b"small", FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    s.write(f.ino, 0, b"tiny file").unwrap();
    s.sync().unwrap();
    let u = s.usage(&[f.ino]).unwrap();
    assert_eq!((u.files, u.inline, u.regular_extents), (1, 1, 0));
    // grow past the inline limit with a hole in between
    s.write(f.ino, 20000, b"tail").unwrap();
    s.sync().unwrap();
    let mut buf = vec![1u8; 20004];
    assert_eq!(s.read(f.ino, 0, &mut buf).unwrap(), 20004);
    assert_eq!(&buf[..9], b"tiny file");
    assert!(buf[9..20000].iter().all(|&b| b == 0));
    assert_eq!(&buf[20000..], b"tail");
    assert_eq!(s.seek_data(f.ino, 100).unwrap(), 20000 / 4096 * 4096);
    assert_eq!(s.seek_hole(f.ino, 0).unwrap(), 9);
    assert!(matches!(s.seek_data(f.ino, 20004), Err(Error::NoData)));
    // truncate down and up
    s.setattr(
        f.ino,
        &SetAttr {
            size: Some(4),
            ..Default::default()
        },
    )
    .unwrap();
    s.setattr(
        f.ino,
        &SetAttr {
            size: Some(10),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(read_all(&s, f.ino), b"tiny\0\0\0\0\0\0");
}

#[test]
fn namespace_errors_and_rename() {
    let (_d, s) = new_store(131072);
    let d = s.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap();
    let f = s
        .mknod(d.ino, b"f", FileKind::File, 0o600, 0, 0, 0)
        .unwrap();
    assert!(matches!(
        s.mknod(d.ino, b"f", FileKind::File, 0o600, 0, 0, 0),
        Err(Error::Exists)
    ));
    assert!(matches!(s.rmdir(ROOT_INO, b"d"), Err(Error::NotEmpty)));
    assert!(matches!(s.unlink(ROOT_INO, b"d"), Err(Error::IsDir)));
    assert!(matches!(
        s.lookup(ROOT_INO, &[b'x'; 256]),
        Err(Error::NameTooLong)
    ));
    assert!(matches!(s.lookup(f.ino, b"x"), Err(Error::NotDir)));
    assert!(matches!(
        s.link(d.ino, ROOT_INO, b"dl"),
        Err(Error::NotPermitted(_))
    ));
    s.link(f.ino, ROOT_INO, b"g").unwrap();
    assert_eq!(s.getattr(f.ino).unwrap().nlink, 2);
    s.rename(ROOT_INO, b"g", d.ino, b"f", RenameFlags::default())
        .unwrap(); // same inode: no-op
    assert_eq!(s.getattr(f.ino).unwrap().nlink, 2);
    assert!(matches!(
        s.rename(ROOT_INO, b"d", d.ino, b"sub", RenameFlags::default()),
        Err(Error::InvalidArgument(_))
    ));
    let e = s.mkdir(ROOT_INO, b"e", 0o755, 0, 0).unwrap();
    assert_eq!(s.getattr(ROOT_INO).unwrap().nlink, 4);
    s.rename(ROOT_INO, b"e", d.ino, b"e2", RenameFlags::default())
        .unwrap();
    assert_eq!(s.getattr(ROOT_INO).unwrap().nlink, 3);
    assert_eq!(s.getattr(d.ino).unwrap().nlink, 3);
    assert_eq!(s.lookup(e.ino, b"..").unwrap().ino, d.ino);
    s.rename(
        d.ino,
        b"f",
        ROOT_INO,
        b"g",
        RenameFlags {
            exchange: true,
            noreplace: false,
        },
    )
    .unwrap();
    assert!(matches!(
        s.rename(
            ROOT_INO,
            b"g",
            d.ino,
            b"e2",
            RenameFlags {
                noreplace: true,
                exchange: false
            }
        ),
        Err(Error::Exists)
    ));
    // unlink while open keeps the data
    s.unlink(ROOT_INO, b"g").unwrap();
    s.open_file(f.ino).unwrap();
    s.write(f.ino, 0, b"data").unwrap();
    s.unlink(d.ino, b"f").unwrap();
    let mut b = [0u8; 4];
    assert_eq!(s.read(f.ino, 0, &mut b).unwrap(), 4);
    assert_eq!(&b, b"data");
    s.release(f.ino).unwrap();
    assert!(matches!(s.getattr(f.ino), Err(Error::NotFound)));
    // readdir cookies
    for i in 0..20 {
        s.mknod(
            ROOT_INO,
            format!("n{i}").as_bytes(),
            FileKind::File,
            0o600,
            0,
            0,
            0,
        )
        .unwrap();
    }
    let mut all = Vec::new();
    let mut off = 0;
    loop {
        let v = s.readdir(ROOT_INO, off, 3).unwrap();
        if v.is_empty() {
            break;
        }
        off = v.last().unwrap().offset;
        all.extend(v.into_iter().map(|e| e.name));
    }
    assert_eq!(all.len(), 2 + 1 + 20);
}

#[test]
fn xattrs_and_compression_property() {
    let (_d, s) = new_store(131072);
    let d = s.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap();
    s.setxattr(d.ino, b"compfs.compression", b"lz4", XattrSet::Any)
        .unwrap();
    assert!(matches!(
        s.setxattr(d.ino, b"compfs.compression", b"bogus:1", XattrSet::Any),
        Err(Error::InvalidArgument(_))
    ));
    let f = s
        .mknod(d.ino, b"f", FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    assert_eq!(s.compression(f.ino).unwrap().unwrap().to_string(), "lz4");
    s.write(f.ino, 0, &pattern(300_000, 3)).unwrap();
    s.sync().unwrap();
    let u = s.usage(&[f.ino]).unwrap();
    assert!(u.per_codec.contains_key("lz4"), "{u:?}");
    s.setxattr(f.ino, b"user.x", b"1", XattrSet::Create)
        .unwrap();
    assert!(matches!(
        s.setxattr(f.ino, b"user.x", b"1", XattrSet::Create),
        Err(Error::Exists)
    ));
    assert!(matches!(
        s.setxattr(f.ino, b"user.y", b"1", XattrSet::Replace),
        Err(Error::NoXattr)
    ));
    assert_eq!(s.getxattr(f.ino, b"user.x").unwrap(), b"1");
    assert_eq!(s.listxattr(f.ino).unwrap().len(), 2);
    s.removexattr(f.ino, b"user.x").unwrap();
    assert!(matches!(s.getxattr(f.ino, b"user.x"), Err(Error::NoXattr)));
    s.set_compression(f.ino, None).unwrap();
    assert_eq!(s.compression(f.ino).unwrap(), None);
    s.recompress(
        f.ino,
        Some((CodecSpec::parse("zstd:1").unwrap().spec, Mode::Force)),
    )
    .unwrap();
    let u = s.usage(&[f.ino]).unwrap();
    assert!(
        u.per_codec.contains_key("zstd") && !u.per_codec.contains_key("lz4"),
        "{u:?}"
    );
    assert_eq!(read_all(&s, f.ino), pattern(300_000, 3));
}

/// The frozen version-1 store in tests/fixtures/v1 must keep opening with its contents intact.
/// (Generated once by `generate_v1_fixture`; never regenerate it for a new format version.)
#[test]
fn frozen_v1_fixture_opens() {
    frozen_fixture_opens("v1", 1);
}

/// The same for the frozen version-2 store (generated by `generate_v2_fixture` with a
/// format-version-2 compfs; it adds `small2`, compressed inline data with a checksum).
#[test]
fn frozen_v2_fixture_opens() {
    frozen_fixture_opens("v2", 2);
}

fn frozen_fixture_opens(name: &str, version: u32) {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join(name);
    copy_dir(&src, &dir);
    let r = fsck(&dir, false, &mut |_, _| {}).unwrap();
    assert!(r.is_clean(), "{:#?}", r.problems);
    // Opened read-only it stays a version-1 store...
    let ro = OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    };
    let s = Store::open(&dir, &ro).unwrap();
    assert_eq!(s.superblock().version, version);
    assert_eq!(
        read_all(&s, s.lookup(ROOT_INO, b"small").unwrap().ino),
        b"inline data"
    );
    s.close().unwrap();
    // ...opened for writing it is upgraded to the current version before anything is written.
    let s = Store::open(&dir, &OpenOptions::default()).unwrap();
    assert_eq!(s.superblock().version, compfs_store::format::FORMAT_VERSION);
    assert_eq!(s.extent_size(), 16384);
    let (want_text, want_rand) = fixture_data();
    let a = s.lookup(ROOT_INO, b"text").unwrap();
    assert_eq!(read_all(&s, a.ino), want_text);
    assert_eq!(s.compression(a.ino).unwrap().unwrap().to_string(), "zstd:1");
    let d = s.lookup(ROOT_INO, b"dir").unwrap();
    let r = s.lookup(d.ino, b"random").unwrap();
    assert_eq!(read_all(&s, r.ino), want_rand);
    assert_eq!(s.getxattr(r.ino, b"user.note").unwrap(), b"v1");
    let l = s.lookup(d.ino, b"link").unwrap();
    assert_eq!(s.readlink(l.ino).unwrap(), b"../text");
    let small = s.lookup(ROOT_INO, b"small").unwrap();
    assert_eq!(read_all(&s, small.ino), b"inline data");
    let h = s.lookup(ROOT_INO, b"hard").unwrap();
    assert_eq!((h.ino, h.nlink), (a.ino, 2));
    let u = s.usage(&[ROOT_INO]).unwrap();
    if version == 1 {
        assert_eq!((u.files, u.inline), (3, 1));
    } else {
        assert_eq!((u.files, u.inline), (4, 2));
        let s2 = s.lookup(ROOT_INO, b"small2").unwrap();
        assert_eq!(read_all(&s, s2.ino), &want_text[..1500]);
        assert!(u.inline_bytes.disk < u.inline_bytes.uncompressed, "{u:?}");
    }
    assert!(
        u.per_codec.contains_key("zstd") && u.per_codec.contains_key("none"),
        "{u:?}"
    );
    // Version-1 records next to new ones: a new inline file, an old inline file rewritten.
    let n = s
        .mknod(ROOT_INO, b"new", FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    s.write(n.ino, 0, &want_text[..1500]).unwrap();
    s.write(small.ino, 0, b"INLINE").unwrap();
    s.close().unwrap();
    let rep = fsck(&dir, false, &mut |_, _| {}).unwrap();
    assert!(rep.is_clean(), "{:#?}", rep.problems);
    let s = Store::open(&dir, &ro).unwrap();
    assert_eq!(s.superblock().version, compfs_store::format::FORMAT_VERSION);
    assert_eq!(read_all(&s, n.ino), &want_text[..1500]);
    assert_eq!(read_all(&s, small.ino), b"INLINE data");
    assert_eq!(read_all(&s, a.ino), want_text);
    assert_eq!(read_all(&s, r.ino), want_rand);
}

/// The frozen fixture's contents, generated here and not by compfs-testdata: they must never
/// change.
fn fixture_data() -> (Vec<u8>, Vec<u8>) {
    let words: [&[u8]; 6] = [
        b"alpha ",
        b"beta ",
        b"gamma ",
        b"delta ",
        b"\n",
        b"0123456789 ",
    ];
    let mut s = 11u64;
    let mut text = Vec::with_capacity(20_016);
    while text.len() < 20_000 {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        text.extend_from_slice(words[(s >> 60) as usize % 6]);
    }
    text.truncate(20_000);
    let mut x = 12345u64;
    let rand: Vec<u8> = (0..9000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect();
    (text, rand)
}

#[test]
#[ignore = "run once to create tests/fixtures/v1; the fixture is frozen"]
fn generate_v1_fixture() {
    generate_fixture("v1");
}

#[test]
#[ignore = "run once (with a format-version-2 compfs) to create tests/fixtures/v2; the fixture is frozen"]
fn generate_v2_fixture() {
    generate_fixture("v2");
}

/// Writes the frozen fixture `name` (the same files in every version; version 2 adds a
/// compressed inline file, `small2`).
fn generate_fixture(name: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let dir = dir.as_path();
    assert!(!dir.exists(), "the fixture is frozen; do not regenerate it");
    let opts = CreateOptions {
        extent_size: 16384,
        ..CreateOptions::default()
    };
    let t = Tuning {
        flush_interval: None,
        ..Tuning::default()
    };
    let s = Store::create_tuned(dir, &opts, t).unwrap();
    let (text, rand) = fixture_data();
    let a = s
        .mknod(ROOT_INO, b"text", FileKind::File, 0o644, 1000, 1000, 0)
        .unwrap();
    s.set_compression(a.ino, Some(CodecSpec::parse("zstd:1").unwrap().spec))
        .unwrap();
    s.write(a.ino, 0, &text).unwrap();
    let d = s.mkdir(ROOT_INO, b"dir", 0o755, 1000, 1000).unwrap();
    let r = s
        .mknod(d.ino, b"random", FileKind::File, 0o600, 0, 0, 0)
        .unwrap();
    s.write(r.ino, 0, &rand).unwrap();
    s.setxattr(r.ino, b"user.note", b"v1", XattrSet::Create)
        .unwrap();
    s.symlink(d.ino, b"link", b"../text", 0, 0).unwrap();
    let sm = s
        .mknod(ROOT_INO, b"small", FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    s.write(sm.ino, 0, b"inline data").unwrap();
    s.link(a.ino, ROOT_INO, b"hard").unwrap();
    if name != "v1" {
        let s2 = s
            .mknod(ROOT_INO, b"small2", FileKind::File, 0o644, 0, 0, 0)
            .unwrap();
        s.write(s2.ino, 0, &text[..1500]).unwrap();
    }
    s.close().unwrap();
}

#[test]
fn allocate_statfs_stats_and_automatic_gc() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("s");
    let tun = Tuning {
        segment_size: 64 << 10,
        flush_interval: Some(std::time::Duration::from_millis(20)),
        gc_min_garbage: 64 << 10,
        gc_garbage_ratio: 0.3,
        ..Tuning::default()
    };
    let s = Store::create_tuned(
        &p,
        &CreateOptions {
            extent_size: 16384,
            ..Default::default()
        },
        tun,
    )
    .unwrap();
    let f = s
        .mknod(ROOT_INO, b"f", FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    s.allocate(f.ino, 0, 100_000, true).unwrap();
    assert_eq!(s.getattr(f.ino).unwrap().size, 0);
    s.allocate(f.ino, 0, 100_000, false).unwrap();
    assert_eq!(s.getattr(f.ino).unwrap().size, 100_000);
    assert!(read_all(&s, f.ino).iter().all(|&b| b == 0));
    let fs = s.statfs().unwrap();
    assert!(fs.blocks > 0 && fs.bsize > 0 && fs.files >= 2);
    // Overwrite the same data many times: garbage piles up, the flusher's GC reclaims it.
    for i in 0..40u64 {
        s.write(f.ino, 0, &pattern(200_000, i)).unwrap();
        s.fsync(f.ino, false).unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while s.stats().gc_runs == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let st = s.stats();
    assert!(st.gc_runs > 0, "automatic GC never ran: {st:?}");
    assert!(st.user_bytes_written >= 40 * 200_000);
    assert!(st.extents_compressed.contains_key("zstd"));
    assert_eq!(read_all(&s, f.ino), pattern(200_000, 39));
    s.close().unwrap();
    assert!(fsck(&p, false, &mut |_, _| {}).unwrap().is_clean());
}

#[test]
fn deleting_files_returns_space() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("s");
    let tun = Tuning {
        segment_size: 256 << 10,
        flush_interval: None,
        ..Tuning::default()
    };
    let s = Store::create_tuned(&p, &CreateOptions::default(), tun).unwrap();
    let mut inos = Vec::new();
    for i in 0..4u64 {
        let f = s
            .mknod(
                ROOT_INO,
                format!("f{i}").as_bytes(),
                FileKind::File,
                0o644,
                0,
                0,
                0,
            )
            .unwrap();
        s.write(f.ino, 0, &pattern(1 << 20, i)).unwrap();
        inos.push(f.ino);
    }
    s.sync().unwrap();
    let seg_bytes = |p: &std::path::Path| -> u64 {
        std::fs::read_dir(p.join("segments"))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum()
    };
    let full = seg_bytes(&p);
    assert!(full > 100_000);
    for i in 0..4u64 {
        s.unlink(ROOT_INO, format!("f{i}").as_bytes()).unwrap();
    }
    assert_eq!(s.stats().live_bytes, 0);
    let r = s.gc().unwrap();
    assert!(r.bytes_after < full / 10, "{r:?}");
    assert!(seg_bytes(&p) < full / 10);
    let u = s.usage(&[ROOT_INO]).unwrap();
    assert_eq!((u.files, u.total.disk), (0, 0));
    s.close().unwrap();
    assert!(fsck(&p, false, &mut |_, _| {}).unwrap().is_clean());
}

#[test]
fn files_beyond_4_gib() {
    let (_d, s) = new_store(131072);
    let f = s
        .mknod(ROOT_INO, b"big", FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    let off = 5u64 << 30;
    s.write(f.ino, off, b"far away").unwrap();
    s.write(f.ino, 10, b"near").unwrap();
    s.sync().unwrap();
    assert_eq!(s.getattr(f.ino).unwrap().size, off + 8);
    let mut b = [0u8; 8];
    assert_eq!(s.read(f.ino, off, &mut b).unwrap(), 8);
    assert_eq!(&b, b"far away");
    assert_eq!(s.read(f.ino, off - 4, &mut b).unwrap(), 8);
    assert_eq!(&b, b"\0\0\0\0far ");
    assert_eq!(s.seek_data(f.ino, 200_000).unwrap(), off / 131072 * 131072);
    assert_eq!(s.seek_hole(f.ino, 0).unwrap(), 131072);
    s.setattr(
        f.ino,
        &SetAttr {
            size: Some(off + 4),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(s.read(f.ino, off, &mut b).unwrap(), 4);
    assert_eq!(&b[..4], b"far ");
    assert!(s.getattr(f.ino).unwrap().blocks < 100);
}

#[test]
fn heuristic_stores_random_data_raw_and_force_mode_is_per_policy() {
    let (_d, s) = new_store(131072);
    assert_eq!(s.policy().1, Mode::Heuristic);
    let random = compfs_testdata::random(512 * 1024, 7);
    let r = s
        .mknod(ROOT_INO, b"random", FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    s.write(r.ino, 0, &random).unwrap();
    let t = s
        .mknod(ROOT_INO, b"text", FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    s.write(t.ino, 0, &pattern(512 * 1024, 5)).unwrap();
    s.sync().unwrap();
    let ur = s.usage(&[r.ino]).unwrap();
    assert_eq!(
        ur.per_codec.keys().collect::<Vec<_>>(),
        vec!["none"],
        "{ur:?}"
    );
    assert_eq!(ur.total.disk, random.len() as u64);
    let ut = s.usage(&[t.ino]).unwrap();
    assert_eq!(
        ut.per_codec.keys().collect::<Vec<_>>(),
        vec!["zstd"],
        "{ut:?}"
    );
    assert!(ut.total.disk * 3 < ut.total.uncompressed);
    let st = s.stats();
    assert!(st.heuristic_skips + st.extents_raw >= 4, "{st:?}");
    // A remount-style policy change applies to later writes.
    s.set_policy(CodecSpec::parse("lz4").unwrap().spec, Mode::Force);
    let l = s
        .mknod(ROOT_INO, b"lz4", FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    s.write(l.ino, 0, &pattern(256 * 1024, 6)).unwrap();
    s.sync().unwrap();
    let ul = s.usage(&[l.ino]).unwrap();
    assert_eq!(
        ul.per_codec.keys().collect::<Vec<_>>(),
        vec!["lz4"],
        "{ul:?}"
    );
    assert_eq!(read_all(&s, r.ino), random);
}

/// `setattr` changes are held in memory until the next commit (see `attrs.rs` in the store):
/// they must read back at once, survive a reopen, never override a newer mtime, and vanish
/// with a freed inode.
#[test]
fn attribute_changes_are_deferred_but_never_stale_or_lost() {
    let (dir, s) = new_store(16384);
    let p = dir.path().join("s");
    let t = |secs| TimeOrNow::Time(Timestamp { secs, nsecs: 7 });
    let d = s.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap();
    let f = s
        .mknod(d.ino, b"f", FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    s.write(f.ino, 0, &pattern(50_000, 3)).unwrap();
    let set = SetAttr {
        mode: Some(0o4600),
        uid: Some(11),
        gid: Some(12),
        atime: Some(t(1_000)),
        mtime: Some(t(2_000)),
        ..SetAttr::default()
    };
    let a = s.setattr(f.ino, &set).unwrap();
    assert_eq!((a.perm, a.uid, a.gid), (0o4600, 11, 12));
    assert_eq!((a.atime.secs, a.mtime.secs), (1_000, 2_000));
    assert_eq!(s.getattr(f.ino).unwrap().mtime.secs, 2_000);
    // A later write sets mtime to now; the pending patch must not put 2000 back.
    s.write(f.ino, 10, b"x").unwrap();
    assert!(s.getattr(f.ino).unwrap().mtime.secs > 2_000);
    // Same for a directory: a patch's mtime loses against a later entry creation.
    s.setattr(
        d.ino,
        &SetAttr {
            mtime: Some(t(3_000)),
            mode: Some(0o700),
            ..SetAttr::default()
        },
    )
    .unwrap();
    assert_eq!(s.getattr(d.ino).unwrap().mtime.secs, 3_000);
    s.mknod(d.ino, b"g", FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    let da = s.getattr(d.ino).unwrap();
    assert!(da.mtime.secs > 3_000);
    assert_eq!(da.perm, 0o700);
    // A patch of an inode freed before any commit disappears with it.
    let h = s
        .mknod(d.ino, b"h", FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    s.setattr(
        h.ino,
        &SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        },
    )
    .unwrap();
    s.unlink(d.ino, b"h").unwrap();
    assert!(matches!(s.getattr(h.ino), Err(Error::NotFound)));
    let before = s.getattr(f.ino).unwrap();
    let dbefore = s.getattr(d.ino).unwrap();
    s.close().unwrap();
    let s = Store::open(&p, &OpenOptions::default()).unwrap();
    let after = s.getattr(f.ino).unwrap();
    assert_eq!(
        (after.perm, after.uid, after.gid, after.atime, after.mtime),
        (
            before.perm,
            before.uid,
            before.gid,
            before.atime,
            before.mtime
        )
    );
    let da2 = s.getattr(d.ino).unwrap();
    assert_eq!((da2.perm, da2.mtime), (0o700, dbefore.mtime));
    assert!(matches!(s.getattr(h.ino), Err(Error::NotFound)));
    // A chmod alone becomes durable with fsync.
    s.setattr(
        f.ino,
        &SetAttr {
            mode: Some(0o640),
            ..SetAttr::default()
        },
    )
    .unwrap();
    s.fsync(f.ino, false).unwrap();
    drop(s);
    let s = Store::open(&p, &OpenOptions::default()).unwrap();
    assert_eq!(s.getattr(f.ino).unwrap().perm, 0o640);
}

/// A flush appends a file's extents in file order, whichever compression worker finished
/// first (the workers take groups of blocks and hand them back as they finish): a file
/// written sequentially lies sequentially in its segment, so readahead along a segment follows
/// the file, and what follows its last extent is the file written after it (what a bucket
/// store fetches ahead of an in-order directory read).
#[test]
fn a_flush_appends_a_files_extents_in_file_order() {
    let (dir, s) = new_store(16384);
    let p = dir.path().join("s");
    let mut inos = Vec::new();
    for (i, name) in [&b"a"[..], b"b"].into_iter().enumerate() {
        let f = s
            .mknod(ROOT_INO, name, FileKind::File, 0o644, 0, 0, 0)
            .unwrap();
        s.open_file(f.ino).unwrap();
        // Text of varying compressibility: the workers' groups take unequal times.
        s.write(f.ino, 0, &pattern(4 << 20, i as u64)).unwrap();
        s.fsync(f.ino, false).unwrap();
        inos.push(f.ino);
    }
    s.close().unwrap();
    let order: Vec<(Ino, u64)> = common::walk_segments(&p)
        .into_iter()
        .map(|(_, _, h)| (h.ino, h.file_offset))
        .filter(|(ino, _)| inos.contains(ino))
        .collect();
    let want: Vec<(Ino, u64)> = inos
        .iter()
        .flat_map(|&ino| (0..256u64).map(move |b| (ino, b * 16384)))
        .collect();
    assert_eq!(order, want, "extents in segment order");
}
