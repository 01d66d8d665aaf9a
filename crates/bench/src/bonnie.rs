//! `compfs bench bonnie`: seed 004's comparison of compressing file systems with Bonnie++
//! (`bonnie++ -u root -x 5 -r 1024 -m NAME -d DIR`), on compfs per method, kernel btrfs on a
//! loop image per method it has, and ext4 and xfs on loop images as uncompressed baselines.
//!
//! Beyond the seed it reports the compression ratio reached on Bonnie++'s own files and, for
//! compfs, the CPU of the FUSE daemon added to Bonnie++'s: on FUSE the work is done in the
//! daemon, which Bonnie++'s `%CP` (its own user + system time) does not see.
//!
//! Bonnie++ runs with `-y p`: it prompts on stdout before each of its twelve tests and waits for
//! a line on stdin. Between tests, outside Bonnie++'s timings, the harness takes the daemon's CPU
//! time, measures the ratio (after the rewrite test: the file is complete, synced first), and
//! drops the page cache before the read and seek tests: with `-r 1024` Bonnie++ writes 2 GiB,
//! twice the RAM it is told about, so that reads miss the cache on the seed's 2 GiB machine; on
//! a machine with more RAM the reads would be served from the page cache without the drop.

use std::collections::BTreeSet;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use clap::Args as ClapArgs;
use compfs_codec::CodecSpec;
use serde::Serialize;

use crate::error::{bail, failed, Context, Result};
use crate::fs::{
    btrfs_ratio, compfs_ratio, df_used, is_root, mkfs_image, CompfsMount, KernelMount,
};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Compression methods, btrfs syntax, comma-separated. compfs runs each; kernel btrfs
    /// those it has (not lz4); ext4 and xfs run once, uncompressed.
    #[arg(long, default_value = "none,lzo,lz4,zstd:-5,zstd:1,zstd:3,zlib:3")]
    pub methods: String,
    /// Bonnie++ runs per file system and method (`bonnie++ -x`).
    #[arg(long, default_value_t = 5)]
    pub runs: u32,
    /// RAM size Bonnie++ is told, MiB (`bonnie++ -r`; it writes twice as much).
    #[arg(long, default_value_t = 1024)]
    pub ram: u32,
    /// One run with small sizes (`-r 64 -s 128 -n 1 -f2`: 2 MiB for the per-char tests), for CI
    /// and checks.
    #[arg(long)]
    pub quick: bool,
    /// Files for the create/stat/delete tests, in units of 1,024 (`bonnie++ -n`; Bonnie++'s
    /// default, the seed's, is 16). On an idle machine kernel file systems finish 16 × 1,024
    /// creates in under 500 ms, where Bonnie++ prints `+++++` instead of a rate: 64 gives rates
    /// to compare. Ignored with `--quick`.
    #[arg(long, value_name = "N")]
    pub files: Option<u32>,
    /// File systems to run, comma-separated, among compfs, btrfs, ext4, xfs (all by default;
    /// the kernel ones need root).
    #[arg(long, default_value = "compfs,btrfs,ext4,xfs")]
    pub fs: String,
    /// Write all rows as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw the seed's graphs (throughput and CPU per column, per method across file systems
    /// and per file system across methods) as SVG files into this directory.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Where stores, images and mount points go (default /var/tmp; must be on a real disk).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
}

/// One Bonnie++ result column.
#[derive(Debug, Clone, Copy)]
pub struct Column {
    /// Name in Bonnie++'s CSV header.
    pub key: &'static str,
    /// What the seed calls it.
    pub label: &'static str,
    /// Unit of the value: `K/s` (KiB per second) or `/s` (operations per second).
    pub unit: &'static str,
    /// Index of the value in a Bonnie++ 1.98-format CSV line; its CPU % follows it.
    pub csv: usize,
}

/// Bonnie++'s twelve tests, in the order it runs them (and prompts for them with `-y p`).
pub const COLUMNS: [Column; 12] = [
    col("putc", "output char", "K/s", 9),
    col("put_block", "output block", "K/s", 11),
    col("rewrite", "output rewrite", "K/s", 13),
    col("getc", "input char", "K/s", 15),
    col("get_block", "input block", "K/s", 17),
    col("seeks", "random seeks", "/s", 19),
    col("seq_create", "sequential create", "/s", 26),
    col("seq_stat", "sequential stat", "/s", 28),
    col("seq_del", "sequential delete", "/s", 30),
    col("ran_create", "random create", "/s", 32),
    col("ran_stat", "random stat", "/s", 34),
    col("ran_del", "random delete", "/s", 36),
];

const fn col(key: &'static str, label: &'static str, unit: &'static str, csv: usize) -> Column {
    Column {
        key,
        label,
        unit,
        csv,
    }
}

/// Index of the getc test: the prompt before it is where the ratio is measured.
const GETC: usize = 3;
/// Fields of a Bonnie++ 1.98-format CSV result line (Bonnie++ 1.98 to 2.00).
const CSV_FIELDS: usize = 50;

/// One Bonnie++ run: each column's value and CPU %, `None` where Bonnie++ printed `+++++` (the
/// test took under 500 ms) or nothing (skipped).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunResult {
    pub value: [Option<f64>; 12],
    pub cpu: [Option<f64>; 12],
    /// CPU % of the compfs daemon during each test (compfs only).
    pub daemon_cpu: [Option<f64>; 12],
}

/// Parses a Bonnie++ CSV result line (format 1.98); `None` for any other line (the header,
/// prompts, text).
pub fn parse_csv_line(line: &str) -> Option<RunResult> {
    let f: Vec<&str> = line.trim().split(',').collect();
    if f.len() != CSV_FIELDS || !f[0].starts_with("1.9") || f[0].parse::<f64>().is_err() {
        return None;
    }
    let num = |s: &str| -> Option<f64> {
        let s = s.trim();
        if s.is_empty() || s.starts_with('+') {
            return None;
        }
        s.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0)
    };
    let mut r = RunResult::default();
    for (i, c) in COLUMNS.iter().enumerate() {
        r.value[i] = num(f[c.csv]);
        r.cpu[i] = num(f[c.csv + 1]);
    }
    Some(r)
}

/// `Some(k)` when `partial` (what Bonnie++ printed since its last newline) is its `-y p` prompt
/// before test `k`: the number and a colon.
pub fn prompt(partial: &str) -> Option<usize> {
    let n = partial.strip_suffix(':')?;
    if n.is_empty() || n.len() > 3 || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

/// Mean, sample standard deviation, min and max of the values present; `None` when none are.
pub fn stats(values: &[Option<f64>]) -> Option<Stat> {
    let v: Vec<f64> = values.iter().flatten().copied().collect();
    if v.is_empty() {
        return None;
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    Some(Stat {
        mean,
        stdev: var.sqrt(),
        min: v.iter().copied().fold(f64::MAX, f64::min),
        max: v.iter().copied().fold(f64::MIN, f64::max),
        n: v.len(),
    })
}

/// Summary of one column over runs.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Stat {
    pub mean: f64,
    pub stdev: f64,
    pub min: f64,
    pub max: f64,
    /// Runs that gave a value.
    pub n: usize,
}

/// One column of a row in the JSON file.
#[derive(Debug, Clone, Serialize)]
pub struct ColumnResult {
    pub column: String,
    pub unit: String,
    /// Value over runs (`None`: every run printed `+++++`).
    pub value: Option<Stat>,
    /// Bonnie++'s own CPU % over runs.
    pub cpu: Option<Stat>,
    /// The compfs daemon's CPU % during the test (compfs only).
    pub daemon_cpu: Option<Stat>,
    /// Bonnie++'s CPU % plus the daemon's, mean over runs.
    pub total_cpu: Option<f64>,
    /// Every run's value.
    pub values: Vec<Option<f64>>,
}

/// One file system and method.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Row {
    pub fs: String,
    pub method: String,
    /// Mount options used.
    pub options: String,
    pub runs: usize,
    /// Uncompressed / disk bytes of Bonnie++'s data file after the rewrite test (mean of runs).
    pub ratio: Option<f64>,
    /// How the ratio was measured.
    pub ratio_source: String,
    pub columns: Vec<ColumnResult>,
    /// Errors or caveats.
    pub note: String,
}

impl Row {
    fn from_runs(fs: &str, method: &str, options: &str, runs: &[RunResult], ratios: &[f64]) -> Row {
        let columns = COLUMNS
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let values: Vec<Option<f64>> = runs.iter().map(|r| r.value[i]).collect();
                let cpu = stats(&runs.iter().map(|r| r.cpu[i]).collect::<Vec<_>>());
                let daemon_cpu = stats(&runs.iter().map(|r| r.daemon_cpu[i]).collect::<Vec<_>>());
                let total_cpu = cpu.map(|c| c.mean + daemon_cpu.map_or(0.0, |d| d.mean));
                ColumnResult {
                    column: c.key.into(),
                    unit: c.unit.into(),
                    value: stats(&values),
                    cpu,
                    daemon_cpu,
                    total_cpu,
                    values,
                }
            })
            .collect();
        Row {
            fs: fs.into(),
            method: method.into(),
            options: options.into(),
            runs: runs.len(),
            ratio: (!ratios.is_empty()).then(|| ratios.iter().sum::<f64>() / ratios.len() as f64),
            columns,
            ..Row::default()
        }
    }

    /// The column called `key`.
    pub fn column(&self, key: &str) -> Option<&ColumnResult> {
        self.columns.iter().find(|c| c.column == key)
    }
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub kernel: String,
    pub bonnie_args: String,
    pub runs: u32,
    pub rows: Vec<Row>,
}

/// What Bonnie++ runs on.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub fs: &'static str,
    pub method: String,
    /// Mount options.
    pub options: String,
}

/// What `--fs` may name.
const FILE_SYSTEMS: [&str; 4] = ["compfs", "btrfs", "ext4", "xfs"];

/// Whether kernel btrfs has `method` (it has no lz4).
pub fn btrfs_has(method: &str) -> bool {
    method == "none"
        || ["lzo", "zlib", "zstd"]
            .iter()
            .any(|a| method == *a || method.starts_with(&format!("{a}:")))
}

/// The file systems and methods, in the order they run: the uncompressed baselines, then per
/// method compfs and btrfs.
pub fn targets(methods: &[String], kernel: bool) -> Vec<Target> {
    let mut t = Vec::new();
    if kernel {
        for fs in ["ext4", "xfs"] {
            t.push(Target {
                fs,
                method: "none".into(),
                options: String::new(),
            });
        }
    }
    for m in methods {
        let on = |fs: &'static str, options: String| Target {
            fs,
            method: m.clone(),
            options,
        };
        t.push(on(
            "compfs",
            if m == "none" {
                "compress=no".into()
            } else {
                format!("compress={m}")
            },
        ));
        if kernel && btrfs_has(m) {
            // No option is btrfs's "none".
            t.push(on(
                "btrfs",
                if m == "none" {
                    String::new()
                } else {
                    format!("compress={m}")
                },
            ));
        }
    }
    t
}

/// Drops the clean page cache, dentries and inodes (root only; otherwise reads may be warm).
fn drop_clean_caches() {
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3\n");
}

/// CPU time (user + system, all threads) of process `pid`, seconds.
pub(crate) fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    cpu_from_stat(&stat, clock_ticks())
}

/// utime + stime of a `/proc/PID/stat` line, in seconds (the command name may hold spaces and
/// parentheses: fields are counted after the last `)`).
pub fn cpu_from_stat(stat: &str, ticks_per_sec: f64) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3 of the line, utime 14, stime 15.
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / ticks_per_sec)
}

fn clock_ticks() -> f64 {
    rustix::param::clock_ticks_per_second() as f64
}

/// The data files Bonnie++ keeps in `dir` during its I/O tests (`Bonnie.PID`, `Bonnie.PID.001`).
fn bonnie_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_name().to_string_lossy().starts_with("Bonnie.") && e.file_type()?.is_file() {
            v.push(e.path());
        }
    }
    v.sort();
    Ok(v)
}

/// Ratio of Bonnie++'s data files in `dir` after syncing them: (ratio, how measured).
fn measure_ratio(fs: &str, dir: &Path, df_before: u64) -> Result<(f64, String)> {
    let files = bonnie_files(dir)?;
    if files.is_empty() {
        bail!("no Bonnie++ data file in {}", dir.display());
    }
    let mut bytes = 0;
    let mut alloc = 0;
    for f in &files {
        let h = std::fs::File::open(f)?;
        h.sync_all()?;
        let md = h.metadata()?;
        bytes += md.len();
        alloc += std::os::unix::fs::MetadataExt::blocks(&md) * 512;
    }
    match fs {
        "compfs" => {
            let mut uncompressed = 0;
            let mut disk = 0;
            for f in &files {
                let (r, d) = compfs_ratio(f)?;
                uncompressed += (r * d as f64) as u64;
                disk += d;
            }
            Ok((
                uncompressed as f64 / disk.max(1) as f64,
                "compfs usage".into(),
            ))
        }
        "btrfs" => {
            let (r, _, src) = btrfs_ratio(dir, bytes, df_before);
            Ok((r, src))
        }
        _ => Ok((bytes as f64 / alloc.max(1) as f64, "st_blocks".into())),
    }
}

/// Bonnie++'s sizes: the seed's (`-r RAM`, file size chosen by Bonnie++: twice the RAM, 16×1024
/// files unless `files` says how many thousands, 20 MiB written and read a byte at a time) or
/// the quick ones.
pub fn bonnie_size_args(ram: u32, files: Option<u32>, quick: bool) -> Vec<String> {
    if quick {
        ["-r", "64", "-s", "128", "-n", "1", "-f2"]
            .map(String::from)
            .to_vec()
    } else {
        let mut v = vec!["-r".into(), ram.to_string()];
        if let Some(n) = files {
            v.extend(["-n".into(), n.to_string()]);
        }
        v
    }
}

/// Runs Bonnie++ `runs` times in `dir` with `-y p`, doing the between-test work described in the
/// module comment. `daemon` is the compfs daemon's pid.
fn run_bonnie(
    fs: &str,
    dir: &Path,
    name: &str,
    size_args: &[String],
    runs: u32,
    daemon: Option<u32>,
    df_before: u64,
) -> Result<(Vec<RunResult>, Vec<f64>, String)> {
    let mut cmd = Command::new("bonnie++");
    if is_root() {
        cmd.args(["-u", "root"]);
    }
    cmd.args(["-y", "p", "-x", &runs.to_string()])
        .args(size_args)
        .args(["-m", name, "-d"])
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .context("cannot run bonnie++ (scripts/deps.sh installs it)")?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| failed!("no bonnie stdin"))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| failed!("no bonnie stdout"))?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| failed!("no bonnie stderr"))?;
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut s);
        s
    });
    let mut results = Vec::new();
    let mut ratios = Vec::new();
    let mut ratio_src = String::new();
    let mut daemon_cpu = [None; 12];
    // The test running now: its index, start time and the daemon's CPU seconds then.
    let mut open: Option<(usize, Instant, f64)> = None;
    let close = |open: &mut Option<(usize, Instant, f64)>, daemon_cpu: &mut [Option<f64>; 12]| {
        if let (Some((k, t, c0)), Some(pid)) = (open.take(), daemon) {
            let wall = t.elapsed().as_secs_f64();
            if let Some(c1) = cpu_secs(pid) {
                if wall > 0.0 {
                    daemon_cpu[k] = Some((c1 - c0) / wall * 100.0);
                }
            }
        }
    };
    let mut line = String::new();
    let mut out = BufReader::new(stdout);
    let mut byte = [0u8; 1];
    let mut failure: Option<crate::Error> = None;
    loop {
        match out.read(&mut byte) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                failure = Some(e.into());
                break;
            }
        }
        if byte[0] == b'\n' {
            if let Some(mut r) = parse_csv_line(&line) {
                close(&mut open, &mut daemon_cpu);
                r.daemon_cpu = std::mem::take(&mut daemon_cpu);
                results.push(r);
            }
            line.clear();
            continue;
        }
        line.push(char::from(byte[0]));
        let Some(k) = prompt(&line) else { continue };
        line.clear();
        close(&mut open, &mut daemon_cpu);
        if k >= COLUMNS.len() {
            failure = Some(failed!("unexpected Bonnie++ prompt {k}"));
            break;
        }
        let mut step = || -> Result<()> {
            if k == GETC {
                let (r, src) = measure_ratio(fs, dir, df_before)?;
                ratios.push(r);
                ratio_src = src;
            }
            // Cold reads, as on the seed's machine with half the RAM of the file size.
            // Bonnie++'s file was synced above: no global sync (slow on a busy machine).
            if (GETC..=GETC + 2).contains(&k) {
                drop_clean_caches();
            }
            Ok(())
        };
        if let Err(e) = step() {
            failure = Some(e);
            break;
        }
        open = Some((k, Instant::now(), daemon.and_then(cpu_secs).unwrap_or(0.0)));
        if let Err(e) = stdin.write_all(b"\n").and_then(|()| stdin.flush()) {
            failure = Some(e.into());
            break;
        }
    }
    drop(stdin);
    if failure.is_some() {
        let _ = child.kill();
    }
    let status = child.wait().context("waiting for bonnie++")?;
    let err = err_thread.join().unwrap_or_default();
    if let Some(e) = failure {
        return Err(e);
    }
    if !status.success() || results.len() != runs as usize {
        let tail: Vec<&str> = err.lines().rev().take(4).collect();
        bail!(
            "bonnie++ {} after {} of {runs} runs: {}",
            status,
            results.len(),
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        );
    }
    Ok((results, ratios, ratio_src))
}

struct Ctx {
    work: PathBuf,
    size_args: Vec<String>,
    runs: u32,
    /// Bytes of the largest data set: image sizes follow.
    data_bytes: u64,
}

impl Ctx {
    fn mnt(&self) -> Result<PathBuf> {
        let m = self.work.join("mnt");
        std::fs::create_dir_all(&m)?;
        Ok(m)
    }

    fn run(&self, t: &Target) -> Result<Row> {
        let mnt = self.mnt()?;
        let name = format!("{}-{}", t.fs, t.method);
        let (runs, ratios, src) = if t.fs == "compfs" {
            let store = self.work.join("store");
            if store.exists() {
                std::fs::remove_dir_all(&store)?;
            }
            compfs_store::Store::create(&store, &compfs_store::CreateOptions::default())?
                .close()?;
            let m = CompfsMount::new(&store, &mnt, &t.options)?;
            let dir = mnt.join("bonnie");
            std::fs::create_dir_all(&dir)?;
            let r = run_bonnie(t.fs, &dir, &name, &self.size_args, self.runs, m.pid(), 0);
            m.unmount()?;
            std::fs::remove_dir_all(&store)?;
            r?
        } else {
            let img = self.work.join(format!("{}.img", t.fs));
            mkfs_image(t.fs, &img, (self.data_bytes * 3).max(1 << 30))?;
            let m = KernelMount::new(t.fs, &img, &mnt, &t.options)?;
            let dir = mnt.join("bonnie");
            std::fs::create_dir_all(&dir)?;
            let before = df_used(&mnt);
            let r = run_bonnie(t.fs, &dir, &name, &self.size_args, self.runs, None, before);
            m.unmount()?;
            std::fs::remove_file(&img)?;
            r?
        };
        let mut row = Row::from_runs(t.fs, &t.method, &t.options, &runs, &ratios);
        row.ratio_source = src;
        Ok(row)
    }
}

fn fmt_stat(s: Option<Stat>, unit: &str) -> String {
    match s {
        None => "+++++".into(),
        Some(s) if unit == "K/s" => format!("{:.1}±{:.1}", s.mean / 1024.0, s.stdev / 1024.0),
        Some(s) => format!("{:.0}±{:.0}", s.mean, s.stdev),
    }
}

fn print_table(rows: &[Row]) {
    print!("{:<7} {:<8} {:>6}", "fs", "method", "ratio");
    for c in COLUMNS {
        print!(" {:>16}", c.key);
    }
    println!();
    for r in rows {
        print!(
            "{:<7} {:<8} {:>6}",
            r.fs,
            r.method,
            r.ratio.map_or("-".into(), |x| format!("{x:.2}"))
        );
        for (c, cr) in COLUMNS.iter().zip(&r.columns) {
            print!(" {:>16}", fmt_stat(cr.value, c.unit));
        }
        println!();
        print!("{:<7} {:<8} {:>6}", "", "CPU %", "");
        for cr in &r.columns {
            let s = match (cr.cpu, cr.daemon_cpu) {
                (None, _) => "-".to_string(),
                (Some(c), None) => format!("{:.0}", c.mean),
                (Some(c), Some(d)) => format!("{:.0}+{:.0}", c.mean, d.mean),
            };
            print!(" {s:>16}");
        }
        println!();
        if !r.note.is_empty() {
            println!("    {}", r.note);
        }
    }
    println!(
        "(mean±stdev over runs; output/input columns in MiB/s, the others per second; \
         +++++: under 500 ms, Bonnie++ gives no figure; CPU: Bonnie++'s %CP + the compfs \
         daemon's)"
    );
}

/// Runs `compfs bench bonnie`.
pub fn run(a: Args) -> Result<()> {
    let methods: Vec<String> = a
        .methods
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(String::from)
        .collect();
    let mut seen = BTreeSet::new();
    for m in &methods {
        CodecSpec::parse(m).map_err(|e| failed!("--methods: {e}"))?;
        if !seen.insert(m.clone()) {
            bail!("--methods names {m} twice");
        }
    }
    if methods.is_empty() {
        bail!("--methods is empty");
    }
    let runs = if a.quick { 1 } else { a.runs.max(1) };
    if a.ram == 0 && !a.quick {
        bail!("--ram must be above 0");
    }
    if a.files == Some(0) {
        bail!("--files must be above 0 (thousands of files, as bonnie++ -n)");
    }
    let base = a
        .workdir
        .clone()
        .unwrap_or_else(|| PathBuf::from("/var/tmp"));
    let work = tempfile::Builder::new()
        .prefix("compfs-bench-bonnie.")
        .tempdir_in(&base)
        .with_context(|| format!("cannot create a work directory in {}", base.display()))?;
    if let Some(p) = &a.plot {
        std::fs::create_dir_all(p).with_context(|| format!("creating {}", p.display()))?;
    }
    let kernel = is_root();
    if !kernel {
        eprintln!("not root: only compfs runs (btrfs, ext4 and xfs need loop devices and mount)");
    }
    let size_args = bonnie_size_args(a.ram, a.files, a.quick);
    let ctx = Ctx {
        work: work.path().to_path_buf(),
        data_bytes: if a.quick {
            128 << 20
        } else {
            (2 * a.ram as u64) << 20
        },
        size_args: size_args.clone(),
        runs,
    };
    let mut report = Report {
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        bonnie_args: format!("-y p -x {runs} {}", size_args.join(" ")),
        runs,
        rows: Vec::new(),
    };
    let wanted: Vec<&str> = a.fs.split(',').map(str::trim).collect();
    if let Some(bad) = wanted.iter().find(|f| !FILE_SYSTEMS.contains(f)) {
        bail!("--fs: unknown file system {bad} (compfs, btrfs, ext4, xfs)");
    }
    for t in targets(&methods, kernel)
        .into_iter()
        .filter(|t| wanted.contains(&t.fs))
    {
        eprintln!("bonnie++ on {} {} ({runs} runs) ...", t.fs, t.method);
        let started = Instant::now();
        let row = match ctx.run(&t) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("  {} {}: FAILED: {e:#}", t.fs, t.method);
                Row {
                    fs: t.fs.into(),
                    method: t.method.clone(),
                    options: t.options.clone(),
                    note: format!("failed: {e:#}"),
                    ..Row::default()
                }
            }
        };
        eprintln!(
            "  done in {:.0} s, ratio {}",
            started.elapsed().as_secs_f64(),
            row.ratio.map_or("-".into(), |r| format!("{r:.2}"))
        );
        report.rows.push(row);
        // After every file system: a long run that stops early keeps what it measured.
        write_outputs(&a, &report)?;
    }
    println!();
    print_table(&report.rows);
    if report.rows.iter().all(|r| r.runs == 0) {
        bail!("every Bonnie++ run failed");
    }
    Ok(())
}

fn write_outputs(a: &Args, report: &Report) -> Result<()> {
    if let Some(j) = &a.json {
        std::fs::write(j, serde_json::to_string_pretty(report)?)
            .with_context(|| format!("writing {}", j.display()))?;
    }
    if let Some(p) = &a.plot {
        crate::plot::bonnie(&report.rows, p)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = "1.98,2.00a,test,1,1796280165,128M,,8192,5,1911,67,+++++,+++,\
        +++++,+++,2435,61,+++++,+++,+++++,+++,1,,,,,917,0,+++++,+++,+++++,+++,+++++,+++,+++++,\
        +++,+++++,+++,18923us,8052us,20065us,25452us,4019us,12115us,12071us,41us,4298us,\
        61820us,20us,25us";

    #[test]
    fn size_args_are_the_seeds_unless_told() {
        assert_eq!(bonnie_size_args(1024, None, false), ["-r", "1024"]);
        assert_eq!(
            bonnie_size_args(1024, Some(64), false),
            ["-r", "1024", "-n", "64"]
        );
        assert_eq!(bonnie_size_args(1024, Some(64), true)[4], "-n");
        assert_eq!(bonnie_size_args(1024, Some(64), true)[5], "1");
    }

    #[test]
    fn parses_a_bonnie_csv_line() {
        let r = parse_csv_line(LINE).unwrap();
        assert_eq!(r.value[0], Some(1911.0));
        assert_eq!(r.cpu[0], Some(67.0));
        assert_eq!(r.value[1], None);
        assert_eq!(r.value[3], Some(2435.0));
        assert_eq!(r.cpu[3], Some(61.0));
        assert_eq!(r.value[6], Some(917.0));
        assert_eq!(r.cpu[6], Some(0.0));
        assert_eq!(r.value[11], None);
    }

    #[test]
    fn other_lines_are_not_results() {
        assert_eq!(parse_csv_line(""), None);
        assert_eq!(
            parse_csv_line("format_version,bonnie_version,name,concurrency"),
            None
        );
        // One field short, a wrong version, garbage.
        let short = LINE.rsplit_once(',').unwrap().0;
        assert_eq!(parse_csv_line(short), None);
        assert_eq!(parse_csv_line(&LINE.replacen("1.98", "x.98", 1)), None);
        assert_eq!(parse_csv_line(&",".repeat(49)), None);
        // A garbled number is no value, not a panic.
        let r = parse_csv_line(&LINE.replacen(",1911,", ",19x1,", 1)).unwrap();
        assert_eq!(r.value[0], None);
        let r = parse_csv_line(&LINE.replacen(",1911,", ",-5,", 1)).unwrap();
        assert_eq!(r.value[0], None);
    }

    #[test]
    fn prompts() {
        assert_eq!(prompt("0:"), Some(0));
        assert_eq!(prompt("11:"), Some(11));
        assert_eq!(prompt(":"), None);
        assert_eq!(prompt("1"), None);
        assert_eq!(prompt("Using uid:"), None);
        assert_eq!(prompt("1.98,2.00a:"), None);
    }

    #[test]
    fn stats_over_runs() {
        assert_eq!(stats(&[None, None]), None);
        let s = stats(&[Some(1.0), None, Some(3.0)]).unwrap();
        assert_eq!((s.mean, s.min, s.max, s.n), (2.0, 1.0, 3.0, 2));
        assert!((s.stdev - 2f64.sqrt()).abs() < 1e-12);
        assert_eq!(stats(&[Some(5.0)]).unwrap().stdev, 0.0);
    }

    #[test]
    fn cpu_from_proc_stat() {
        let line = "1234 (compfs (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 \
                    9 0 100 1000 10 18446744073709551615";
        assert_eq!(cpu_from_stat(line, 100.0), Some(4.0));
        assert_eq!(cpu_from_stat("1234 (x) S 1", 100.0), None);
        assert_eq!(cpu_from_stat("garbage", 100.0), None);
    }

    #[test]
    fn targets_follow_the_seed() {
        let m: Vec<String> = ["none", "lz4", "zstd:3"].map(String::from).to_vec();
        let t = targets(&m, true);
        let names: Vec<String> = t.iter().map(|t| format!("{} {}", t.fs, t.method)).collect();
        assert_eq!(
            names,
            [
                "ext4 none",
                "xfs none",
                "compfs none",
                "btrfs none",
                "compfs lz4",
                "compfs zstd:3",
                "btrfs zstd:3"
            ]
        );
        assert_eq!(t[2].options, "compress=no");
        assert_eq!(t[3].options, "");
        assert_eq!(t[6].options, "compress=zstd:3");
        assert_eq!(targets(&m, false).len(), 3);
        assert!(btrfs_has("zstd:-5") && btrfs_has("zlib:3") && !btrfs_has("lz4"));
    }
}
