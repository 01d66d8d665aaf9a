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

use compfs_store::object::lease::{LeaseOptions, LeaseRecord, LeaseState, LEASE_KEY};
use compfs_store::object::{self, ObjectOptions, ObjectStoreHandle, S3Url};
use compfs_store::*;

/// The shared server's options with this file's short lease ([`LEASE`]), so tests of a lost
/// writer wait out its lease in seconds.
fn options(
    srv: &Server,
    cache: &std::path::Path,
    cache_size: u64,
    deadline: Duration,
) -> ObjectOptions {
    ObjectOptions {
        lease: LeaseOptions {
            timeout: LEASE,
            force: false,
        },
        ..srv.options(cache, cache_size, deadline)
    }
}

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

/// The lease timeout of the tests' mounts (renewed every third of it).
const LEASE: Duration = Duration::from_secs(4);

/// The writer is lost (a crash: no final commit, no upload, the lease not released); returns
/// once its lease expired.
fn lose_writer(h: ObjectStoreHandle) {
    h.abandon();
    std::thread::sleep(LEASE + Duration::from_millis(200));
}

/// Opens with `--force` (after a lost writer).
fn open_force(url: &S3Url, o: &ObjectOptions) -> ObjectStoreHandle {
    let mut o = o.clone();
    o.lease.force = true;
    open_s3(url, &o)
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
    let o1 = options(
        &srv,
        &t.path().join("c1"),
        64 << 20,
        Duration::from_secs(20),
    );
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
    lose_writer(h);
    let o2 = options(
        &srv,
        &t.path().join("c2"),
        64 << 20,
        Duration::from_secs(20),
    );
    let h2 = open_force(&url, &o2);
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
    h2.close().unwrap();
    let o3 = options(&srv, &t.path().join("c3"), 0, Duration::from_secs(20));
    let h3 = open_s3(&url, &o3);
    let a = h3.store.lookup(ROOT_INO, b"more").unwrap();
    assert!(read_all(&h3.store, a.ino).unwrap() == more);
    assert!(h3.store.lookup(ROOT_INO, b"f1").is_err());
    let a = h3.store.lookup(ROOT_INO, b"f4").unwrap();
    assert!(read_all(&h3.store, a.ino).unwrap() == files[4].1);
    new_file(&h3.store, "third", b"from the third mount");
    h3.close().unwrap();
    // The second cache directory, stale now, is brought up to date at its next mount.
    let h2 = open_s3(&url, &o2);
    let a = h2.store.lookup(ROOT_INO, b"third").unwrap();
    assert_eq!(read_all(&h2.store, a.ino).unwrap(), b"from the third mount");
    h2.close().unwrap();
}

/// The server disappears while a file is written: the sync fails with EIO, the store refuses
/// further writes, and everything acknowledged before reads back from the bucket afterwards.
#[test]
fn a_server_that_disappears_fails_the_sync_with_eio_and_loses_nothing_acknowledged() {
    let srv = Server::start();
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/faults").unwrap();
    let o = options(&srv, &t.path().join("c1"), 8 << 20, Duration::from_secs(3));
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
    lose_writer(h);
    let srv = srv.restart();
    let o2 = options(&srv, &t.path().join("c2"), 8 << 20, Duration::from_secs(20));
    let h2 = open_force(&url, &o2);
    let a = h2.store.lookup(ROOT_INO, b"before").unwrap();
    assert!(read_all(&h2.store, a.ino).unwrap() == before);
    h2.close().unwrap();
}

/// Reading more data than the cache holds keeps the cache within its bound, on disk too.
#[test]
fn the_data_cache_stays_within_its_bound() {
    let srv = Server::start();
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/cache").unwrap();
    let o = options(&srv, &t.path().join("w"), 0, Duration::from_secs(20));
    mkfs(&url, &o);
    let h = open_s3(&url, &o);
    let data = random(8 << 20, 3);
    new_file(&h.store, "big", &data);
    h.close().unwrap();
    let bound = 3u64 << 20;
    let o2 = options(&srv, &t.path().join("r"), bound, Duration::from_secs(20));
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
    h2.close().unwrap();
}

/// The data cache's blocks are named by segment, chunk start and block only: a cache directory
/// keeps them across its own remounts, but once another mount wrote the store (a newer
/// snapshot in the bucket than the directory's: a takeover may have deleted a cached segment
/// and made a new one with its id) they are dropped at the next mount, never served.
#[test]
fn a_cache_dir_behind_the_buckets_snapshot_starts_with_an_empty_data_cache() {
    let srv = Server::start();
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/cachegen").unwrap();
    let oa = options(&srv, &t.path().join("a"), 8 << 20, Duration::from_secs(20));
    mkfs(&url, &oa);
    let h = open_s3(&url, &oa);
    let data = random(2 << 20, 4);
    new_file(&h.store, "f", &data);
    h.close().unwrap();
    let h = open_s3(&url, &oa);
    let a = h.store.lookup(ROOT_INO, b"f").unwrap();
    assert!(read_all(&h.store, a.ino).unwrap() == data);
    assert!(h.backend.cached_bytes() > 0);
    h.close().unwrap();
    // Remounted from the same directory, nothing else written: the blocks stay.
    let h = open_s3(&url, &oa);
    assert!(h.backend.cached_bytes() > 0);
    h.close().unwrap();
    // Another machine writes the store.
    let ob = options(&srv, &t.path().join("b"), 0, Duration::from_secs(20));
    let hb = open_s3(&url, &ob);
    hb.store.unlink(ROOT_INO, b"f").unwrap();
    new_file(&hb.store, "g", &pattern(1 << 20, 5));
    hb.close().unwrap();
    let h = open_s3(&url, &oa);
    assert_eq!(h.backend.cached_bytes(), 0);
    assert_eq!(
        std::fs::read_dir(t.path().join("a/cache")).unwrap().count(),
        0
    );
    assert!(h.store.lookup(ROOT_INO, b"f").is_err());
    let g = h.store.lookup(ROOT_INO, b"g").unwrap();
    assert!(read_all(&h.store, g.ino).unwrap() == pattern(1 << 20, 5));
    h.close().unwrap();
}

/// GC compacts a mostly-dead segment and deletes its chunks only once the snapshot in the
/// bucket no longer references them: a mount from an empty cache directory right after the
/// GC (the writer lost, no unmount) reads everything.
#[test]
fn gc_deletes_only_chunks_no_fetchable_snapshot_references() {
    gc_case(false);
}

/// The same with `-o writeback`: the syncs leave their chunks in the upload queue; GC's commit
/// uploads the queue, then the snapshot, and only then are chunks deleted.
#[test]
fn gc_with_writeback_uploads_the_queue_and_the_snapshot_before_deleting() {
    gc_case(true);
}

fn gc_case(writeback: bool) {
    let srv = Server::start();
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/gc").unwrap();
    let o = ObjectOptions {
        writeback,
        metadata_interval: Duration::from_secs(3600),
        ..options(&srv, &t.path().join("c1"), 8 << 20, Duration::from_secs(20))
    };
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
    if writeback {
        // GC's commit drained the queue before its snapshot.
        let (n, _) = h.backend.queued().unwrap();
        let files = std::fs::read_dir(t.path().join("c1/upload"))
            .unwrap()
            .count();
        assert_eq!(n, files);
    }
    lose_writer(h);
    let o2 = options(&srv, &t.path().join("c2"), 8 << 20, Duration::from_secs(20));
    let h2 = open_force(&url, &o2);
    let a = h2.store.lookup(ROOT_INO, b"keep").unwrap();
    assert!(read_all(&h2.store, a.ino).unwrap() == keep);
    let a = h2.store.lookup(ROOT_INO, b"churn").unwrap();
    assert!(read_all(&h2.store, a.ino).unwrap() == random(900_000, 6));
    h2.close().unwrap();
}

/// A cold sequential read fetches ahead: once a file is read from its start, the blocks
/// holding its next extents come into the cache without being read, by parallel GETs, each
/// block fetched once; the data read back is the data written. The file is written a MiB at a
/// time, each part fsynced before the next, and the tests' segments are 256 KiB: each part
/// lands in a segment of its own, so the blocks ahead lie in other segments (readahead along
/// one segment would not find them).
#[test]
fn cold_sequential_reads_fetch_the_next_blocks_ahead() {
    let srv = Server::start();
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/ahead").unwrap();
    let o = options(&srv, &t.path().join("w"), 0, Duration::from_secs(20));
    mkfs(&url, &o);
    let h = open_s3(&url, &o);
    let data = random(12 << 20, 5);
    let ino = new_file(&h.store, "big", &[]);
    for (i, part) in data.chunks(1 << 20).enumerate() {
        h.store.write(ino, (i << 20) as u64, part).unwrap();
        h.store.fsync(ino, true).unwrap();
    }
    h.close().unwrap();
    let o2 = options(&srv, &t.path().join("r"), 1 << 30, Duration::from_secs(20));
    let h2 = open_s3(&url, &o2);
    let a = h2.store.lookup(ROOT_INO, b"big").unwrap();
    let gets0 = h2.counts().gets;
    // One 128 KiB read at the start of the file.
    let mut buf = vec![0u8; 128 << 10];
    h2.store.read(a.ino, 0, &mut buf).unwrap();
    assert!(buf[..] == data[..buf.len()]);
    // Blocks are 1 MiB of a chunk, shorter at a chunk's end, so the next 8 MiB of the file
    // (incompressible: as many bytes stored) lie in at least 8 blocks besides the first.
    let cache = t.path().join("r/cache");
    let blocks_cached = || {
        std::fs::read_dir(&cache)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| !e.file_name().to_string_lossy().starts_with("tmp."))
                    .count() as u64
            })
            .unwrap_or(0)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while blocks_cached() < 9 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let cached = blocks_cached();
    assert!(
        cached >= 9,
        "only {cached} blocks cached after reading 128 KiB: no readahead ({} bytes)",
        h2.backend.cached_bytes()
    );
    // The whole file reads back right, sequentially, and no block was fetched twice.
    let mut back = Vec::new();
    let mut off = 0u64;
    loop {
        let n = h2.store.read(a.ino, off, &mut buf).unwrap();
        if n == 0 {
            break;
        }
        back.extend_from_slice(&buf[..n]);
        off += n as u64;
    }
    assert!(back == data);
    let gets = h2.counts().gets - gets0;
    let blocks = blocks_cached();
    assert!(
        gets <= blocks,
        "{gets} GETs for {blocks} blocks of segment data"
    );
    h2.close().unwrap();
}

/// A file read to its end has the head of the file written after it fetched in the
/// background (what `tar c` of a tree written by `cp -r` reads next): the first bytes of the
/// second file are in the data cache without anything reading that file. Deterministic: the
/// fetch is queued by the first read of the first file (its window reaches the file's end),
/// the test waits for the readahead workers to stop (every queued block fetched; a minute at
/// most, for a stuck worker) and then looks once for the bytes themselves (incompressible, so
/// stored as they are; a 1 GiB cache evicts nothing). The files' extents are 16 KiB and
/// compressed by several workers at once: the second file's head follows the first file's
/// data only because a flush appends its extents in file order, whichever worker finished
/// first.
#[test]
fn reading_a_file_to_its_end_fetches_the_head_of_the_next_one() {
    let srv = Server::start();
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/nextfile").unwrap();
    let o = options(&srv, &t.path().join("w"), 0, Duration::from_secs(20));
    mkfs(&url, &o);
    let h = open_s3(&url, &o);
    let a_data = random(1 << 20, 7);
    let b_data = random(1 << 20, 8);
    let a = new_file(&h.store, "a", &a_data);
    h.store.fsync(a, true).unwrap();
    let b = new_file(&h.store, "b", &b_data);
    h.store.fsync(b, true).unwrap();
    h.close().unwrap();
    let o2 = options(&srv, &t.path().join("r"), 1 << 30, Duration::from_secs(20));
    let h2 = open_s3(&url, &o2);
    let a = h2.store.lookup(ROOT_INO, b"a").unwrap().ino;
    let mut buf = vec![0u8; 128 << 10];
    let mut off = 0u64;
    let mut back = Vec::new();
    loop {
        let n = h2.store.read(a, off, &mut buf).unwrap();
        if n == 0 {
            break;
        }
        back.extend_from_slice(&buf[..n]);
        off += n as u64;
    }
    assert!(back == a_data);
    let cache = t.path().join("r/cache");
    let head = &b_data[..4096];
    let b_head_cached = || {
        std::fs::read_dir(&cache).unwrap().any(|e| {
            let e = e.unwrap();
            !e.file_name().to_string_lossy().starts_with("tmp.")
                && std::fs::read(e.path())
                    .map(|d| d.windows(head.len()).any(|w| w == head))
                    .unwrap_or(false)
        })
    };
    assert!(
        h2.backend.wait_readahead(Duration::from_secs(60)),
        "the readahead workers did not stop within a minute"
    );
    assert!(
        b_head_cached(),
        "the head of file b was not fetched after file a was read to its end"
    );
    let b = h2.store.lookup(ROOT_INO, b"b").unwrap().ino;
    let n = h2.store.read(b, 0, &mut buf).unwrap();
    assert!(buf[..n] == b_data[..n]);
    h2.close().unwrap();
}

/// Closing the store stops its readahead first: once `close` returned, nothing more is written
/// into the cache directory (the next mount may already use it; before, fetches ahead of a
/// reader went on filling it after the daemon released the store).
#[test]
fn closing_stops_the_readahead_before_it_returns() {
    let srv = Server::start();
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/stopahead").unwrap();
    let o = options(&srv, &t.path().join("w"), 0, Duration::from_secs(20));
    mkfs(&url, &o);
    let h = open_s3(&url, &o);
    let data = random(24 << 20, 11);
    let big = new_file(&h.store, "big", &data);
    h.store.fsync(big, true).unwrap();
    h.close().unwrap();
    let o2 = options(&srv, &t.path().join("r"), 1 << 30, Duration::from_secs(20));
    let h2 = open_s3(&url, &o2);
    let big = h2.store.lookup(ROOT_INO, b"big").unwrap().ino;
    // A sequential reader: the store asks the backend to fetch the file ahead of it.
    let mut buf = vec![0u8; 128 << 10];
    for i in 0..4u64 {
        let n = h2.store.read(big, i * (128 << 10), &mut buf).unwrap();
        let at = (i * (128 << 10)) as usize;
        assert!(buf[..n] == data[at..at + n]);
    }
    h2.close().unwrap();
    let cache = t.path().join("r/cache");
    let listing = || {
        let mut v: Vec<(String, u64)> = std::fs::read_dir(&cache)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let len = e.metadata().map(|m| m.len()).unwrap_or(0);
                (e.file_name().to_string_lossy().into_owned(), len)
            })
            .collect();
        v.sort();
        v
    };
    let at_close = listing();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        listing(),
        at_close,
        "the cache changed after close returned"
    );
    assert!(
        at_close.iter().all(|(n, _)| !n.starts_with("tmp.")),
        "a block was half written at close: {at_close:?}"
    );
}

/// The lease object as it is in the bucket.
fn lease_of(url: &S3Url, o: &ObjectOptions) -> LeaseRecord {
    let r = object::Remote::connect(url, &o.remote).unwrap();
    LeaseRecord::decode(&r.get(LEASE_KEY).unwrap().expect("a lease object")).unwrap()
}

/// Writes a lease as another machine's mount would have (unconditionally).
fn put_foreign_lease(
    url: &S3Url,
    o: &ObjectOptions,
    expires_in_ms: i64,
    boot_id: [u8; 16],
    pid: u32,
) {
    let now = object::lease::now_ms();
    let rec = LeaseRecord {
        state: LeaseState::Held,
        pid,
        mount_id: [0xab; 16],
        boot_id,
        taken_ms: now - 100_000,
        expires_ms: (now as i64 + expires_in_ms) as u64,
        timeout_ms: 60_000,
        renewals: 7,
        host: "elsewhere".into(),
    };
    let r = object::Remote::connect(url, &o.remote).unwrap();
    r.put(LEASE_KEY, rec.encode()).unwrap();
}

fn open_err(url: &S3Url, o: &ObjectOptions) -> String {
    match object::open(url, o, &OpenOptions::default(), tuning()) {
        Ok(_) => panic!("a second writer was let in"),
        Err(e) => {
            assert!(matches!(e, Error::LeaseHeld(_)), "{e:?}");
            assert_eq!(e.errno(), libc::EBUSY);
            e.to_string()
        }
    }
}

/// One writer: a second read-write open of the store is refused with a line naming the
/// holder, even with --force; a read-only open works; the holder renews the lease while it
/// runs and releases it when it closes, after which another mount opens without --force.
#[test]
fn a_second_writer_is_refused_while_the_lease_is_renewed_then_released() {
    let srv = Server::start();
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/lease/one").unwrap();
    let o1 = options(&srv, &t.path().join("c1"), 8 << 20, Duration::from_secs(20));
    mkfs(&url, &o1);
    assert_eq!(lease_of(&url, &o1).state, LeaseState::Released);
    let h = open_s3(&url, &o1);
    let r0 = lease_of(&url, &o1);
    assert_eq!(r0.state, LeaseState::Held);
    assert_eq!(r0.pid, std::process::id());
    let o2 = options(&srv, &t.path().join("c2"), 8 << 20, Duration::from_secs(20));
    let e = open_err(&url, &o2);
    assert!(
        e.contains(&r0.host) && e.contains("unmount it there first"),
        "{e}"
    );
    let mut forced = o2.clone();
    forced.lease.force = true;
    let e = open_err(&url, &forced);
    assert!(e.contains("only a lease that expired"), "{e}");
    // Reading is not writing.
    let ro = OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    };
    let r = object::open(&url, &o2, &ro, tuning()).unwrap();
    assert!(r.lease.is_none());
    r.close().unwrap();
    // Renewed: after more than a timeout the lease still holds, later, and writes go on.
    std::thread::sleep(LEASE + Duration::from_millis(500));
    let r1 = lease_of(&url, &o1);
    assert!(r1.renewals >= r0.renewals + 2, "{r0:?} -> {r1:?}");
    assert!(r1.expires_ms > object::lease::now_ms(), "{r1:?}");
    assert_eq!(r1.mount_id, r0.mount_id);
    let ino = new_file(&h.store, "f", b"written after renewals");
    h.store.fsync(ino, false).unwrap();
    open_err(&url, &o2);
    h.close().unwrap();
    assert_eq!(lease_of(&url, &o1).state, LeaseState::Released);
    let h2 = open_s3(&url, &o2);
    let a = h2.store.lookup(ROOT_INO, b"f").unwrap();
    assert_eq!(
        read_all(&h2.store, a.ino).unwrap(),
        b"written after renewals"
    );
    h2.close().unwrap();
}

/// --force takes over an expired lease of another machine, never an unexpired one; a damaged
/// lease needs --force too; the unreleased lease of a dead process of this machine is taken
/// over without it.
#[test]
fn force_takes_over_only_an_expired_lease() {
    let srv = Server::start();
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/lease/force").unwrap();
    let o = options(&srv, &t.path().join("c1"), 8 << 20, Duration::from_secs(20));
    let mut forced = o.clone();
    forced.lease.force = true;
    mkfs(&url, &o);
    put_foreign_lease(&url, &o, 60_000, [1; 16], 1);
    let e = open_err(&url, &o);
    assert!(e.contains("elsewhere (pid 1, mount abababab)"), "{e}");
    open_err(&url, &forced);
    put_foreign_lease(&url, &o, -5_000, [1; 16], 1);
    let e = open_err(&url, &o);
    assert!(e.contains("expired") && e.contains("--force"), "{e}");
    let h = open_s3(&url, &forced);
    assert_eq!(lease_of(&url, &o).pid, std::process::id());
    new_file(&h.store, "mine", b"after the takeover");
    h.close().unwrap();
    // A damaged lease: who holds the store is unknown.
    object::Remote::connect(&url, &o.remote)
        .unwrap()
        .put(LEASE_KEY, b"CFSLEASE and then garbage".to_vec())
        .unwrap();
    let e = open_err(&url, &o);
    assert!(e.contains("damaged"), "{e}");
    open_s3(&url, &forced).close().unwrap();
    // A process of this machine that died holding the lease (kill -9).
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    put_foreign_lease(&url, &o, 60_000, object::lease::boot_id(), dead);
    let h = open_s3(&url, &o);
    let a = h.store.lookup(ROOT_INO, b"mine").unwrap();
    assert_eq!(read_all(&h.store, a.ino).unwrap(), b"after the takeover");
    h.close().unwrap();
}

/// A mount whose lease another machine took over (after it expired) finds out at its next
/// renewal and writes nothing more to the bucket: its next fsync fails with EIO and the store
/// latches read-only; the other machine's lease and snapshot stay as they were.
#[test]
fn a_mount_whose_lease_was_taken_over_latches_read_only() {
    let srv = Server::start();
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/lease/lost").unwrap();
    let o = options(&srv, &t.path().join("c1"), 8 << 20, Duration::from_secs(20));
    mkfs(&url, &o);
    let h = open_s3(&url, &o);
    let ino = new_file(&h.store, "a", b"before");
    h.store.fsync(ino, false).unwrap();
    put_foreign_lease(&url, &o, 60_000, [1; 16], 1);
    let manifest: Vec<std::path::PathBuf> = srv
        .objects("lease/lost/meta")
        .into_iter()
        .filter(|p| p.ends_with("manifest"))
        .collect();
    assert_eq!(manifest.len(), 1);
    let m0 = std::fs::read(&manifest[0]).unwrap();
    let gate = h.lease.as_ref().unwrap().gate();
    let deadline = std::time::Instant::now() + LEASE * 3;
    while !gate.is_lost() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(gate.is_lost(), "the renewal did not notice the takeover");
    let ino2 = new_file(&h.store, "b", &random(100_000, 1));
    let e = h.store.fsync(ino2, false).unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    let e = h.store.write(ino2, 0, b"x").unwrap_err();
    assert!(matches!(e, Error::ReadOnly(_)), "{e}");
    assert_eq!(std::fs::read(&manifest[0]).unwrap(), m0);
    assert_eq!(lease_of(&url, &o).host, "elsewhere");
    let _ = h.close();
    assert_eq!(lease_of(&url, &o).host, "elsewhere");
}

/// metadata_interval: an fsync uploads the snapshot at once; a change nobody fsyncs is
/// uploaded by the flusher within metadata_interval of its commit and not long before; an idle
/// mount uploads nothing; a mount from an empty cache after the writer is lost sees the change.
#[test]
fn unsynced_changes_reach_the_bucket_within_metadata_interval() {
    let srv = Server::start();
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/interval").unwrap();
    let mut o = options(&srv, &t.path().join("c1"), 8 << 20, Duration::from_secs(20));
    let interval = Duration::from_secs(6);
    o.metadata_interval = interval;
    mkfs(&url, &o);
    let with_flusher = Tuning {
        flush_interval: Some(Duration::from_secs(2)),
        ..tuning()
    };
    let h = object::open(&url, &o, &OpenOptions::default(), with_flusher).unwrap();
    let remote = object::Remote::connect(&url, &o.remote).unwrap();
    let gen = || {
        object::snapshot::fetch_manifest(&remote)
            .unwrap()
            .unwrap()
            .gen
    };
    let g0 = gen();
    let ino = new_file(&h.store, "synced", b"fsynced");
    h.store.fsync(ino, false).unwrap();
    let g1 = gen();
    assert!(g1 > g0, "fsync did not upload");
    let t0 = std::time::Instant::now();
    let data = random(200_000, 11);
    new_file(&h.store, "unsynced", &data);
    // The flusher commits durably every 5 s but uploads only when the change is due.
    while t0.elapsed() < interval / 2 {
        assert_eq!(gen(), g1, "uploaded {:?} after the change", t0.elapsed());
        std::thread::sleep(Duration::from_millis(250));
    }
    while gen() == g1 {
        assert!(
            t0.elapsed() < interval + Duration::from_secs(8),
            "not uploaded {:?} after the change",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let line = h.store.remote_status().unwrap();
    assert!(line.contains("generation"), "{line}");
    // Idle: nothing changes, nothing is uploaded (the flusher still commits every 5 s).
    std::thread::sleep(Duration::from_millis(500));
    let g2 = gen();
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(gen(), g2, "an idle mount uploaded a snapshot");
    lose_writer(h);
    let o2 = options(&srv, &t.path().join("c2"), 8 << 20, Duration::from_secs(20));
    let h2 = open_force(&url, &o2);
    let a = h2.store.lookup(ROOT_INO, b"unsynced").unwrap();
    assert!(read_all(&h2.store, a.ino).unwrap() == data);
    h2.close().unwrap();
}

/// Measurement for docs/benchmarks.md (not a test: `cargo test -p compfs-store --test
/// object_store -- --ignored --nocapture writeback_fsync_latency`): small files written and
/// fsynced one by one, with and without `-o writeback`, rounds alternating, medians and spread.
#[test]
#[ignore]
fn writeback_fsync_latency() {
    let srv = Server::start();
    let t = tempfile::tempdir().unwrap();
    let files = 100;
    let mut lat: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut rate: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..5 {
        for (m, wb) in [false, true].into_iter().enumerate() {
            let url = S3Url::parse(&format!("s3://compfs/bench{round}-{m}")).unwrap();
            let mut o = options(
                &srv,
                &t.path().join(format!("c{round}-{m}")),
                64 << 20,
                Duration::from_secs(20),
            );
            o.writeback = wb;
            mkfs(&url, &o);
            let h = open_s3(&url, &o);
            let start = std::time::Instant::now();
            for i in 0..files {
                let data = pattern(4096 + i * 13, i as u64);
                let ino = new_file(&h.store, &format!("f{i}"), &data);
                let t0 = std::time::Instant::now();
                h.store.fsync(ino, false).unwrap();
                lat[m].push(t0.elapsed().as_secs_f64() * 1e3);
            }
            rate[m].push(files as f64 / start.elapsed().as_secs_f64());
            h.close().unwrap();
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        (v[v.len() / 2], v[v.len() / 10], v[v.len() * 9 / 10])
    };
    for (m, name) in ["PUT at fsync", "-o writeback"].iter().enumerate() {
        let (l, l10, l90) = med(&mut lat[m]);
        let (r, rlo, rhi) = med(&mut rate[m]);
        println!(
            "{name}: fsync median {l:.2} ms (p10 {l10:.2}, p90 {l90:.2}); \
             {r:.0} files/s (rounds {rlo:.0}..{rhi:.0})"
        );
    }
}

/// Snapshot copies are uploaded in the order they were taken, whatever order their uploads
/// run in: one taken before a copy already uploaded is skipped (the bucket holds its changes
/// and more), so the manifest never goes back to an older image and generations stay
/// gap-free; a copy taken later is uploaded as the next generation, reusing unchanged pieces.
#[test]
fn a_snapshot_copy_older_than_the_uploaded_one_is_skipped() {
    use compfs_store::object::snapshot::{download, fetch_manifest, MetaUploader};
    use compfs_store::object::Remote;
    let srv = Server::start();
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/copies").unwrap();
    let o = options(&srv, &t.path().join("c"), 0, Duration::from_secs(20));
    let remote = std::sync::Arc::new(Remote::connect(&url, &o.remote).unwrap());
    let dir = t.path().join("c");
    std::fs::create_dir_all(&dir).unwrap();
    let meta = dir.join("meta.redb");
    let up = MetaUploader::new(remote.clone(), &dir, [5; 16], None);
    std::fs::write(&meta, random((3 << 20) + 5, 1)).unwrap();
    let older = up.take_copy().unwrap();
    let mut image = random((2 << 20) + 7, 2);
    std::fs::write(&meta, &image).unwrap();
    let newer = up.take_copy().unwrap();
    assert!(older.seq() < newer.seq());
    assert!(up.upload_copy(newer).unwrap());
    assert_eq!(up.generation(), 1);
    assert!(
        !up.upload_copy(older).unwrap(),
        "an older copy was uploaded"
    );
    assert_eq!(up.generation(), 1);
    let fetched = |n: &str| {
        let m = fetch_manifest(&remote).unwrap().unwrap();
        let d = t.path().join(n);
        std::fs::create_dir_all(&d).unwrap();
        download(&remote, &m, &d).unwrap();
        (m, std::fs::read(d.join("meta.redb")).unwrap())
    };
    let (m, got) = fetched("d1");
    assert_eq!(m.gen, 1);
    assert!(
        got == image,
        "the bucket holds another image than the newer copy"
    );
    // A later copy changing the second piece only: generation 2, the first piece kept.
    image[(1 << 20) + 3] ^= 1;
    std::fs::write(&meta, &image).unwrap();
    let later = up.take_copy().unwrap();
    let puts = remote.counts().puts;
    assert!(up.upload_copy(later).unwrap());
    assert_eq!(remote.counts().puts - puts, 2, "one piece and the manifest");
    let (m, got) = fetched("d2");
    assert_eq!(m.gen, 2);
    assert_eq!(m.pieces[0].gen, 1);
    assert_eq!(m.pieces[1].gen, 2);
    assert!(got == image);
}
