//! `compfs bench blk`: compfs blk against kernel zram (ratio, memory) and against nbdkit's
//! uncompressed `memory` plugin (IOPS through the same fio nbd client, resident memory).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;
use compfs_blk::server::{control_path, control_request};
use compfs_blk::Stats;
use serde::Serialize;

use crate::corpus;
use crate::error::{bail, failed, Context, Result};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Data written to every device: a file, or a `.zst` file unpacked first (e.g. a tar).
    #[arg(long)]
    pub input: PathBuf,
    /// compfs codecs to measure, comma-separated.
    #[arg(long, default_value = "lzo,lz4,zstd:1,zstd:3,zstd:9")]
    pub codecs: String,
    /// Codecs (zstd only) also measured with `--dict auto`, comma-separated ("" for none): the
    /// ratio is read once the server has trained and recompressed and is idle.
    #[arg(long, default_value = "zstd:1")]
    pub dict: String,
    /// Codec whose server also runs the fio jobs.
    #[arg(long, default_value = "lz4")]
    pub fio_codec: String,
    /// Seconds per fio job.
    #[arg(long, default_value = "5")]
    pub runtime: u64,
    /// Repetitions of each fio job; devices alternate and the median is reported.
    #[arg(long, default_value = "3")]
    pub reps: u32,
    /// Skip kernel zram (needs root and /dev/zram0).
    #[arg(long)]
    pub no_zram: bool,
    /// Skip the fio throughput runs.
    #[arg(long)]
    pub no_fio: bool,
    /// Seconds per working-set phase of the memory-policy run (0: skip it). The fio codec's
    /// server with `--policy --idle-age SECS`, zstd:9 recompression and a backing file, against
    /// the same server without the policy, with fio's random reads moving through four
    /// quarters of the device.
    #[arg(long, default_value = "6")]
    pub policy_secs: u64,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write an SVG plot of orig/mem per device here.
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

#[derive(Debug, Serialize, Clone)]
pub struct RatioRow {
    pub device: String,
    pub codec: String,
    pub orig: u64,
    pub compr: u64,
    pub mem_used: u64,
    pub orig_per_compr: f64,
    pub orig_per_mem: f64,
    pub mem_per_compr: f64,
    /// Resident memory of the server process after the write (userspace devices only).
    pub rss: Option<u64>,
    pub write_mb_s: f64,
    /// `--dict auto` rows: total training time, trainings, and seconds from the end of the
    /// write until the server was idle (trained and recompressed).
    pub dict: Option<DictRow>,
}

#[derive(Debug, Serialize, Clone)]
pub struct DictRow {
    pub train_ms_total: u64,
    pub train_ms_last: u64,
    pub trainings: u64,
    pub recompressed: u64,
    pub dict_bytes: u64,
    pub settle_s: f64,
}

#[derive(Debug, Serialize, Clone)]
pub struct FioRow {
    pub device: String,
    pub rw: String,
    pub jobs: u32,
    /// Requests in flight per job.
    pub iodepth: u32,
    /// Median of `runs`.
    pub iops: f64,
    pub runs: Vec<f64>,
}

/// The page store alone, in this process, without NBD: does the sharded locking scale?
#[derive(Debug, Serialize, Clone)]
pub struct ScalingRow {
    pub op: String,
    pub threads: u32,
    pub pages_per_s: f64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub input: String,
    pub input_bytes: u64,
    pub ratios: Vec<RatioRow>,
    pub fio: Vec<FioRow>,
    pub store_scaling: Vec<ScalingRow>,
    pub policy: Vec<PolicyRow>,
}

/// One working-set phase of the policy run: the working set's IOPS and the memory after the
/// phase, with and without `--policy`.
#[derive(Debug, Serialize, Clone)]
pub struct PolicyRow {
    pub phase: u32,
    pub iops_policy: f64,
    pub iops_plain: f64,
    /// IOPS of each half-phase run, in the order they ran (with, without, with, without): the
    /// first run with the policy is where the working set's pages are first touched after the
    /// move (promoted back from zstd:9 or read from the backing file).
    pub runs_policy: Vec<f64>,
    pub runs_plain: Vec<f64>,
    /// Pages promoted back to the primary codec during the phase.
    pub promoted: u64,
    pub mem_used_policy: u64,
    pub mem_used_plain: u64,
    pub rss_policy: u64,
    pub rss_plain: u64,
    pub bd_count_policy: u64,
    /// The server's `policy` stat line after the phase.
    pub policy_line: String,
}

/// The memory-policy run: a server with `--policy` and one without, both filled with the
/// input; fio's 4 KiB random reads (iodepth 1, one job) go to one quarter of the device per
/// phase, quarter after quarter, alternating between the servers in halves of the phase;
/// memory is read after each phase. The idle age is the phase length: twice the time a
/// server waits while the other runs, so the working set never looks idle, and a quarter
/// left behind is recompressed within a phase and written back within the next.
fn policy_run(
    input: &Path,
    dir: &Path,
    codec: &str,
    size: u64,
    secs: u64,
) -> Result<Vec<PolicyRow>> {
    let extra = |policy: bool| -> Vec<String> {
        let mut v: Vec<String> = ["--recomp-algo", "zstd:9", "--backing"]
            .iter()
            .map(|x| x.to_string())
            .collect();
        v.push(
            dir.join(format!("backing-{}.img", u8::from(policy)))
                .display()
                .to_string(),
        );
        if policy {
            v.extend([
                "--policy".into(),
                "--idle-age".into(),
                secs.max(2).to_string(),
            ]);
        }
        v
    };
    let with = compfs_start(input, dir, codec, size, &extra(true))?;
    let without = compfs_start(input, dir, codec, size, &extra(false))?;
    let quarter = (size / 4) & !0xfff;
    let mut rows = Vec::new();
    let mut promoted_before = 0;
    for phase in 0..4u32 {
        let target = |uri: &str| {
            vec![
                "--ioengine=nbd".to_string(),
                format!("--uri={uri}"),
                format!("--offset={}", u64::from(phase) * quarter),
            ]
        };
        // Half the phase each, twice, alternating.
        let mut ip = Vec::new();
        let mut iq = Vec::new();
        for _ in 0..2 {
            ip.push(fio(
                &target(&with.uri),
                "randread",
                (1, 1),
                secs.div_ceil(2),
                quarter,
            )?);
            iq.push(fio(
                &target(&without.uri),
                "randread",
                (1, 1),
                secs.div_ceil(2),
                quarter,
            )?);
        }
        let (sp, lines) = stat_of(&with.ctl)?;
        let (sq, _) = stat_of(&without.ctl)?;
        let policy_line = lines
            .iter()
            .find_map(|l| l.strip_prefix("policy "))
            .unwrap_or("")
            .to_string();
        let promoted_now = promoted_of(&policy_line);
        let row = PolicyRow {
            phase,
            iops_policy: ip.iter().sum::<f64>() / ip.len() as f64,
            iops_plain: iq.iter().sum::<f64>() / iq.len() as f64,
            runs_policy: ip.clone(),
            runs_plain: iq.clone(),
            promoted: promoted_now.saturating_sub(promoted_before),
            mem_used_policy: sp.mem_used_total,
            mem_used_plain: sq.mem_used_total,
            rss_policy: rss(with.pid)?,
            rss_plain: rss(without.pid)?,
            bd_count_policy: sp.bd_count,
            policy_line,
        };
        eprintln!("  policy phase {phase}: {row:?}");
        promoted_before = promoted_now;
        rows.push(row);
    }
    Ok(rows)
}

/// The `promoted N` count of a `policy` stat line (0 if absent).
fn promoted_of(line: &str) -> u64 {
    let words: Vec<&str> = line.split_whitespace().collect();
    words
        .windows(2)
        .find(|w| w[0] == "promoted")
        .and_then(|w| w[1].parse().ok())
        .unwrap_or(0)
}

/// A started, filled compfs server for the policy run.
struct Started {
    _proc: Proc,
    pid: u32,
    uri: String,
    ctl: PathBuf,
}

fn compfs_start(
    input: &Path,
    dir: &Path,
    codec: &str,
    size: u64,
    extra: &[String],
) -> Result<Started> {
    static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let sock = dir.join(format!("compfs-policy-{n}.sock"));
    let exe = std::env::current_exe()?;
    let child = Command::new(exe)
        .args(["blk", "serve", "--size", &size.to_string(), "--algo", codec])
        .args(extra)
        .arg("--socket")
        .arg(&sock)
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start compfs blk serve")?;
    let p = Proc(child);
    let ctl = control_path(&sock);
    wait_for(&ctl)?;
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    nbdcopy_in(input, &uri)?;
    Ok(Started {
        pid: p.0.id(),
        _proc: p,
        uri,
        ctl,
    })
}

/// The server's statistics and its raw stat lines.
fn stat_of(ctl: &Path) -> Result<(Stats, Vec<String>)> {
    let lines = control_request(ctl, "stat").map_err(|e| failed!("{e}"))?;
    let get = |k: &str| {
        lines
            .iter()
            .find_map(|l| l.strip_prefix(k))
            .unwrap_or("")
            .to_string()
    };
    let stats = Stats::parse(&get("mm_stat "), &get("io_stat "), &get("bd_stat "))
        .ok_or_else(|| failed!("bad stat reply"))?;
    Ok((stats, lines))
}

/// Random 4 KiB page reads and overwrites (with pages of the input) on an in-process store,
/// 1 and 2 threads, `secs` seconds each.
fn store_scaling(input: &Path, codec: &str, secs: f64) -> Result<Vec<ScalingRow>> {
    use compfs_blk::{Config, PageStore, PAGE};
    let data = std::fs::read(input)?;
    let pages = (data.len() / PAGE) as u64;
    if pages == 0 {
        bail!("the input is smaller than a page");
    }
    let spec = compfs_codec::CodecSpec::parse(codec)
        .map_err(|e| failed!("{e}"))?
        .spec;
    let store = PageStore::new(Config {
        size: pages * PAGE as u64,
        algo: spec,
        recomp: vec![],
        mem_limit: 0,
    })
    .map_err(|e| failed!("{e}"))?;
    store
        .write(0, &data[..pages as usize * PAGE])
        .map_err(|e| failed!("{e}"))?;
    let mut rows = Vec::new();
    for op in ["read", "write"] {
        for threads in [1u32, 2] {
            let t0 = Instant::now();
            let total: u64 = std::thread::scope(|sc| {
                let hs: Vec<_> = (0..threads)
                    .map(|t| {
                        let (store, data) = (&store, &data);
                        sc.spawn(move || {
                            let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(t);
                            let mut buf = vec![0u8; PAGE];
                            let mut n = 0u64;
                            while t0.elapsed().as_secs_f64() < secs {
                                for _ in 0..256 {
                                    x ^= x << 13;
                                    x ^= x >> 7;
                                    x ^= x << 17;
                                    let p = x % pages;
                                    let r = if op == "read" {
                                        store.read(p * PAGE as u64, &mut buf)
                                    } else {
                                        let src = ((x >> 32) % pages) as usize * PAGE;
                                        store.write(p * PAGE as u64, &data[src..src + PAGE])
                                    };
                                    if r.is_ok() {
                                        n += 1;
                                    }
                                }
                            }
                            n
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap_or(0)).sum()
            });
            let rate = total as f64 / t0.elapsed().as_secs_f64();
            eprintln!("  store {codec} {op} threads={threads}: {rate:.0} pages/s");
            rows.push(ScalingRow {
                op: format!("{codec} {op}"),
                threads,
                pages_per_s: rate,
            });
        }
    }
    Ok(rows)
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn rss(pid: u32) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| failed!("no VmRSS for pid {pid}"))?;
    Ok(kb * 1024)
}

fn wait_for(path: &Path) -> Result<()> {
    let start = Instant::now();
    while !path.exists() {
        if start.elapsed() > Duration::from_secs(20) {
            bail!("{} did not appear", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn check(cmd: &mut Command) -> Result<std::process::Output> {
    let o = cmd
        .output()
        .with_context(|| format!("cannot run {cmd:?} (install it with scripts/deps.sh)"))?;
    if !o.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(o)
}

/// Copies `input` onto the NBD export and returns MB/s.
fn nbdcopy_in(input: &Path, uri: &str) -> Result<f64> {
    let t = Instant::now();
    check(Command::new("nbdcopy").arg(input).arg(uri))?;
    let secs = t.elapsed().as_secs_f64();
    Ok(std::fs::metadata(input)?.len() as f64 / 1e6 / secs)
}

/// The fio jobs: (jobs, iodepth) for each of randread and randwrite. One job at iodepth 1 is one
/// request at a time (latency); iodepth 32 keeps a connection's queue full (the server's
/// per-request cost with no client wait); two jobs are two connections at once.
pub const FIO_JOBS: [(u32, u32); 4] = [(1, 1), (2, 1), (1, 32), (2, 32)];

fn fio(
    target: &[String],
    rw: &str,
    (jobs, iodepth): (u32, u32),
    runtime: u64,
    size: u64,
) -> Result<f64> {
    let mut args: Vec<String> = [
        "--name=blk",
        &format!("--rw={rw}"),
        "--bs=4k",
        &format!("--numjobs={jobs}"),
        "--group_reporting",
        "--time_based",
        &format!("--runtime={runtime}"),
        &format!("--size={size}"),
        &format!("--iodepth={iodepth}"),
        "--buffer_compress_percentage=50",
        "--refill_buffers",
        "--randrepeat=0",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    args.extend_from_slice(target);
    crate::fio::iops(&args, rw)
}

/// Runs every fio job `reps` times on each target, alternating targets so a busy machine
/// affects them alike, and records the medians.
fn fio_interleaved(
    targets: &[(String, Vec<String>)],
    a: &Args,
    size: u64,
    out: &mut Vec<FioRow>,
) -> Result<()> {
    for rw in ["randread", "randwrite"] {
        for (jobs, iodepth) in FIO_JOBS {
            let mut runs = vec![Vec::new(); targets.len()];
            for _ in 0..a.reps.max(1) {
                for (i, (_, args)) in targets.iter().enumerate() {
                    runs[i].push(fio(args, rw, (jobs, iodepth), a.runtime, size)?);
                }
            }
            for ((device, _), mut r) in targets.iter().zip(runs) {
                let mut sorted = r.clone();
                sorted.sort_by(f64::total_cmp);
                let iops = sorted[sorted.len() / 2];
                eprintln!(
                    "  fio {device} {rw} jobs={jobs} iodepth={iodepth}: {iops:.0} IOPS (runs {r:.0?})"
                );
                r.shrink_to_fit();
                out.push(FioRow {
                    device: device.clone(),
                    rw: rw.into(),
                    jobs,
                    iodepth,
                    iops,
                    runs: r,
                });
            }
        }
    }
    Ok(())
}

fn row(device: &str, codec: &str, s: &Stats, rss: Option<u64>, mb_s: f64) -> RatioRow {
    let r = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    RatioRow {
        device: device.into(),
        codec: codec.into(),
        orig: s.orig_data_size,
        compr: s.compr_data_size,
        mem_used: s.mem_used_total,
        orig_per_compr: r(s.orig_data_size, s.compr_data_size),
        orig_per_mem: r(s.orig_data_size, s.mem_used_total),
        mem_per_compr: r(s.mem_used_total, s.compr_data_size),
        rss,
        write_mb_s: mb_s,
        dict: None,
    }
}

/// A started, filled server: its ratio row, the process (killed on drop) and its URI.
struct Filled {
    row: RatioRow,
    _proc: Proc,
    uri: String,
}

fn compfs_run(input: &Path, dir: &Path, codec: &str, size: u64) -> Result<Filled> {
    compfs_run_with(input, dir, codec, size, false)
}

/// Polls the server's `dict` stat line until a training has happened and nothing is due or
/// under way; returns it and the seconds waited.
fn dict_settle(ctl: &Path) -> Result<(compfs_blk::store::DictStatus, f64)> {
    let t = Instant::now();
    loop {
        let lines = control_request(ctl, "stat").map_err(|e| failed!("{e}"))?;
        let st = lines
            .iter()
            .find_map(|l| l.strip_prefix("dict "))
            .and_then(compfs_blk::store::DictStatus::parse)
            .ok_or_else(|| failed!("no dict line in the stat reply"))?;
        // The server retrains after IDLE_RETRAIN of quiet: give it that long first.
        if st.trainings >= 1 && !st.busy && t.elapsed() > Duration::from_millis(1500) {
            return Ok((st, t.elapsed().as_secs_f64()));
        }
        if t.elapsed() > Duration::from_secs(600) {
            bail!("the server did not settle: {st:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn compfs_run_with(input: &Path, dir: &Path, codec: &str, size: u64, dict: bool) -> Result<Filled> {
    static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let sock = dir.join(format!("compfs-{}-{n}.sock", codec.replace(':', "-")));
    let exe = std::env::current_exe()?;
    let child = Command::new(exe)
        .args(["blk", "serve", "--size", &size.to_string(), "--algo", codec])
        .args(if dict { &["--dict", "auto"][..] } else { &[] })
        .arg("--socket")
        .arg(&sock)
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start compfs blk serve")?;
    let p = Proc(child);
    wait_for(&control_path(&sock))?;
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    let mb_s = nbdcopy_in(input, &uri)?;
    let settled = if dict {
        Some(dict_settle(&control_path(&sock))?)
    } else {
        None
    };
    let (stats, _) = stat_of(&control_path(&sock))?;
    let mut row = row("compfs", codec, &stats, Some(rss(p.0.id())?), mb_s);
    if let Some((st, settle_s)) = settled {
        row.codec = format!("{codec} --dict auto");
        row.dict = Some(DictRow {
            train_ms_total: st.train_ms_total,
            train_ms_last: st.train_ms_last,
            trainings: st.trainings,
            recompressed: st.recompressed,
            dict_bytes: st.bytes,
            settle_s,
        });
    }
    Ok(Filled { row, _proc: p, uri })
}

fn nbdkit_run(input: &Path, dir: &Path, size: u64) -> Result<Filled> {
    // A killed nbdkit may leave its socket file behind: never reuse a name.
    static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let sock = dir.join(format!("nbdkit-{n}.sock"));
    let child = Command::new("nbdkit")
        .args(["-f", "-U"])
        .arg(&sock)
        .args(["memory", &format!("size={size}")])
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start nbdkit (install it with scripts/deps.sh)")?;
    let p = Proc(child);
    wait_for(&sock)?;
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    let mb_s = nbdcopy_in(input, &uri)?;
    let len = std::fs::metadata(input)?.len();
    let rss = rss(p.0.id())?;
    let stats = Stats {
        orig_data_size: len,
        compr_data_size: len,
        mem_used_total: rss,
        ..Stats::default()
    };
    let row = row("nbdkit memory", "none", &stats, Some(rss), mb_s);
    Ok(Filled { row, _proc: p, uri })
}

const ZRAM: &str = "/sys/block/zram0";

fn zram_write(name: &str, value: &str) -> Result<()> {
    std::fs::write(format!("{ZRAM}/{name}"), value)
        .with_context(|| format!("cannot write {value} to {ZRAM}/{name}"))
}

fn zram_run(
    input: &Path,
    alg: &str,
    size: u64,
    a: &Args,
    fio_rows: &mut Vec<FioRow>,
) -> Result<RatioRow> {
    zram_write("reset", "1")?;
    zram_write("comp_algorithm", alg)?;
    zram_write("disksize", &size.to_string())?;
    let t = Instant::now();
    check(Command::new("dd").args([
        &format!("if={}", input.display()),
        "of=/dev/zram0",
        "bs=1M",
        "oflag=direct",
        "status=none",
    ]))?;
    let mb_s = std::fs::metadata(input)?.len() as f64 / 1e6 / t.elapsed().as_secs_f64();
    let mm = std::fs::read_to_string(format!("{ZRAM}/mm_stat"))?;
    let stats = Stats::parse(mm.trim(), "0 0 0 0", "0 0 0")
        .ok_or_else(|| failed!("cannot parse zram mm_stat '{mm}'"))?;
    let r = row("kernel zram", alg, &stats, None, mb_s);
    if !a.no_fio && alg == "lz4" {
        let target = vec![
            // libaio keeps iodepth requests in flight (psync would run one at a time).
            "--ioengine=libaio".to_string(),
            "--direct=1".into(),
            "--filename=/dev/zram0".into(),
        ];
        fio_interleaved(&[("kernel zram lz4".into(), target)], a, size, fio_rows)?;
    }
    zram_write("reset", "1")?;
    Ok(r)
}

/// IOPS runs as "12.3k 11.0k".
fn runs(r: &[f64]) -> String {
    let v: Vec<String> = r.iter().map(|x| format!("{:.1}k", x / 1000.0)).collect();
    v.join(" ")
}

fn human_mb(b: u64) -> String {
    format!("{:.1}", b as f64 / 1048576.0)
}

fn print_tables(rep: &Report) {
    println!("input: {} ({} MiB)\n", rep.input, human_mb(rep.input_bytes));
    println!(
        "| device | codec | orig MiB | compr MiB | mem_used MiB | orig/compr | orig/mem | mem/compr | RSS MiB | write MB/s |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rep.ratios {
        println!(
            "| {} | {} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {} | {:.0} |",
            r.device,
            r.codec,
            human_mb(r.orig),
            human_mb(r.compr),
            human_mb(r.mem_used),
            r.orig_per_compr,
            r.orig_per_mem,
            r.mem_per_compr,
            r.rss.map(human_mb).unwrap_or_else(|| "-".into()),
            r.write_mb_s
        );
    }
    let dict_rows: Vec<&RatioRow> = rep.ratios.iter().filter(|r| r.dict.is_some()).collect();
    if !dict_rows.is_empty() {
        println!("\n| codec | orig/compr | vs no dictionary | trainings | train ms (last / total) | dictionary + samples KiB | pages moved | settle s | write MB/s (without) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for r in dict_rows {
            let Some(d) = &r.dict else { continue };
            let base = rep.ratios.iter().find(|b| {
                b.dict.is_none()
                    && b.device == "compfs"
                    && r.codec.starts_with(&format!("{} ", b.codec))
            });
            println!(
                "| {} | {:.3} | {} | {} | {} / {} | {} | {} | {:.1} | {:.0} ({}) |",
                r.codec,
                r.orig_per_compr,
                base.map_or("-".into(), |b| format!(
                    "{:.3}x",
                    r.orig_per_compr / b.orig_per_compr
                )),
                d.trainings,
                d.train_ms_last,
                d.train_ms_total,
                d.dict_bytes / 1024,
                d.recompressed,
                d.settle_s,
                r.write_mb_s,
                base.map_or("-".into(), |b| format!("{:.0}", b.write_mb_s)),
            );
        }
    }
    if !rep.fio.is_empty() {
        println!(
            "\n| device | job | jobs | iodepth | IOPS (median) | runs |\n|---|---|---:|---:|---:|---|"
        );
        for f in &rep.fio {
            let runs: Vec<String> = f.runs.iter().map(|r| format!("{r:.0}")).collect();
            println!(
                "| {} | {} 4k | {} | {} | {:.0} | {} |",
                f.device,
                f.rw,
                f.jobs,
                f.iodepth,
                f.iops,
                runs.join(" ")
            );
        }
        print_fio_ratios(&rep.fio);
    }
}

/// compfs against nbdkit memory, job by job (medians of the same run).
fn print_fio_ratios(rows: &[FioRow]) {
    let find = |dev: &str, f: &FioRow| {
        rows.iter().find(|g| {
            g.device.starts_with(dev) && g.rw == f.rw && g.jobs == f.jobs && g.iodepth == f.iodepth
        })
    };
    let pairs: Vec<(&FioRow, &FioRow)> = rows
        .iter()
        .filter(|f| f.device.starts_with("compfs"))
        .filter_map(|f| find("nbdkit", f).map(|n| (f, n)))
        .collect();
    if pairs.is_empty() {
        return;
    }
    println!("\n| job | jobs | iodepth | compfs IOPS | nbdkit IOPS | compfs / nbdkit |\n|---|---:|---:|---:|---:|---:|");
    for (c, n) in pairs {
        println!(
            "| {} 4k | {} | {} | {:.0} | {:.0} | {:.2}x |",
            c.rw,
            c.jobs,
            c.iodepth,
            c.iops,
            n.iops,
            if n.iops > 0.0 { c.iops / n.iops } else { 0.0 }
        );
    }
}

fn print_policy(rep: &Report) {
    if rep.policy.is_empty() {
        return;
    }
    println!(
        "\n| phase (working set) | IOPS with --policy | IOPS without | ratio | runs with / without | promoted | mem_used MiB with | without | RSS MiB with | without | written back | policy |\n|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|"
    );
    for r in &rep.policy {
        println!(
            "| {} (quarter {}) | {:.0} | {:.0} | {:.2}x | {} / {} | {} | {} | {} | {} | {} | {} | {} |",
            r.phase,
            r.phase + 1,
            r.iops_policy,
            r.iops_plain,
            if r.iops_plain > 0.0 {
                r.iops_policy / r.iops_plain
            } else {
                0.0
            },
            runs(&r.runs_policy),
            runs(&r.runs_plain),
            r.promoted,
            human_mb(r.mem_used_policy),
            human_mb(r.mem_used_plain),
            human_mb(r.rss_policy),
            human_mb(r.rss_plain),
            r.bd_count_policy,
            r.policy_line
        );
    }
}

fn print_scaling(rep: &Report) {
    if rep.store_scaling.is_empty() {
        return;
    }
    println!("\n| page store (in process) | threads | pages/s |\n|---|---:|---:|");
    for r in &rep.store_scaling {
        println!("| {} 4k | {} | {:.0} |", r.op, r.threads, r.pages_per_s);
    }
}

/// Runs `compfs bench blk`.
pub fn run(a: Args) -> Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("compfs-bench-blk-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    run_in(&a, dir.path())
}

fn run_in(a: &Args, dir: &Path) -> Result<()> {
    let input = corpus::plain_file(&a.input, dir)?;
    let len = std::fs::metadata(&input)
        .with_context(|| format!("cannot read {}", input.display()))?
        .len();
    let size = len.div_ceil(1 << 20) << 20;
    let mut ratios = Vec::new();
    let mut fio_rows = Vec::new();
    for codec in a.codecs.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        eprintln!("compfs blk {codec} ...");
        ratios.push(compfs_run(&input, dir, codec, size)?.row);
    }
    for codec in a.dict.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        eprintln!("compfs blk {codec} --dict auto ...");
        ratios.push(compfs_run_with(&input, dir, codec, size, true)?.row);
    }
    eprintln!("nbdkit memory ...");
    match nbdkit_run(&input, dir, size) {
        Ok(f) => ratios.push(f.row),
        Err(e) => eprintln!("compfs: skipping nbdkit: {e:#}"),
    }
    if !a.no_fio {
        // Both servers run at once, filled with the input, and take turns.
        eprintln!(
            "fio: compfs {} and nbdkit memory, alternating ...",
            a.fio_codec
        );
        let c = compfs_run(&input, dir, &a.fio_codec, size)?;
        let n = nbdkit_run(&input, dir, size)?;
        let nbd = |uri: &str| vec!["--ioengine=nbd".to_string(), format!("--uri={uri}")];
        fio_interleaved(
            &[
                (format!("compfs {}", a.fio_codec), nbd(&c.uri)),
                ("nbdkit memory".into(), nbd(&n.uri)),
            ],
            a,
            size,
            &mut fio_rows,
        )?;
    }
    let root = rustix::process::geteuid().is_root();
    if !a.no_zram && root && Path::new(ZRAM).exists() {
        let avail = std::fs::read_to_string(format!("{ZRAM}/comp_algorithm"))?;
        for alg in ["lzo-rle", "lzo", "lz4", "zstd"] {
            if avail
                .split_whitespace()
                .any(|w| w.trim_matches(|c| c == '[' || c == ']') == alg)
            {
                eprintln!("kernel zram {alg} ...");
                ratios.push(zram_run(&input, alg, size, a, &mut fio_rows)?);
            }
        }
    } else if !a.no_zram {
        eprintln!("compfs: skipping kernel zram (needs root and /dev/zram0)");
    }
    let policy = if a.no_fio || a.policy_secs == 0 {
        Vec::new()
    } else {
        eprintln!(
            "memory policy: compfs {} with and without --policy ...",
            a.fio_codec
        );
        policy_run(&input, dir, &a.fio_codec, size, a.policy_secs)?
    };
    let store_scaling = if a.no_fio {
        Vec::new()
    } else {
        eprintln!("in-process page store, 1 and 2 threads ...");
        store_scaling(&input, &a.fio_codec, a.runtime as f64)?
    };
    let rep = Report {
        input: a.input.display().to_string(),
        input_bytes: len,
        ratios,
        fio: fio_rows,
        store_scaling,
        policy,
    };
    print_tables(&rep);
    print_scaling(&rep);
    print_policy(&rep);
    if let Some(j) = &a.json {
        std::fs::write(j, serde_json::to_string_pretty(&rep)?)
            .with_context(|| format!("cannot write {}", j.display()))?;
    }
    if let Some(s) = &a.svg {
        crate::plot::blk(&rep, s)?;
    }
    Ok(())
}
