//! `compfs bench store`: the store API alone, without FUSE: sequential write speed against
//! single-thread compression, read-back, GC after overwrites, and random 4 KiB overwrites.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use compfs_codec::{human, parse_size, CodecSpec, Compressor, Mode};
use compfs_store::{CreateOptions, FileKind, OpenOptions, Store, Tuning, ROOT_INO};
use serde::Serialize;

use crate::corpus;
use crate::error::{bail, Result};

#[derive(clap::Args, Debug)]
pub struct Args {
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

fn mb_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64().max(1e-9)
}

fn bench_tuning() -> Tuning {
    Tuning::default()
}

/// Writes every corpus file through the store in 128 KiB writes (as FUSE delivers them).
pub(crate) fn write_corpus(s: &Store, files: &[(String, Vec<u8>)], prefix: &str) -> Result<()> {
    for (name, data) in files {
        let n = format!("{prefix}{name}");
        let ino = match s.lookup(ROOT_INO, n.as_bytes()) {
            Ok(a) => a.ino,
            Err(_) => {
                s.mknod(ROOT_INO, n.as_bytes(), FileKind::File, 0o644, 0, 0, 0)?
                    .ino
            }
        };
        s.open_file(ino)?;
        for (i, c) in data.chunks(128 << 10).enumerate() {
            s.write(ino, (i as u64) << 17, c)?;
        }
        s.release(ino)?;
    }
    Ok(())
}

/// CPU time (user + system, all threads) this process has used so far.
pub(crate) fn cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// A codec spec, telling the user when the level was adjusted.
fn spec(s: &str) -> Result<CodecSpec> {
    let p = CodecSpec::parse(s)?;
    if let Some(a) = p.adjustment {
        eprintln!("compfs: {a}");
    }
    Ok(p.spec)
}

pub(crate) fn single_thread(spec: CodecSpec, files: &[(String, Vec<u8>)]) -> Result<f64> {
    let mut c = Compressor::new();
    let mut dst = Vec::new();
    let total: u64 = files.iter().map(|f| f.1.len() as u64).sum();
    let mut best = f64::MAX;
    let start = Instant::now();
    while best == f64::MAX || start.elapsed() < Duration::from_secs(1) {
        let t = Instant::now();
        for (_, d) in files {
            for b in d.chunks(128 << 10) {
                c.compress(spec, b, &mut dst)?;
            }
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(total as f64 / 1e6 / best)
}

/// Runs `compfs bench store`.
pub fn run(a: Args) -> Result<()> {
    let threads = corpus::threads_or_cores(a.threads);
    let base = corpus::work_dir(a.dir.as_deref(), "store")?;
    let base = base.path();
    let files = corpus::load(&a.corpus, base)?;
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
            let dir = base.join(format!("seq-{sp}-{round}"));
            let s = Store::create_tuned(
                &dir,
                &CreateOptions {
                    compression: sp,
                    mode: Mode::Force,
                    ..CreateOptions::default()
                },
                bench_tuning(),
            )?;
            s.close()?;
            let s = Store::open_tuned(&dir, &oo, bench_tuning())?;
            // All copies, then one sync (as `cp -r` then `sync` in the filesystem benchmark).
            let (t, c0) = (Instant::now(), cpu_time());
            for c in 0..a.copies {
                write_corpus(&s, &files, &format!("{c}-"))?;
            }
            let w1 = t.elapsed();
            s.sync()?;
            let el1 = t.elapsed();
            if el1 < el {
                cores = (cpu_time() - c0).as_secs_f64() / el1.as_secs_f64();
            }
            w = w.min(w1);
            el = el.min(el1);
            let u = s.usage(&[ROOT_INO])?;
            ratio = u.total.referenced as f64 / u.total.disk.max(1) as f64;
            s.close()?;
            // Read everything back through a freshly opened store (empty extent cache; the
            // segment files may still be in the OS page cache).
            let s = Store::open_tuned(&dir, &oo, bench_tuning())?;
            let t = Instant::now();
            let mut buf = vec![0u8; 128 << 10];
            let mut got = 0u64;
            for e in s.readdir(ROOT_INO, 0, usize::MAX)?.into_iter().skip(2) {
                let mut off = 0u64;
                loop {
                    let n = s.read(e.ino, off, &mut buf)?;
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
            s.close()?;
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
        let dir = base.join("gc");
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
        )?;
        for _ in 0..4 {
            write_corpus(&s, &files, "")?;
            s.sync()?;
        }
        let before = dir_bytes(&dir.join("segments"))?;
        let t = Instant::now();
        s.gc()?;
        let gc_secs = t.elapsed().as_secs_f64();
        let st = s.stats();
        let after = dir_bytes(&dir.join("segments"))?;
        // Deleting every file must return the space too.
        for (name, _) in &files {
            s.unlink(ROOT_INO, name.as_bytes())?;
        }
        s.gc()?;
        let after_delete = dir_bytes(&dir.join("segments"))?;
        s.close()?;
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
        let dir = base.join("rand");
        let size = parse_size(&a.random_file)?;
        let s = Store::create_tuned(&dir, &CreateOptions::default(), bench_tuning())?;
        s.close()?;
        let s = Store::open_tuned(&dir, &oo, bench_tuning())?;
        let ino = s
            .mknod(ROOT_INO, b"big", FileKind::File, 0o644, 0, 0, 0)?
            .ino;
        let mut off = 0u64;
        'fill: loop {
            for (_, d) in &files {
                for c in d.chunks(128 << 10) {
                    if off >= size {
                        break 'fill;
                    }
                    let n = (c.len() as u64).min(size - off) as usize;
                    s.write(ino, off, &c[..n])?;
                    off += n as u64;
                }
            }
        }
        s.sync()?;
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
                s.write(ino, at, &block)?;
                n += 1;
            }
        }
        s.sync()?;
        let el = t.elapsed();
        let st1 = s.stats();
        s.close()?;
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
    Ok(())
}

fn dir_bytes(p: &Path) -> Result<u64> {
    let mut t = 0;
    for e in std::fs::read_dir(p)? {
        t += e?.metadata()?.len();
    }
    Ok(t)
}
