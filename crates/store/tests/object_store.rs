//! Stores in a bucket, against a real local S3 server (s3s-fs, started by
//! `scripts/s3-local.sh` on a free port and stopped when the test ends, passing or not):
//! acknowledged data is in the bucket and reads back from an empty cache directory after the
//! writer is lost; a server that disappears makes the sync fail with EIO and latches the store
//! read-only, losing nothing acknowledged; the local data cache stays within its bound.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod s3support;
use common::*;
use s3support::Server;

use std::time::Duration;

use compfs_store::object::{self, ObjectOptions, ObjectStoreHandle, S3Url};
use compfs_store::*;

fn mkfs(url: &S3Url, o: &ObjectOptions) {
    let opts = CreateOptions {
        extent_size: 16384,
        ..CreateOptions::default()
    };
    object::create(url, o, &opts, tuning()).unwrap();
}

fn open_s3(url: &S3Url, o: &ObjectOptions) -> ObjectStoreHandle {
    object::open(url, o, &OpenOptions::default(), tuning()).unwrap()
}

fn new_file(s: &Store, name: &str, data: &[u8]) -> Ino {
    let a = s
        .mknod(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    s.open_file(a.ino).unwrap();
    s.write(a.ino, 0, data).unwrap();
    a.ino
}

/// Everything acknowledged by fsync/sync is in the bucket: a machine that loses the writer
/// (its process state and its cache directory) mounts the store from an empty cache directory
/// and reads every byte back; the store is then written further and reopened once more.
#[test]
fn acknowledged_data_survives_the_loss_of_the_writer() {
    let srv = Server::start();
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/durable/store").unwrap();
    let o1 = srv.options(&t.path().join("c1"), 64 << 20, Duration::from_secs(20));
    mkfs(&url, &o1);
    // A second mkfs of the same prefix is refused.
    let again = object::create(&url, &o1, &CreateOptions::default(), tuning());
    assert!(matches!(again, Err(Error::AlreadyExists(_))), "{again:?}");
    let h = open_s3(&url, &o1);
    let files: Vec<(String, Vec<u8>)> = (0..6)
        .map(|i| {
            let data = if i % 2 == 0 {
                pattern(300_000 + i * 7777, i as u64)
            } else {
                random(200_000 + i * 999, i as u64)
            };
            (format!("f{i}"), data)
        })
        .collect();
    let mut inos = Vec::new();
    for (i, (name, data)) in files.iter().enumerate() {
        let ino = new_file(&h.store, name, data);
        if i == 2 {
            h.store.fsync(ino, false).unwrap();
        }
        inos.push(ino);
    }
    // A small file kept inline, and a directory.
    new_file(&h.store, "small", b"hello");
    h.store.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap();
    h.store.sync().unwrap();
    let c = h.counts();
    assert!(c.puts > 0 && c.put_bytes > 1_000_000, "{c:?}");
    assert!(!srv.objects("durable/store/segs").is_empty());
    assert!(srv.objects("durable/store/meta").len() >= 2);
    // The writer is lost without closing (no final commit, no upload at unmount).
    std::mem::forget(h);
    let o2 = srv.options(&t.path().join("c2"), 64 << 20, Duration::from_secs(20));
    let h2 = open_s3(&url, &o2);
    for (name, data) in &files {
        let a = h2.store.lookup(ROOT_INO, name.as_bytes()).unwrap();
        assert!(
            read_all(&h2.store, a.ino).unwrap() == *data,
            "{name} differs"
        );
    }
    let a = h2.store.lookup(ROOT_INO, b"small").unwrap();
    assert_eq!(read_all(&h2.store, a.ino).unwrap(), b"hello");
    assert!(h2.store.lookup(ROOT_INO, b"d").is_ok());
    assert!(h2.counts().gets > 0);
    // Go on writing there, unmount, and mount once more from a third empty cache.
    let more = pattern(500_000, 99);
    new_file(&h2.store, "more", &more);
    h2.store.unlink(ROOT_INO, b"f1").unwrap();
    h2.store.close().unwrap();
    let o3 = srv.options(&t.path().join("c3"), 0, Duration::from_secs(20));
    let h3 = open_s3(&url, &o3);
    let a = h3.store.lookup(ROOT_INO, b"more").unwrap();
    assert!(read_all(&h3.store, a.ino).unwrap() == more);
    assert!(h3.store.lookup(ROOT_INO, b"f1").is_err());
    let a = h3.store.lookup(ROOT_INO, b"f4").unwrap();
    assert!(read_all(&h3.store, a.ino).unwrap() == files[4].1);
    new_file(&h3.store, "third", b"from the third mount");
    h3.store.close().unwrap();
    // The second cache directory, stale now, is brought up to date at its next mount.
    let h2 = open_s3(&url, &o2);
    let a = h2.store.lookup(ROOT_INO, b"third").unwrap();
    assert_eq!(read_all(&h2.store, a.ino).unwrap(), b"from the third mount");
    h2.store.close().unwrap();
}

/// The server disappears while a file is written: the sync fails with EIO, the store refuses
/// further writes, and everything acknowledged before reads back from the bucket afterwards.
#[test]
fn a_server_that_disappears_fails_the_sync_with_eio_and_loses_nothing_acknowledged() {
    let srv = Server::start();
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/faults").unwrap();
    let o = srv.options(&t.path().join("c1"), 8 << 20, Duration::from_secs(3));
    mkfs(&url, &o);
    let h = open_s3(&url, &o);
    let before = pattern(400_000, 1);
    let ino = new_file(&h.store, "before", &before);
    h.store.fsync(ino, false).unwrap();
    srv.stop();
    let during = random(300_000, 2);
    let ino2 = new_file(&h.store, "during", &during);
    let e = h.store.fsync(ino2, false).unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    let e = h.store.write(ino2, 0, b"x").unwrap_err();
    assert!(matches!(e, Error::ReadOnly(_)), "{e}");
    std::mem::forget(h);
    let srv = srv.restart();
    let o2 = srv.options(&t.path().join("c2"), 8 << 20, Duration::from_secs(20));
    let h2 = open_s3(&url, &o2);
    let a = h2.store.lookup(ROOT_INO, b"before").unwrap();
    assert!(read_all(&h2.store, a.ino).unwrap() == before);
    h2.store.close().unwrap();
}

/// Reading more data than the cache holds keeps the cache within its bound, on disk too.
#[test]
fn the_data_cache_stays_within_its_bound() {
    let srv = Server::start();
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/cache").unwrap();
    let o = srv.options(&t.path().join("w"), 0, Duration::from_secs(20));
    mkfs(&url, &o);
    let h = open_s3(&url, &o);
    let data = random(8 << 20, 3);
    new_file(&h.store, "big", &data);
    h.store.close().unwrap();
    let bound = 3u64 << 20;
    let o2 = srv.options(&t.path().join("r"), bound, Duration::from_secs(20));
    let h2 = open_s3(&url, &o2);
    let a = h2.store.lookup(ROOT_INO, b"big").unwrap();
    assert!(read_all(&h2.store, a.ino).unwrap() == data);
    let cached = h2.backend.cached_bytes();
    assert!(cached > 0 && cached <= bound, "cached {cached}");
    let on_disk: u64 = std::fs::read_dir(t.path().join("r/cache"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(on_disk <= bound, "{on_disk} bytes in the cache directory");
    // A second read of the last MiB comes from the cache: no new GET.
    let gets = h2.counts().gets;
    let mut buf = vec![0u8; 1 << 20];
    h2.store.read(a.ino, (7 << 20) as u64, &mut buf).unwrap();
    assert!(buf == data[7 << 20..]);
    assert_eq!(h2.counts().gets, gets);
    h2.store.close().unwrap();
}

/// GC compacts a mostly-dead segment and deletes its chunks only once the snapshot in the
/// bucket no longer references them: a mount from an empty cache directory right after the
/// GC (the writer lost, no unmount) reads everything.
#[test]
fn gc_deletes_only_chunks_no_fetchable_snapshot_references() {
    let srv = Server::start();
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/gc").unwrap();
    let o = srv.options(&t.path().join("c1"), 8 << 20, Duration::from_secs(20));
    mkfs(&url, &o);
    let h = open_s3(&url, &o);
    let keep = random(600_000, 4);
    new_file(&h.store, "keep", &keep);
    let ino = new_file(&h.store, "churn", &random(900_000, 5));
    h.store.sync().unwrap();
    // Overwrite the second file: its first extents become garbage.
    h.store.write(ino, 0, &random(900_000, 6)).unwrap();
    h.store.sync().unwrap();
    let r = h.store.gc().unwrap();
    assert!(r.segments_freed > 0, "{r:?}");
    assert!(h.counts().deletes > 0);
    std::mem::forget(h);
    let o2 = srv.options(&t.path().join("c2"), 8 << 20, Duration::from_secs(20));
    let h2 = open_s3(&url, &o2);
    let a = h2.store.lookup(ROOT_INO, b"keep").unwrap();
    assert!(read_all(&h2.store, a.ino).unwrap() == keep);
    let a = h2.store.lookup(ROOT_INO, b"churn").unwrap();
    assert!(read_all(&h2.store, a.ino).unwrap() == random(900_000, 6));
    h2.store.close().unwrap();
}

/// A cold sequential read fetches ahead: once a reader missed two blocks in a row, the next
/// blocks of the segment come into the cache without being read, by parallel GETs, each
/// block fetched once; the data read back is the data written.
#[test]
fn cold_sequential_reads_fetch_the_next_blocks_ahead() {
    let srv = Server::start();
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/ahead").unwrap();
    let o = srv.options(&t.path().join("w"), 0, Duration::from_secs(20));
    mkfs(&url, &o);
    let h = open_s3(&url, &o);
    let data = random(12 << 20, 5);
    new_file(&h.store, "big", &data);
    h.store.close().unwrap();
    let o2 = srv.options(&t.path().join("r"), 1 << 30, Duration::from_secs(20));
    let h2 = open_s3(&url, &o2);
    let a = h2.store.lookup(ROOT_INO, b"big").unwrap();
    let gets0 = h2.counts().gets;
    let mut buf = vec![0u8; 128 << 10];
    // Two 128 KiB reads a MiB apart: two misses in a row, the second one sequential.
    for off in [0u64, 1 << 20] {
        h2.store.read(a.ino, off, &mut buf).unwrap();
        assert!(buf[..] == data[off as usize..off as usize + buf.len()]);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while h2.backend.cached_bytes() < (6u64 << 20) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let cached = h2.backend.cached_bytes();
    assert!(
        cached >= 6 << 20,
        "only {cached} bytes cached after reading two blocks: no readahead"
    );
    // The whole file reads back right, and no block was fetched twice.
    assert!(read_all(&h2.store, a.ino).unwrap() == data);
    let gets = h2.counts().gets - gets0;
    let blocks = (h2.backend.cached_bytes() + (1 << 20) - 1) >> 20;
    assert!(
        gets <= blocks + 2,
        "{gets} GETs for {blocks} blocks of segment data"
    );
    h2.store.close().unwrap();
}
