//! Fault injection into the metadata database (`meta.redb`): redb's writes and syncs of its file
//! fail with EIO or ENOSPC, or tear, at chosen calls during a workload of creates, writes,
//! overwrites, unlinks and fsyncs. The operation that meets the fault fails, the store latches
//! read-only, nothing panics, and after a reopen without faults every file acknowledged by
//! `fsync`/`sync` before the fault reads back exactly and fsck is clean.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

use std::collections::BTreeMap;

use compfs_store::backend::{Fault, FaultBackend, FaultKind, FaultOp};
use compfs_store::*;

const EXTENT: u32 = 16384;

fn meta_tuning(fb: &FaultBackend) -> Tuning {
    Tuning {
        meta_faults: Some(fb.clone()),
        ..tuning()
    }
}

/// One step of the workload, each ending in a durability point.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// A new file of `len` bytes (inline when small), then `fsync`.
    Create(usize),
    /// Overwrite 5000 bytes in the middle of an earlier file, then `fsync`.
    Overwrite,
    /// Unlink an earlier file, then `sync`.
    Unlink,
    /// `n` new small (inline) files, then `sync`: grows the metadata file.
    Batch(usize),
}

fn step(i: u64) -> Step {
    match i % 5 {
        0 | 3 => Step::Create(20_000 + (i as usize % 7) * 3000),
        1 => Step::Create(300 + i as usize * 10),
        2 => Step::Overwrite,
        _ => Step::Unlink,
    }
}

/// Twenty rounds of creates, overwrites and unlinks.
fn mixed() -> Vec<Step> {
    (0..20).map(step).collect()
}

/// A file, then batches of small files until redb grows its file.
fn growing() -> Vec<Step> {
    let mut v = vec![Step::Create(30_000)];
    v.extend((0..GROW_BATCHES).map(|_| Step::Batch(250)));
    v
}

const GROW_BATCHES: usize = 12;

/// What the test knows a file holds: its acknowledged content (`None`: absent), and the change
/// in flight when the fault hit (either may be what survives).
#[derive(Default)]
struct Model {
    acked: BTreeMap<String, Option<Vec<u8>>>,
    pending: Vec<(String, Option<Vec<u8>>)>,
}

impl Model {
    fn live(&self) -> Vec<String> {
        self.acked
            .iter()
            .filter(|(_, v)| v.is_some())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Whether `got` is an allowed state of file `name`.
    fn allowed(&self, name: &str, got: &Option<Vec<u8>>) -> bool {
        let acked = self.acked.get(name).cloned().unwrap_or(None);
        if *got == acked {
            return true;
        }
        self.pending.iter().any(|(n, new)| n == name && got == new)
    }
}

/// Runs round `i` of the workload. The model's `pending` is set before the operations, and the
/// change is acknowledged only when every operation of the round succeeded.
fn run_step(s: &Store, m: &mut Model, i: u64, st: Step) -> Result<()> {
    let live = m.live();
    match st {
        Step::Create(len) => {
            let name = format!("f{i}");
            let data = pattern(len, i);
            m.pending = vec![(name.clone(), Some(data.clone()))];
            let a = s.mknod(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, 0, 0, 0)?;
            s.write(a.ino, 0, &data)?;
            s.fsync(a.ino, false)?;
        }
        Step::Overwrite => {
            let name = live[i as usize % live.len()].clone();
            let mut data = m.acked[&name].clone().unwrap_or_default();
            let at = data.len() / 3;
            let patch = random(5000, i);
            let end = at + patch.len();
            if data.len() < end {
                data.resize(end, 0);
            }
            data[at..end].copy_from_slice(&patch);
            m.pending = vec![(name.clone(), Some(data))];
            let a = s.lookup(ROOT_INO, name.as_bytes())?;
            s.write(a.ino, at as u64, &patch)?;
            s.fsync(a.ino, false)?;
        }
        Step::Unlink => {
            let name = live[i as usize % live.len()].clone();
            m.pending = vec![(name.clone(), None)];
            s.unlink(ROOT_INO, name.as_bytes())?;
            s.sync()?;
        }
        Step::Batch(n) => {
            m.pending = (0..n)
                .map(|k| {
                    (
                        format!("b{i}-{k}"),
                        Some(pattern(1500, i * 1000 + k as u64)),
                    )
                })
                .collect();
            for (name, data) in m.pending.clone() {
                let a = s.mknod(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, 0, 0, 0)?;
                s.write(a.ino, 0, data.as_deref().unwrap_or_default())?;
            }
            s.sync()?;
        }
    }
    for (n, v) in std::mem::take(&mut m.pending) {
        m.acked.insert(n, v);
    }
    Ok(())
}

/// The state of every file named in the model, read through `s`.
fn read_state(s: &Store, m: &Model) -> Result<BTreeMap<String, Option<Vec<u8>>>> {
    let mut names: Vec<String> = m.acked.keys().cloned().collect();
    names.extend(m.pending.iter().map(|(n, _)| n.clone()));
    names.sort();
    names.dedup();
    let mut out = BTreeMap::new();
    for n in names {
        let got = match s.lookup(ROOT_INO, n.as_bytes()) {
            Ok(a) => Some(read_all(s, a.ino)?),
            Err(Error::NotFound) => None,
            Err(e) => return Err(e),
        };
        out.insert(n, got);
    }
    Ok(out)
}

/// How many redb calls of kind `op` workload `w` makes (run without faults).
fn workload_calls(w: &[Step], op: FaultOp) -> u64 {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let fb = FaultBackend::new();
    let s = create(&dir, EXTENT, meta_tuning(&fb));
    let mut m = Model::default();
    let before = fb.count(op);
    for (i, st) in w.iter().enumerate() {
        run_step(&s, &mut m, i as u64, *st).unwrap();
    }
    let n = fb.count(op) - before;
    s.close().unwrap();
    n
}

/// ENOSPC surfaces as [`Error::NoSpace`], every other fault as EIO.
fn assert_fault_error(e: &Error, kind: FaultKind, what: &str) {
    match kind {
        FaultKind::NoSpace => assert!(matches!(e, Error::NoSpace), "{what}: {e}"),
        _ => assert_eq!(e.errno(), libc::EIO, "{what}: {e}"),
    }
}

/// Arms `fault` after the store was created, runs the workload until an operation fails, checks
/// the read-only latch and reads, then reopens without faults and checks that everything
/// acknowledged survived and fsck is clean.
fn run_with_fault(fault: Fault, w: &[Step]) {
    let what = format!("{fault:?}");
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let fb = FaultBackend::new();
    let s = create(&dir, EXTENT, meta_tuning(&fb));
    let mut m = Model::default();
    fb.arm(fault);
    let mut failed = None;
    for (i, st) in w.iter().enumerate() {
        if let Err(e) = run_step(&s, &mut m, i as u64, *st) {
            failed = Some(e);
            break;
        }
    }
    let e = failed.unwrap_or_else(|| panic!("{what}: the fault never surfaced"));
    assert!(fb.fired() > 0, "{what}: failed without the fault: {e}");
    assert_fault_error(&e, fault.kind, &what);
    // Latched read-only: every later change is refused.
    assert!(s.stats().read_only, "{what}: not read-only after {e}");
    let probe = m.live().first().cloned();
    if let Some(name) = &probe {
        if let Ok(a) = s.lookup(ROOT_INO, name.as_bytes()) {
            assert!(matches!(s.write(a.ino, 0, b"x"), Err(Error::ReadOnly(_))));
            assert!(matches!(s.fsync(a.ino, false), Err(Error::ReadOnly(_))));
        }
    }
    assert!(
        matches!(
            s.mkdir(ROOT_INO, b"d", 0o755, 0, 0),
            Err(Error::ReadOnly(_))
        ),
        "{what}"
    );
    assert!(
        matches!(
            s.mknod(ROOT_INO, b"late", FileKind::File, 0o644, 0, 0, 0),
            Err(Error::ReadOnly(_))
        ),
        "{what}"
    );
    assert!(matches!(s.sync(), Err(Error::ReadOnly(_))), "{what}");
    // Reads return allowed contents or an error, never other bytes.
    if let Ok(state) = read_state(&s, &m) {
        for (n, got) in &state {
            assert!(m.allowed(n, got), "{what}: {n} reads wrong before reopen");
        }
    }
    drop(s);

    let s = open(&dir, tuning());
    let state = read_state(&s, &m).unwrap();
    for (n, got) in &state {
        assert!(
            m.allowed(n, got),
            "{what}: {n} after reopen: {:?} bytes, acknowledged {:?}",
            got.as_ref().map(|g| g.len()),
            m.acked.get(n).map(|v| v.as_ref().map(|v| v.len()))
        );
    }
    // Nothing else appeared.
    let names: Vec<Vec<u8>> = s
        .readdir(ROOT_INO, 0, 1000)
        .unwrap()
        .into_iter()
        .map(|d| d.name)
        .filter(|n| n != b"." && n != b"..")
        .collect();
    for n in &names {
        let n = String::from_utf8(n.clone()).unwrap();
        assert!(state.contains_key(&n), "{what}: unexpected {n}");
    }
    // The reopened store takes writes again.
    let a = s
        .mknod(ROOT_INO, b"after", FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    s.write(a.ino, 0, b"after the fault").unwrap();
    s.fsync(a.ino, false).unwrap();
    s.close().unwrap();
    let r = fsck_report(&dir, false);
    assert!(r.is_clean(), "{what}: fsck: {:#?}", r.problems);
}

/// Call numbers spread over the workload: the first, the second, and three later ones.
fn chosen(total: u64) -> Vec<u64> {
    assert!(total >= 8, "workload made only {total} calls");
    let mut v = vec![0, 1, total / 3, total * 2 / 3, total - 1];
    v.dedup();
    v
}

/// Runs the mixed workload with a fault at each of several calls of `op`.
fn each(op: FaultOp, kind: FaultKind) {
    for nth in chosen(workload_calls(&mixed(), op)) {
        run_with_fault(
            Fault {
                op,
                nth,
                kind,
                sticky: false,
            },
            &mixed(),
        );
    }
}

#[test]
fn meta_write_eio_latches_read_only_and_keeps_acknowledged_files() {
    each(FaultOp::Write, FaultKind::Eio);
}

#[test]
fn meta_write_enospc_latches_read_only_and_keeps_acknowledged_files() {
    each(FaultOp::Write, FaultKind::NoSpace);
}

#[test]
fn meta_fsync_eio_latches_read_only_and_keeps_acknowledged_files() {
    each(FaultOp::Sync, FaultKind::Eio);
}

#[test]
fn torn_meta_write_latches_read_only_and_keeps_acknowledged_files() {
    for torn in [1usize, 100, 3000] {
        each(FaultOp::Write, FaultKind::Torn(torn));
    }
}

#[test]
fn sticky_meta_faults_fail_every_later_call_without_hanging() {
    for op in [FaultOp::Write, FaultOp::Sync] {
        run_with_fault(
            Fault {
                op,
                nth: workload_calls(&mixed(), op) / 2,
                kind: FaultKind::Eio,
                sticky: true,
            },
            &mixed(),
        );
    }
}

#[test]
fn a_store_open_with_meta_faults_still_refuses_a_second_open() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let fb = FaultBackend::new();
    let s = create(&dir, EXTENT, meta_tuning(&fb));
    for second in [tuning(), meta_tuning(&FaultBackend::new())] {
        let e = Store::open_tuned(&dir, &OpenOptions::default(), second)
            .err()
            .unwrap();
        assert!(matches!(e, Error::InUse(_)), "{e}");
    }
    s.close().unwrap();
    let plain = open(&dir, tuning());
    let e = Store::open_tuned(&dir, &OpenOptions::default(), meta_tuning(&fb))
        .err()
        .unwrap();
    assert!(matches!(e, Error::InUse(_)), "{e}");
    plain.close().unwrap();
    // Once closed, it opens with faults configured (none armed) and works.
    let s = open(&dir, meta_tuning(&fb));
    let f = mkfile(&s, ROOT_INO, "a");
    s.write(f, 0, b"hello").unwrap();
    s.fsync(f, false).unwrap();
    s.close().unwrap();
    assert_clean(&dir);
}

#[test]
fn meta_faults_while_creating_leave_no_store_and_create_force_recovers() {
    // Calls redb makes while the store's database is created (before the superblock exists).
    for (op, kind, calls) in [
        (FaultOp::Write, FaultKind::Eio, 3),
        (FaultOp::Write, FaultKind::NoSpace, 3),
        (FaultOp::Write, FaultKind::Torn(10), 3),
        (FaultOp::Sync, FaultKind::Eio, 2),
        (FaultOp::SetLen, FaultKind::NoSpace, 1),
    ] {
        for nth in 0..calls {
            let what = format!("{op:?} {kind:?} {nth}");
            let t = tempfile::tempdir().unwrap();
            let dir = t.path().join("s");
            let fb = FaultBackend::new();
            fb.arm(Fault {
                op,
                nth,
                kind,
                sticky: false,
            });
            let opts = CreateOptions {
                extent_size: EXTENT,
                ..CreateOptions::default()
            };
            let e = Store::create_tuned(&dir, &opts, meta_tuning(&fb))
                .err()
                .unwrap_or_else(|| panic!("{what}: created despite the fault"));
            assert!(fb.fired() > 0, "{what}: {e}");
            assert_fault_error(&e, kind, &what);
            assert!(!Store::is_store(&dir), "{what}");
            assert!(matches!(
                Store::open(&dir, &OpenOptions::default()),
                Err(Error::NotAStore { .. })
            ));
            assert!(matches!(
                Store::create_tuned(&dir, &opts, tuning()),
                Err(Error::AlreadyExists(_))
            ));
            let opts = CreateOptions {
                force: true,
                ..opts
            };
            Store::create_tuned(&dir, &opts, tuning())
                .unwrap()
                .close()
                .unwrap();
            let s = open(&dir, tuning());
            let f = mkfile(&s, ROOT_INO, "a");
            s.write(f, 0, b"works").unwrap();
            s.fsync(f, false).unwrap();
            s.close().unwrap();
            assert_clean(&dir);
        }
    }
}

/// A store with three files and an orphan (an inode unlinked while open), closed uncleanly
/// (dropped while the orphan is open): the next open frees the orphan in a durable commit.
fn store_with_orphan(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let s = create(dir, EXTENT, tuning());
    let mut files = Vec::new();
    for i in 0..3u64 {
        let f = mkfile(&s, ROOT_INO, &format!("f{i}"));
        let data = pattern(40_000, i);
        s.write(f, 0, &data).unwrap();
        files.push((format!("f{i}"), data));
    }
    let o = mkfile(&s, ROOT_INO, "orphan");
    s.write(o, 0, &pattern(30_000, 9)).unwrap();
    s.open_file(o).unwrap();
    s.unlink(ROOT_INO, b"orphan").unwrap();
    s.sync().unwrap();
    drop(s);
    files
}

#[test]
fn meta_faults_while_opening_fail_the_open_and_lose_nothing() {
    for (op, kind) in [
        (FaultOp::Write, FaultKind::Eio),
        (FaultOp::Write, FaultKind::NoSpace),
        (FaultOp::Write, FaultKind::Torn(200)),
        (FaultOp::Sync, FaultKind::Eio),
    ] {
        for sticky in [false, true] {
            let what = format!("{op:?} {kind:?} sticky {sticky}");
            let t = tempfile::tempdir().unwrap();
            let dir = t.path().join("s");
            let files = store_with_orphan(&dir);
            let fb = FaultBackend::new();
            fb.arm(Fault {
                op,
                nth: 0,
                kind,
                sticky,
            });
            let e = Store::open_tuned(&dir, &OpenOptions::default(), meta_tuning(&fb))
                .err()
                .unwrap_or_else(|| panic!("{what}: opened despite the fault"));
            assert!(fb.fired() > 0, "{what}: {e}");
            assert_fault_error(&e, kind, &what);
            let s = open(&dir, tuning());
            for (n, want) in &files {
                let a = s.lookup(ROOT_INO, n.as_bytes()).unwrap();
                assert_eq!(&read_all(&s, a.ino).unwrap(), want, "{what}: {n}");
            }
            assert!(matches!(
                s.lookup(ROOT_INO, b"orphan"),
                Err(Error::NotFound)
            ));
            s.close().unwrap();
            assert_clean(&dir);
        }
    }
}

/// The first growth of the metadata file (at the first commit after creation) fails.
#[test]
fn failed_meta_file_growth_latches_read_only_and_keeps_acknowledged_files() {
    let grows = workload_calls(&growing(), FaultOp::SetLen);
    assert!(grows >= 2, "the metadata file grew only {grows} times");
    for kind in [FaultKind::Eio, FaultKind::NoSpace] {
        run_with_fault(
            Fault {
                op: FaultOp::SetLen,
                nth: 0,
                kind,
                sticky: false,
            },
            &growing(),
        );
    }
}

#[test]
fn meta_faults_while_closing_fail_the_close_and_lose_nothing_acknowledged() {
    for (op, kind) in [
        (FaultOp::Write, FaultKind::Eio),
        (FaultOp::Write, FaultKind::Torn(500)),
        (FaultOp::Sync, FaultKind::Eio),
    ] {
        let what = format!("{op:?} {kind:?}");
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("s");
        let fb = FaultBackend::new();
        let s = create(&dir, EXTENT, meta_tuning(&fb));
        let a = mkfile(&s, ROOT_INO, "acked");
        let acked = pattern(50_000, 1);
        s.write(a, 0, &acked).unwrap();
        s.fsync(a, false).unwrap();
        // Buffered and committed non-durably: only the close would make these durable.
        let b = mkfile(&s, ROOT_INO, "unsynced");
        let unsynced = pattern(20_000, 2);
        s.write(b, 0, &unsynced).unwrap();
        s.write(a, 0, b"rewritten").unwrap();
        fb.arm(Fault {
            op,
            nth: 0,
            kind,
            sticky: false,
        });
        let e = s.close().err().unwrap_or_else(|| panic!("{what}: closed"));
        assert!(fb.fired() > 0, "{what}: {e}");
        assert_fault_error(&e, kind, &what);

        let s = open(&dir, tuning());
        let a = s.lookup(ROOT_INO, b"acked").unwrap();
        let got = read_all(&s, a.ino).unwrap();
        let mut rewritten = acked.clone();
        rewritten[..9].copy_from_slice(b"rewritten");
        assert!(
            got == acked || got == rewritten,
            "{what}: acked file changed"
        );
        match s.lookup(ROOT_INO, b"unsynced") {
            Ok(b) => {
                let got = read_all(&s, b.ino).unwrap();
                assert_eq!(got, unsynced, "{what}: unsynced file");
            }
            Err(Error::NotFound) => {}
            Err(e) => panic!("{what}: {e}"),
        }
        s.close().unwrap();
        assert_clean(&dir);
    }
}

/// A late growth of the metadata file fails inside a write transaction (redb extends the file
/// while allocating a page, not at commit): the operation returns EIO, but the store does not
/// latch read-only, because only `Inner::begin` and `Inner::commit` errors go through
/// `Inner::fail`. Ignored until transaction bodies latch too: it fails in some runs, not all,
/// since the background threads change which transaction meets the failing growth.
#[test]
fn failed_late_meta_file_growth_latches_read_only() {
    let grows = workload_calls(&growing(), FaultOp::SetLen);
    for kind in [FaultKind::Eio, FaultKind::NoSpace] {
        run_with_fault(
            Fault {
                op: FaultOp::SetLen,
                nth: grows - 1,
                kind,
                sticky: false,
            },
            &growing(),
        );
    }
}

/// A store with a few files, closed, then reopened with `fb` as its metadata fault backend: the
/// redb page cache is cold, so the next transactions read their pages from the file.
fn reopened_cold(dir: &std::path::Path, fb: &FaultBackend) -> Store {
    let s = create(dir, EXTENT, tuning());
    for i in 0..500u64 {
        let name = format!("f{i}");
        let a = s
            .mknod(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, 0, 0, 0)
            .unwrap();
        s.write(a.ino, 0, &content(i, 3000 + i as usize)).unwrap();
    }
    s.close().unwrap();
    // A small page cache: a debug build's redb walks the whole file at open, which would
    // otherwise leave every page cached.
    open(
        dir,
        Tuning {
            meta_cache: Some(64 << 10),
            ..meta_tuning(fb)
        },
    )
}

fn content(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (seed as usize * 31 + j * 7 % 251) as u8)
        .collect()
}

/// A store from [`reopened_cold`] with every read of `meta.redb` failing from now on
/// (`sticky`) or only the next one.
fn cold_with_read_fault(
    sticky: bool,
) -> (tempfile::TempDir, std::path::PathBuf, FaultBackend, Store) {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    let fb = FaultBackend::new();
    let s = reopened_cold(&dir, &fb);
    fb.arm(Fault {
        op: FaultOp::Read,
        nth: 0,
        kind: FaultKind::Eio,
        sticky,
    });
    (t, dir, fb, s)
}

/// Reopens without faults: every file of [`reopened_cold`] reads back, fsck is clean after.
fn reopen_and_check(dir: &std::path::Path) -> Store {
    let s = open(dir, tuning());
    for i in 0..500u64 {
        let a = s.lookup(ROOT_INO, format!("f{i}").as_bytes()).unwrap();
        let got = read_all(&s, a.ino).unwrap();
        assert_eq!(got, content(i, 3000 + i as usize), "f{i}");
    }
    s
}

/// A read of `meta.redb` failing inside a write transaction's body (not at begin or commit)
/// fails that operation and latches the store read-only at once, like btrfs aborting a
/// transaction; after a reopen everything is there.
#[test]
fn meta_read_error_inside_a_write_transaction_latches_read_only() {
    let (_t, dir, fb, s) = cold_with_read_fault(true);
    let e = s
        .mknod(ROOT_INO, b"new", FileKind::File, 0o644, 0, 0, 0)
        .unwrap_err();
    assert!(fb.fired() > 0, "failed without the fault: {e}");
    assert_eq!(e.errno(), libc::EIO, "{e}");
    fb.disarm();
    assert!(s.stats().read_only, "not read-only after {e}");
    assert!(matches!(
        s.mkdir(ROOT_INO, b"d", 0o755, 0, 0),
        Err(Error::ReadOnly(_))
    ));
    assert!(matches!(s.sync(), Err(Error::ReadOnly(_))));
    drop(s);
    let s = reopen_and_check(&dir);
    assert!(matches!(s.lookup(ROOT_INO, b"new"), Err(Error::NotFound)));
    s.close().unwrap();
    assert_clean(&dir);
}

/// A read of `meta.redb` failing in an operation that changes nothing (a lookup) fails it with
/// EIO. redb refuses its file after any I/O error until it is reopened, so the next change fails
/// with EIO too and latches the store read-only; nothing panics, and after a reopen everything
/// is there and the store takes writes.
#[test]
fn meta_read_error_in_a_lookup_fails_with_eio_and_a_reopen_recovers() {
    let (_t, dir, fb, s) = cold_with_read_fault(false);
    let e = s.lookup(ROOT_INO, b"f7").unwrap_err();
    assert!(fb.fired() > 0, "failed without the fault: {e}");
    assert_eq!(e.errno(), libc::EIO, "{e}");
    let e = s
        .mknod(ROOT_INO, b"new", FileKind::File, 0o644, 0, 0, 0)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    assert!(s.stats().read_only, "not read-only after {e}");
    assert!(matches!(s.sync(), Err(Error::ReadOnly(_))));
    drop(s);
    let s = reopen_and_check(&dir);
    let n = s
        .mknod(ROOT_INO, b"new", FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    s.write(n.ino, 0, b"writable again").unwrap();
    s.fsync(n.ino, false).unwrap();
    s.close().unwrap();
    assert_clean(&dir);
}
