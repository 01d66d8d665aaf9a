//! Stores in a bucket behind a fault proxy (a real s3s-fs server, the proxy forwarding bytes
//! to it): with connections cut mid-request and mid-answer, delays and 503 answers, requests
//! are retried with backoff and nothing acknowledged is lost; with the bucket unreachable,
//! writes block on the dirty limit (memory stays bounded), then fail with EIO once the
//! deadline passed and the store turns read-only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod s3support;
use common::*;
use s3support::*;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// mkfs, mount, writes and fsyncs through a proxy that answers 503, cuts requests and answers
/// halfway and delays (seeded): every operation succeeds (the client retried, waiting its
/// backoff before each retry), and a mount from an empty cache directory straight from the
/// server reads every acknowledged byte.
#[test]
fn faults_between_store_and_bucket_are_retried_and_lose_nothing_acknowledged() {
    let srv = Server::start();
    let proxy = FaultProxy::start(
        srv.addr(),
        Faults {
            seed: 18,
            unavailable: 100,
            drop_request: 80,
            drop_response: 80,
            delay: 150,
            max_delay: Duration::from_millis(30),
        },
    );
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/proxied").unwrap();
    let o = srv.options_via(
        &proxy,
        &t.path().join("c1"),
        8 << 20,
        Duration::from_secs(30),
    );
    mkfs(&url, &o);
    let h = open_s3(&url, &o);
    let mut acked: Vec<(String, Vec<u8>)> = Vec::new();
    for i in 0..8u64 {
        let data = if i % 2 == 0 {
            pattern(200_000 + i as usize * 30_011, i)
        } else {
            random(150_000 + i as usize * 20_011, i)
        };
        let name = format!("f{i}");
        let ino = new_file(&h.store, &name, &data);
        h.store.fsync(ino, false).unwrap();
        acked.push((name, data));
    }
    // A file overwritten in place, then synced with the whole store.
    let a = h.store.lookup(ROOT_INO, b"f3").unwrap();
    let patch = random(40_000, 99);
    h.store.write(a.ino, 10_000, &patch).unwrap();
    acked[3].1[10_000..50_000].copy_from_slice(&patch);
    h.store.sync().unwrap();
    let c = proxy.counts();
    assert!(
        c.unavailable >= 3 && c.dropped_requests >= 2 && c.dropped_responses >= 2 && c.delayed > 0,
        "too few faults to test anything: {c:?}"
    );
    // Every fault of a request for one object (a PUT, a ranged GET) was retried, and not at
    // once: the backoff starts at 100 ms. (Other requests, such as bulk deletes, repeat their
    // target for other work, so the next one is not necessarily a retry.)
    let retries: Vec<Retry> = proxy
        .retries()
        .into_iter()
        .filter(|r| r.what.starts_with("PUT ") || r.what.starts_with("GET /compfs/proxied/"))
        .collect();
    assert!(retries.len() >= 3, "{retries:?}");
    eprintln!("proxy: {c:?}; {} PUT/GET faults retried", retries.len());
    for r in &retries {
        let at = r
            .retried_at
            .unwrap_or_else(|| panic!("{} ({}) was never retried", r.what, r.fault));
        let gap = at - r.failed_at;
        assert!(
            gap >= Duration::from_millis(80),
            "{} ({}) retried after {gap:?}, without backoff",
            r.what,
            r.fault
        );
    }
    // The writer is lost (no unmount); another machine mounts straight from the server.
    std::mem::forget(h);
    drop(proxy);
    let o2 = srv.options(&t.path().join("c2"), 8 << 20, Duration::from_secs(20));
    expire_lost_writer(&url, &o2);
    let h2 = open_s3(&url, &o2);
    for (name, data) in &acked {
        let a = h2.store.lookup(ROOT_INO, name.as_bytes()).unwrap();
        assert!(
            read_all(&h2.store, a.ino).unwrap() == *data,
            "{name} differs"
        );
    }
    h2.store.close().unwrap();
}

/// The bucket becomes unreachable (the proxy swallows every request). Store A: a writer going
/// on blocks once the dirty limit of appended bytes is held in memory, instead of growing it,
/// and once the deadline passed its write fails with EIO and the store is read-only. Store B,
/// meanwhile: an fsync fails with EIO after the deadline, and the store is read-only. What was
/// acknowledged before reads back from an empty cache directory.
#[test]
fn an_unreachable_bucket_blocks_writes_on_the_dirty_limit_then_fails_with_eio() {
    let srv = Server::start();
    let proxy = FaultProxy::start(srv.addr(), Faults::default());
    let t = tempfile::tempdir().unwrap();
    let deadline = Duration::from_secs(2);
    let limit = 4u64 << 20;
    let stores: Vec<(S3Url, Arc<ObjectStoreHandle>, Vec<u8>)> = ["a", "b"]
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let url = S3Url::parse(&format!("s3://compfs/unreachable-{n}")).unwrap();
            let mut o = srv.options_via(&proxy, &t.path().join(n), 0, deadline);
            o.dirty_limit = limit;
            mkfs(&url, &o);
            let h = Arc::new(open_s3(&url, &o));
            let before = random(1 << 20, i as u64);
            let ino = new_file(&h.store, "before", &before);
            h.store.fsync(ino, false).unwrap();
            (url, h, before)
        })
        .collect();
    let (ha, hb) = (stores[0].1.clone(), stores[1].1.clone());
    let mk = |h: &ObjectStoreHandle| {
        let a = h
            .store
            .mknod(ROOT_INO, b"during", FileKind::File, 0o644, 0, 0, 0)
            .unwrap();
        h.store.open_file(a.ino).unwrap();
        a.ino
    };
    let (ia, ib) = (mk(&ha), mk(&hb));

    proxy.black_hole(true);
    let written = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let writer = {
        let (h, written, done) = (ha.clone(), written.clone(), done.clone());
        std::thread::spawn(move || {
            let total = 64u64 << 20;
            let mut off = 0u64;
            let r = loop {
                if off >= total {
                    break Ok(());
                }
                let chunk = random(256 << 10, off);
                if let Err(e) = h.store.write(ia, off, &chunk) {
                    break Err(e);
                }
                off += chunk.len() as u64;
                written.store(off, Ordering::SeqCst);
            };
            done.store(true, Ordering::SeqCst);
            r
        })
    };
    // While A's writer is blocked, appended bytes in memory stay near the limit.
    let sampler = {
        let (h, done) = (ha.clone(), done.clone());
        std::thread::spawn(move || {
            let mut max = 0u64;
            while !done.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(60) {
                max = max.max(h.backend.pending_bytes());
                std::thread::sleep(Duration::from_millis(5));
            }
            max
        })
    };
    // B: an fsync of data appended while the bucket is unreachable.
    hb.store.write(ib, 0, &random(300_000, 7)).unwrap();
    let t0 = Instant::now();
    let e = hb.store.fsync(ib, false).unwrap_err();
    let fsync_took = t0.elapsed();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    assert!(
        fsync_took >= deadline && fsync_took < deadline * 5,
        "fsync failed after {fsync_took:?} with a deadline of {deadline:?}"
    );
    let e = hb.store.write(ib, 0, b"x").unwrap_err();
    assert!(matches!(e, Error::ReadOnly(_)), "{e}");

    let r = writer.join().unwrap();
    let took = start.elapsed();
    let max_pending = sampler.join().unwrap();
    let e = r.expect_err("64 MiB written to an unreachable bucket with a 4 MiB dirty limit");
    assert!(
        e.errno() == libc::EIO || matches!(e, Error::ReadOnly(_)),
        "the blocked write failed with {e}"
    );
    let w = written.load(Ordering::SeqCst);
    assert!(
        w < 32 << 20,
        "{w} bytes written with the bucket unreachable"
    );
    // Appends of one flush may pass the limit before the writer waits: one flush's worth.
    assert!(
        max_pending <= limit + (8 << 20),
        "{max_pending} bytes pending with a limit of {limit}"
    );
    assert!(
        took >= deadline && took < deadline * 10,
        "the write failed after {took:?} with a deadline of {deadline:?}"
    );
    eprintln!(
        "dirty limit {limit}: at most {max_pending} bytes pending, {w} bytes written, the \
         write failed after {took:?}, fsync after {fsync_took:?}"
    );
    let e = ha.store.write(ia, 0, b"x").unwrap_err();
    assert!(matches!(e, Error::ReadOnly(_)), "{e}");
    assert!(proxy.counts().black_holed > 0);
    drop((ha, hb));
    for (_, h, _) in &stores {
        std::mem::forget(h.clone());
    }
    drop(proxy);
    for (i, (url, _, before)) in stores.iter().enumerate() {
        let o2 = srv.options(&t.path().join(format!("r{i}")), 0, Duration::from_secs(20));
        expire_lost_writer(url, &o2);
        let h2 = open_s3(url, &o2);
        let a = h2.store.lookup(ROOT_INO, b"before").unwrap();
        assert!(read_all(&h2.store, a.ino).unwrap() == *before);
        h2.store.close().unwrap();
    }
}

/// `fsck --full` of a store in a bucket: clean when it is, right after a GC too (the fetchable
/// snapshot references no deleted object); a byte flipped in a chunk object
/// (in the server's data directory) is found by the walk without the metadata and by the
/// metadata checks, and a read of the file it belongs to fails with EIO (the other files read
/// right, never wrong bytes); an object whose size disagrees with its name is found too.
#[test]
fn fsck_full_finds_a_damaged_object_and_reads_of_it_fail_with_eio() {
    let srv = Server::start();
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/damaged").unwrap();
    let o = srv.options(&t.path().join("w"), 0, Duration::from_secs(20));
    mkfs(&url, &o);
    let h = open_s3(&url, &o);
    let mut files: Vec<(String, Vec<u8>)> = (0..4u64)
        .map(|i| (format!("f{i}"), random(300_000 + i as usize * 1000, i)))
        .collect();
    let mut inos = Vec::new();
    for (name, data) in &files {
        inos.push(new_file(&h.store, name, data));
    }
    h.store.sync().unwrap();
    // GC after an overwrite deletes chunks; the writer is then lost. The snapshot a mount
    // fetches references no deleted object: every extent it names reads and checks out.
    files[0].1 = random(300_000, 50);
    h.store.write(inos[0], 0, &files[0].1).unwrap();
    h.store.sync().unwrap();
    let g = h.store.gc().unwrap();
    assert!(g.segments_freed > 0, "{g:?}");
    std::mem::forget(h);
    let fsck = |full| object::fsck_bucket(&url, &o, full, &mut |_, _| {}).unwrap();
    let r = fsck(true);
    assert!(r.report.is_clean(), "{:?}", r.report.problems);
    assert!(r.objects > 0 && r.walked_extents >= 4 * 18, "{r:?}");
    assert!(r.report.bytes_verified > 1_000_000, "{r:?}");

    // Flip a byte in the middle of the largest chunk: inside some extent's stored bytes.
    let chunks = srv.objects("damaged/segs");
    let victim = chunks
        .iter()
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap()
        .clone();
    let mut bytes = std::fs::read(&victim).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x20;
    std::fs::write(&victim, &bytes).unwrap();
    let name = victim.file_name().unwrap().to_string_lossy().into_owned();
    let r = fsck(true);
    let walk: Vec<_> = r
        .report
        .problems
        .iter()
        .filter(|p| p.kind == ProblemKind::CorruptExtent && p.message.starts_with("object "))
        .collect();
    assert!(
        walk.len() == 1 && walk[0].message.contains(&name),
        "{:?}",
        r.report.problems
    );
    // The metadata checks find it too, without --full.
    let r = fsck(false);
    assert!(
        r.report
            .problems
            .iter()
            .any(|p| p.kind == ProblemKind::CorruptExtent && p.message.starts_with("extent ")),
        "{:?}",
        r.report.problems
    );
    // Reads: EIO for the damaged file, the right bytes for the others.
    let o2 = srv.options(&t.path().join("r"), 0, Duration::from_secs(20));
    let h2 = object::open(
        &url,
        &o2,
        &OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
        tuning(),
    )
    .unwrap();
    let mut failed = 0;
    for (name, data) in &files {
        let a = h2.store.lookup(ROOT_INO, name.as_bytes()).unwrap();
        match read_all(&h2.store, a.ino) {
            Ok(got) => assert!(got == *data, "{name}: wrong bytes"),
            Err(e) => {
                assert_eq!(e.errno(), libc::EIO, "{name}: {e}");
                failed += 1;
            }
        }
    }
    assert_eq!(failed, 1, "one file holds the damaged byte");
    h2.store.close().unwrap();

    // An object one byte longer than its name says.
    let other = chunks.iter().find(|p| **p != victim).unwrap();
    let mut b = std::fs::read(other).unwrap();
    b.push(0);
    std::fs::write(other, &b).unwrap();
    let r = fsck(true);
    let oname = other.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        r.report
            .problems
            .iter()
            .any(|p| p.kind == ProblemKind::BadSegment
                && p.message.contains(&oname)
                && p.message.contains("its name says")),
        "{:?}",
        r.report.problems
    );
}

/// Options of a `-o writeback` mount through `proxy`: requests give up after 10 s (the uploader
/// tries again), no snapshot upload by the flusher during the test (an hour).
fn writeback_options(srv: &Server, proxy: &FaultProxy, cache: &std::path::Path) -> ObjectOptions {
    ObjectOptions {
        writeback: true,
        metadata_interval: Duration::from_secs(3600),
        ..srv.options_via(proxy, cache, 8 << 20, Duration::from_secs(10))
    }
}

fn read_named(s: &Store, name: &str) -> Vec<u8> {
    let a = s.lookup(ROOT_INO, name.as_bytes()).unwrap();
    read_all(s, a.ino).unwrap()
}

/// `-o writeback`: with the bucket unreachable an fsync returns (its bytes are fsynced in the
/// upload queue), reads of them come from the queue; once the bucket is back the uploader
/// empties the queue, and a mount from an empty cache directory reads every byte.
#[test]
fn writeback_fsync_returns_while_the_bucket_is_unreachable_and_uploads_once_back() {
    let srv = Server::start();
    let proxy = FaultProxy::start(srv.addr(), Faults::default());
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/wb-unreachable").unwrap();
    let o = writeback_options(&srv, &proxy, &t.path().join("c1"));
    mkfs(&url, &o);
    let h = open_s3(&url, &o);
    let first = pattern(300_000, 1);
    let ino = new_file(&h.store, "first", &first);
    h.store.fsync(ino, false).unwrap();
    proxy.black_hole(true);
    let data = random(700_000, 2);
    let ino = new_file(&h.store, "during", &data);
    h.store.fsync(ino, false).unwrap();
    h.store.sync().unwrap();
    let (n, bytes) = h.backend.queued().unwrap();
    assert!(
        n > 0 && bytes >= 700_000,
        "{n} chunks, {bytes} bytes queued"
    );
    let status = h.store.remote_status().unwrap();
    assert!(status.contains("upload queue: "), "{status}");
    assert!(read_named(&h.store, "during") == data);
    proxy.black_hole(false);
    let deadline = Instant::now() + Duration::from_secs(120);
    while h.backend.queued().unwrap().0 > 0 {
        assert!(Instant::now() < deadline, "the upload queue never emptied");
        std::thread::sleep(Duration::from_millis(100));
    }
    h.close().unwrap();
    assert_eq!(
        std::fs::read_dir(t.path().join("c1/upload"))
            .unwrap()
            .count(),
        0
    );
    let o2 = srv.options(&t.path().join("c2"), 0, Duration::from_secs(20));
    let h2 = open_s3(&url, &o2);
    assert!(read_named(&h2.store, "first") == first);
    assert!(read_named(&h2.store, "during") == data);
    h2.close().unwrap();
}

/// `-o writeback`, then a crash with chunks in the upload queue: a mount of another machine
/// (an empty cache directory) sees the last snapshot, consistent (every file it lists reads
/// back whole); the next mount from the same cache directory uploads the queue first, and
/// every acknowledged byte reads back, there and from a further empty cache directory.
#[test]
fn writeback_queue_left_by_a_crash_is_uploaded_by_the_next_mount_from_the_same_cache_dir() {
    let srv = Server::start();
    let proxy = FaultProxy::start(srv.addr(), Faults::default());
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/wb-crash").unwrap();
    let o = writeback_options(&srv, &proxy, &t.path().join("c1"));
    mkfs(&url, &o);
    let h = open_s3(&url, &o);
    let before = pattern(400_000, 3);
    new_file(&h.store, "before", &before);
    // Unmount: the queue goes first, then the snapshot referencing it.
    h.close().unwrap();
    let h = open_s3(&url, &o);
    proxy.black_hole(true);
    let mut acked = Vec::new();
    for i in 0..3u64 {
        let data = random(200_000 + i as usize * 50_000, 10 + i);
        let ino = new_file(&h.store, &format!("acked{i}"), &data);
        h.store.fsync(ino, false).unwrap();
        acked.push((format!("acked{i}"), data));
    }
    h.store.sync().unwrap();
    assert!(h.backend.queued().unwrap().0 > 0);
    // The crash: no final commit, the uploader stopped, the queue left as it is. The abandoned
    // store still holds its cache directory's database in this process: the next mount uses
    // a copy of the directory as the crash left it (everything acknowledged was fsynced).
    h.abandon();
    let c1 = t.path().join("c1-after-crash");
    copy_dir(&t.path().join("c1"), &c1);
    drop(proxy);
    let queued = std::fs::read_dir(c1.join("upload")).unwrap().count();
    assert!(queued > 0);
    // Another machine, read-only: the last snapshot, whole.
    let ro = OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    };
    let o2 = srv.options(&t.path().join("c2"), 8 << 20, Duration::from_secs(20));
    let h2 = object::open(&url, &o2, &ro, tuning()).unwrap();
    assert!(read_named(&h2.store, "before") == before);
    assert!(h2.store.lookup(ROOT_INO, b"acked0").is_err());
    h2.store.close().unwrap();
    // A read-only open from the crashed cache directory refuses: it would upload nothing.
    let o1 = srv.options(&c1, 8 << 20, Duration::from_secs(20));
    let e = object::open(&url, &o1, &ro, tuning()).err().unwrap();
    assert!(e.to_string().contains("upload queue"), "{e}");
    // The same cache directory, read-write: the queue is uploaded before anything else.
    expire_lost_writer(&url, &o1);
    let h1 = open_s3(&url, &o1);
    assert_eq!(std::fs::read_dir(c1.join("upload")).unwrap().count(), 0);
    for (name, data) in &acked {
        assert!(read_named(&h1.store, name) == *data, "{name}");
    }
    assert!(read_named(&h1.store, "before") == before);
    h1.close().unwrap();
    let o3 = srv.options(&t.path().join("c3"), 0, Duration::from_secs(20));
    let h3 = object::open(&url, &o3, &ro, tuning()).unwrap();
    for (name, data) in &acked {
        assert!(read_named(&h3.store, name) == *data, "{name}");
    }
    h3.store.close().unwrap();
}

/// A queue file damaged while the store was down is never uploaded: the mount fails with a
/// message naming it.
#[test]
fn a_damaged_upload_queue_file_is_refused_not_uploaded() {
    let srv = Server::start();
    let proxy = FaultProxy::start(srv.addr(), Faults::default());
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/wb-damaged").unwrap();
    let o = writeback_options(&srv, &proxy, &t.path().join("c1"));
    mkfs(&url, &o);
    let h = open_s3(&url, &o);
    proxy.black_hole(true);
    let ino = new_file(&h.store, "f", &random(300_000, 5));
    h.store.fsync(ino, false).unwrap();
    h.abandon();
    let c1 = t.path().join("c1-after-crash");
    copy_dir(&t.path().join("c1"), &c1);
    drop(proxy);
    let f = std::fs::read_dir(c1.join("upload"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut b = std::fs::read(&f).unwrap();
    let n = b.len();
    b[n - 10] ^= 0x40;
    std::fs::write(&f, &b).unwrap();
    let o1 = srv.options(&c1, 8 << 20, Duration::from_secs(20));
    expire_lost_writer(&url, &o1);
    let e = object::open(&url, &o1, &OpenOptions::default(), tuning())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("damaged") && e.contains("not uploaded"), "{e}");
    assert!(
        srv.objects("wb-damaged/segs").is_empty(),
        "nothing of it was uploaded"
    );
}

/// `-o writeback` options with an upload queue bound of `limit` bytes and request deadline
/// `deadline`.
fn limited_options(
    srv: &Server,
    proxy: &FaultProxy,
    cache: &std::path::Path,
    limit: u64,
    deadline: Duration,
) -> ObjectOptions {
    ObjectOptions {
        writeback: true,
        upload_limit: limit,
        metadata_interval: Duration::from_secs(3600),
        ..srv.options_via(proxy, cache, 8 << 20, deadline)
    }
}

/// Polls `cond` every 20 ms until it holds; panics (naming `what`) after 60 s. Only for
/// things that are bound to happen.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "{what} never happened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// 300,000 random bytes (incompressible: about as many stored bytes) for file `i`.
fn file_data(i: u64) -> Vec<u8> {
    random(300_000, 100 + i)
}

/// `-o writeback` with `upload_limit=1M` and the bucket unreachable: three fsyncs of 300 KB
/// each return (their chunks in the queue), the fourth would pass the bound and waits for
/// room (the queue stays within it); once the bucket is back the uploader makes room, the
/// waiting fsync returns and later ones too, and a mount from an empty cache directory reads
/// every byte.
#[test]
fn writeback_fsyncs_wait_at_the_upload_limit_and_go_on_once_the_bucket_is_back() {
    let srv = Server::start();
    let proxy = FaultProxy::start(srv.addr(), Faults::default());
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/wb-limit").unwrap();
    let limit = 1u64 << 20;
    // A deadline far longer than the test's black hole: nothing gives up meanwhile.
    let o = limited_options(
        &srv,
        &proxy,
        &t.path().join("c1"),
        limit,
        Duration::from_secs(60),
    );
    mkfs(&url, &o);
    let h = Arc::new(open_s3(&url, &o));
    assert_eq!(h.backend.queue_limit(), Some((limit, 0)));
    proxy.black_hole(true);
    for i in 0..3u64 {
        let ino = new_file(&h.store, &format!("f{i}"), &file_data(i));
        h.store.fsync(ino, false).unwrap();
    }
    let (n, bytes) = h.backend.queued().unwrap();
    assert!(
        n > 0 && bytes >= 900_000 && bytes <= limit,
        "{n} chunks, {bytes} bytes queued"
    );
    // The fourth: 300 KB more do not fit, and nothing leaves the queue.
    let ino = new_file(&h.store, "f3", &file_data(3));
    let fsync = {
        let h = h.clone();
        std::thread::spawn(move || h.store.fsync(ino, false))
    };
    wait_for("a sync waiting for room in the upload queue", || {
        h.backend.queue_limit().unwrap().1 > 0
    });
    let status = h.store.remote_status().unwrap();
    assert!(
        status.contains(&format!(
            "(upload_limit {limit} bytes; syncs waiting for room: 1)"
        )),
        "{status}"
    );
    assert!(
        !fsync.is_finished(),
        "the fsync returned with the queue full"
    );
    assert!(h.backend.queued().unwrap().1 <= limit);
    proxy.black_hole(false);
    fsync.join().unwrap().unwrap();
    for i in 4..6u64 {
        let ino = new_file(&h.store, &format!("f{i}"), &file_data(i));
        h.store.fsync(ino, false).unwrap();
    }
    let h = Arc::into_inner(h).unwrap();
    h.close().unwrap();
    let o2 = srv.options(&t.path().join("c2"), 0, Duration::from_secs(20));
    let h2 = open_s3(&url, &o2);
    for i in 0..6u64 {
        assert!(
            read_named(&h2.store, &format!("f{i}")) == file_data(i),
            "f{i}"
        );
    }
    h2.close().unwrap();
}

/// `-o writeback` with `upload_limit=1M`, a 2 s deadline and the bucket unreachable: the fsync
/// that would pass the bound fails with EIO once no chunk left the queue for the deadline, and
/// the store refuses further writes. Nothing acknowledged is lost: the next mount from the
/// cache directory uploads the queue, and a mount from an empty one reads the three files.
#[test]
fn a_full_upload_queue_fails_the_fsync_with_eio_after_the_deadline_and_loses_nothing() {
    let srv = Server::start();
    let proxy = FaultProxy::start(srv.addr(), Faults::default());
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/wb-limit-eio").unwrap();
    let limit = 1u64 << 20;
    let deadline = Duration::from_secs(2);
    let o = limited_options(&srv, &proxy, &t.path().join("c1"), limit, deadline);
    mkfs(&url, &o);
    let h = open_s3(&url, &o);
    proxy.black_hole(true);
    for i in 0..3u64 {
        let ino = new_file(&h.store, &format!("f{i}"), &file_data(i));
        h.store.fsync(ino, false).unwrap();
    }
    let ino = new_file(&h.store, "f3", &file_data(3));
    let t0 = Instant::now();
    let e = h.store.fsync(ino, false).unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    assert!(t0.elapsed() >= deadline, "failed after {:?}", t0.elapsed());
    let e = h.store.write(ino, 0, b"x").unwrap_err();
    assert!(matches!(e, Error::ReadOnly(_)), "{e}");
    let e = h
        .store
        .mknod(ROOT_INO, b"late", FileKind::File, 0o644, 0, 0, 0)
        .unwrap_err();
    assert!(matches!(e, Error::ReadOnly(_)), "{e}");
    // The machine goes on (or crashes): the queue stays as it is; the next mount from this
    // cache directory (a copy: the abandoned store still holds it) uploads it.
    h.abandon();
    drop(proxy);
    let c1 = t.path().join("c1-after");
    copy_dir(&t.path().join("c1"), &c1);
    assert!(std::fs::read_dir(c1.join("upload")).unwrap().count() > 0);
    let o1 = srv.options(&c1, 0, Duration::from_secs(20));
    expire_lost_writer(&url, &o1);
    let h1 = open_s3(&url, &o1);
    for i in 0..3u64 {
        assert!(
            read_named(&h1.store, &format!("f{i}")) == file_data(i),
            "f{i}"
        );
    }
    h1.close().unwrap();
    let o2 = srv.options(&t.path().join("c2"), 0, Duration::from_secs(20));
    let h2 = open_s3(&url, &o2);
    for i in 0..3u64 {
        assert!(
            read_named(&h2.store, &format!("f{i}")) == file_data(i),
            "f{i}"
        );
    }
    h2.close().unwrap();
}

/// The snapshot upload of `compfs sync --remote` waits for the upload queue (the bucket is
/// unreachable) without holding redb's write lock or the batch lock: meanwhile a new file is
/// created, written and fsynced, a directory made and a file renamed. Once the bucket is back
/// the sync returns, and an empty cache directory sees everything.
#[test]
fn metadata_writes_go_on_while_a_snapshot_upload_waits_for_the_upload_queue() {
    let srv = Server::start();
    let proxy = FaultProxy::start(srv.addr(), Faults::default());
    let t = tempfile::tempdir().unwrap();
    let url = S3Url::parse("s3://compfs/wb-unlocked").unwrap();
    let o = limited_options(
        &srv,
        &proxy,
        &t.path().join("c1"),
        64 << 20,
        Duration::from_secs(60),
    );
    mkfs(&url, &o);
    let h = Arc::new(open_s3(&url, &o));
    proxy.black_hole(true);
    let ino = new_file(&h.store, "queued", &file_data(0));
    h.store.fsync(ino, false).unwrap();
    let sync = {
        let h = h.clone();
        std::thread::spawn(move || h.store.sync_remote())
    };
    wait_for("the snapshot upload waiting for the upload queue", || {
        h.store
            .remote_status()
            .unwrap()
            .contains("a snapshot upload is waiting for the upload queue")
    });
    let ino = new_file(&h.store, "during", &file_data(1));
    h.store.fsync(ino, false).unwrap();
    let d = h.store.mkdir(ROOT_INO, b"dir", 0o755, 0, 0).unwrap();
    h.store
        .rename(ROOT_INO, b"during", d.ino, b"moved", RenameFlags::default())
        .unwrap();
    h.store.sync().unwrap();
    // Still waiting: the bucket is unreachable and the deadline far off.
    assert!(h
        .store
        .remote_status()
        .unwrap()
        .contains("a snapshot upload is waiting for the upload queue"));
    proxy.black_hole(false);
    sync.join().unwrap().unwrap();
    let h = Arc::into_inner(h).unwrap();
    h.close().unwrap();
    let o2 = srv.options(&t.path().join("c2"), 0, Duration::from_secs(20));
    let h2 = open_s3(&url, &o2);
    assert!(read_named(&h2.store, "queued") == file_data(0));
    let d = h2.store.lookup(ROOT_INO, b"dir").unwrap();
    let m = h2.store.lookup(d.ino, b"moved").unwrap();
    assert!(read_all(&h2.store, m.ino).unwrap() == file_data(1));
    h2.close().unwrap();
}

/// Not a test: how long other metadata writes stall while `compfs sync --remote` uploads the
/// snapshot (docs/benchmarks-s3.md). A bucket behind a proxy delaying every request by up to
/// 100 ms. Each round writes and fsyncs a 4 MiB file (with `-o writeback` it waits in the
/// queue: 16 chunks), makes a directory, starts `sync --remote` in a thread (the drain of the
/// queue, then the snapshot's pieces and manifest) and, 20 ms later, times a metadata write of
/// the main thread: a directory and a file created, 4 KiB written (no fsync). Both modes,
/// rounds alternating; medians and spreads. Run with `cargo test -p compfs-store --test
/// object_faults -- --ignored --nocapture snapshot_lock_bench`.
#[test]
#[ignore]
fn snapshot_lock_bench() {
    let srv = Server::start();
    let proxy = FaultProxy::start(
        srv.addr(),
        Faults {
            seed: 7,
            delay: 1000,
            max_delay: Duration::from_millis(100),
            ..Faults::default()
        },
    );
    let t = tempfile::tempdir().unwrap();
    let stores: Vec<(&str, Arc<ObjectStoreHandle>)> = [("plain", false), ("writeback", true)]
        .into_iter()
        .map(|(name, wb)| {
            let url = S3Url::parse(&format!("s3://compfs/lock-bench-{name}")).unwrap();
            let o = ObjectOptions {
                writeback: wb,
                metadata_interval: Duration::from_secs(3600),
                ..srv.options_via(
                    &proxy,
                    &t.path().join(name),
                    8 << 20,
                    Duration::from_secs(60),
                )
            };
            mkfs(&url, &o);
            (name, Arc::new(open_s3(&url, &o)))
        })
        .collect();
    let mut meta = vec![Vec::new(); stores.len()];
    let mut syncs = vec![Vec::new(); stores.len()];
    for r in 0..12u64 {
        for (m, (_, h)) in stores.iter().enumerate() {
            let ino = new_file(&h.store, &format!("big{r}"), &random(4 << 20, r));
            h.store.fsync(ino, false).unwrap();
            h.store
                .mkdir(ROOT_INO, format!("d{r}").as_bytes(), 0o755, 0, 0)
                .unwrap();
            let sync = {
                let h = h.clone();
                std::thread::spawn(move || {
                    let t0 = Instant::now();
                    h.store.sync_remote().unwrap();
                    t0.elapsed()
                })
            };
            std::thread::sleep(Duration::from_millis(20));
            let t0 = Instant::now();
            h.store
                .mkdir(ROOT_INO, format!("e{r}").as_bytes(), 0o755, 0, 0)
                .unwrap();
            new_file(&h.store, &format!("small{r}"), &random(4096, 1000 + r));
            meta[m].push(t0.elapsed());
            syncs[m].push(sync.join().unwrap());
        }
    }
    let show = |what: String, v: &mut Vec<Duration>| {
        v.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        eprintln!(
            "{what}: median {:.1} ms (min {:.1}, p25 {:.1}, p75 {:.1}, max {:.1}), {} rounds",
            ms(v[v.len() / 2]),
            ms(v[0]),
            ms(v[v.len() / 4]),
            ms(v[v.len() * 3 / 4]),
            ms(v[v.len() - 1]),
            v.len()
        );
    };
    for (m, (name, _)) in stores.iter().enumerate() {
        show(
            format!("{name}: metadata write during sync --remote"),
            &mut meta[m],
        );
        show(format!("{name}: sync --remote"), &mut syncs[m]);
    }
    for (_, h) in stores {
        Arc::into_inner(h).unwrap().close().unwrap();
    }
}

/// Copies directory `from` (recursively) to `to`.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
}
