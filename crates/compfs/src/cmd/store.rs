//! Store commands: `compfs mkfs`, `compfs fsck`, `compfs gc`, and `compfs bench store`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use compfs_codec::{CodecSpec, Compressor, Mode};
use compfs_store::{
    fsck, uuid_string, CreateOptions, FileKind, OpenOptions, Store, Tuning, ROOT_INO,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use super::util::{human, parse_size};

#[derive(clap::Args, Debug)]
pub struct MkfsArgs {
    /// Directory to hold the store (created if missing; must be empty unless --force).
    pub store: PathBuf,
    /// Extent size: a power of two from 4K to 1M.
    #[arg(long, default_value = "128K")]
    pub extent_size: String,
    /// Default compression (btrfs syntax: zstd:3, zlib:9, lzo, lz4, none); the heuristic
    /// decides per extent whether to try, like `compress=`.
    #[arg(long, default_value = "zstd:3", conflicts_with = "compress_force")]
    pub compress: String,
    /// Default compression in force mode, like `compress-force=`.
    #[arg(long)]
    pub compress_force: Option<String>,
    /// Overwrite an existing store or create in a non-empty directory.
    #[arg(long)]
    pub force: bool,
}

#[derive(clap::Args, Debug)]
pub struct FsckArgs {
    /// The store directory (not in use by a mount).
    pub store: PathBuf,
    /// Do the safe repairs: drop references to corrupt extents, fix counts, free orphans.
    #[arg(long)]
    pub repair: bool,
}

#[derive(clap::Args, Debug)]
pub struct GcArgs {
    /// The store directory (not in use by a mount).
    pub store: PathBuf,
}

fn spec(s: &str) -> Result<CodecSpec> {
    let p = CodecSpec::parse(s).map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Some(a) = p.adjustment {
        eprintln!("compfs: {a}");
    }
    Ok(p.spec)
}

pub fn mkfs(a: MkfsArgs) -> Result<ExitCode> {
    let extent = parse_size(&a.extent_size)?;
    let (compression, mode) = match &a.compress_force {
        Some(s) => (spec(s)?, Mode::Force),
        None => (spec(&a.compress)?, Mode::Heuristic),
    };
    let opts = CreateOptions {
        extent_size: u32::try_from(extent).context("extent size too large")?,
        compression,
        mode,
        force: a.force,
    };
    let s = Store::create(&a.store, &opts).map_err(|e| anyhow::anyhow!("{e}"))?;
    let sb = s.superblock();
    s.close()?;
    println!(
        "created compfs store {} (UUID {}, extent size {}, {}={})",
        a.store.display(),
        uuid_string(&sb.uuid),
        human(sb.extent_size as u64),
        mode,
        compression
    );
    Ok(ExitCode::SUCCESS)
}

pub fn fsck_cmd(a: FsckArgs) -> Result<ExitCode> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message("checking");
    let r = fsck(&a.store, a.repair, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    let r = match r {
        Ok(r) => r,
        Err(e) => {
            eprintln!("compfs fsck: {e}");
            return Ok(ExitCode::from(8));
        }
    };
    for p in &r.problems {
        let tag = if p.kind.is_info() {
            "note"
        } else if p.repaired {
            "FIXED"
        } else {
            "ERROR"
        };
        println!("{tag}: {:?}: {}", p.kind, p.message);
    }
    println!(
        "{}: {} inodes, {} extents ({} verified), {} segments, {} reclaimable by gc; {} errors, {} repaired",
        a.store.display(),
        r.inodes,
        r.extents,
        human(r.bytes_verified),
        r.segments,
        human(r.dead_bytes),
        r.errors(),
        r.repaired()
    );
    // e2fsck exit codes: 0 clean, 1 errors corrected, 4 errors left uncorrected.
    Ok(ExitCode::from(if r.unrepaired() > 0 {
        4
    } else if r.repaired() > 0 {
        1
    } else {
        0
    }))
}

pub fn gc(a: GcArgs) -> Result<ExitCode> {
    let s = Store::open(&a.store, &OpenOptions::default()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let r = s.gc().map_err(|e| anyhow::anyhow!("{e}"))?;
    s.close()?;
    println!(
        "gc: examined {} segments, freed {}, moved {} extents ({}); segment files {} -> {}",
        r.segments_examined,
        r.segments_freed,
        r.extents_moved,
        human(r.bytes_moved),
        human(r.bytes_before),
        human(r.bytes_after)
    );
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Corpus: a .tar.zst (unpacked with `zstd -dc | tar x`), a directory or files.
    #[arg(long, default_value = "../shared/corpus/silesia.tar.zst")]
    pub corpus: PathBuf,
    /// Levels for the sequential-write test.
    #[arg(long, default_value = "zstd:1,zstd:3")]
    pub levels: String,
    /// Where to create the stores (default: a temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Copies of the corpus written (under different names) in the sequential test. Ten
    /// copies of the 86 MB corpus take about a second, as long as the single-thread
    /// measurement; with three, start-up costs (the first buffers, the final sync) weigh on a
    /// 0.3 s run.
    #[arg(long, default_value_t = 10)]
    pub copies: usize,
    /// Rounds of the sequential test (single-thread and store runs alternate; best counts).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Size of the file for random 4 KiB overwrites.
    #[arg(long, default_value = "256M")]
    pub random_file: String,
    /// Seconds of random overwrites.
    #[arg(long, default_value_t = 10.0)]
    pub random_secs: f64,
    /// Compression worker threads (default: cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Write results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Serialize, Debug, Default)]
struct SeqResult {
    spec: String,
    input_bytes: u64,
    single_thread_mb_s: f64,
    store_write_mb_s: f64,
    store_write_no_sync_mb_s: f64,
    speedup: f64,
    /// CPU time of the process over wall time, writes and sync (2.0 = both cores busy).
    cores_busy: f64,
    ratio: f64,
    /// One reader, 128 KiB reads, fresh store (extent cache empty).
    read_mb_s: f64,
}

#[derive(Serialize, Debug, Default)]
struct GcResult {
    rounds: u32,
    live_bytes: u64,
    segment_bytes_before_gc: u64,
    segment_bytes_after_gc: u64,
    overhead_after_gc: f64,
    gc_secs: f64,
    segment_bytes_after_delete_and_gc: u64,
}

#[derive(Serialize, Debug, Default)]
struct RandResult {
    file_bytes: u64,
    writes: u64,
    secs: f64,
    iops: f64,
    user_bytes: u64,
    segment_bytes: u64,
    write_amplification: f64,
}

#[derive(Serialize, Debug, Default)]
struct Report {
    threads: usize,
    sequential: Vec<SeqResult>,
    gc: GcResult,
    random_4k: RandResult,
}

struct TempDir(PathBuf, bool);
impl Drop for TempDir {
    fn drop(&mut self) {
        if self.1 {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn load_corpus(p: &Path, tmp: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files = Vec::new();
    let root = if p.is_file() && p.to_string_lossy().ends_with(".tar.zst") {
        let out = tmp.join("corpus");
        std::fs::create_dir_all(&out)?;
        let st = std::process::Command::new("sh")
            .arg("-c")
            .arg("zstd -dc \"$1\" | tar x -C \"$2\"")
            .arg("sh")
            .arg(p)
            .arg(&out)
            .status()
            .context("cannot run zstd and tar")?;
        if !st.success() {
            bail!("unpacking {} failed: is zstd installed?", p.display());
        }
        out
    } else {
        p.to_path_buf()
    };
    let mut todo = vec![root];
    while let Some(d) = todo.pop() {
        if d.is_dir() {
            let mut v: Vec<PathBuf> = std::fs::read_dir(&d)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            v.sort();
            todo.extend(v.into_iter().rev());
        } else if d.is_file() {
            let name = d
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default();
            files.push((name, std::fs::read(&d)?));
        }
    }
    if files.is_empty() {
        bail!("no files in the corpus {}", p.display());
    }
    Ok(files)
}

fn se(e: compfs_store::Error) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

fn mb_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64().max(1e-9)
}

fn bench_tuning() -> Tuning {
    Tuning::default()
}

/// Writes every corpus file through the store in 128 KiB writes (as FUSE delivers them).
fn write_corpus(s: &Store, files: &[(String, Vec<u8>)], prefix: &str) -> Result<()> {
    for (name, data) in files {
        let n = format!("{prefix}{name}");
        let ino = match s.lookup(ROOT_INO, n.as_bytes()) {
            Ok(a) => a.ino,
            Err(_) => {
                s.mknod(ROOT_INO, n.as_bytes(), FileKind::File, 0o644, 0, 0, 0)
                    .map_err(se)?
                    .ino
            }
        };
        s.open_file(ino).map_err(se)?;
        for (i, c) in data.chunks(128 << 10).enumerate() {
            s.write(ino, (i as u64) << 17, c).map_err(se)?;
        }
        s.release(ino).map_err(se)?;
    }
    Ok(())
}

/// CPU time (user + system) this process has used so far.
fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the zeroed struct we own.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn single_thread(spec: CodecSpec, files: &[(String, Vec<u8>)]) -> Result<f64> {
    let mut c = Compressor::new();
    let mut dst = Vec::new();
    let total: u64 = files.iter().map(|f| f.1.len() as u64).sum();
    let mut best = f64::MAX;
    let start = Instant::now();
    while best == f64::MAX || start.elapsed() < Duration::from_secs(1) {
        let t = Instant::now();
        for (_, d) in files {
            for b in d.chunks(128 << 10) {
                c.compress(spec, b, &mut dst)
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
            }
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(total as f64 / 1e6 / best)
}

pub fn bench(a: BenchArgs) -> Result<ExitCode> {
    let threads = a.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
    });
    let base = match &a.dir {
        Some(d) => TempDir(d.join(format!("compfs-bench-{}", std::process::id())), true),
        None => TempDir(
            std::env::temp_dir().join(format!("compfs-bench-store-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&base.0)?;
    let files = load_corpus(&a.corpus, &base.0)?;
    let total: u64 = files.iter().map(|f| f.1.len() as u64).sum();
    println!(
        "corpus: {} files, {}; {} compression threads",
        files.len(),
        human(total),
        threads
    );
    let mut rep = Report {
        threads,
        ..Report::default()
    };
    let oo = OpenOptions {
        threads,
        ..OpenOptions::default()
    };

    println!(
        "\nsequential write through the store API (128 KiB writes, then sync), compress-force:"
    );
    println!(
        "{:<8} {:>14} {:>14} {:>14} {:>9} {:>6} {:>7} {:>10}",
        "spec",
        "1-thread MB/s",
        "writes MB/s",
        "+sync MB/s",
        "speedup",
        "cores",
        "ratio",
        "read MB/s"
    );
    for l in a.levels.split(',') {
        let sp = spec(l)?;
        // Alternate single-thread and store runs and keep the best of each, so that a change
        // in the machine's load hits both sides alike.
        let (mut st, mut w, mut el) = (0f64, Duration::MAX, Duration::MAX);
        let mut cores = 0.0;
        let mut ratio = 0.0;
        let mut read = Duration::MAX;
        let bytes = total * a.copies as u64;
        for round in 0..a.rounds.max(1) {
            st = st.max(single_thread(sp, &files)?);
            let dir = base.0.join(format!("seq-{sp}-{round}"));
            let s = Store::create_tuned(
                &dir,
                &CreateOptions {
                    compression: sp,
                    mode: Mode::Force,
                    ..CreateOptions::default()
                },
                bench_tuning(),
            )
            .map_err(se)?;
            s.close().map_err(se)?;
            let s = Store::open_tuned(&dir, &oo, bench_tuning()).map_err(se)?;
            // All copies, then one sync (as `cp -r` then `sync` in the filesystem benchmark).
            let (t, c0) = (Instant::now(), cpu_time());
            for c in 0..a.copies {
                write_corpus(&s, &files, &format!("{c}-"))?;
            }
            let w1 = t.elapsed();
            s.sync().map_err(se)?;
            let el1 = t.elapsed();
            if el1 < el {
                cores = (cpu_time() - c0).as_secs_f64() / el1.as_secs_f64();
            }
            w = w.min(w1);
            el = el.min(el1);
            let u = s.usage(&[ROOT_INO]).map_err(se)?;
            ratio = u.total.referenced as f64 / u.total.disk.max(1) as f64;
            s.close().map_err(se)?;
            // Read everything back through a freshly opened store (empty extent cache; the
            // segment files may still be in the OS page cache).
            let s = Store::open_tuned(&dir, &oo, bench_tuning()).map_err(se)?;
            let t = Instant::now();
            let mut buf = vec![0u8; 128 << 10];
            let mut got = 0u64;
            for e in s
                .readdir(ROOT_INO, 0, usize::MAX)
                .map_err(se)?
                .into_iter()
                .skip(2)
            {
                let mut off = 0u64;
                loop {
                    let n = s.read(e.ino, off, &mut buf).map_err(se)?;
                    if n == 0 {
                        break;
                    }
                    off += n as u64;
                    got += n as u64;
                }
            }
            read = read.min(t.elapsed());
            if got != bytes {
                bail!("read back {got} bytes, wrote {bytes}");
            }
            s.close().map_err(se)?;
            let _ = std::fs::remove_dir_all(&dir);
        }
        let r = SeqResult {
            spec: sp.to_string(),
            input_bytes: bytes,
            single_thread_mb_s: st,
            store_write_mb_s: mb_s(bytes, el),
            store_write_no_sync_mb_s: mb_s(bytes, w),
            speedup: mb_s(bytes, el) / st,
            cores_busy: cores,
            ratio,
            read_mb_s: mb_s(bytes, read),
        };
        println!(
            "{:<8} {:>14.1} {:>14.1} {:>14.1} {:>8.2}x {:>6.2} {:>7.3} {:>10.1}",
            r.spec,
            r.single_thread_mb_s,
            r.store_write_no_sync_mb_s,
            r.store_write_mb_s,
            r.speedup,
            r.cores_busy,
            r.ratio,
            r.read_mb_s
        );
        rep.sequential.push(r);
    }

    // GC: write the corpus, overwrite it 3 times, collect.
    {
        let dir = base.0.join("gc");
        let sp = spec("zstd:1")?;
        let s = Store::create_tuned(
            &dir,
            &CreateOptions {
                compression: sp,
                mode: Mode::Force,
                ..CreateOptions::default()
            },
            Tuning {
                flush_interval: None,
                ..bench_tuning()
            },
        )
        .map_err(se)?;
        for _ in 0..4 {
            write_corpus(&s, &files, "")?;
            s.sync().map_err(se)?;
        }
        let before = dir_bytes(&dir.join("segments"))?;
        let t = Instant::now();
        s.gc().map_err(se)?;
        let gc_secs = t.elapsed().as_secs_f64();
        let st = s.stats();
        let after = dir_bytes(&dir.join("segments"))?;
        // Deleting every file must return the space too.
        for (name, _) in &files {
            s.unlink(ROOT_INO, name.as_bytes()).map_err(se)?;
        }
        s.gc().map_err(se)?;
        let after_delete = dir_bytes(&dir.join("segments"))?;
        s.close().map_err(se)?;
        rep.gc = GcResult {
            rounds: 3,
            live_bytes: st.live_bytes,
            segment_bytes_before_gc: before,
            segment_bytes_after_gc: after,
            overhead_after_gc: after as f64 / st.live_bytes.max(1) as f64 - 1.0,
            gc_secs,
            segment_bytes_after_delete_and_gc: after_delete,
        };
        println!(
            "\nGC after writing the corpus and overwriting it 3 times (zstd:1): segment files {} before GC, {} after ({:.1}s); live compressed bytes {}; overhead {:.1}%; after deleting every file and GC: {}",
            human(before), human(after), gc_secs, human(st.live_bytes), rep.gc.overhead_after_gc * 100.0, human(after_delete)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    // Random 4 KiB overwrites into a compressed file.
    {
        let dir = base.0.join("rand");
        let size = parse_size(&a.random_file)?;
        let s = Store::create_tuned(&dir, &CreateOptions::default(), bench_tuning()).map_err(se)?;
        s.close().map_err(se)?;
        let s = Store::open_tuned(&dir, &oo, bench_tuning()).map_err(se)?;
        let ino = s
            .mknod(ROOT_INO, b"big", FileKind::File, 0o644, 0, 0, 0)
            .map_err(se)?
            .ino;
        let mut off = 0u64;
        'fill: loop {
            for (_, d) in &files {
                for c in d.chunks(128 << 10) {
                    if off >= size {
                        break 'fill;
                    }
                    let n = (c.len() as u64).min(size - off) as usize;
                    s.write(ino, off, &c[..n]).map_err(se)?;
                    off += n as u64;
                }
            }
        }
        s.sync().map_err(se)?;
        let st0 = s.stats();
        let mut rng = 0x9e3779b97f4a7c15u64;
        let block: Vec<u8> = files[0].1.iter().copied().cycle().take(4096).collect();
        let t = Instant::now();
        let mut n = 0u64;
        while t.elapsed().as_secs_f64() < a.random_secs {
            for _ in 0..64 {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let at = (rng % (size / 4096)) * 4096;
                s.write(ino, at, &block).map_err(se)?;
                n += 1;
            }
        }
        s.sync().map_err(se)?;
        let el = t.elapsed();
        let st1 = s.stats();
        s.close().map_err(se)?;
        let seg = st1.segment_bytes_written - st0.segment_bytes_written;
        rep.random_4k = RandResult {
            file_bytes: size,
            writes: n,
            secs: el.as_secs_f64(),
            iops: n as f64 / el.as_secs_f64(),
            user_bytes: n * 4096,
            segment_bytes: seg,
            write_amplification: seg as f64 / (n * 4096) as f64,
        };
        println!(
            "\nrandom 4 KiB overwrites into a {} zstd:3 file for {:.1}s (then sync): {} writes, {:.0} IOPS, segment bytes written / user bytes = {:.2}",
            human(size), el.as_secs_f64(), n, rep.random_4k.iops, rep.random_4k.write_amplification
        );
    }
    if let Some(j) = &a.json {
        std::fs::write(j, serde_json::to_string_pretty(&rep)?)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn dir_bytes(p: &Path) -> Result<u64> {
    let mut t = 0;
    for e in std::fs::read_dir(p)? {
        t += e?.metadata()?.len();
    }
    Ok(t)
}
