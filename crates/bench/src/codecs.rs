//! `compfs bench codecs`: compress files in extent-sized blocks with each codec and level, like
//! `zstd -b -B<block>` / lzbench, and print ratio, compress and decompress MB/s, and the measured
//! memory of the compression and decompression contexts. `--vs-cli` runs the `zstd` and `lz4`
//! command-line benchmarks on the same bytes in the same run and prints their figures beside
//! ours. `--json` writes the table; `--plot` draws ratio against compress speed from that table.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use compfs_codec::spec::btrfs_zstd_workspace_bytes;
use compfs_codec::{
    check_extent_size, parse_level_list, Algorithm, CodecSpec, Compressor, Decompressor,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::corpus;
use crate::error::{bail, Context, Result};

use compfs_codec::{human, parse_size};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Codecs and levels: a comma-separated list of specs and level ranges, e.g.
    /// `zstd:-15..15,zlib:1..9,lzo,lz4`.
    #[arg(long, default_value = "zstd:-5..9,zlib:1..9,lzo,lz4")]
    pub levels: String,
    /// Block (extent) size, a power of two from 4K to 1M.
    #[arg(long, default_value = "128K")]
    pub block: String,
    /// Worker threads, each with its own contexts compressing its share of the blocks.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Minimum time per codec and direction, in seconds; the fastest pass counts, as in `zstd -b`.
    #[arg(long, default_value_t = 1.0)]
    pub min_time: f64,
    /// Rounds per codec; with --vs-cli ours and the tool's benchmark alternate in each round.
    /// The best figures of all rounds count, so a busy machine disturbs both sides alike.
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw ratio against compress speed, Pareto frontier marked, as SVG to this file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Also run the `zstd` and `lz4` command-line benchmarks on the same data (where installed).
    #[arg(long)]
    pub vs_cli: bool,
    /// Files to read (concatenated, then cut into blocks; a directory is read recursively).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// Figures reported by a command-line tool's benchmark mode.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CliFigures {
    pub tool: String,
    pub command: String,
    pub ratio: f64,
    pub compress_mbs: f64,
    pub decompress_mbs: f64,
}

/// One codec/level: our figures, and the CLI's beside them when measured.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub codec: String,
    pub algorithm: String,
    pub level: i32,
    pub ratio: f64,
    pub compress_mbs: f64,
    pub decompress_mbs: f64,
    /// Heap bytes one compression context holds after compressing a block (measured).
    pub cctx_bytes: u64,
    /// Heap bytes one decompression context holds after decompressing a block (measured).
    pub dctx_bytes: u64,
    /// btrfs's zstd workspace size for this level, for comparison.
    pub btrfs_workspace_bytes: Option<u64>,
    pub cli: Option<CliFigures>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub files: Vec<String>,
    pub input_bytes: u64,
    pub block: u64,
    pub blocks: u64,
    pub threads: usize,
    pub min_time_secs: f64,
    pub rounds: u32,
    pub rows: Vec<Row>,
}

/// Runs `compfs bench codecs`.
pub fn run(args: Args) -> Result<()> {
    let specs = parse_level_list(&args.levels)?;
    let block = parse_size(&args.block)? as usize;
    check_extent_size(block)?;
    if args.threads == 0 {
        bail!("--threads must be at least 1");
    }
    if !(args.min_time.is_finite() && args.min_time >= 0.0) {
        bail!("--min-time must be a non-negative number of seconds");
    }
    let mut data = Vec::new();
    corpus::concatenate(&args.files, &mut data)?;
    if data.is_empty() {
        bail!("no data: the given files are empty");
    }
    let blocks: Vec<&[u8]> = data.chunks(block).collect();
    let min_time = Duration::from_secs_f64(args.min_time);

    // The CLIs read a file: write the concatenation once, removed again on drop.
    let cli_input = if args.vs_cli {
        let mut f = tempfile::Builder::new()
            .prefix("compfs-bench-")
            .suffix(".bin")
            .tempfile()
            .context("cannot create a temporary file")?;
        f.write_all(&data)
            .with_context(|| format!("cannot write temporary file {}", f.path().display()))?;
        Some(f)
    } else {
        None
    };

    println!(
        "{} in {} blocks of {}, {} thread{}",
        human(data.len() as u64),
        blocks.len(),
        human(block as u64),
        args.threads,
        if args.threads == 1 { "" } else { "s" }
    );
    let bar = ProgressBar::new(specs.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed_precise}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    if args.vs_cli && args.threads > 1 {
        println!(
            "note: zstd -b and lz4 -b run single-threaded; ours uses {} threads",
            args.threads
        );
    }
    print_header(args.vs_cli);
    let mut rows = Vec::with_capacity(specs.len());
    for spec in specs {
        bar.set_message(format!("{spec}"));
        let mut m: Option<Measured> = None;
        let mut cli: Option<CliFigures> = None;
        for round in 0..args.rounds.max(1) {
            bar.set_message(format!("{spec} round {}", round + 1));
            let r = bench_spec(spec, &blocks, args.threads, min_time)?;
            m = Some(match m {
                Some(b) => b.best(r),
                None => r,
            });
            if let Some(f) = &cli_input {
                bar.set_message(format!("{spec} round {} (cli)", round + 1));
                if let Some(c) = run_cli(spec, f.path(), block, args.min_time)? {
                    cli = Some(match cli {
                        Some(b) => CliFigures {
                            compress_mbs: b.compress_mbs.max(c.compress_mbs),
                            decompress_mbs: b.decompress_mbs.max(c.decompress_mbs),
                            ..c
                        },
                        None => c,
                    });
                }
            }
        }
        // rounds.max(1) >= 1, so m was set.
        let m = m.unwrap_or_else(|| unreachable!());
        let (cctx, dctx) = context_memory(spec, blocks[0]);
        rows.push(Row {
            codec: spec.to_string(),
            algorithm: spec.algorithm().name().to_string(),
            level: spec.level(),
            ratio: m.ratio,
            compress_mbs: m.compress_mbs,
            decompress_mbs: m.decompress_mbs,
            cctx_bytes: cctx,
            dctx_bytes: dctx,
            btrfs_workspace_bytes: if spec.algorithm() == Algorithm::Zstd {
                btrfs_zstd_workspace_bytes(spec.level())
            } else {
                None
            },
            cli,
        });
        if let Some(r) = rows.last() {
            bar.suspend(|| println!("{}", format_row(r, args.vs_cli)));
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    if args.vs_cli {
        println!("ratio/, comp/, dec/: ours divided by the command-line tool's");
    }

    let report = Report {
        files: args.files.iter().map(|p| p.display().to_string()).collect(),
        input_bytes: data.len() as u64,
        block: block as u64,
        blocks: blocks.len() as u64,
        threads: args.threads,
        min_time_secs: args.min_time,
        rounds: args.rounds.max(1),
        rows,
    };
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        crate::plot::codecs(&report, path)?;
    }
    Ok(())
}

fn print_header(vs_cli: bool) {
    let mut head = format!(
        "{:<10} {:>7} {:>10} {:>10} {:>8} {:>8} {:>9}",
        "codec", "ratio", "comp MB/s", "dec MB/s", "cctx", "dctx", "btrfs ws"
    );
    if vs_cli {
        head += &format!(
            " | {:>7} {:>10} {:>10} | {:>7} {:>6} {:>6}",
            "cli rat", "comp MB/s", "dec MB/s", "ratio/", "comp/", "dec/"
        );
    }
    println!("{head}");
}

fn format_row(r: &Row, vs_cli: bool) -> String {
    let mut line = format!(
        "{:<10} {:>7.3} {:>10.1} {:>10.1} {:>8} {:>8} {:>9}",
        r.codec,
        r.ratio,
        r.compress_mbs,
        r.decompress_mbs,
        human(r.cctx_bytes),
        human(r.dctx_bytes),
        r.btrfs_workspace_bytes.map(human).unwrap_or_default(),
    );
    if vs_cli {
        match &r.cli {
            Some(c) => {
                line += &format!(
                    " | {:>7.3} {:>10.1} {:>10.1} | {:>7.4} {:>6.2} {:>6.2}",
                    c.ratio,
                    c.compress_mbs,
                    c.decompress_mbs,
                    r.ratio / c.ratio,
                    r.compress_mbs / c.compress_mbs,
                    r.decompress_mbs / c.decompress_mbs
                )
            }
            None => line += " | (no cli)",
        }
    }
    line
}

struct Measured {
    ratio: f64,
    compress_mbs: f64,
    decompress_mbs: f64,
}

impl Measured {
    /// The faster figures of two measurements of the same data.
    fn best(self, o: Measured) -> Measured {
        Measured {
            ratio: self.ratio,
            compress_mbs: self.compress_mbs.max(o.compress_mbs),
            decompress_mbs: self.decompress_mbs.max(o.decompress_mbs),
        }
    }
}

/// One worker's share: its contexts and its blocks' compressed forms, kept across passes so a
/// pass allocates nothing.
struct Worker<'a> {
    c: Compressor,
    d: Decompressor,
    blocks: &'a [&'a [u8]],
    compressed: Vec<Vec<u8>>,
    out: Vec<u8>,
}

/// Runs `pass` on every worker in parallel (inline with one worker) and returns the wall time.
fn timed_pass(
    workers: &mut [Worker<'_>],
    pass: &(dyn Fn(&mut Worker<'_>) -> Result<()> + Sync),
) -> Result<Duration> {
    let start = Instant::now();
    if let [w] = workers {
        pass(w)?;
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = workers.iter_mut().map(|w| s.spawn(|| pass(w))).collect();
            handles
                .into_iter()
                .try_for_each(|h| h.join().unwrap_or_else(|_| bail!("worker panicked")))
        })?;
    }
    Ok(start.elapsed())
}

/// Repeats `pass` until `min_time` has passed (at least once) and returns the fastest pass.
fn best_of(
    workers: &mut [Worker<'_>],
    min_time: Duration,
    pass: &(dyn Fn(&mut Worker<'_>) -> Result<()> + Sync),
) -> Result<Duration> {
    let start = Instant::now();
    let mut best = Duration::MAX;
    loop {
        best = best.min(timed_pass(workers, pass)?);
        if start.elapsed() >= min_time {
            return Ok(best);
        }
    }
}

fn bench_spec(
    spec: CodecSpec,
    blocks: &[&[u8]],
    threads: usize,
    min_time: Duration,
) -> Result<Measured> {
    let total: usize = blocks.iter().map(|b| b.len()).sum();
    let per = blocks.len().div_ceil(threads);
    let mut workers: Vec<Worker<'_>> = blocks
        .chunks(per.max(1))
        .map(|share| Worker {
            c: Compressor::new(),
            d: Decompressor::new(),
            blocks: share,
            compressed: vec![Vec::new(); share.len()],
            out: vec![0u8; share.iter().map(|b| b.len()).max().unwrap_or(0)],
        })
        .collect();
    let comp = best_of(&mut workers, min_time, &|w| {
        for (b, z) in w.blocks.iter().zip(w.compressed.iter_mut()) {
            w.c.compress(spec, b, z)?;
        }
        Ok(())
    })?;
    let stored: usize = workers
        .iter()
        .flat_map(|w| w.compressed.iter().map(Vec::len))
        .sum();
    let alg = spec.algorithm();
    let decomp = best_of(&mut workers, min_time, &|w| {
        for (b, z) in w.blocks.iter().zip(w.compressed.iter()) {
            w.d.decompress(alg, z, &mut w.out[..b.len()])?;
        }
        Ok(())
    })?;
    // Check the last pass's output once, outside the timing.
    for w in &mut workers {
        for (b, z) in w.blocks.iter().zip(w.compressed.iter()) {
            w.d.decompress(alg, z, &mut w.out[..b.len()])?;
            if w.out[..b.len()] != **b {
                bail!("{spec}: decompressed data differs from the input");
            }
        }
    }
    let mb = total as f64 / 1e6;
    Ok(Measured {
        ratio: total as f64 / stored.max(1) as f64,
        compress_mbs: mb / comp.as_secs_f64(),
        decompress_mbs: mb / decomp.as_secs_f64(),
    })
}

/// Heap bytes in use (malloc'd by Rust or C code), from glibc's allocator statistics.
fn heap_in_use() -> u64 {
    // SAFETY: mallinfo2 only reads the allocator's statistics.
    let mi = unsafe { libc::mallinfo2() };
    (mi.uordblks + mi.hblkhd) as u64
}

/// Measures what one compression and one decompression context of `spec` hold on the heap after
/// handling `block`: the difference in heap use around creating and using a fresh context.
/// Buffers for the data are allocated before the first reading so only the contexts count.
fn context_memory(spec: CodecSpec, block: &[u8]) -> (u64, u64) {
    let bound = compfs_codec::max_compressed_len(spec.algorithm(), block.len());
    let mut z = Vec::with_capacity(bound);
    let mut back = vec![0u8; block.len()];
    let before = heap_in_use();
    let mut c = Compressor::new();
    let ok = c.compress(spec, block, &mut z).is_ok();
    let cctx = heap_in_use().saturating_sub(before);
    let before = heap_in_use();
    let mut d = Decompressor::new();
    let ok = ok && d.decompress(spec.algorithm(), &z, &mut back).is_ok();
    let dctx = heap_in_use().saturating_sub(before);
    drop((c, d));
    if ok {
        (cctx, dctx)
    } else {
        (0, 0)
    }
}

/// The command line that benchmarks `spec` with its reference tool on independent blocks, or
/// None where no such tool exists (zlib, lzo, none).
fn cli_command(spec: CodecSpec, file: &Path, block: usize, secs: u64) -> Option<Vec<String>> {
    let mut argv = match spec.algorithm() {
        Algorithm::Zstd => {
            let l = spec.level();
            let level = if l < 0 {
                format!("--fast={}", -l)
            } else {
                format!("-b{l}")
            };
            // --fast=N alone does not select benchmark mode.
            let mut v = vec!["zstd".to_string(), "-b".into()];
            if l < 0 {
                v.push(level);
            } else {
                v[1] = level;
            }
            v
        }
        Algorithm::Lz4 => vec!["lz4".to_string(), "-b1".into()],
        _ => return None,
    };
    argv.push(format!("-B{block}"));
    argv.push(format!("-i{secs}"));
    argv.push(file.display().to_string());
    Some(argv)
}

fn run_cli(
    spec: CodecSpec,
    file: &Path,
    block: usize,
    min_time: f64,
) -> Result<Option<CliFigures>> {
    let secs = (min_time.ceil() as u64).max(1);
    let Some(argv) = cli_command(spec, file, block, secs) else {
        return Ok(None);
    };
    let out = match Command::new(&argv[0]).args(&argv[1..]).output() {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot run {}", argv[0])),
    };
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("`{}` failed: {}", argv.join(" "), text.trim());
    }
    let Some((input, output, comp, decomp)) = parse_cli_bench(&text) else {
        bail!(
            "cannot parse the output of `{}`: {}",
            argv.join(" "),
            text.trim()
        );
    };
    Ok(Some(CliFigures {
        tool: argv[0].clone(),
        command: argv.join(" "),
        ratio: input as f64 / output.max(1) as f64,
        compress_mbs: comp,
        decompress_mbs: decomp,
    }))
}

/// Parses the final result line of `zstd -b` / `lz4 -b`, e.g.
/// ` 3#silesia.tar : 211957760 -> 66945558 (x3.166), 307.1 MB/s, 1054.2 MB/s` or
/// `silesia.tar : 211957760 -> 99986561 (2.120), 709.2 MB/s ,3030.4 MB/s`: returns input bytes,
/// output bytes, compress and decompress MB/s. Progress updates are separated by `\r`.
pub fn parse_cli_bench(text: &str) -> Option<(u64, u64, f64, f64)> {
    text.split(['\r', '\n']).rev().find_map(|line| {
        let clean: String = line
            .chars()
            .map(|c| if matches!(c, ',' | '(' | ')') { ' ' } else { c })
            .collect();
        let t: Vec<&str> = clean.split_whitespace().collect();
        let arrow = t.iter().position(|&w| w == "->")?;
        let input = t.get(arrow.checked_sub(1)?)?.parse().ok()?;
        let output = t.get(arrow + 1)?.parse().ok()?;
        let speeds: Vec<f64> = t
            .iter()
            .enumerate()
            .filter(|(_, &w)| w == "MB/s")
            .filter_map(|(i, _)| t.get(i.checked_sub(1)?)?.parse().ok())
            .collect();
        match speeds[..] {
            [c, d] => Some((input, output, c, d)),
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_zstd_and_lz4_bench_output() {
        let zstd = " 3#\r |-codec-silesia.bin :  90401053 -> \r |-codec-silesia.bin :  \
                    90401053 ->  27292147 (x3.312),  272.2 MB/s \r 3#codec-silesia.bin :  \
                    90401053 ->  27292147 (x3.312),  272.2 MB/s, 1191.5 MB/s\n";
        assert_eq!(
            parse_cli_bench(zstd),
            Some((90401053, 27292147, 272.2, 1191.5))
        );
        let lz4 = "\r/-codec-silesia.bin :  90401053 ->  40497583 (2.232), 709.2 MB/s\r\
                   =-codec-silesia.bin :  90401053 ->  40497583 (2.232), 709.2 MB/s ,3030.4 MB/s\n 1#";
        assert_eq!(
            parse_cli_bench(lz4),
            Some((90401053, 40497583, 709.2, 3030.4))
        );
        assert_eq!(parse_cli_bench("Incorrect parameter\n"), None);
        assert_eq!(parse_cli_bench("a -> b (x1), 3 MB/s, 4 MB/s"), None);
        assert_eq!(parse_cli_bench(""), None);
    }

    #[test]
    fn cli_commands() {
        let f = Path::new("/tmp/x");
        let c = |s: &str| {
            cli_command(CodecSpec::parse(s).unwrap().spec, f, 131072, 2).map(|v| v.join(" "))
        };
        assert_eq!(c("zstd:3").unwrap(), "zstd -b3 -B131072 -i2 /tmp/x");
        assert_eq!(
            c("zstd:-5").unwrap(),
            "zstd -b --fast=5 -B131072 -i2 /tmp/x"
        );
        assert_eq!(c("lz4").unwrap(), "lz4 -b1 -B131072 -i2 /tmp/x");
        assert_eq!(c("zlib:3"), None);
        assert_eq!(c("lzo"), None);
    }

    #[test]
    fn bench_measures_a_round_trip() {
        let data: Vec<u8> = b"compfs bench "
            .iter()
            .cycle()
            .take(300_000)
            .copied()
            .collect();
        let blocks: Vec<&[u8]> = data.chunks(65536).collect();
        for threads in [1, 2] {
            let m = bench_spec(
                CodecSpec::parse("zstd:1").unwrap().spec,
                &blocks,
                threads,
                Duration::ZERO,
            )
            .unwrap();
            assert!(m.ratio > 50.0 && m.compress_mbs > 0.0 && m.decompress_mbs > 0.0);
        }
    }
}
