//! `compfs bench fs`: the method of the zstd btrfs patch (seed 000) — copy N copies of a corpus
//! in with `compress-force=METHOD`, sync (write MB/s), ratio from the usage report, unmount,
//! drop caches, remount, `tar cf - . | cat > /dev/null` (read MB/s) — on compfs and, with
//! `--vs-btrfs`, on kernel btrfs on a loop image in the same run. Extra workloads: heuristic
//! mode, 512 KiB extents, untar of a source tree (also on `bindfs`, a FUSE passthrough that does
//! no work: the FUSE floor), fio 4 KiB random overwrite.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use clap::Args as ClapArgs;
use compfs_codec::{CodecSpec, Mode};
use compfs_store::{CreateOptions, Store};
use serde::Serialize;

use crate::corpus;
use crate::error::{bail, failed, Context, Result};
pub(crate) use crate::mounts::*;

use compfs_codec::{human, parse_size};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Run every step on kernel btrfs too (root only: loop device, mkfs.btrfs, mount).
    #[arg(long)]
    pub vs_btrfs: bool,
    /// The corpus: a directory, a .tar, or a .tar.zst (e.g. the Silesia corpus).
    #[arg(long, value_name = "DIR|TAR")]
    pub corpus: PathBuf,
    /// Methods, btrfs syntax, comma-separated.
    #[arg(
        long,
        default_value = "none,lzo,zlib:3,zstd:-5,zstd:1,zstd:3,zstd:9,zstd:15"
    )]
    pub methods: String,
    /// Copies of the corpus for fast methods (none, lzo, lz4, zstd up to level 3).
    #[arg(long, default_value_t = 10)]
    pub copies_fast: u32,
    /// Copies for slow methods (zlib, zstd above level 3).
    #[arg(long, default_value_t = 3)]
    pub copies_slow: u32,
    /// Where stores, images and mount points go (default /var/tmp; must be on a real disk).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Skip the extra workloads (heuristic, 512K extents, untar, fio).
    #[arg(long)]
    pub no_extras: bool,
    /// Tarball for the untar workload (default: a tar of /usr/include, ~8000 small files).
    #[arg(long)]
    pub untar: Option<PathBuf>,
    /// Runs of the untar workload on each filesystem (alternating; the median counts: the
    /// per-file round trips of FUSE make it the noisiest workload on a shared VM).
    #[arg(long, default_value_t = 3)]
    pub untar_runs: u32,
    /// File size for the fio 4 KiB random-overwrite workload.
    #[arg(long, default_value = "256M")]
    pub fio_size: String,
    /// Write all rows as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Instead of the rows above: the object-store rows, a store in this bucket
    /// (s3://BUCKET/PREFIX, server from the AWS_* variables) against the same store on the
    /// local disk, and rclone's compress remote as the peer (method: zstd:3, or the one
    /// --methods names).
    #[arg(long, value_name = "s3://BUCKET/PREFIX")]
    pub object_store: Option<String>,
    /// Instead of the rows above: the small-file rows (issue 16). Each tree (comma-separated
    /// directories, or `gen:N` for N small text files cut from the corpus) is copied with
    /// `compress=zstd:3` onto compfs and kernel btrfs: the store directory after unmount
    /// against btrfs's `df` delta and against each file compressed alone with `zstd -3`, copy
    /// and cold read times (root). Without a value: /usr/include,/usr/share/doc,gen:100000.
    #[arg(
        long,
        value_name = "TREES",
        num_args = 0..=1,
        default_missing_value = crate::smallfiles::DEFAULT_TREES
    )]
    pub small_files: Option<String>,
    /// With --small-files: also measure compfs with these mount options added (repeatable;
    /// one more row per tree each, e.g. `dict=nopack` for packs without the dictionary).
    #[arg(long, value_name = "OPTIONS")]
    pub small_files_vs: Vec<String>,
    /// Draw ratio against write MB/s per method (compfs and btrfs) as SVG here.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// One measurement.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Row {
    pub fs: String,
    pub workload: String,
    pub method: String,
    pub copies: u32,
    pub bytes: u64,
    pub write_secs: f64,
    pub write_mbs: f64,
    pub read_secs: f64,
    pub read_mbs: f64,
    /// Uncompressed / disk bytes of the data (usage report or compsize; df without compsize).
    pub ratio: f64,
    pub disk_bytes: u64,
    /// How the ratio was measured.
    pub ratio_source: String,
    /// fio IOPS (fio workload only).
    pub iops: f64,
    /// Peak resident memory of the compfs daemon (VmHWM), MiB.
    pub daemon_rss_mib: f64,
    /// Errors or caveats.
    pub note: String,
}

/// What one copy-then-read run measured.
struct CopyRun {
    bytes: u64,
    write_secs: f64,
    read_secs: f64,
    ratio: f64,
    disk: u64,
    src: String,
}

impl Row {
    /// A row of the copy workloads, speeds derived from the bytes and times.
    fn copy(fs: &str, workload: &str, method: &str, copies: u32, run: CopyRun) -> Row {
        Row {
            fs: fs.into(),
            workload: workload.into(),
            method: method.into(),
            copies,
            bytes: run.bytes,
            write_secs: run.write_secs,
            write_mbs: run.bytes as f64 / run.write_secs / 1e6,
            read_secs: run.read_secs,
            read_mbs: run.bytes as f64 / run.read_secs / 1e6,
            ratio: run.ratio,
            disk_bytes: run.disk,
            ratio_source: run.src,
            ..Row::default()
        }
    }
}

#[derive(Debug, Serialize)]
struct Report {
    corpus: String,
    corpus_bytes: u64,
    kernel: String,
    rows: Vec<Row>,
}

fn is_slow(method: &str) -> bool {
    match CodecSpec::parse(method) {
        Ok(p) => {
            let s = p.spec;
            matches!(s.algorithm(), compfs_codec::Algorithm::Zlib)
                || (matches!(s.algorithm(), compfs_codec::Algorithm::Zstd) && s.level() > 3)
        }
        Err(_) => false,
    }
}

/// btrfs spelling of a method for `-o compress-force=`.
fn btrfs_opts(method: &str, force: bool) -> String {
    let key = if force { "compress-force" } else { "compress" };
    if method == "none" {
        // btrfs has no compress-force=none; no option means no compression.
        String::new()
    } else {
        format!("{key}={method}")
    }
}

struct Ctx {
    work: PathBuf,
    corpus: PathBuf,
    corpus_bytes: u64,
    vs_btrfs: bool,
    can_drop: bool,
}

impl Ctx {
    fn fresh_store(&self, extent: u32) -> Result<PathBuf> {
        let store = self.work.join("store");
        if store.exists() {
            std::fs::remove_dir_all(&store)?;
        }
        let opts = CreateOptions {
            extent_size: extent,
            compression: CodecSpec::default(),
            mode: Mode::Heuristic,
            force: false,
        };
        Store::create(&store, &opts)?.close()?;
        Ok(store)
    }

    fn mnt(&self) -> Result<PathBuf> {
        let m = self.work.join("mnt");
        std::fs::create_dir_all(&m)?;
        Ok(m)
    }

    fn copy_in(&self, mnt: &Path, copies: u32) -> Result<f64> {
        let t = Instant::now();
        for i in 0..copies {
            run_tool(
                Command::new("cp")
                    .arg("-r")
                    .arg(&self.corpus)
                    .arg(mnt.join(format!("copy{i}"))),
            )?;
        }
        full_sync(mnt)?;
        Ok(t.elapsed().as_secs_f64())
    }

    /// Copy workload on compfs.
    fn compfs_copy(
        &self,
        workload: &str,
        method: &str,
        opts: &str,
        extent: u32,
        copies: u32,
    ) -> Result<Row> {
        let store = self.fresh_store(extent)?;
        let mnt = self.mnt()?;
        let bytes = self.corpus_bytes * copies as u64;
        let m = CompfsMount::new(&store, &mnt, opts)?;
        let write_secs = self.copy_in(&mnt, copies)?;
        let (ratio, disk) = compfs_ratio(&mnt)?;
        let rss = m.peak_rss_mib();
        m.unmount()?;
        drop_caches();
        let m = CompfsMount::new(&store, &mnt, "")?;
        let read_secs = read_all(&mnt)?;
        let rss = rss.max(m.peak_rss_mib());
        m.unmount()?;
        std::fs::remove_dir_all(&store)?;
        let run = CopyRun {
            bytes,
            write_secs,
            read_secs,
            ratio,
            disk,
            src: "compfs usage".into(),
        };
        Ok(Row {
            daemon_rss_mib: rss,
            note: if self.can_drop {
                String::new()
            } else {
                "caches not dropped (not root)".into()
            },
            ..Row::copy("compfs", workload, method, copies, run)
        })
    }

    fn btrfs_image(&self, copies: u32) -> Result<PathBuf> {
        let img = self.work.join("btrfs.img");
        let size = (self.corpus_bytes * copies as u64 * 2).max(4 << 30);
        mkfs_btrfs(&img, size)?;
        Ok(img)
    }

    fn btrfs_copy(&self, workload: &str, method: &str, opts: &str, copies: u32) -> Result<Row> {
        let img = self.btrfs_image(copies)?;
        let mnt = self.mnt()?;
        let bytes = self.corpus_bytes * copies as u64;
        let m = KernelMount::new("btrfs", &img, &mnt, opts)?;
        let before = df_used(&mnt);
        let write_secs = self.copy_in(&mnt, copies)?;
        let (ratio, disk, src) = btrfs_ratio(&mnt, bytes, before);
        m.unmount()?;
        drop_caches();
        let m = KernelMount::new("btrfs", &img, &mnt, opts)?;
        let read_secs = read_all(&mnt)?;
        m.unmount()?;
        std::fs::remove_file(&img)?;
        let run = CopyRun {
            bytes,
            write_secs,
            read_secs,
            ratio,
            disk,
            src,
        };
        Ok(Row::copy("btrfs", workload, method, copies, run))
    }

    /// Runs `f` on a fresh file system of kind `fs` (128 KiB extents / a new image) mounted with
    /// `opts`, then unmounts and deletes it.
    fn on_fresh_fs<T>(
        &self,
        fs: &str,
        opts: &str,
        f: impl FnOnce(&Path) -> Result<T>,
    ) -> Result<T> {
        let mnt = self.mnt()?;
        if fs == "bindfs" {
            let src = self.work.join("bindfs-src");
            if src.exists() {
                std::fs::remove_dir_all(&src)?;
            }
            std::fs::create_dir_all(&src)?;
            let m = BindfsMount::new(&src, &mnt)?;
            let r = f(&mnt)?;
            m.unmount()?;
            std::fs::remove_dir_all(&src)?;
            Ok(r)
        } else if fs == "compfs" || fs == "compfs-uring" {
            let store = self.fresh_store(128 << 10)?;
            let m = CompfsMount::new(&store, &mnt, opts)?;
            let r = f(&mnt)?;
            m.unmount()?;
            std::fs::remove_dir_all(&store)?;
            Ok(r)
        } else {
            let img = self.btrfs_image(1)?;
            let m = KernelMount::new("btrfs", &img, &mnt, opts)?;
            let r = f(&mnt)?;
            m.unmount()?;
            std::fs::remove_file(&img)?;
            Ok(r)
        }
    }

    /// Untar of a source tree, then sync.
    fn untar(&self, fs: &str, tarball: &Path, bytes: u64) -> Result<Row> {
        let run_it = |mnt: &Path| -> Result<f64> {
            let t = Instant::now();
            run_tool(
                Command::new("tar")
                    .arg("xf")
                    .arg(tarball)
                    .arg("-C")
                    .arg(mnt),
            )?;
            full_sync(mnt)?;
            Ok(t.elapsed().as_secs_f64())
        };
        // The compfs rows name their FUSE transport: `/dev/fuse` (`nouring`), or FUSE over
        // io_uring (`uring`: per-CPU queues; as root this switches the kernel's
        // `enable_uring` on).
        let opts = match fs {
            "compfs" => "compress=zstd:3,nouring",
            "compfs-uring" => "compress=zstd:3,uring",
            _ => "compress=zstd:3",
        };
        let secs = self.on_fresh_fs(fs, opts, run_it)?;
        Ok(Row {
            fs: fs.into(),
            workload: "untar".into(),
            method: untar_method(fs).into(),
            copies: 1,
            bytes,
            write_secs: secs,
            write_mbs: bytes as f64 / secs / 1e6,
            ..Row::default()
        })
    }

    /// fio 4 KiB random overwrite of one file.
    fn fio(&self, fs: &str, size: u64) -> Result<Row> {
        let run_fio = |mnt: &Path| -> Result<f64> {
            let mut args: Vec<String> = [
                "--name=randwrite",
                "--rw=randwrite",
                "--bs=4k",
                "--ioengine=psync",
                "--end_fsync=1",
                "--randrepeat=1",
            ]
            .map(String::from)
            .to_vec();
            args.push(format!("--size={size}"));
            args.push(format!("--filename={}", mnt.join("fio.dat").display()));
            crate::fio::iops(&args, "randwrite")
        };
        let iops = self.on_fresh_fs(fs, "compress-force=zstd:3", run_fio)?;
        Ok(Row {
            fs: fs.into(),
            workload: "fio-4k-randwrite".into(),
            method: "zstd:3".into(),
            copies: 1,
            bytes: size,
            iops,
            ..Row::default()
        })
    }
}

/// The method of an untar row: compfs (both transports) and btrfs compress with zstd:3, bindfs
/// passes through.
fn untar_method(fs: &str) -> &'static str {
    if fs == "bindfs" {
        "none"
    } else {
        "zstd:3"
    }
}

/// The run with the median time, noting every run's seconds.
fn median_run(mut runs: Vec<Row>) -> Result<Row> {
    runs.sort_by(|a, b| a.write_secs.total_cmp(&b.write_secs));
    let all: Vec<String> = runs
        .iter()
        .map(|r| format!("{:.2}", r.write_secs))
        .collect();
    let mid = runs.len() / 2;
    let mut r = runs
        .into_iter()
        .nth(mid)
        .ok_or_else(|| failed!("no untar run"))?;
    r.note = format!("median of {} runs: {} s", all.len(), all.join(", "));
    Ok(r)
}

fn fmt_ratio(a: f64, b: f64) -> String {
    if a > 0.0 && b > 0.0 {
        format!("{:.2}x", a / b)
    } else {
        "-".into()
    }
}

fn print_table(rows: &[Row]) {
    let find = |fs: &str, w: &str, m: &str| {
        rows.iter()
            .find(|r| r.fs == fs && r.workload == w && r.method == m)
    };
    println!(
        "{:<16} {:<8} {:>6} {:>7} | {:>8} {:>8} {:>6} {:>6} | {:>8} {:>8} {:>6} | {:>7} {:>7} {:>7}",
        "workload", "method", "copies", "MB", "cf wr", "cf rd", "cf x", "RSS", "bt wr", "bt rd", "bt x", "wr c/b", "rd c/b", "x c/b"
    );
    let mut seen = Vec::new();
    for r in rows.iter().filter(|r| r.fs == "compfs" || r.fs == "btrfs") {
        let key = (r.workload.clone(), r.method.clone());
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let c = find("compfs", &r.workload, &r.method);
        let b = find("btrfs", &r.workload, &r.method);
        let num = |v: Option<f64>, w: usize, p: usize| match v {
            Some(x) if x > 0.0 => format!("{x:>w$.p$}"),
            _ => format!("{:>w$}", "-"),
        };
        let (cw, cr, cx, rss) = (
            c.map(|r| if r.iops > 0.0 { r.iops } else { r.write_mbs }),
            c.map(|r| r.read_mbs),
            c.map(|r| r.ratio),
            c.map(|r| r.daemon_rss_mib),
        );
        let (bw, br, bx) = (
            b.map(|r| if r.iops > 0.0 { r.iops } else { r.write_mbs }),
            b.map(|r| r.read_mbs),
            b.map(|r| r.ratio),
        );
        println!(
            "{:<16} {:<8} {:>6} {:>7.0} | {} {} {} {} | {} {} {} | {:>7} {:>7} {:>7}",
            r.workload,
            r.method,
            r.copies,
            r.bytes as f64 / 1e6,
            num(cw, 8, 1),
            num(cr, 8, 1),
            num(cx, 6, 2),
            num(rss, 6, 0),
            num(bw, 8, 1),
            num(br, 8, 1),
            num(bx, 6, 2),
            fmt_ratio(cw.unwrap_or(0.0), bw.unwrap_or(0.0)),
            fmt_ratio(cr.unwrap_or(0.0), br.unwrap_or(0.0)),
            fmt_ratio(cx.unwrap_or(0.0), bx.unwrap_or(0.0)),
        );
        for x in [c, b].into_iter().flatten() {
            if !x.note.is_empty() {
                println!("    {} {}: {}", x.fs, x.method, x.note);
            }
        }
    }
    println!("(wr/rd = MB/s, or IOPS for fio; x = compression ratio; RSS = compfs daemon peak MiB; c/b = compfs / btrfs)");
    for u in rows.iter().filter(|r| r.fs == "compfs-uring") {
        let c = find("compfs", &u.workload, "zstd:3");
        let b = find("btrfs", &u.workload, "zstd:3");
        println!(
            "compfs over FUSE io_uring (-o uring) {}: {:.2} s{}{}; {}",
            u.workload,
            u.write_secs,
            c.map_or(String::new(), |c| format!(
                ", {} the /dev/fuse time",
                fmt_ratio(u.write_secs, c.write_secs)
            )),
            b.map_or(String::new(), |b| format!(
                ", {} btrfs's",
                fmt_ratio(u.write_secs, b.write_secs)
            )),
            u.note
        );
    }
    for b in rows.iter().filter(|r| r.fs == "bindfs") {
        let c = find("compfs", &b.workload, "zstd:3");
        println!(
            "bindfs (FUSE passthrough, the FUSE floor) {}: {:.2} s{}; {}",
            b.workload,
            b.write_secs,
            c.map_or(String::new(), |c| format!(
                ", compfs takes {} its time",
                fmt_ratio(c.write_secs, b.write_secs)
            )),
            b.note
        );
    }
}

/// Runs `compfs bench fs`.
pub fn run(a: Args) -> Result<()> {
    if a.vs_btrfs && !is_root() {
        bail!("--vs-btrfs needs root (loop device, mkfs.btrfs, mount)");
    }
    let base = a
        .workdir
        .clone()
        .unwrap_or_else(|| PathBuf::from("/var/tmp"));
    let work = tempfile::Builder::new()
        .prefix("compfs-bench-fs.")
        .tempdir_in(&base)
        .with_context(|| format!("cannot create a work directory in {}", base.display()))?;
    bench(&a, work.path())
}

fn bench(a: &Args, work: &Path) -> Result<()> {
    let corpus = corpus::unpack(&a.corpus, work)?;
    let corpus_bytes = corpus::tree_bytes(&corpus)?;
    if corpus_bytes == 0 {
        bail!("corpus {} holds no data", a.corpus.display());
    }
    if let Some(url) = &a.object_store {
        let method = match a.methods.split(',').collect::<Vec<_>>().as_slice() {
            [one] => one.to_string(),
            _ => "zstd:3".to_string(),
        };
        let rows = crate::objstore::run(url, work, &corpus, corpus_bytes, a.copies_fast, &method)?;
        if let Some(j) = &a.json {
            std::fs::write(j, serde_json::to_vec_pretty(&rows)?)?;
        }
        return Ok(());
    }
    if let Some(trees) = &a.small_files {
        let rows = crate::smallfiles::run(trees, &corpus, work, &a.small_files_vs)?;
        if let Some(j) = &a.json {
            std::fs::write(j, serde_json::to_vec_pretty(&rows)?)?;
        }
        return Ok(());
    }
    let can_drop = drop_caches();
    let ctx = Ctx {
        work: work.to_path_buf(),
        corpus,
        corpus_bytes,
        vs_btrfs: a.vs_btrfs,
        can_drop,
    };
    eprintln!(
        "corpus: {} ({}); work dir {}",
        a.corpus.display(),
        human(corpus_bytes),
        work.display()
    );
    let mut rows: Vec<Row> = Vec::new();
    let record = |r: Result<Row>, fs: &str, w: &str, m: &str, rows: &mut Vec<Row>| match r {
        Ok(r) => {
            eprintln!(
                "  {fs:<12} {w:<16} {m:<8} write {:>7.1} MB/s  read {:>7.1} MB/s  ratio {:.2}{}",
                r.write_mbs,
                r.read_mbs,
                r.ratio,
                if r.iops > 0.0 {
                    format!("  {:.0} IOPS", r.iops)
                } else {
                    String::new()
                }
            );
            rows.push(r);
        }
        Err(e) => {
            eprintln!("  {fs:<6} {w:<16} {m:<8} FAILED: {e:#}");
            rows.push(Row {
                fs: fs.into(),
                workload: w.into(),
                method: m.into(),
                note: format!("failed: {e:#}"),
                ..Row::default()
            });
        }
    };
    for method in a
        .methods
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
    {
        CodecSpec::parse(method).map_err(|e| failed!("--methods: {e}"))?;
        let copies = if is_slow(method) {
            a.copies_slow
        } else {
            a.copies_fast
        };
        let r = ctx.compfs_copy(
            "copy",
            method,
            &format!("compress-force={method}"),
            128 << 10,
            copies,
        );
        record(r, "compfs", "copy", method, &mut rows);
        if ctx.vs_btrfs {
            let r = ctx.btrfs_copy("copy", method, &btrfs_opts(method, true), copies);
            record(r, "btrfs", "copy", method, &mut rows);
        }
    }
    if !a.no_extras {
        let copies = a.copies_fast;
        let r = ctx.compfs_copy(
            "copy-heuristic",
            "zstd:3",
            "compress=zstd:3",
            128 << 10,
            copies,
        );
        record(r, "compfs", "copy-heuristic", "zstd:3", &mut rows);
        if ctx.vs_btrfs {
            let r = ctx.btrfs_copy("copy-heuristic", "zstd:3", "compress=zstd:3", copies);
            record(r, "btrfs", "copy-heuristic", "zstd:3", &mut rows);
        }
        let r = ctx.compfs_copy(
            "copy-512K",
            "zstd:3",
            "compress-force=zstd:3",
            512 << 10,
            copies,
        );
        record(r, "compfs", "copy-512K", "zstd:3", &mut rows);
        // untar of a source tree
        let tarball = match &a.untar {
            Some(t) => t.clone(),
            None => {
                let t = work.join("src.tar");
                run_tool(
                    Command::new("tar")
                        .arg("cf")
                        .arg(&t)
                        .args(["-C", "/usr", "include"]),
                )
                .context("building the untar workload from /usr/include")?;
                t
            }
        };
        let tar_bytes = std::fs::metadata(&tarball)?.len();
        // bindfs, a FUSE passthrough to the work directory's file system that does no work,
        // is the FUSE floor: what any FUSE file system pays in round trips on this machine.
        // compfs-uring: the same over FUSE over io_uring, where the kernel has it (Linux
        // 6.14+) and root may switch it on.
        let untar_fs = ["compfs", "compfs-uring", "btrfs", "bindfs"];
        let skip = |fs: &str| {
            (fs == "btrfs" && !ctx.vs_btrfs)
                || (fs == "compfs-uring"
                    && !(is_root() && compfs_fs::mount::kernel_uring_enabled().is_some()))
        };
        let mut runs: [Vec<Row>; 4] = Default::default();
        let mut failed: [Option<crate::Error>; 4] = Default::default();
        for _ in 0..a.untar_runs.max(1) {
            for (i, fs) in untar_fs.into_iter().enumerate() {
                if skip(fs) || failed[i].is_some() {
                    continue;
                }
                match ctx.untar(fs, &tarball, tar_bytes) {
                    Ok(r) => runs[i].push(r),
                    Err(e) => failed[i] = Some(e),
                }
            }
        }
        for (i, fs) in untar_fs.into_iter().enumerate() {
            if skip(fs) {
                continue;
            }
            let r = match failed[i].take() {
                Some(e) => Err(e),
                None => median_run(std::mem::take(&mut runs[i])),
            };
            record(r, fs, "untar", untar_method(fs), &mut rows);
        }
        let size = parse_size(&a.fio_size)?;
        for fs in ["compfs", "btrfs"] {
            if fs == "btrfs" && !ctx.vs_btrfs {
                continue;
            }
            let r = ctx.fio(fs, size);
            record(r, fs, "fio-4k-randwrite", "zstd:3", &mut rows);
        }
    }
    println!();
    print_table(&rows);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let report = Report {
        corpus: a.corpus.display().to_string(),
        corpus_bytes,
        kernel,
        rows,
    };
    if let Some(j) = &a.json {
        std::fs::write(j, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", j.display()))?;
    }
    if let Some(p) = &a.plot {
        crate::plot::fs(&report.rows, p)?;
    }
    Ok(())
}
