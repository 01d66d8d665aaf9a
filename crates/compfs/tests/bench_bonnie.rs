//! `compfs bench bonnie --quick`: one short Bonnie++ run on compfs and, as root, on ext4, xfs
//! and kernel btrfs; checks the JSON rows (every column, the ratio, the daemon's CPU) and the
//! graphs. Needs root and FUSE (CI has both); as root a missing bonnie++ fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod fs_common;

use std::process::Command;

use fs_common::*;

#[test]
fn quick_bonnie_run_reports_every_file_system() {
    require_fuse!();
    assert!(
        Command::new("bonnie++").arg("-h").output().is_ok(),
        "bonnie++ missing (scripts/deps.sh installs it)"
    );
    let t = TempDir::new("bonnie");
    let json = t.path().join("bonnie.json");
    let plots = t.path().join("plots");
    let work = t.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let (ok, out, err) = compfs(&[
        "bench",
        "bonnie",
        "--quick",
        "--methods",
        "zstd:3",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        plots.to_str().unwrap(),
        "--workdir",
        work.to_str().unwrap(),
    ]);
    assert!(ok, "bench bonnie failed\nstdout:\n{out}\nstderr:\n{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let names: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{} {}",
                r["fs"].as_str().unwrap(),
                r["method"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        names,
        ["ext4 none", "xfs none", "compfs zstd:3", "btrfs zstd:3"],
        "{out}"
    );
    for r in rows {
        let what = format!("{} {}", r["fs"], r["method"]);
        assert_eq!(r["runs"], 1, "{what}: {}", r["note"]);
        let cols = r["columns"].as_array().unwrap();
        assert_eq!(cols.len(), 12, "{what}");
        // The per-char tests write and read 2 MiB with a system call per byte: over 500 ms
        // (Bonnie++'s "+++++" threshold) on any machine, so at least one of them has a figure.
        let figure = |key: &str| {
            cols.iter()
                .find(|c| c["column"] == key)
                .and_then(|c| c["value"]["mean"].as_f64())
        };
        assert!(
            figure("putc").or(figure("getc")).is_some_and(|v| v > 0.0),
            "{what}: {cols:?}"
        );
        for c in cols {
            if c["value"]["mean"].as_f64().is_some() {
                assert!(c["cpu"]["mean"].as_f64().is_some(), "{what}: {c}");
            }
        }
        let ratio = r["ratio"].as_f64().unwrap();
        let daemon: Vec<f64> = cols
            .iter()
            .filter_map(|c| c["daemon_cpu"]["mean"].as_f64())
            .collect();
        if r["fs"] == "ext4" || r["fs"] == "xfs" {
            assert!((0.9..1.1).contains(&ratio), "{what}: ratio {ratio}");
            assert!(daemon.is_empty(), "{what}");
        } else {
            // Bonnie++ writes highly compressible data.
            assert!(ratio > 4.0, "{what}: ratio {ratio}");
        }
        if r["fs"] == "compfs" {
            // A daemon figure for every test (zero allowed), and the daemon works somewhere.
            assert_eq!(daemon.len(), 12, "{what}");
            assert!(daemon.iter().any(|d| *d > 0.0), "{what}: {daemon:?}");
        }
    }
    for f in ["method-none", "method-zstd3"] {
        for kind in ["throughput", "cpu"] {
            let p = plots.join(format!("{f}-{kind}.svg"));
            let svg = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
            assert!(svg.contains("<svg") && svg.contains("Bonnie++"), "{p:?}");
        }
    }
    assert!(out.contains("compfs  zstd:3"), "{out}");
}
