//! Crash test: a child process (this test binary re-executed in child mode) applies random
//! operations (writes, truncation, hole punching, recompression with `defrag`) with fsync/sync
//! to a store and is killed with SIGKILL at a random moment; the parent reopens the store and
//! checks that every file is in its last durable state or a state an operation after it
//! produced, that nothing else appeared, and that fsck is clean.
//!
//! Default: 200 kill points. `COMPFS_CRASH_ITERS=5000` for a long run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use compfs_store::*;
use compfs_testdata::Rng;

const CHILD_ENV: &str = "COMPFS_CRASH_CHILD";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Gone,
    Content(u64, u64),
}

fn hash(d: &[u8]) -> u64 {
    let mut h = 0xcbf29ce484222325u64;
    for &b in d {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

fn state_of(d: &[u8]) -> State {
    State::Content(d.len() as u64, hash(d))
}

fn fmt(name: &str, s: State) -> String {
    match s {
        State::Gone => format!("{name} gone"),
        State::Content(l, h) => format!("{name} {l} {h}"),
    }
}

fn child_tuning() -> Tuning {
    Tuning {
        segment_size: 1 << 20,
        flush_interval: Some(Duration::from_millis(15)),
        flush_blocks: 4,
        ..Tuning::default()
    }
}

/// The child: runs until killed (or 3000 operations). Log lines: `P name state` before an
/// operation that may produce the state, `D name state` once the state is durable.
fn child(dir: &Path, log: &Path, seed: u64) {
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut say = |line: String| {
        log.write_all(format!("{line}\n").as_bytes()).unwrap();
    };
    let s = Store::open_tuned(
        dir,
        &OpenOptions {
            threads: 2,
            ..OpenOptions::default()
        },
        child_tuning(),
    )
    .unwrap();
    let mut files: BTreeMap<String, (Ino, Vec<u8>)> = BTreeMap::new();
    for e in s.readdir(ROOT_INO, 0, 10_000).unwrap().into_iter().skip(2) {
        let name = String::from_utf8(e.name).unwrap();
        let data = read_all(&s, e.ino).unwrap();
        say(format!("D {}", fmt(&name, state_of(&data))));
        files.insert(name, (e.ino, data));
    }
    let mut rng = Rng::new(seed.wrapping_mul(0x9e3779b97f4a7c15));
    let fixed: Vec<String> = (0..3).map(|i| format!("f{i}")).collect();
    let mut next_t = rng.below(1 << 30);
    for _ in 0..3000 {
        let name = if rng.below(4) == 0 && files.keys().any(|k| k.starts_with('t')) {
            let ts: Vec<&String> = files.keys().filter(|k| k.starts_with('t')).collect();
            ts[rng.below(ts.len())].clone()
        } else {
            fixed[rng.below(3)].clone()
        };
        match rng.below(13) {
            0..=4 => {
                let (ino, data) = files.get_mut(&name).unwrap();
                let off = rng.below(200_000);
                let len = 1 + rng.below(70_000);
                let buf = match rng.below(3) {
                    0 => random(len, rng.next_u64()),
                    1 => vec![0; len],
                    _ => pattern(len, rng.next_u64()),
                };
                if data.len() < off + len {
                    data.resize(off + len, 0);
                }
                data[off..off + len].copy_from_slice(&buf);
                say(format!("P {}", fmt(&name, state_of(data))));
                s.write(*ino, off as u64, &buf).unwrap();
            }
            5 => {
                let (ino, data) = files.get_mut(&name).unwrap();
                let size = rng.below(250_000);
                data.resize(size, 0);
                say(format!("P {}", fmt(&name, state_of(data))));
                s.setattr(
                    *ino,
                    &SetAttr {
                        size: Some(size as u64),
                        ..Default::default()
                    },
                )
                .unwrap();
            }
            6 => {
                let (ino, data) = files.get_mut(&name).unwrap();
                let off = rng.below(200_000);
                let len = rng.below(100_000);
                let end = (off + len).min(data.len());
                if off < end {
                    data[off..end].fill(0);
                }
                say(format!("P {}", fmt(&name, state_of(data))));
                s.punch_hole(*ino, off as u64, len as u64).unwrap();
            }
            7 | 8 => {
                let (ino, data) = &files[&name];
                s.fsync(*ino, false).unwrap();
                say(format!("D {}", fmt(&name, state_of(data))));
            }
            9 => {
                s.sync().unwrap();
                for (n, (_, d)) in &files {
                    say(format!("D {}", fmt(n, state_of(d))));
                }
            }
            10 => {
                next_t += 1;
                let n = format!("t{next_t}");
                let data = pattern(rng.below(5000), rng.next_u64());
                say(format!("P {}", fmt(&n, State::Content(0, hash(&[])))));
                say(format!("P {}", fmt(&n, state_of(&data))));
                let a = s
                    .mknod(ROOT_INO, n.as_bytes(), FileKind::File, 0o644, 0, 0, 0)
                    .unwrap();
                s.write(a.ino, 0, &data).unwrap();
                s.fsync(a.ino, false).unwrap();
                say(format!("D {}", fmt(&n, state_of(&data))));
                files.insert(n, (a.ino, data));
            }
            12 => {
                // Recompression changes no content: a kill in the middle of it must leave the
                // file in a state it already had (no log line needed).
                let (ino, _) = &files[&name];
                let specs = ["zstd:1", "zstd:9", "lz4", "none", "zlib:3"];
                let t = DefragTarget {
                    spec: Some(CodecSpec::parse(specs[rng.below(5)]).unwrap().spec),
                    level: None,
                    force: rng.below(2) == 0,
                    extent_size: None,
                };
                s.defrag(*ino, &t, &mut |_| {}).unwrap();
            }
            _ => {
                if name.starts_with('t') {
                    say(format!("P {}", fmt(&name, State::Gone)));
                    s.unlink(ROOT_INO, name.as_bytes()).unwrap();
                    files.remove(&name);
                    if rng.below(2) == 0 {
                        s.sync().unwrap();
                        say(format!("D {}", fmt(&name, State::Gone)));
                    }
                }
            }
        }
    }
    s.close().unwrap();
}

#[test]
#[ignore = "child process of crash_kill_points; run by the parent"]
fn crash_child() {
    let Ok(v) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut it = v.splitn(3, ';');
    let dir = it.next().unwrap().to_string();
    let log = it.next().unwrap().to_string();
    let seed: u64 = it.next().unwrap().parse().unwrap();
    child(Path::new(&dir), Path::new(&log), seed);
}

fn parse_state(f: &[&str]) -> State {
    if f[0] == "gone" {
        State::Gone
    } else {
        State::Content(f[0].parse().unwrap(), f[1].parse().unwrap())
    }
}

/// Checks the reopened store against the child's log.
fn verify(
    dir: &Path,
    log: &str,
    iter: u64,
    before: &BTreeMap<String, State>,
) -> BTreeMap<String, State> {
    // name -> allowed states (the last durable one and every state possible after it)
    let mut allowed: BTreeMap<String, Vec<State>> =
        before.iter().map(|(k, v)| (k.clone(), vec![*v])).collect();
    for line in log.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() < 3 {
            continue; // a line torn by the kill
        }
        let st = parse_state(&f[2..]);
        match f[0] {
            "D" => {
                allowed.insert(f[1].to_string(), vec![st]);
            }
            "P" => allowed
                .entry(f[1].to_string())
                .or_insert_with(|| vec![State::Gone])
                .push(st),
            _ => {}
        }
    }
    let s = open(dir, tuning());
    let mut present = BTreeMap::new();
    for e in s.readdir(ROOT_INO, 0, 100_000).unwrap().into_iter().skip(2) {
        let name = String::from_utf8(e.name).unwrap();
        let data = read_all(&s, e.ino).unwrap_or_else(|err| panic!("iter {iter}: {name}: {err}"));
        let st = state_of(&data);
        let ok = allowed.get(&name).is_some_and(|v| v.contains(&st));
        assert!(
            ok,
            "iter {iter}: {name} is {st:?}, allowed {:?}",
            allowed.get(&name)
        );
        present.insert(name, st);
    }
    for (name, v) in &allowed {
        if !present.contains_key(name) {
            assert!(
                v.contains(&State::Gone),
                "iter {iter}: {name} vanished; allowed {v:?}"
            );
        }
    }
    s.close().unwrap();
    let r = fsck_report(dir, false);
    assert!(r.is_clean(), "iter {iter}: fsck: {:#?}", r.problems);
    present
}

#[test]
fn crash_kill_points() {
    let iters: u64 = std::env::var("COMPFS_CRASH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("s");
    {
        let s = create(&dir, 16384, tuning());
        for i in 0..3 {
            let ino = mkfile(&s, ROOT_INO, &format!("f{i}"));
            s.write(ino, 0, &pattern(40_000, i)).unwrap();
        }
        s.close().unwrap();
    }
    let mut known: BTreeMap<String, State> = (0..3)
        .map(|i| (format!("f{i}"), state_of(&pattern(40_000, i))))
        .collect();
    known = verify(&dir, "", 0, &known);
    let exe = std::env::current_exe().unwrap();
    let mut rng = Rng::new(0x5eed);
    let mut killed = 0;
    for it in 0..iters {
        let log = t.path().join(format!("log{it}"));
        let mut child = std::process::Command::new(&exe)
            .args([
                "--exact",
                "crash_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(
                CHILD_ENV,
                format!("{};{};{}", dir.display(), log.display(), it),
            )
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(5 + rng.below(120) as u64));
        if child.try_wait().unwrap().is_none() {
            killed += 1;
        }
        let _ = child.kill(); // SIGKILL
        child.wait().unwrap();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        known = verify(&dir, &text, it, &known);
        // GC now and then, so compaction after crashes is exercised too.
        if it % 25 == 24 {
            let s = open(&dir, tuning());
            s.gc().unwrap();
            s.close().unwrap();
            known = verify(&dir, "", it, &known);
        }
    }
    assert!(
        killed >= iters * 9 / 10,
        "only {killed} of {iters} children were still running when killed"
    );
}
