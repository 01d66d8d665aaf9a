//! Usage report figures (hand-computed and against the store's own accounting), and forced vs
//! heuristic compression on compressible and random data.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod fs_common;

use std::fs;

use compfs_codec::{CodecSpec, ExtentEncoder, ExtentOutcome, ExtentPolicy, Mode as CMode};
use compfs_fs::UsageReport;
use compfs_store::Mode;
use fs_common::*;

/// One row of the report: type, disk, uncompressed, referenced.
type Row = (String, u64, u64, u64);

/// Parses `compfs usage -b` output back into figures: (files, extents, refs, inline, rows).
fn parse_report(out: &str) -> (Vec<u64>, Vec<Row>) {
    let mut lines = out.lines();
    let head = lines.next().unwrap();
    let nums: Vec<u64> = head
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    let mut rows = Vec::new();
    for l in lines.skip(1) {
        let f: Vec<&str> = l.split_whitespace().collect();
        rows.push((
            f[0].to_string(),
            f[2].parse().unwrap(),
            f[3].parse().unwrap(),
            f[4].parse().unwrap(),
        ));
    }
    (nums, rows)
}

fn usage_b(path: &std::path::Path) -> String {
    let (ok, out, err) = compfs(&["usage", "-b", path.to_str().unwrap()]);
    assert!(ok, "compfs usage failed: {err}");
    out
}

#[test]
fn usage_matches_hand_computed_figures_and_store_accounting() {
    require_fuse!();
    let t = TempDir::new("usage");
    let store = t.path().join("store");
    mkstore(&store, "zstd:3", Mode::Heuristic, 128 << 10);
    let m = Mount::new(&store, &t.path().join("mnt"), "compress-force=zstd:3");

    // Hand-computed case 1: 256 KiB of random data = two raw 128 KiB extents.
    fs::create_dir(m.path("rand")).unwrap();
    fs::write(m.path("rand/r.bin"), random_bytes(256 << 10, 11)).unwrap();
    fs::hard_link(m.path("rand/r.bin"), m.path("rand/r.link")).unwrap();
    let out = usage_b(&m.path("rand"));
    let expected = format!(
        "Processed 1 files, 2 regular extents (2 refs), 0 inline.\n\
Type       Perc     Disk Usage   Uncompressed Referenced  \n\
TOTAL      100%     {n:<12} {n:<12} {n:<12}\n\
none       100%     {n:<12} {n:<12} {n:<12}\n",
        n = 262144
    );
    assert_eq!(out, expected);

    // Hand-computed case 2: 512 KiB of text = four zstd:3 extents whose compressed sizes we
    // compute here with the codec layer, extent by extent.
    let text = text_bytes(512 << 10, 12);
    fs::create_dir(m.path("text")).unwrap();
    fs::write(m.path("text/t.txt"), &text).unwrap();
    let policy = ExtentPolicy::new(CodecSpec::parse("zstd:3").unwrap().spec, CMode::Force);
    let mut enc = ExtentEncoder::new();
    let mut disk = 0u64;
    for block in text.chunks(128 << 10) {
        let mut dst = Vec::new();
        match enc.encode(&policy, block, &mut dst).unwrap() {
            ExtentOutcome::Compressed { len } => disk += len as u64,
            ExtentOutcome::Raw(r) => panic!("text block stored raw: {r:?}"),
        }
    }
    let (nums, rows) = parse_report(&usage_b(&m.path("text")));
    assert_eq!(nums, [1, 4, 4, 0]);
    let n = 512u64 << 10;
    assert_eq!(
        rows,
        [
            ("TOTAL".into(), disk, n, n),
            ("zstd".into(), disk, n, n),
            // The breakdown by codec and level follows the codec rows.
            ("zstd:3".into(), disk, n, n)
        ]
    );

    // A small file is inline.
    fs::write(m.path("small"), b"tiny file").unwrap();
    let (nums, _) = parse_report(&usage_b(&m.path("small")));
    assert_eq!(nums, [1, 0, 0, 1]);

    // The whole mount, through the per-file xattrs, equals the store's own accounting of the
    // unmounted store.
    let via_mount = usage_b(&m.mnt);
    let (nums, _) = parse_report(&via_mount);
    assert_eq!(nums, [3, 6, 6, 1]);
    // Per-file records decode and add up to the same report.
    let mut sum = UsageReport::default();
    for p in ["rand/r.bin", "text/t.txt", "small"] {
        sum.merge(
            &UsageReport::from_record(&getxattr(&m.path(p), "compfs.usage").unwrap()).unwrap(),
        );
    }
    assert_eq!(sum.render(true), via_mount);
    assert!(m.unmount().success());
    let via_store = usage_b(&store);
    assert_eq!(via_store, via_mount);
    // Human units by default.
    let (ok, human, _) = compfs(&["usage", store.to_str().unwrap()]);
    assert!(ok);
    assert!(human.contains(" 256K "), "{human}");
}

#[test]
fn unprivileged_usage_reports_only_readable_files() {
    require_fuse!();
    let t = TempDir::new("usage-user");
    let store = t.path().join("store");
    mkstore(&store, "zstd:3", Mode::Heuristic, 128 << 10);
    let m = Mount::new(&store, &t.path().join("mnt"), "allow_other");
    fs::create_dir(m.path("pub")).unwrap();
    fs::write(m.path("pub/a"), text_bytes(200 << 10, 1)).unwrap();
    fs::write(m.path("secret"), text_bytes(200 << 10, 2)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(m.path("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    let bin_ok = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            BIN,
            "--version",
        ])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !bin_ok {
        eprintln!("SKIPPED: the compfs binary is not executable by user nobody here");
        return;
    }
    let run = |p: &std::path::Path| {
        std::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                BIN,
                "usage",
                "-b",
            ])
            .arg(p)
            .output()
            .unwrap()
    };
    let o = run(&m.path("pub"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), usage_b(&m.path("pub")));
    let o = run(&m.path("secret"));
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("permission denied"));
}

/// Disk and uncompressed bytes of one file's usage, per codec.
fn codecs_of(p: &std::path::Path) -> Vec<Row> {
    parse_report(&usage_b(p))
        .1
        .into_iter()
        // Codec rows only (the codec:level breakdown after them is checked on its own).
        .filter(|r| r.0 != "TOTAL" && !r.0.contains(':'))
        .collect()
}

#[test]
fn force_and_heuristic_on_compressible_and_random_data() {
    require_fuse!();
    let text = text_bytes(1 << 20, 21);
    let random = random_bytes(1 << 20, 22);
    let mut ratios = Vec::new();
    for opts in ["compress=zstd:3", "compress-force=zstd:3"] {
        let t = TempDir::new("modes");
        let store = t.path().join("store");
        mkstore(&store, "none", Mode::Heuristic, 128 << 10);
        let m = Mount::new(&store, &t.path().join("mnt"), opts);
        fs::write(m.path("text"), &text).unwrap();
        fs::write(m.path("random"), &random).unwrap();
        // Random data is stored raw in both modes.
        let r = codecs_of(&m.path("random"));
        assert_eq!(
            r,
            [("none".to_string(), 1 << 20, 1 << 20, 1 << 20)],
            "{opts}"
        );
        // Text is compressed in both modes.
        let tx = codecs_of(&m.path("text"));
        assert_eq!(tx.len(), 1, "{opts}: {tx:?}");
        assert_eq!(tx[0].0, "zstd");
        ratios.push(tx[0].2 as f64 / tx[0].1 as f64);
        // stats count what happened
        let (_, stats, _) = compfs(&["stats", m.mnt.to_str().unwrap()]);
        assert!(stats.contains("zstd=8"), "{opts}: {stats}");
        if opts.starts_with("compress=") {
            assert!(!stats.contains("heuristic skips        0\n"), "{stats}");
        }
    }
    // On compressible data the heuristic compresses as well as forcing.
    assert!(ratios[0] >= 0.97 * ratios[1], "{ratios:?}");
    // compress=no stores everything raw
    let t = TempDir::new("modes-no");
    let store = t.path().join("store");
    mkstore(&store, "zstd:3", Mode::Heuristic, 128 << 10);
    let m = Mount::new(&store, &t.path().join("mnt"), "compress=no");
    fs::write(m.path("text"), &text).unwrap();
    assert_eq!(codecs_of(&m.path("text"))[0].0, "none");
}
