//! Small files (issue 16): the byte-granular worth-it rule, compressed and checksummed inline
//! data, and the format version they need.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use compfs_store::format;
use compfs_store::*;

fn store_with(dir: &std::path::Path, inline_max: u32, min_saving: MinSaving) -> Store {
    let t = Tuning {
        inline_max,
        ..tuning()
    };
    let s = create(dir, 131072, t.clone());
    s.close().unwrap();
    // These tests are about files stored alone (inline or in an extent of their own): no
    // packs (tests/pack.rs has those).
    let o = OpenOptions {
        min_saving,
        pack: 0,
        ..OpenOptions::default()
    };
    Store::open_tuned(dir, &o, t).unwrap()
}

fn put(s: &Store, name: &[u8], data: &[u8]) -> Ino {
    let f = s
        .mknod(ROOT_INO, name, FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    s.write(f.ino, 0, data).unwrap();
    f.ino
}

/// A 3,000-byte text file in an extent: kept compressed under the byte rule (it saves bytes,
/// not a 4 KiB sector), stored raw under the sector rule; both read back exactly.
#[test]
fn byte_rule_compresses_what_the_sector_rule_stores_raw() {
    let text = pattern(3000, 16);
    let t = tempfile::tempdir().unwrap();
    for (name, rule, want_codec) in [
        ("bytes", MinSaving::Bytes(1), "zstd"),
        ("sector", MinSaving::Sectors(1), "none"),
    ] {
        let dir = t.path().join(name);
        let s = store_with(&dir, 0, rule);
        let ino = put(&s, b"f", &text);
        s.sync().unwrap();
        let u = s.usage(&[ino]).unwrap();
        assert_eq!((u.inline, u.regular_extents), (0, 1), "{name}: {u:?}");
        assert_eq!(
            u.per_codec.keys().collect::<Vec<_>>(),
            [want_codec],
            "{name}"
        );
        let disk = u.total.disk;
        if want_codec == "zstd" {
            assert!(disk < 3000, "{name}: {disk}");
        } else {
            assert_eq!(disk, 3000, "{name}");
        }
        assert_eq!(read_all(&s, ino).unwrap(), text);
        s.close().unwrap();
        let s = open(&dir, tuning());
        assert_eq!(read_all(&s, ino).unwrap(), text);
        s.close().unwrap();
        let r = fsck(&dir, false, &mut |_, _| {}).unwrap();
        assert!(r.is_clean(), "{name}: {:#?}", r.problems);
    }
}

/// Rewrites the inode record of `ino` in the closed store at `dir` through `f`.
fn patch_inode(dir: &std::path::Path, ino: Ino, f: impl FnOnce(&mut format::InodeRec)) {
    use redb::{ReadableTable, TableDefinition};
    const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
    let db = redb::Database::open(dir.join(format::META_FILE)).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut t = txn.open_table(INODES).unwrap();
        let mut rec = format::InodeRec::decode(t.get(ino).unwrap().unwrap().value()).unwrap();
        f(&mut rec);
        t.insert(ino, rec.encode().as_slice()).unwrap();
    }
    txn.commit().unwrap();
}

/// Small files are inline, compressed with the file's codec when that is shorter, and
/// checksummed: a damaged byte of the stored bytes, or of the checksum, gives EIO for that file
/// only (never other bytes), fsck reports it, and `fsck --repair` drops it.
#[test]
fn inline_data_is_compressed_checksummed_and_damage_is_eio() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let s = store_with(&dir, 4096, DEFAULT_MIN_SAVING);
    let text = pattern(1500, 7);
    let a = put(&s, b"a", &text);
    let b = put(&s, b"b", &text[..900]);
    let rnd = random(1000, 8);
    let c = put(&s, b"c", &rnd);
    s.sync().unwrap();
    let u = s.usage(&[a]).unwrap();
    assert_eq!((u.inline, u.regular_extents), (1, 0), "{u:?}");
    assert!(u.per_codec.contains_key("zstd"), "{u:?}");
    assert!(u.total.disk < 1500, "{u:?}");
    // Random bytes do not compress: inline raw.
    let u = s.usage(&[c]).unwrap();
    assert_eq!(u.per_codec.keys().collect::<Vec<_>>(), ["none"]);
    s.close().unwrap();

    patch_inode(&dir, a, |r| r.inline.as_mut().unwrap().bytes[3] ^= 0x20);
    patch_inode(&dir, c, |r| r.inline.as_mut().unwrap().crc ^= 1);
    let r = fsck(&dir, false, &mut |_, _| {}).unwrap();
    let bad: Vec<_> = r
        .problems
        .iter()
        .filter(|p| p.kind == ProblemKind::CorruptExtent)
        .map(|p| p.ino)
        .collect();
    assert_eq!(bad, [Some(a), Some(c)], "{:#?}", r.problems);
    let s = open(&dir, tuning());
    let mut buf = vec![0u8; 2000];
    for ino in [a, c] {
        match s.read(ino, 0, &mut buf) {
            Err(e @ Error::Corrupt { .. }) => assert_eq!(e.errno(), libc_eio()),
            other => panic!("damaged inline data read as {other:?}"),
        }
    }
    assert_eq!(read_all(&s, b).unwrap(), &text[..900]);
    s.close().unwrap();
    // Repair drops the damaged inline data, as it drops a corrupt extent's map entries: the
    // files keep their size and read as zeros; the rest is untouched.
    let r = fsck(&dir, true, &mut |_, _| {}).unwrap();
    assert_eq!(r.unrepaired(), 0, "{:#?}", r.problems);
    let r = fsck(&dir, false, &mut |_, _| {}).unwrap();
    assert!(r.is_clean(), "{:#?}", r.problems);
    let s = open(&dir, tuning());
    assert_eq!(read_all(&s, a).unwrap(), vec![0u8; 1500]);
    assert_eq!(read_all(&s, c).unwrap(), vec![0u8; 1000]);
    assert_eq!(read_all(&s, b).unwrap(), &text[..900]);
    s.close().unwrap();
}

fn libc_eio() -> i32 {
    5
}

/// Inline data after every kind of change: grown past the limit (moved to an extent), shrunk
/// back by truncation, rewritten in place; the v2 record's optional fields (rdev, directory
/// fields, disk bytes) survive a reopen.
#[test]
fn inline_files_through_growth_truncation_and_reopen() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let s = store_with(&dir, 4096, DEFAULT_MIN_SAVING);
    let text = pattern(10_000, 9);
    let f = put(&s, b"f", &text[..3000]);
    s.sync().unwrap();
    assert_eq!(s.usage(&[f]).unwrap().inline, 1);
    s.write(f, 3000, &text[3000..]).unwrap();
    s.sync().unwrap();
    let u = s.usage(&[f]).unwrap();
    assert_eq!((u.inline, u.regular_extents), (0, 1), "{u:?}");
    s.setattr(
        f,
        &SetAttr {
            size: Some(2000),
            ..Default::default()
        },
    )
    .unwrap();
    s.write(f, 10, b"XYZ").unwrap();
    s.sync().unwrap();
    let mut want = text[..2000].to_vec();
    want[10..13].copy_from_slice(b"XYZ");
    assert_eq!(read_all(&s, f).unwrap(), want);
    let dev = s
        .mknod(ROOT_INO, b"dev", FileKind::CharDev, 0o600, 0, 0, 0x0103)
        .unwrap();
    let d = s.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap();
    s.symlink(d.ino, b"l", b"../f", 0, 0).unwrap();
    s.close().unwrap();
    let r = fsck(&dir, false, &mut |_, _| {}).unwrap();
    assert!(r.is_clean(), "{:#?}", r.problems);
    let s = open(&dir, tuning());
    assert_eq!(read_all(&s, f).unwrap(), want);
    assert_eq!(s.getattr(dev.ino).unwrap().rdev, 0x0103);
    assert_eq!(s.lookup(d.ino, b"..").unwrap().ino, ROOT_INO);
    let l = s.lookup(d.ino, b"l").unwrap();
    assert_eq!(s.readlink(l.ino).unwrap(), b"../f");
    s.close().unwrap();
}

/// The measurement behind the inline limit (docs/benchmarks.md): copies the tree named by
/// `COMPFS_SMALL_TREE` into stores with several inline limits (store API, zstd:3 heuristic,
/// one close per file as `cp` does) and prints the store's bytes after close.
#[test]
#[ignore = "measurement: COMPFS_SMALL_TREE=DIR cargo test -p compfs-store --test small_files -- --ignored --nocapture"]
fn measure_inline_limits() {
    let Ok(tree) = std::env::var("COMPFS_SMALL_TREE") else {
        panic!("set COMPFS_SMALL_TREE");
    };
    let limits: Vec<u32> = std::env::var("COMPFS_INLINE_LIMITS")
        .unwrap_or_else(|_| "2048,4096,8192,16384".into())
        .split(',')
        .map(|x| x.parse().unwrap())
        .collect();
    let t = tempfile::tempdir().unwrap();
    for limit in limits {
        let dir = t.path().join(format!("s{limit}"));
        let tn = Tuning {
            inline_max: limit,
            segment_size: 64 << 20,
            flush_interval: Some(std::time::Duration::from_secs(2)),
            ..Tuning::default()
        };
        let s = create(&dir, 131072, tn.clone());
        let start = std::time::Instant::now();
        let mut todo = vec![(std::path::PathBuf::from(&tree), ROOT_INO)];
        let (mut files, mut bytes) = (0u64, 0u64);
        while let Some((p, parent)) = todo.pop() {
            for e in std::fs::read_dir(&p).unwrap() {
                let e = e.unwrap();
                let name = e.file_name();
                let name = name.as_encoded_bytes();
                let ft = e.file_type().unwrap();
                if ft.is_dir() {
                    let d = s.mkdir(parent, name, 0o755, 0, 0).unwrap();
                    todo.push((e.path(), d.ino));
                } else if ft.is_file() {
                    let data = std::fs::read(e.path()).unwrap();
                    let f = s
                        .mknod(parent, name, FileKind::File, 0o644, 0, 0, 0)
                        .unwrap();
                    s.open_file(f.ino).unwrap();
                    s.write(f.ino, 0, &data).unwrap();
                    s.release(f.ino).unwrap();
                    files += 1;
                    bytes += data.len() as u64;
                }
            }
        }
        s.sync().unwrap();
        let u = s.usage(&[ROOT_INO]).unwrap();
        s.close().unwrap();
        let secs = start.elapsed().as_secs_f64();
        let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
        let meta = size(&dir.join(format::META_FILE));
        let segs: u64 = std::fs::read_dir(dir.join(format::SEGMENT_DIR))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        println!(
            "inline_max {limit:>6}: {files} files {bytes} bytes -> segments {segs} + meta.redb {meta} = {} ({:.3}x); inline files {}, extents {}; {secs:.1} s",
            segs + meta,
            (segs + meta) as f64 / bytes as f64,
            u.inline,
            u.regular_extents
        );
        table_costs(&dir);
    }
}

/// Prints, per metadata table, its rows and the bytes of its keys and values, and redb's own
/// accounting of the database (what the leaner metadata is measured by).
fn table_costs(dir: &std::path::Path) {
    use redb::{ReadableDatabase, ReadableTableMetadata, TableHandle};
    let mut db = redb::Database::open(dir.join(format::META_FILE)).unwrap();
    let txn = db.begin_read().unwrap();
    for h in txn.list_tables().unwrap() {
        let name = h.name().to_string();
        let t = txn.open_untyped_table(h).unwrap();
        let s = t.stats().unwrap();
        println!(
            "  {name:<16} rows {:>7}  stored {:>9}  leaf pages {:>6}  branch pages {:>5}  fragmented {:>8}",
            t.len().unwrap(),
            s.stored_bytes(),
            s.leaf_pages(),
            s.branch_pages(),
            s.fragmented_bytes()
        );
    }
    drop(txn);
    let w = db.begin_write().unwrap();
    let s = w.stats().unwrap();
    println!(
        "  database: stored {} metadata {} fragmented {} leaf pages {} page size {}",
        s.stored_bytes(),
        s.metadata_bytes(),
        s.fragmented_bytes(),
        s.leaf_pages(),
        s.page_size()
    );
    w.abort().unwrap();
    if std::env::var_os("COMPFS_TRY_REPACK").is_some() {
        try_repack(dir, &db);
    }
    if std::env::var_os("COMPFS_TRY_COMPACT").is_some() {
        db.compact().unwrap();
        drop(db);
        let len = std::fs::metadata(dir.join(format::META_FILE))
            .unwrap()
            .len();
        println!("  after redb compact: meta.redb {len}");
    }
}

/// Copies `tree` into `s` through the store API (one close per file, as `cp` does); returns the
/// files' inodes and bytes.
fn copy_tree(s: &Store, tree: &std::path::Path) -> (Vec<Ino>, u64) {
    let mut todo = vec![(tree.to_path_buf(), ROOT_INO)];
    let (mut files, mut bytes) = (Vec::new(), 0u64);
    while let Some((p, parent)) = todo.pop() {
        for e in std::fs::read_dir(&p).unwrap() {
            let e = e.unwrap();
            let name = e.file_name();
            let name = name.as_encoded_bytes();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                let d = s.mkdir(parent, name, 0o755, 0, 0).unwrap();
                todo.push((e.path(), d.ino));
            } else if ft.is_file() {
                let data = std::fs::read(e.path()).unwrap();
                let f = s
                    .mknod(parent, name, FileKind::File, 0o644, 0, 0, 0)
                    .unwrap();
                s.open_file(f.ino).unwrap();
                s.write(f.ino, 0, &data).unwrap();
                s.release(f.ino).unwrap();
                files.push(f.ino);
                bytes += data.len() as u64;
            }
        }
    }
    (files, bytes)
}

/// The measurement behind the store dictionaries (docs/benchmarks-fs.md, small files): copies
/// `COMPFS_SMALL_TREE` into a store with `dict=off`, one with dictionaries (trained in the
/// background as the flusher finds enough samples), and the latter again after `defrag` of
/// every file (which moves the files written before the training onto the dictionary); prints
/// the store's bytes after close.
#[test]
#[ignore = "measurement: COMPFS_SMALL_TREE=DIR cargo test -p compfs-store --test small_files -- --ignored --nocapture measure_dict"]
fn measure_dict() {
    let Ok(tree) = std::env::var("COMPFS_SMALL_TREE") else {
        panic!("set COMPFS_SMALL_TREE");
    };
    let t = tempfile::tempdir().unwrap();
    let size = |dir: &std::path::Path| {
        let f = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
        let segs: u64 = std::fs::read_dir(dir.join(format::SEGMENT_DIR))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        (segs, f(&dir.join(format::META_FILE)))
    };
    for (label, dict) in [("dict=off", false), ("dict=on", true)] {
        let dir = t.path().join(label);
        let tn = Tuning {
            segment_size: 64 << 20,
            flush_interval: Some(std::time::Duration::from_secs(2)),
            ..Tuning::default()
        };
        create(&dir, 131072, tn.clone()).close().unwrap();
        let o = OpenOptions {
            dict,
            ..OpenOptions::default()
        };
        let s = Store::open_tuned(&dir, &o, tn.clone()).unwrap();
        let start = std::time::Instant::now();
        let (files, bytes) = copy_tree(&s, std::path::Path::new(&tree));
        s.sync().unwrap();
        let u = s.usage(&[ROOT_INO]).unwrap();
        let dict_id = s.current_dictionary();
        s.close().unwrap();
        let secs = start.elapsed().as_secs_f64();
        let (segs, meta) = size(&dir);
        println!(
            "{label}: {} files {bytes} bytes -> segments {segs} + meta.redb {meta} = {} ({:.3}x); dictionary {dict_id:?}; dict-compressed {} of {} bytes; inline {} files; {secs:.1} s",
            files.len(),
            segs + meta,
            (segs + meta) as f64 / bytes as f64,
            u.dict_bytes.disk,
            u.dict_bytes.uncompressed,
            u.inline
        );
        if dict {
            let s = Store::open_tuned(&dir, &o, tn).unwrap();
            let start = std::time::Instant::now();
            for &ino in &files {
                s.defrag(ino, &DefragTarget::default(), &mut |_| {})
                    .unwrap();
            }
            s.gc().unwrap();
            s.sync().unwrap();
            let u = s.usage(&[ROOT_INO]).unwrap();
            s.close().unwrap();
            let (segs, meta) = size(&dir);
            println!(
                "{label} + defrag + gc: segments {segs} + meta.redb {meta} = {} ({:.3}x); dict-compressed {} of {} bytes; {:.1} s",
                segs + meta,
                (segs + meta) as f64 / bytes as f64,
                u.dict_bytes.disk,
                u.dict_bytes.uncompressed,
                start.elapsed().as_secs_f64()
            );
        }
    }
}

/// The measurement behind packed extents (docs/benchmarks-fs.md, small files): copies
/// `COMPFS_SMALL_TREE` through the store API (one close per file, the writeback thread and the
/// flusher as on a mount) into stores with each pack size of `COMPFS_PACKS` (comma-separated
/// bytes, 0 = `pack=off`; default `0,65536,131072,262144`) and inline limit of
/// `COMPFS_INLINE` (default 2048), and prints the store's bytes after close, the copy's time
/// and the time of reading every file back after a reopen (the decompressed-extent cache
/// empty, the host's page cache not dropped).
#[test]
#[ignore = "measurement: COMPFS_SMALL_TREE=DIR cargo test -p compfs-store --test small_files -- --ignored --nocapture measure_pack"]
fn measure_pack() {
    let Ok(tree) = std::env::var("COMPFS_SMALL_TREE") else {
        panic!("set COMPFS_SMALL_TREE");
    };
    let list = |var: &str, default: &str| -> Vec<u32> {
        std::env::var(var)
            .unwrap_or_else(|_| default.to_string())
            .split(',')
            .map(|v| v.trim().parse().unwrap())
            .collect()
    };
    let t = tempfile::tempdir().unwrap();
    for inline_max in list("COMPFS_INLINE", "2048") {
        for pack in list("COMPFS_PACKS", "0,65536,131072,262144") {
            let dir = t.path().join(format!("p{pack}-i{inline_max}"));
            let tn = Tuning {
                segment_size: 64 << 20,
                inline_max,
                flush_interval: Some(std::time::Duration::from_secs(2)),
                ..Tuning::default()
            };
            create(&dir, 131072, tn.clone()).close().unwrap();
            let o = OpenOptions {
                pack,
                ..OpenOptions::default()
            };
            let s = Store::open_tuned(&dir, &o, tn.clone()).unwrap();
            let start = std::time::Instant::now();
            let (files, bytes) = copy_tree(&s, std::path::Path::new(&tree));
            s.sync().unwrap();
            let copy = start.elapsed().as_secs_f64();
            let u = s.usage(&[ROOT_INO]).unwrap();
            s.close().unwrap();
            let segs: u64 = std::fs::read_dir(dir.join(format::SEGMENT_DIR))
                .unwrap()
                .map(|e| e.unwrap().metadata().unwrap().len())
                .sum();
            let meta = std::fs::metadata(dir.join(format::META_FILE))
                .unwrap()
                .len();
            let s = Store::open_tuned(&dir, &o, tn).unwrap();
            let start = std::time::Instant::now();
            for &ino in &files {
                read_all(&s, ino).unwrap();
            }
            let read = start.elapsed().as_secs_f64();
            s.close().unwrap();
            println!(
                "pack={pack} inline_max={inline_max}: {} files {bytes} bytes -> segments {segs} + meta.redb {meta} = {}; {} extents, {} refs, {} inline; copy {copy:.1} s, read all {read:.2} s",
                files.len(),
                segs + meta,
                u.regular_extents,
                u.refs,
                u.inline
            );
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}

/// What a rebuild of the tables could save (measurement only, `COMPFS_TRY_REPACK`): copies
/// every table into a fresh database, inserting each table's rows in two passes (every other
/// row, then the rest) so that redb's half splits of the first pass are filled by the second,
/// and prints that file's size after compaction.
fn try_repack(dir: &std::path::Path, src: &redb::Database) {
    use redb::{ReadableDatabase, ReadableTable, TableDefinition};
    let path = dir.join("repacked.redb");
    let mut dst = redb::Database::create(&path).unwrap();
    let r = src.begin_read().unwrap();
    let w = dst.begin_write().unwrap();
    macro_rules! copy {
        ($name:literal, $k:ty, $v:ty, |$kk:ident| $kown:expr, |$vv:ident| $vown:expr, |$o:ident, $a:ident, $b:ident| $ins:expr) => {{
            let def: TableDefinition<$k, $v> = TableDefinition::new($name);
            let t = r.open_table(def).unwrap();
            let rows: Vec<_> = t
                .iter()
                .unwrap()
                .map(|e| {
                    let (k, v) = e.unwrap();
                    let ($kk, $vv) = (k.value(), v.value());
                    ($kown, $vown)
                })
                .collect();
            let mut $o = w.open_table(def).unwrap();
            for pass in 0..2 {
                for (i, ($a, $b)) in rows.iter().enumerate() {
                    if i % 2 == pass {
                        $ins;
                    }
                }
            }
        }};
    }
    copy!("inodes", u64, &[u8], |k| k, |v| v.to_vec(), |o, a, b| o
        .insert(*a, b.as_slice())
        .unwrap());
    copy!(
        "dirents",
        (u64, &[u8]),
        &[u8],
        |k| (k.0, k.1.to_vec()),
        |v| v.to_vec(),
        |o, a, b| o.insert((a.0, a.1.as_slice()), b.as_slice()).unwrap()
    );
    copy!(
        "dir_index",
        (u64, u64),
        &[u8],
        |k| k,
        |v| v.to_vec(),
        |o, a, b| o.insert(*a, b.as_slice()).unwrap()
    );
    copy!(
        "extent_map",
        (u64, u64),
        &[u8],
        |k| k,
        |v| v.to_vec(),
        |o, a, b| o.insert(*a, b.as_slice()).unwrap()
    );
    copy!("extents", u64, &[u8], |k| k, |v| v.to_vec(), |o, a, b| o
        .insert(*a, b.as_slice())
        .unwrap());
    copy!(
        "segment_extents",
        (u64, u64),
        u64,
        |k| k,
        |v| v,
        |o, a, b| o.insert(*a, *b).unwrap()
    );
    copy!("dicts", u16, &[u8], |k| k, |v| v.to_vec(), |o, a, b| o
        .insert(*a, b.as_slice())
        .unwrap());
    w.commit().unwrap();
    drop(r);
    dst.compact().unwrap();
    let s = dst.begin_write().unwrap().stats().unwrap();
    println!(
        "  repacked (two passes): stored {} fragmented {} leaf pages {}",
        s.stored_bytes(),
        s.fragmented_bytes(),
        s.leaf_pages()
    );
    drop(dst);
    println!(
        "  repacked meta.redb {}",
        std::fs::metadata(&path).unwrap().len()
    );
    std::fs::remove_file(&path).unwrap();
}
