//! `compfs bench recompress --mount N`: `compfs defrag -r -c TO` through a FUSE mount against
//! the same command on the unmounted store, alternating, each run on a fresh copy of one store
//! written at FROM. Both sides go through [`defrag_run`] (the code of `compfs defrag`): on the
//! mount one `compfs.defrag` request per file, then an fsync of the mount's root (the store's
//! sync); unmounted, [`compfs_store::Store::defrag`] per file, then the store's sync and close.

use std::path::Path;
use std::time::Instant;

use compfs_codec::CodecSpec;
use compfs_fs::defrag_run;
use compfs_store::{DefragReport, DefragTarget};
use serde::Serialize;

use crate::background::median;
use crate::error::{failed, Context, Result};
use crate::mounts::{run_tool, CompfsMount};

/// One side's runs.
#[derive(Serialize, Debug, Default, Clone)]
pub struct Side {
    /// Wall seconds of each run: defrag of every file and the sync.
    pub secs: Vec<f64>,
    /// CPU seconds of the process doing the work (the mount's daemon, or this one).
    pub cpu_secs: Vec<f64>,
    pub median_secs: f64,
    pub median_mb_s: f64,
    /// median MB/s / (1-thread TO compression MB/s × threads).
    pub vs_cores: f64,
}

#[derive(Serialize, Debug, Default, Clone)]
pub struct MountReport {
    pub runs: usize,
    pub bytes_examined: u64,
    pub mounted: Side,
    pub unmounted: Side,
    /// Median mounted MB/s over median unmounted MB/s.
    pub mounted_vs_unmounted: f64,
}

/// Copies a store directory (segments and metadata: plain files and directories).
fn copy_store(from: &Path, to: &Path) -> Result<()> {
    let _ = std::fs::remove_dir_all(to);
    run_tool(std::process::Command::new("cp").arg("-a").arg(from).arg(to))
}

/// `compfs defrag -r` of `path` (a mount or a store directory): figures, failures.
fn defrag_path(path: &Path, target: &DefragTarget) -> Result<DefragReport> {
    let plan = defrag_run::plan(&[path.to_path_buf()], true).context("compfs defrag")?;
    let mut failures = Vec::new();
    let r = defrag_run::run(plan, target, &|_| {}, &mut |e| failures.push(e.to_string()));
    match failures.first() {
        Some(f) => Err(failed!("defrag of {}: {f}", path.display())),
        None => Ok(r),
    }
}

/// Runs `runs` alternating pairs (mounted first) on copies of the store `tpl`, written at
/// `from`; `single` is the 1-thread compression speed of the target, MB/s.
pub fn measure(
    base: &Path,
    tpl: &Path,
    from: CodecSpec,
    target: &DefragTarget,
    threads: usize,
    single: f64,
    runs: usize,
) -> Result<MountReport> {
    let mut rep = MountReport {
        runs,
        ..MountReport::default()
    };
    let (work, mnt) = (base.join("mount-run"), base.join("mnt"));
    std::fs::create_dir_all(&mnt)?;
    for _ in 0..runs {
        copy_store(tpl, &work)?;
        let m = CompfsMount::new(
            &work,
            &mnt,
            &format!("compress-force={from},threads={threads}"),
        )?;
        let pid = m.pid().ok_or_else(|| failed!("the daemon is gone"))?;
        let c0 = crate::bonnie::cpu_secs(pid).unwrap_or(0.0);
        let t = Instant::now();
        let r = defrag_path(&mnt, target)?;
        std::fs::File::open(&mnt)?.sync_all()?;
        rep.mounted.secs.push(t.elapsed().as_secs_f64());
        rep.mounted
            .cpu_secs
            .push(crate::bonnie::cpu_secs(pid).unwrap_or(0.0) - c0);
        m.unmount()?;
        rep.bytes_examined = r.bytes_examined;

        copy_store(tpl, &work)?;
        let (c0, t) = (crate::store::cpu_time(), Instant::now());
        let r = defrag_path(&work, target)?;
        rep.unmounted.secs.push(t.elapsed().as_secs_f64());
        rep.unmounted
            .cpu_secs
            .push((crate::store::cpu_time() - c0).as_secs_f64());
        if r.bytes_examined != rep.bytes_examined {
            return Err(failed!(
                "mounted and unmounted defrag examined {} and {} bytes",
                rep.bytes_examined,
                r.bytes_examined
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    let mb = rep.bytes_examined as f64 / 1e6;
    for s in [&mut rep.mounted, &mut rep.unmounted] {
        s.median_secs = median(&s.secs);
        s.median_mb_s = mb / s.median_secs.max(1e-9);
        s.vs_cores = s.median_mb_s / (single * threads as f64).max(1e-9);
    }
    rep.mounted_vs_unmounted = rep.mounted.median_mb_s / rep.unmounted.median_mb_s.max(1e-9);
    Ok(rep)
}

/// Prints the comparison.
pub fn print(r: &MountReport, to: CodecSpec) {
    let line = |name: &str, s: &Side| {
        let lo = s.secs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = s.secs.iter().copied().fold(0.0, f64::max);
        println!(
            "  {name:9} median {:.2} s ({lo:.2}..{hi:.2}), {:.1} MB/s, {:.2}x {to} x cores; cpu {:?} s",
            s.median_secs,
            s.median_mb_s,
            s.vs_cores,
            s.cpu_secs
                .iter()
                .map(|c| (c * 100.0).round() / 100.0)
                .collect::<Vec<_>>()
        );
    };
    println!(
        "defrag -r -c {to} through a mount against the unmounted store ({} runs each, alternating):",
        r.runs
    );
    line("mounted", &r.mounted);
    line("unmounted", &r.unmounted);
    println!(
        "  mounted / unmounted: {:.2}x (medians)",
        r.mounted_vs_unmounted
    );
}
