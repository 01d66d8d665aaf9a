//! `compfs bench codecs`: compress files in extent-sized blocks with each codec and level, like
//! `zstd -b` / lzbench, and print ratio, compress and decompress MB/s, and context memory.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use compfs_codec::{
    check_extent_size, context_memory, parse_level_list, CodecSpec, Compressor, Decompressor,
};

use super::util::{human, parse_size};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Codecs and levels, e.g. `zstd:-15..15,zlib:1..9,lzo,lz4`.
    #[arg(long, default_value = "zstd:-5..9,zlib:1..9,lzo,lz4")]
    pub levels: String,
    /// Block (extent) size, a power of two from 4K to 1M.
    #[arg(long, default_value = "128K")]
    pub block: String,
    /// Minimum time spent per codec and direction, in seconds.
    #[arg(long, default_value_t = 0.5)]
    pub min_time: f64,
    /// Files to read (each is cut into blocks; a directory is read recursively).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

fn collect(paths: &[PathBuf], out: &mut Vec<u8>) -> Result<()> {
    for p in paths {
        let md =
            std::fs::symlink_metadata(p).with_context(|| format!("cannot read {}", p.display()))?;
        if md.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("cannot list {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            entries.sort();
            collect(&entries, out)?;
        } else if md.is_file() {
            out.extend_from_slice(
                &std::fs::read(p).with_context(|| format!("cannot read {}", p.display()))?,
            );
        }
    }
    Ok(())
}

pub fn run(args: Args) -> Result<ExitCode> {
    let specs = parse_level_list(&args.levels)?;
    let block = parse_size(&args.block)? as usize;
    check_extent_size(block)?;
    let mut data = Vec::new();
    collect(&args.files, &mut data)?;
    anyhow::ensure!(!data.is_empty(), "no data: the given files are empty");
    let blocks: Vec<&[u8]> = data.chunks(block).collect();
    let min_time = Duration::from_secs_f64(args.min_time);
    println!(
        "{} in {} blocks of {}",
        human(data.len() as u64),
        blocks.len(),
        human(block as u64)
    );
    println!(
        "{:<10} {:>7} {:>11} {:>11} {:>10}",
        "codec", "ratio", "comp MB/s", "decomp MB/s", "ctx mem"
    );
    let mut c = Compressor::new();
    let mut d = Decompressor::new();
    for spec in specs {
        let (ratio, comp, decomp) = bench_one(&mut c, &mut d, spec, &blocks, min_time)?;
        println!(
            "{:<10} {:>7.3} {:>11.1} {:>11.1} {:>10}",
            spec.to_string(),
            ratio,
            comp,
            decomp,
            human(context_memory(spec, block) as u64)
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn bench_one(
    c: &mut Compressor,
    d: &mut Decompressor,
    spec: CodecSpec,
    blocks: &[&[u8]],
    min_time: Duration,
) -> Result<(f64, f64, f64)> {
    let total: usize = blocks.iter().map(|b| b.len()).sum();
    let mut compressed: Vec<Vec<u8>> = Vec::with_capacity(blocks.len());
    let mut buf = Vec::new();
    let start = Instant::now();
    let mut rounds = 0u32;
    loop {
        compressed.clear();
        for b in blocks {
            c.compress(spec, b, &mut buf)?;
            compressed.push(buf.clone());
        }
        rounds += 1;
        if start.elapsed() >= min_time {
            break;
        }
    }
    let comp_secs = start.elapsed().as_secs_f64() / rounds as f64;
    let stored: usize = compressed.iter().map(|c| c.len()).sum();
    let mut out = vec![0u8; blocks.iter().map(|b| b.len()).max().unwrap_or(0)];
    let start = Instant::now();
    let mut rounds = 0u32;
    loop {
        for (b, z) in blocks.iter().zip(&compressed) {
            d.decompress(spec.algorithm(), z, &mut out[..b.len()])?;
        }
        rounds += 1;
        if start.elapsed() >= min_time {
            break;
        }
    }
    let decomp_secs = start.elapsed().as_secs_f64() / rounds as f64;
    let mb = total as f64 / 1e6;
    Ok((
        total as f64 / stored as f64,
        mb / comp_secs,
        mb / decomp_secs,
    ))
}
