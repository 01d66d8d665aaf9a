//! The held batch of namespace changes (see `txn`): every read sees a change as soon as its
//! call returned, a crash loses at most the changes since the last durable commit (never part
//! of one), and `fsync`/`sync` make the batch durable.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::*;
use compfs_store::*;

/// The files of a store as a crash would leave them with the page cache written (what a
/// SIGKILL leaves), copied to `to` while the store is open.
fn crash_copy(from: &Path, to: &Path) {
    let ok = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap()
        .success();
    assert!(ok, "cp -a {} {}", from.display(), to.display());
}

fn names(s: &Store, dir: Ino) -> Vec<String> {
    let mut v: Vec<String> = s
        .readdir(dir, 0, 100_000)
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .filter(|n| n != "." && n != "..")
        .collect();
    v.sort();
    v
}

#[test]
fn reads_see_batched_changes() {
    let t = tempfile::tempdir().unwrap();
    let s = create(t.path(), 131072, tuning());
    s.sync().unwrap();
    let d = s.mkdir(ROOT_INO, b"d", 0o755, 0, 0).expect("mkdir").ino;
    let f = mkfile(&s, d, "f");
    s.setxattr(f, b"user.k", b"v", XattrSet::Any).unwrap();
    let l = s.symlink(d, b"l", b"target", 0, 0).unwrap().ino;
    assert!(s.batched_changes() >= 4, "{}", s.batched_changes());
    assert_eq!(s.lookup(ROOT_INO, b"d").unwrap().ino, d);
    assert_eq!(s.lookup(d, b"f").unwrap().ino, f);
    assert_eq!(s.lookup(d, b"..").unwrap().ino, ROOT_INO);
    assert_eq!(s.getattr(d).unwrap().nlink, 2);
    assert_eq!(s.getattr(ROOT_INO).unwrap().nlink, 3);
    assert_eq!(names(&s, d), ["f", "l"]);
    assert_eq!(s.getxattr(f, b"user.k").unwrap(), b"v");
    assert_eq!(s.listxattr(f).unwrap(), [b"user.k".to_vec()]);
    assert_eq!(s.readlink(l).unwrap(), b"target");
    // A refused change leaves the batch as it was.
    assert!(matches!(
        s.mknod(d, b"f", FileKind::File, 0o644, 0, 0, 0),
        Err(Error::Exists)
    ));
    assert!(matches!(
        s.removexattr(f, b"user.none"),
        Err(Error::NoXattr)
    ));
    assert!(matches!(s.rmdir(ROOT_INO, b"d"), Err(Error::NotEmpty)));
    assert!(s.batched_changes() >= 4);
    // Changes of changes in the same batch.
    s.rename(d, b"f", ROOT_INO, b"g", RenameFlags::default())
        .unwrap();
    s.unlink(d, b"l").unwrap();
    assert_eq!(names(&s, d), Vec::<String>::new());
    assert_eq!(names(&s, ROOT_INO), ["d", "g"]);
    assert_eq!(s.lookup(ROOT_INO, b"g").unwrap().ino, f);
    assert!(matches!(s.getattr(l), Err(Error::NotFound)));
    // Data written to a file created in the batch, read back before and after its flush.
    s.write(f, 0, b"hello").unwrap();
    assert_eq!(read_all(&s, f).unwrap(), b"hello");
    s.fsync(f, false).unwrap();
    assert_eq!(s.batched_changes(), 0);
    assert_eq!(read_all(&s, f).unwrap(), b"hello");
    s.close().unwrap();
    assert_clean(t.path());
    let s = open(t.path(), tuning());
    assert_eq!(names(&s, ROOT_INO), ["d", "g"]);
    assert_eq!(read_all(&s, f).unwrap(), b"hello");
    assert_eq!(s.getxattr(f, b"user.k").unwrap(), b"v");
}

#[test]
fn a_batch_commits_by_itself_when_full() {
    let t = tempfile::tempdir().unwrap();
    let s = create(t.path(), 131072, tuning());
    for i in 0..1000 {
        mkfile(&s, ROOT_INO, &format!("f{i}"));
        assert!(s.batched_changes() < 256);
    }
    assert_eq!(names(&s, ROOT_INO).len(), 1000);
}

#[test]
fn a_crash_loses_the_batch_and_nothing_durable() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let s = create(&dir, 131072, tuning());
    let a = mkfile(&s, ROOT_INO, "a");
    s.write(a, 0, b"durable").unwrap();
    s.sync().unwrap();
    let b = mkfile(&s, ROOT_INO, "b");
    s.write(b, 0, b"maybe").unwrap();
    s.mkdir(ROOT_INO, b"c", 0o755, 0, 0).unwrap();
    assert!(s.batched_changes() > 0);
    let img = t.path().join("crash");
    crash_copy(&dir, &img);
    // The crashed image: what was synced is there; the rest is all there or not at all.
    assert_clean(&img);
    let c = open(&img, tuning());
    assert_eq!(read_all(&c, a).unwrap(), b"durable");
    let n = names(&c, ROOT_INO);
    assert!(
        n == ["a"] || n == ["a", "b"] || n == ["a", "b", "c"],
        "not a prefix of the changes: {n:?}"
    );
    c.close().unwrap();
    // sync makes the batch durable.
    s.sync().unwrap();
    assert_eq!(s.batched_changes(), 0);
    let img2 = t.path().join("crash2");
    crash_copy(&dir, &img2);
    let c = open(&img2, tuning());
    assert_eq!(names(&c, ROOT_INO), ["a", "b", "c"]);
    assert_eq!(read_all(&c, b).unwrap(), b"maybe");
}

/// What batching saves per file on the store API: the requests an untar sends per file
/// (negative lookup, create, three attribute changes, getattr, write, release), 8,000 files
/// in one directory, with every change committed at once (`batch_ops: 1`, as before
/// batching) and batched, alternating. Run with
/// `cargo test --release -p compfs-store --test batch -- --ignored --nocapture`.
#[test]
#[ignore = "timing, run by hand"]
fn untar_like_timing() {
    let data = pattern(6000, 1);
    let mut res: Vec<(u32, f64)> = Vec::new();
    for round in 0..3 {
        for batch_ops in [1u32, 256] {
            let t = tempfile::tempdir().unwrap();
            let tun = Tuning {
                batch_ops,
                flush_interval: Some(std::time::Duration::from_secs(2)),
                ..tuning()
            };
            let s = create(t.path(), 131072, tun);
            let start = std::time::Instant::now();
            for i in 0..8000 {
                let name = format!("file{i}");
                assert!(s.lookup(ROOT_INO, name.as_bytes()).is_err());
                let a = s
                    .mknod(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, 0, 0, 0)
                    .unwrap();
                s.open_file(a.ino).unwrap();
                for set in [
                    SetAttr {
                        uid: Some(1),
                        gid: Some(1),
                        ..SetAttr::default()
                    },
                    SetAttr {
                        mode: Some(0o600),
                        ..SetAttr::default()
                    },
                    SetAttr {
                        mtime: Some(TimeOrNow::Now),
                        ..SetAttr::default()
                    },
                ] {
                    s.setattr(a.ino, &set).unwrap();
                }
                s.write(a.ino, 0, &data).unwrap();
                s.release(a.ino).unwrap();
                s.getattr(a.ino).unwrap();
            }
            s.sync().unwrap();
            let us = start.elapsed().as_secs_f64() * 1e6 / 8000.0;
            eprintln!("round {round} batch_ops {batch_ops}: {us:.1} µs per file");
            res.push((batch_ops, us));
            s.close().unwrap();
        }
    }
    for b in [1u32, 256] {
        let mut v: Vec<f64> = res.iter().filter(|r| r.0 == b).map(|r| r.1).collect();
        v.sort_by(f64::total_cmp);
        eprintln!(
            "batch_ops {b}: median {:.1} µs per file ({v:.1?})",
            v[v.len() / 2]
        );
    }
}
