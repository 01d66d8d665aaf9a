//! FUSE over io_uring (`-o uring`): requests made on every CPU are served through the per-CPU
//! rings (the daemon's counters in `compfs.stats` say so, queue by queue), every byte written
//! reads back, and the daemon comes down cleanly on unmount and when the connection is aborted
//! with requests in flight. The kernel of the CI machine has the ring (6.14+): if it refuses,
//! these tests fail rather than skip.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod fs_common;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use compfs_store::Mode;
use fs_common::*;

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// The daemon's `compfs.stats` figures.
fn stats(mnt: &Path) -> BTreeMap<String, u64> {
    let v = xattr::get(mnt, "compfs.stats")
        .unwrap()
        .expect("compfs.stats");
    let text = String::from_utf8(v).unwrap();
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let (k, n) = l.split_once(' ')?;
            Some((k.to_string(), n.parse().ok()?))
        })
        .collect()
}

/// CPUs in a sysfs list such as `0-3,6`.
fn cpu_list(path: &str) -> Vec<usize> {
    let s = fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    for part in s.trim().split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        out.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap());
    }
    out
}

fn pin_to(cpu: usize) {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set)
        .unwrap_or_else(|e| panic!("pin to CPU {cpu}: {e}"));
    assert_eq!(rustix::thread::sched_getcpu(), cpu);
}

/// Deterministic contents of file `i` of worker `w`: sizes from 0 to past 1 MiB (the largest
/// request payload), so that small, page-sized and multi-request writes and reads all occur.
fn contents(w: usize, i: usize) -> Vec<u8> {
    let len = match i % 6 {
        0 => 0,
        1 => 1 + i * 7,
        2 => 4096,
        3 => 70_000 + i,
        4 => (1 << 20) + 3 * i + 1,
        _ => 3000 + i * 31,
    };
    let mut x = (w as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i as u64;
    (0..len)
        .map(|k| {
            if k % 64 == 0 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
            }
            // Half compressible, half not.
            if (k / 4096) % 2 == 0 {
                (k % 251) as u8
            } else {
                (x >> (k % 8 * 8)) as u8
            }
        })
        .collect()
}

const FILES: usize = 36;

/// One worker pinned to `cpu`: creates, writes, reads back, renames, unlinks and lists files in
/// its own directory, checking every byte and every listing.
fn worker(root: PathBuf, w: usize, cpu: usize) {
    pin_to(cpu);
    let dir = root.join(format!("w{w}"));
    fs::create_dir(&dir).unwrap();
    for i in 0..FILES {
        let data = contents(w, i);
        let tmp = dir.join(format!(".tmp{i}"));
        let mut f = fs::File::create(&tmp).unwrap();
        // Several write calls per file.
        for chunk in data.chunks(50_000) {
            f.write_all(chunk).unwrap();
        }
        drop(f);
        assert_eq!(fs::read(&tmp).unwrap(), data, "{}", tmp.display());
        fs::rename(&tmp, dir.join(format!("f{i}"))).unwrap();
    }
    for i in (0..FILES).filter(|i| i % 4 == 1) {
        fs::remove_file(dir.join(format!("f{i}"))).unwrap();
    }
    let mut names: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut want: Vec<String> = (0..FILES)
        .filter(|i| i % 4 != 1)
        .map(|i| format!("f{i}"))
        .collect();
    want.sort();
    assert_eq!(names, want, "listing of {}", dir.display());
    verify(&dir, w);
}

fn verify(dir: &Path, w: usize) {
    for i in (0..FILES).filter(|i| i % 4 != 1) {
        let p = dir.join(format!("f{i}"));
        let got = fs::read(&p).unwrap();
        let want = contents(w, i);
        assert_eq!(got.len(), want.len(), "{}", p.display());
        assert!(got == want, "{}: contents differ", p.display());
        assert_eq!(fs::metadata(&p).unwrap().len(), want.len() as u64);
    }
}

/// The kernel must offer FUSE over io_uring here (Linux 6.14+, built with
/// CONFIG_FUSE_IO_URING): the test fails, not skips, when it does not.
fn require_kernel_ring() {
    assert!(
        Path::new(ENABLE_URING).exists(),
        "{ENABLE_URING} is missing: this kernel has no FUSE over io_uring"
    );
}

#[test]
fn ring_serves_every_cpu_and_every_byte_reads_back() {
    require_fuse!();
    require_kernel_ring();
    let t = TempDir::new("uring");
    let store = t.path().join("store");
    mkstore(&store, "zstd:3", Mode::Heuristic, 128 << 10);
    let mnt = t.path().join("mnt");
    // `uring` as root switches the module parameter on if it is off.
    let m = Mount::new(&store, &mnt, "uring");
    assert_eq!(fs::read_to_string(ENABLE_URING).unwrap().trim(), "Y");
    let possible = cpu_list("/sys/devices/system/cpu/possible");
    let online = cpu_list("/sys/devices/system/cpu/online");
    let before = stats(&m.mnt);
    assert_eq!(
        before["fuse.uring_queues"],
        possible.len() as u64,
        "one registered queue per possible CPU: {before:?}"
    );
    let root = m.path("work");
    fs::create_dir(&root).unwrap();
    // Two workers per online CPU, each pinned.
    let workers: Vec<_> = online
        .iter()
        .chain(online.iter())
        .enumerate()
        .map(|(w, &cpu)| {
            let root = root.clone();
            std::thread::spawn(move || worker(root, w, cpu))
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let after = stats(&m.mnt);
    let served = after["fuse.uring_requests"] - before["fuse.uring_requests"];
    // Each worker made well over 100 requests (creates, writes, reads, renames, unlinks).
    assert!(
        served > 100 * 2 * online.len() as u64,
        "only {served} requests went through the rings: {after:?}"
    );
    for cpu in &online {
        let k = format!("fuse.uring_requests.cpu{cpu}");
        assert!(
            after.get(&k).copied().unwrap_or(0) > 100,
            "queue of CPU {cpu} served too little: {after:?}"
        );
    }
    let status = m.unmount();
    assert!(status.success(), "daemon exit: {status:?}");
    // Everything is in the store: read it back through /dev/fuse.
    let m = Mount::new(&store, &mnt, "nouring");
    let st = stats(&m.mnt);
    assert_eq!(st["fuse.uring_queues"], 0, "{st:?}");
    assert_eq!(st["fuse.uring_requests"], 0, "{st:?}");
    for w in 0..2 * online.len() {
        verify(&m.path(&format!("work/w{w}")), w);
    }
    assert!(m.unmount().success());
}

/// `/sys/fs/fuse/connections/N/abort` of the mount at `mnt`.
fn abort_file(mnt: &Path) -> PathBuf {
    let conns = Path::new("/sys/fs/fuse/connections");
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    if !info.lines().any(|l| l.contains(" - fusectl ")) {
        let st = Command::new("mount")
            .args(["-t", "fusectl", "fusectl"])
            .arg(conns)
            .status()
            .unwrap();
        assert!(st.success(), "mount fusectl");
    }
    let dev = fs::metadata(mnt).unwrap().dev();
    let minor = libc::minor(dev);
    conns.join(minor.to_string()).join("abort")
}

#[test]
fn abort_with_requests_in_flight_ends_the_daemon_cleanly() {
    require_fuse!();
    require_kernel_ring();
    let t = TempDir::new("uring-abort");
    let store = t.path().join("store");
    mkstore(&store, "zstd:3", Mode::Heuristic, 128 << 10);
    let mnt = t.path().join("mnt");
    let mut m = Mount::new(&store, &mnt, "uring,uring_depth=1");
    let abort = abort_file(&m.mnt);
    let root = m.path("busy");
    fs::create_dir(&root).unwrap();
    // Writers and listers on every CPU, running until the connection goes away.
    let mut procs = Vec::new();
    for cpu in cpu_list("/sys/devices/system/cpu/online") {
        for job in ["write", "list"] {
            let script = match job {
                "write" => format!(
                    "i=0; while :; do head -c 300000 /dev/urandom > '{r}/c{cpu}-$i' || exit 0; \
                     cat '{r}/c{cpu}-$i' > /dev/null || exit 0; i=$((i+1)); done",
                    r = root.display()
                ),
                _ => format!(
                    "while :; do ls -l '{r}' > /dev/null || exit 0; done",
                    r = root.display()
                ),
            };
            procs.push(
                Command::new("taskset")
                    .args(["-c", &cpu.to_string(), "sh", "-c", &script])
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
        }
    }
    // Until requests are flowing through the rings.
    let start = Instant::now();
    while stats(&m.mnt)["fuse.uring_requests"] < 200 {
        assert!(start.elapsed() < Duration::from_secs(30), "no ring traffic");
        std::thread::sleep(Duration::from_millis(20));
    }
    fs::write(&abort, "1").unwrap();
    // The daemon ends by itself: every ring entry is completed with an error, the /dev/fuse
    // readers see ENODEV, the store is closed.
    let mut child = m.child.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the daemon did not end after the connection was aborted");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "daemon exit after abort: {status:?}");
    for mut p in procs {
        let _ = p.kill();
        let _ = p.wait();
    }
    let _ = Command::new("umount").arg("-l").arg(&mnt).status();
    // The store opens again.
    let m = Mount::new(&store, &mnt, "uring");
    assert!(m.path("busy").is_dir());
    assert!(m.unmount().success());
}

/// A long request (a `compfs defrag` of a 48 MiB file, one SETXATTR) is handed by its CPU's
/// ring thread to a helper, so the requests made on that CPU meanwhile are served at once: the
/// defrag tool's progress polls, made from the same CPU, see progress within the file.
#[test]
fn a_long_request_does_not_hold_up_its_cpus_queue() {
    require_fuse!();
    require_kernel_ring();
    let t = TempDir::new("uring-long");
    let store = t.path().join("store");
    mkstore(&store, "zstd:1", Mode::Force, 128 << 10);
    let m = Mount::new(&store, &t.path().join("mnt"), "uring,uring_depth=2");
    let data = text_bytes(48 << 20, 5);
    fs::write(m.path("big"), &data).unwrap();
    let before = stats(&m.mnt);
    // Everything below, the defrag's thread included (it inherits the mask), runs on one CPU:
    // its requests all go to that CPU's queue.
    let cpu = cpu_list("/sys/devices/system/cpu/online")[0];
    let (examined, seen) = std::thread::scope(|s| {
        s.spawn(|| {
            pin_to(cpu);
            defrag_to_zstd9_polling(&m.path("big"))
        })
        .join()
        .unwrap()
    });
    assert_eq!(examined, data.len() as u64);
    assert!(
        seen.iter().any(|&b| b > 0 && b < data.len() as u64),
        "no progress seen within the file while its defrag ran: {seen:?}"
    );
    let after = stats(&m.mnt);
    assert!(
        after["fuse.uring_requests"] > before["fuse.uring_requests"],
        "the requests did not go through the ring: {after:?}"
    );
    assert!(
        after["fuse.uring_handed_off"] > before["fuse.uring_handed_off"],
        "the defrag request was not handed off: {after:?}"
    );
    assert!(fs::read(m.path("big")).unwrap() == data);
    assert!(m.unmount().success());
}

/// While the store has nothing written to compress, the ring threads commit their replies so
/// as to wake the requester on their own CPU (`compfs_fs::ring`): counted in `compfs.stats`;
/// and metadata requests made meanwhile (creates, stats, deletes) all succeed. A ring thread
/// that had to wait over 1 ms for its CPU stops doing so for a second (other tests load the
/// machine), so the count is awaited, not expected after a fixed number of requests.
#[test]
fn idle_store_replies_wake_requesters_on_the_ring_threads_cpu() {
    require_fuse!();
    require_kernel_ring();
    let t = TempDir::new("uring-wake");
    let store = t.path().join("store");
    mkstore(&store, "zstd:3", Mode::Heuristic, 128 << 10);
    let m = Mount::new(&store, &t.path().join("mnt"), "uring");
    let before = stats(&m.mnt)["fuse.uring_woken_here"];
    let dir = m.path("d");
    fs::create_dir(&dir).unwrap();
    for i in 0..2000 {
        fs::File::create(dir.join(format!("f{i}"))).unwrap();
    }
    for i in 0..2000 {
        assert_eq!(fs::metadata(dir.join(format!("f{i}"))).unwrap().len(), 0);
    }
    for i in 0..2000 {
        fs::remove_file(dir.join(format!("f{i}"))).unwrap();
    }
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // Root can leave SCHED_IDLE again: replies are committed so, at the latest once a
        // back-off has run out.
        let start = Instant::now();
        loop {
            let st = stats(&m.mnt);
            if st["fuse.uring_woken_here"] > before {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no reply committed so as to wake its requester here: {st:?}"
            );
            // A request the ring thread answers itself (a LOOKUP of a missing name; the
            // stats above go to a helper).
            assert!(fs::metadata(dir.join("missing")).is_err());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert!(m.unmount().success());
}
