//! `compfs defrag` end to end: on a mount (through the compfs.defrag xattr, with permission
//! checks), on an unmounted store, and kill -9 of the daemon in the middle of a defrag.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod fs_common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use compfs_store::{Mode, OpenOptions, Store};
use fs_common::*;

/// A tree of compressible, incompressible, mixed and inline files.
fn tree() -> BTreeMap<&'static str, Vec<u8>> {
    let mut mixed = random_bytes(100 << 10, 3);
    mixed.extend(text_bytes(300 << 10, 4));
    BTreeMap::from([
        ("a/text", text_bytes(600 << 10, 1)),
        ("a/b/random", random_bytes(300 << 10, 2)),
        ("a/b/mixed", mixed),
        ("small", b"a small inline file".to_vec()),
    ])
}

fn write_tree(root: &Path, t: &BTreeMap<&str, Vec<u8>>) {
    for (p, v) in t {
        let p = root.join(p);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, v).unwrap();
    }
}

fn check_tree(root: &Path, t: &BTreeMap<&str, Vec<u8>>) {
    for (p, v) in t {
        assert!(fs::read(root.join(p)).unwrap() == *v, "{p} differs");
    }
}

/// The integer field `key` of the --json output.
fn field(json: &str, key: &str) -> u64 {
    let k = format!("\"{key}\":");
    let at = json
        .find(&k)
        .unwrap_or_else(|| panic!("{key} missing in {json}"))
        + k.len();
    json[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Runs `compfs defrag ARGS --json FILE` and returns (success, json, stderr).
fn defrag(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let j = dir.join("out.json");
    let _ = fs::remove_file(&j);
    let mut a = vec!["defrag", "--json", j.to_str().unwrap()];
    a.extend_from_slice(args);
    let (ok, out, err) = compfs(&a);
    assert!(out.contains("extents rewritten"), "{out}{err}");
    (ok, fs::read_to_string(&j).unwrap_or_default(), err)
}

/// The `compfs usage -b` row names.
fn usage_rows(p: &Path) -> Vec<String> {
    let (ok, out, err) = compfs(&["usage", "-b", p.to_str().unwrap()]);
    assert!(ok, "{err}");
    out.lines()
        .skip(2)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

fn as_nobody(args: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn defrag_on_a_mount_skips_what_is_done_and_checks_permission() {
    require_fuse!();
    let t = TempDir::new("defrag-mnt");
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let store = t.path().join("store");
    mkstore(&store, "zstd:3", Mode::Heuristic, 128 << 10);
    let m = Mount::new(&store, &t.path().join("mnt"), "compress=zstd:1,allow_other");
    let files = tree();
    write_tree(&m.mnt, &files);
    assert!(usage_rows(&m.mnt).contains(&"zstd:1".to_string()));

    let mnt = m.mnt.to_str().unwrap();
    let (ok, j, err) = defrag(t.path(), &["-r", "-c", "zstd:9", mnt]);
    assert!(ok, "{err}");
    assert_eq!(field(&j, "files"), 4, "{j}");
    assert!(field(&j, "extents_rewritten") > 0, "{j}");
    assert!(
        field(&j, "extents_skipped") > 0,
        "raw random extents stay: {j}"
    );
    assert!(
        field(&j, "disk_bytes_after") < field(&j, "disk_bytes_before"),
        "{j}"
    );
    check_tree(&m.mnt, &files);
    let rows = usage_rows(&m.mnt);
    assert!(rows.contains(&"zstd:9".to_string()), "{rows:?}");
    assert!(!rows.contains(&"zstd:1".to_string()), "{rows:?}");

    // The second identical run rewrites nothing; -c zstd -L 9 is the same target.
    for args in [["-r", "-c", "zstd:9"], ["-r", "-czstd", "-L9"]] {
        let mut a = args.to_vec();
        a.push(mnt);
        let (ok, j, err) = defrag(t.path(), &a);
        assert!(ok, "{err}");
        assert_eq!(field(&j, "extents_rewritten"), 0, "{args:?}: {j}");
        assert_eq!(field(&j, "bytes_rewritten"), 0, "{j}");
    }
    // A directory without -r is skipped, as in btrfs-progs.
    let (ok, j, err) = defrag(t.path(), &["-c", "lz4", m.path("a").to_str().unwrap()]);
    assert!(ok && err.contains("use -r"), "{err}");
    assert_eq!(field(&j, "files"), 0);

    // Permission: nobody may not defrag root's 0644 file, may defrag a 0666 one.
    let text = m.path("a/text");
    let o = as_nobody(&[BIN, "defrag", "-c", "lz4", text.to_str().unwrap()]);
    assert!(!o.status.success(), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("permission denied"),
        "{o:?}"
    );
    fs::set_permissions(m.path("a/b/mixed"), fs::Permissions::from_mode(0o666)).unwrap();
    let o = as_nobody(&[
        BIN,
        "defrag",
        "-c",
        "lz4",
        m.path("a/b/mixed").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{o:?}");
    assert!(usage_rows(&m.path("a/b/mixed")).contains(&"lz4".to_string()));
    assert!(!usage_rows(&text).contains(&"lz4".to_string()));

    // The raw channel: a malformed request is EINVAL, an answer never asked for ENODATA,
    // and the name cannot be removed.
    assert_eq!(
        setxattr(&text, "compfs.defrag", b"codec=zip", 0),
        Err(libc::EINVAL)
    );
    assert_eq!(
        getxattr(&m.path("small"), "compfs.defrag"),
        Err(libc::ENODATA)
    );
    assert_eq!(setxattr(&m.mnt, "compfs.defrag", b"", 0), Err(libc::EISDIR));
    // --nocomp stores everything raw.
    let (ok, _, err) = defrag(t.path(), &["-r", "--nocomp", mnt]);
    assert!(ok, "{err}");
    // (The small file is inline: its bytes also have their own `inline` row.)
    assert_eq!(usage_rows(&m.mnt), vec!["TOTAL", "none", "inline"]);
    check_tree(&m.mnt, &files);
    drop(m);
    let r = compfs_store::fsck(&store, false, &mut |_, _| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
}

#[test]
fn defrag_on_an_unmounted_store() {
    require_fuse!();
    let t = TempDir::new("defrag-store");
    let store = t.path().join("store");
    mkstore(&store, "zstd:1", Mode::Heuristic, 128 << 10);
    let files = tree();
    {
        let m = Mount::new(&store, &t.path().join("mnt"), "");
        write_tree(&m.mnt, &files);
        // A mounted store is refused.
        let (ok, _, err) = compfs(&["defrag", "-r", store.to_str().unwrap()]);
        assert!(!ok && err.contains("is mounted"), "{err}");
    }
    let s = store.to_str().unwrap();
    // A path inside the store directory names a file of the store.
    let one = format!("{s}/a/b/mixed");
    let (ok, j, err) = defrag(t.path(), &["-c", "lz4", &one]);
    assert!(ok, "{err}");
    assert_eq!(field(&j, "files"), 1, "{j}");
    assert!(usage_rows(&store).contains(&"lz4".to_string()));
    let (ok, j, err) = defrag(t.path(), &["-r", "-c", "zstd:9", s]);
    assert!(ok, "{err}");
    assert_eq!(field(&j, "files"), 4, "{j}");
    assert!(field(&j, "extents_rewritten") > 0, "{j}");
    let (ok, j, _) = defrag(t.path(), &["-r", "-c", "zstd:9", s]);
    assert!(ok);
    assert_eq!(field(&j, "extents_rewritten"), 0, "{j}");
    let rows = usage_rows(&store);
    assert!(rows.contains(&"zstd:9".to_string()), "{rows:?}");
    assert!(
        !rows.iter().any(|r| r == "zstd:1" || r == "lz4"),
        "{rows:?}"
    );
    let (ok, _, err) = compfs(&["defrag", &format!("{s}/no/such")]);
    assert!(!ok && err.contains("no such file"), "{err}");
    let m = Mount::new(&store, &t.path().join("mnt"), "");
    check_tree(&m.mnt, &files);
}

#[test]
fn kill9_during_defrag_keeps_every_file_and_gc_reclaims() {
    require_fuse!();
    let t = TempDir::new("defrag-crash");
    let store = t.path().join("store");
    let mnt = t.path().join("mnt");
    mkstore(&store, "zstd:1", Mode::Heuristic, 128 << 10);
    let files: Vec<(PathBuf, Vec<u8>)> = (0..48)
        .map(|i| {
            let mut v = text_bytes(640 << 10, i + 10);
            v.extend(random_bytes(64 << 10, i + 100));
            (PathBuf::from(format!("d{}/f{i}", i % 4)), v)
        })
        .collect();
    {
        let m = Mount::new(&store, &mnt, "");
        for (p, v) in &files {
            fs::create_dir_all(m.mnt.join(p).parent().unwrap()).unwrap();
            fs::write(m.mnt.join(p), v).unwrap();
        }
    }
    let check = |root: &Path| {
        for (p, v) in &files {
            assert!(
                fs::read(root.join(p)).unwrap() == *v,
                "{} differs",
                p.display()
            );
        }
    };
    let m = Mount::new(&store, &mnt, "");
    let before = written(&m.mnt);
    let mut child = Command::new(BIN)
        .args(["defrag", "-r", "-c", "zstd:9", m.mnt.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill the daemon once the defrag has written its first extents.
    let deadline = Instant::now() + Duration::from_secs(60);
    while written(&m.mnt) == before {
        assert!(Instant::now() < deadline, "defrag wrote nothing");
        std::thread::sleep(Duration::from_millis(5));
    }
    let running = child.try_wait().unwrap().is_none();
    m.kill9();
    let st = child.wait().unwrap();
    assert!(running && !st.success(), "the defrag was not cut short");

    let r = compfs_store::fsck(&store, false, &mut |_, _| {}).unwrap();
    assert!(r.is_clean(), "fsck after kill -9: {:?}", r.problems);
    {
        let m = Mount::new(&store, &mnt, "");
        check(&m.mnt);
        // Finish the job; every file is still identical.
        let (ok, _, err) = compfs(&["defrag", "-r", "-c", "zstd:9", m.mnt.to_str().unwrap()]);
        assert!(ok, "{err}");
        check(&m.mnt);
    }
    // GC reclaims the old extents (and whatever the killed run left behind).
    let (ok, _, err) = compfs(&["gc", store.to_str().unwrap()]);
    assert!(ok, "{err}");
    let s = Store::open(&store, &OpenOptions::default()).unwrap();
    let st = s.stats();
    assert!(
        st.segment_bytes - st.live_bytes < st.segment_bytes / 10,
        "garbage left after gc: {st:?}"
    );
    let u = s.usage(&[compfs_store::ROOT_INO]).unwrap();
    assert!(!u.per_level.contains_key("zstd:1"), "{:?}", u.per_level);
    s.close().unwrap();
    let m = Mount::new(&store, &mnt, "");
    check(&m.mnt);
}

/// Extents (distinct) of a file or tree on a mount, from its `compfs.usage` records.
fn extents_of(p: &Path) -> u64 {
    let rec = getxattr(p, "compfs.usage").unwrap();
    compfs_fs::UsageReport::from_record(&rec)
        .unwrap()
        .regular_extents
}

/// The `compfs.extent_size` property on a mount: set on a directory, inherited by the files
/// made in it, used by their writes, and by `compfs defrag` (with `--extent-size` overriding
/// it) to re-cut a file, after which the same run rewrites nothing.
#[test]
fn extent_size_property_on_a_mount() {
    require_fuse!();
    let t = TempDir::new("defrag-extsize");
    let store = t.path().join("store");
    mkstore(&store, "zstd:3", Mode::Heuristic, 128 << 10);
    let m = Mount::new(&store, &t.path().join("mnt"), "");
    let d = m.path("d");
    fs::create_dir(&d).unwrap();
    let ds = d.to_str().unwrap();
    let (ok, _, err) = compfs(&["property", "set", ds, "extent_size", "3K"]);
    assert!(!ok && err.contains("extent_size"), "{err}");
    assert_eq!(
        setxattr(&d, "compfs.extent_size", b"2M", 0),
        Err(libc::EINVAL)
    );
    let (ok, _, err) = compfs(&["property", "set", ds, "extent_size", "32768"]);
    assert!(ok, "{err}");
    let (_, out, _) = compfs(&["property", "get", ds, "extent_size"]);
    assert_eq!(out.trim(), "extent_size=32K");

    let data = text_bytes((1 << 20) + 1000, 21);
    let f = d.join("f");
    fs::write(&f, &data).unwrap();
    assert_eq!(getxattr(&f, "compfs.extent_size").unwrap(), b"32K");
    // 1 MiB + 1000 bytes in 32 KiB extents: 33 (at the store's 128 KiB it would be 9). The
    // kernel may hand the last block over in two writes, which lays a small extent over it.
    let n = extents_of(&f);
    assert!((33..=34).contains(&n), "{n} extents");
    assert!(fs::read(&f).unwrap() == data);

    // defrag cuts the file to its property's size, codec and level unchanged.
    let fs_ = f.to_str().unwrap();
    let (ok, _, err) = compfs(&["property", "set", fs_, "extent_size", "128K"]);
    assert!(ok, "{err}");
    let (ok, j, err) = defrag(t.path(), &[fs_]);
    assert!(ok, "{err}");
    // Every 32 KiB extent is rewritten but the last (1000 bytes, already whole at 128 KiB).
    assert_eq!(field(&j, "extents_rewritten"), 32, "{j}");
    assert_eq!(extents_of(&f), 9);
    let (ok, j, _) = defrag(t.path(), &[fs_]);
    assert!(ok);
    assert_eq!(field(&j, "extents_rewritten"), 0, "{j}");
    // --extent-size overrides it.
    let (ok, _, err) = defrag(t.path(), &["--extent-size", "64K", fs_]);
    assert!(ok, "{err}");
    assert_eq!(extents_of(&f), 17);
    let (ok, j, _) = defrag(t.path(), &["--extent-size", "65536", fs_]);
    assert!(ok);
    assert_eq!(field(&j, "extents_rewritten"), 0, "{j}");
    assert!(fs::read(&f).unwrap() == data);
    assert!(usage_rows(&f).contains(&"zstd:3".to_string()));
    let (ok, _, err) = compfs(&["defrag", "--extent-size", "5K", fs_]);
    assert!(!ok && err.contains("--extent-size"), "{err}");
    drop(m);
    let r = compfs_store::fsck(&store, false, &mut |_, _| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
}

/// Argument errors are one-line messages (no FUSE needed).
#[test]
fn defrag_argument_errors() {
    let (ok, _, err) = compfs(&["defrag", "--nocomp", "-c", "zstd", "/tmp"]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");
    let (ok, _, err) = compfs(&["defrag", "-c", "zip", "/tmp"]);
    assert!(!ok && err.contains("invalid -c 'zip'"), "{err}");
    let (ok, _, err) = compfs(&["defrag"]);
    assert!(!ok && err.contains("PATHS"), "{err}");
    let t = TempDir::new("defrag-args");
    let (ok, _, err) = compfs(&["defrag", "-r", t.path().to_str().unwrap()]);
    assert!(
        !ok && err.contains("not on a mounted compfs filesystem"),
        "{err}"
    );
    let (ok, _, err) = compfs(&["defrag", t.path().join("nothing/here").to_str().unwrap()]);
    assert!(!ok && err.contains("not a compfs store directory"), "{err}");
}

/// On a mount, progress within one big file comes from polling the daemon's running figures.
#[test]
fn progress_within_a_file_on_a_mount() {
    require_fuse!();
    let t = TempDir::new("defrag-progress");
    let store = t.path().join("store");
    mkstore(&store, "zstd:1", Mode::Force, 128 << 10);
    let m = Mount::new(&store, &t.path().join("mnt"), "");
    let data = text_bytes(48 << 20, 5);
    fs::write(m.path("big"), &data).unwrap();
    let (examined, seen) = defrag_to_zstd9_polling(&m.path("big"));
    assert_eq!(examined, data.len() as u64);
    assert!(
        seen.iter().any(|&b| b > 0 && b < examined),
        "no progress within the file: {seen:?}"
    );
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    assert!(fs::read(m.path("big")).unwrap() == data);
}

/// `compfs bench recompress --mount 1`: the defrag through a mount and on the unmounted store
/// examine every byte of the corpus, as the store API's defrag does, and both are timed.
#[test]
fn bench_recompress_compares_a_mount_with_the_unmounted_store() {
    require_fuse!();
    let t = TempDir::new("bench-recompress");
    let corpus = t.path().join("corpus");
    let tr = tree();
    write_tree(&corpus, &tr);
    let (work, json) = (t.path().join("work"), t.path().join("r.json"));
    fs::create_dir_all(&work).unwrap();
    let (ok, out, err) = compfs(&[
        "bench",
        "recompress",
        "--corpus",
        corpus.to_str().unwrap(),
        "--dir",
        work.to_str().unwrap(),
        "--mount",
        "1",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        ok,
        "bench recompress failed\nstdout:\n{out}\nstderr:\n{err}"
    );
    assert!(out.contains("mounted / unmounted:"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&fs::read_to_string(&json).unwrap()).unwrap();
    let total: u64 = tr.values().map(|v| v.len() as u64).sum();
    assert_eq!(v["first"]["bytes_examined"], total, "{v}");
    let m = &v["mount"];
    assert_eq!(m["runs"], 1, "{m}");
    assert_eq!(m["bytes_examined"], total, "{m}");
    for side in ["mounted", "unmounted"] {
        assert_eq!(m[side]["secs"].as_array().unwrap().len(), 1, "{m}");
        assert!(m[side]["median_secs"].as_f64().unwrap() > 0.0, "{m}");
    }
    assert!(m["mounted_vs_unmounted"].as_f64().unwrap() > 0.0, "{m}");
}
