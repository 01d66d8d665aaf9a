//! `compfs bench creates`: empty-file creates, stats and unlinks per second on compfs, on the
//! null FUSE filesystem ([`compfs_fs::nullfs`], the floor of any FUSE daemon here) and on
//! kernel btrfs, alternating within each round of one run (issue 17).
//!
//! The workload is Bonnie++'s create phase without Bonnie++: in one directory, `openat(O_CREAT
//! | O_EXCL | O_WRONLY)` and `close` of N empty files, then `fstatat` of each, then `unlinkat`
//! of each, names relative to the directory's descriptor. Over FUSE each create is a LOOKUP
//! (the name is new), a CREATE and an asynchronous RELEASE, plus a GETATTR of the directory:
//! the previous create invalidated its attributes and `default_permissions` needs them for the
//! search permission. The null filesystem pays exactly those requests and nothing else, so
//! compfs / null is the share of FUSE's floor compfs reaches, and null / btrfs the most any
//! FUSE daemon can reach against the kernel filesystem.

use std::path::{Path, PathBuf};
use std::time::Instant;

use rustix::fs::{AtFlags, Mode, OFlags};
use serde::Serialize;

use crate::background::median;
use crate::error::{bail, Context, Result};
use crate::mounts::{is_root, mkfs_btrfs, CompfsMount, KernelMount};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Files per filesystem and round.
    #[arg(long, default_value_t = 20_000)]
    pub files: u32,
    /// Rounds; the filesystems alternate within each round (report: median, min–max).
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Filesystems, in the order they run each round: compfs, null (the FUSE floor), btrfs.
    #[arg(long, value_delimiter = ',', default_value = "compfs,null,btrfs")]
    pub fs: Vec<String>,
    /// FUSE transport of compfs and null: `ring` (FUSE over io_uring; as root, sets the
    /// kernel's enable_uring as `compfs mount -o uring` does) or `dev` (/dev/fuse).
    #[arg(long, default_value = "ring")]
    pub transport: String,
    /// Compression of compfs (mount option) and btrfs (`compress=`).
    #[arg(long, default_value = "zstd:3")]
    pub method: String,
    /// Write the rows as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Where the stores, images and mount points go (default /var/tmp).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
}

/// One filesystem's figures in one round.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub fs: String,
    pub round: u32,
    pub files: u32,
    pub creates_per_s: f64,
    pub stats_per_s: f64,
    pub unlinks_per_s: f64,
}

/// What `run` measured, as written to `--json`.
#[derive(Debug, Serialize)]
pub struct Report {
    pub transport: String,
    pub method: String,
    pub rows: Vec<Row>,
}

const KNOWN: [&str; 3] = ["compfs", "null", "btrfs"];

/// The three phases on `n` files in a new directory under `mnt`.
fn phases(mnt: &Path, n: u32) -> Result<(f64, f64, f64)> {
    let dir = mnt.join("creates");
    std::fs::create_dir(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
    let d = rustix::fs::open(&dir, OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty())
        .with_context(|| format!("open {}", dir.display()))?;
    let names: Vec<String> = (0..n).map(|i| format!("f{i:08}")).collect();
    let rate = |secs: f64| n as f64 / secs.max(1e-9);

    let t = Instant::now();
    for name in &names {
        let fd = rustix::fs::openat(
            &d,
            name.as_str(),
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .with_context(|| format!("create {}/{name}", dir.display()))?;
        drop(fd);
    }
    let creates = rate(t.elapsed().as_secs_f64());

    let t = Instant::now();
    for name in &names {
        rustix::fs::statat(&d, name.as_str(), AtFlags::empty())
            .with_context(|| format!("stat {}/{name}", dir.display()))?;
    }
    let stats = rate(t.elapsed().as_secs_f64());

    let t = Instant::now();
    for name in &names {
        rustix::fs::unlinkat(&d, name.as_str(), AtFlags::empty())
            .with_context(|| format!("unlink {}/{name}", dir.display()))?;
    }
    let unlinks = rate(t.elapsed().as_secs_f64());
    drop(d);
    std::fs::remove_dir(&dir).with_context(|| format!("rmdir {}", dir.display()))?;
    Ok((creates, stats, unlinks))
}

/// As root, sets the kernel's `enable_uring` when it is off (as `compfs mount -o uring`).
fn enable_uring() -> Result<()> {
    match compfs_fs::mount::kernel_uring_enabled() {
        Some(true) => Ok(()),
        None => bail!("this kernel has no FUSE over io_uring; use --transport dev"),
        Some(false) if !is_root() => {
            bail!(
                "FUSE over io_uring is off ({} is N) and only root can turn it on; \
                 run as root or use --transport dev",
                compfs_fs::mount::ENABLE_URING
            )
        }
        Some(false) => {
            std::fs::write(compfs_fs::mount::ENABLE_URING, "Y\n")
                .with_context(|| format!("setting {}", compfs_fs::mount::ENABLE_URING))?;
            eprintln!(
                "set {} to Y: the kernel now offers FUSE over io_uring to new mounts",
                compfs_fs::mount::ENABLE_URING
            );
            Ok(())
        }
    }
}

/// One filesystem, fresh, for one round.
fn one(a: &Args, work: &Path, fs: &str, round: u32) -> Result<Row> {
    let mnt = work.join("mnt");
    std::fs::create_dir_all(&mnt)?;
    let ring = a.transport == "ring";
    let (c, s, u) = match fs {
        "compfs" => {
            let store = work.join("store");
            let _ = std::fs::remove_dir_all(&store);
            let exe = std::env::current_exe()?;
            crate::mounts::run_tool(std::process::Command::new(exe).arg("mkfs").arg(&store))
                .context("compfs mkfs")?;
            let opts = format!(
                "compress={},{}",
                a.method,
                if ring { "uring" } else { "nouring" }
            );
            let m = CompfsMount::new(&store, &mnt, &opts)?;
            let r = phases(&mnt, a.files)?;
            m.unmount()?;
            std::fs::remove_dir_all(&store)?;
            r
        }
        "null" => {
            let session = compfs_fs::nullfs::mount_null(&mnt, ring).with_context(|| {
                format!("mounting the null FUSE filesystem on {}", mnt.display())
            })?;
            let r = phases(&mnt, a.files);
            session
                .umount_and_join()
                .context("unmounting the null FUSE filesystem")?;
            r?
        }
        _ => {
            let img = work.join("btrfs.img");
            mkfs_btrfs(&img, 4 << 30)?;
            let m = KernelMount::new("btrfs", &img, &mnt, &format!("compress={}", a.method))?;
            let r = phases(&mnt, a.files)?;
            m.unmount()?;
            std::fs::remove_file(&img)?;
            r
        }
    };
    Ok(Row {
        fs: fs.to_string(),
        round,
        files: a.files,
        creates_per_s: c,
        stats_per_s: s,
        unlinks_per_s: u,
    })
}

/// `median (min–max)` of a column, thousands separated.
fn cell(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(0.0, f64::max);
    format!("{} ({}–{})", sep(median(v)), sep(lo), sep(hi))
}

fn sep(x: f64) -> String {
    let s = format!("{:.0}", x.max(0.0));
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// The printed table: one line per filesystem, then the ratios of medians.
pub fn table(rows: &[Row], order: &[String]) -> String {
    let col = |fs: &str, f: fn(&Row) -> f64| -> Vec<f64> {
        rows.iter().filter(|r| r.fs == fs).map(f).collect()
    };
    let mut out = format!(
        "{:<8} {:>26} {:>26} {:>26}\n",
        "fs", "creates/s", "stats/s", "unlinks/s"
    );
    for fs in order {
        out.push_str(&format!(
            "{:<8} {:>26} {:>26} {:>26}\n",
            fs,
            cell(&col(fs, |r| r.creates_per_s)),
            cell(&col(fs, |r| r.stats_per_s)),
            cell(&col(fs, |r| r.unlinks_per_s)),
        ));
    }
    let med = |fs: &str, f: fn(&Row) -> f64| median(&col(fs, f));
    for (a, b) in [("compfs", "btrfs"), ("null", "btrfs"), ("compfs", "null")] {
        if !order.iter().any(|f| f == a) || !order.iter().any(|f| f == b) {
            continue;
        }
        let r = |f: fn(&Row) -> f64| med(a, f) / med(b, f).max(1e-9);
        out.push_str(&format!(
            "{:<15} creates {:.2}×  stats {:.2}×  unlinks {:.2}×\n",
            format!("{a} / {b}"),
            r(|r| r.creates_per_s),
            r(|r| r.stats_per_s),
            r(|r| r.unlinks_per_s),
        ));
    }
    out
}

pub fn run(a: Args) -> Result<()> {
    if a.files == 0 || a.rounds == 0 {
        bail!("--files and --rounds must be above 0");
    }
    if let Some(bad) = a.fs.iter().find(|f| !KNOWN.contains(&f.as_str())) {
        bail!("unknown filesystem {bad:?} in --fs (known: compfs, null, btrfs)");
    }
    if a.transport != "ring" && a.transport != "dev" {
        bail!("--transport must be ring or dev, not {:?}", a.transport);
    }
    if a.fs.iter().any(|f| f == "btrfs") && !is_root() {
        bail!("btrfs needs root (a loop image and mount); run as root or leave it out of --fs");
    }
    compfs_codec::CodecSpec::parse(&a.method).with_context(|| format!("--method {}", a.method))?;
    if a.transport == "ring" && a.fs.iter().any(|f| f != "btrfs") {
        enable_uring()?;
    }
    let base = a
        .workdir
        .clone()
        .unwrap_or_else(|| PathBuf::from("/var/tmp"));
    let work = tempfile::Builder::new()
        .prefix("compfs-bench-creates.")
        .tempdir_in(&base)
        .with_context(|| format!("cannot create a work directory in {}", base.display()))?;
    println!(
        "empty-file creates, stats and unlinks, {} files per round, {} rounds, FUSE {}, {}",
        a.files,
        a.rounds,
        if a.transport == "ring" {
            "over io_uring"
        } else {
            "over /dev/fuse"
        },
        a.method
    );
    let mut rows = Vec::new();
    for round in 1..=a.rounds {
        for fs in &a.fs {
            let r = one(&a, work.path(), fs, round)?;
            eprintln!(
                "round {round} {fs}: {:.0} creates/s, {:.0} stats/s, {:.0} unlinks/s",
                r.creates_per_s, r.stats_per_s, r.unlinks_per_s
            );
            rows.push(r);
        }
    }
    print!("{}", table(&rows, &a.fs));
    if let Some(j) = &a.json {
        let rep = Report {
            transport: a.transport.clone(),
            method: a.method.clone(),
            rows,
        };
        std::fs::write(j, serde_json::to_string_pretty(&rep)?)
            .with_context(|| format!("writing {}", j.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(fs: &str, c: f64) -> Row {
        Row {
            fs: fs.into(),
            round: 1,
            files: 10,
            creates_per_s: c,
            stats_per_s: 2.0 * c,
            unlinks_per_s: c / 2.0,
        }
    }

    #[test]
    fn thousands_are_separated() {
        assert_eq!(sep(0.0), "0");
        assert_eq!(sep(999.4), "999");
        assert_eq!(sep(1000.0), "1,000");
        assert_eq!(sep(1234567.0), "1,234,567");
    }

    #[test]
    fn the_table_has_medians_and_ratios_of_medians() {
        let rows = vec![
            row("compfs", 10_000.0),
            row("compfs", 14_000.0),
            row("compfs", 12_000.0),
            row("null", 20_000.0),
            row("btrfs", 40_000.0),
        ];
        let order: Vec<String> = ["compfs", "null", "btrfs"].map(String::from).to_vec();
        let t = table(&rows, &order);
        assert!(t.contains("12,000 (10,000–14,000)"), "{t}");
        assert!(t.contains("compfs / btrfs  creates 0.30×"), "{t}");
        assert!(t.contains("null / btrfs    creates 0.50×"), "{t}");
        assert!(t.contains("compfs / null   creates 0.60×"), "{t}");
    }

    #[test]
    fn ratios_need_both_filesystems() {
        let rows = vec![row("compfs", 1.0)];
        let t = table(&rows, &["compfs".to_string()]);
        assert!(!t.contains(" / "), "{t}");
    }
}
