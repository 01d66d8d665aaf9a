//! `compfs bench heuristic`: how good is the "should this extent be compressed?" decision?
//!
//! For every extent of every input it compares btrfs's heuristic and compfs's heuristic with the
//! real outcome (does zstd:1 save at least one sector?), times both heuristics, and encodes the
//! data in heuristic mode and in force mode with the chosen codec to report the ratio each mode
//! reaches and the CPU time heuristic mode spends on extents it ends up storing raw.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use compfs_codec::{
    btrfs_heuristic, check_extent_size, human, parse_size, worth_it, CodecSpec, Compressor,
    ExtentEncoder, ExtentOutcome, ExtentPolicy, Heuristic, MinSaving, Mode, RawReason, SECTOR,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::corpus::list_files;
use crate::error::{bail, Context, Result};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Codec whose heuristic and forced modes are compared.
    #[arg(long, default_value = "zstd:3")]
    pub spec: String,
    /// Codec that defines the real outcome: an extent is compressible if it saves a sector.
    #[arg(long, default_value = "zstd:1")]
    pub judge: String,
    /// Extent size, a power of two from 4K to 1M.
    #[arg(long, default_value = "128K")]
    pub block: String,
    /// Add an input of this many random bytes (e.g. 32M), labelled `random`.
    #[arg(long)]
    pub random: Option<String>,
    /// Timing passes; each extent's fastest pass counts.
    #[arg(long, default_value_t = 3)]
    pub passes: u32,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Inputs: each file is one row; a directory is one row of all files below it.
    pub files: Vec<PathBuf>,
}

/// Per-input results.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Row {
    pub input: String,
    pub bytes: u64,
    pub extents: u64,
    /// Extents too small for any compressed form to save a sector (at most one sector): the
    /// encoder stores them raw without asking a heuristic, so they are left out of agreement
    /// and heuristic speed.
    pub tiny: u64,
    /// Extents the judge codec compresses by at least one sector.
    pub compressible: u64,
    pub btrfs_agree: u64,
    pub compfs_agree: u64,
    pub btrfs_secs: f64,
    pub compfs_secs: f64,
    /// Bytes the heuristics were timed on (all but tiny extents).
    pub heuristic_bytes: u64,
    /// Bytes after encoding (sector-rounded) in force and heuristic mode.
    pub forced_stored: u64,
    pub heuristic_stored: u64,
    /// Bytes stored if btrfs's heuristic gated compression (what kernel btrfs's `compress=`
    /// would store, without its whole-file give-up rule).
    pub btrfs_stored: u64,
    /// CPU seconds of the whole encode in each mode.
    pub forced_secs: f64,
    pub heuristic_secs: f64,
    /// Over the extents heuristic mode stores raw: its CPU seconds, and force mode's on them.
    pub raw_heuristic_secs: f64,
    pub raw_forced_secs: f64,
    /// Extents per deciding reason of compfs's heuristic: (count, compressible by the judge).
    pub reasons: BTreeMap<String, (u64, u64)>,
}

impl Row {
    fn add(&mut self, o: &Row) {
        self.bytes += o.bytes;
        self.extents += o.extents;
        self.tiny += o.tiny;
        self.compressible += o.compressible;
        self.btrfs_agree += o.btrfs_agree;
        self.compfs_agree += o.compfs_agree;
        self.btrfs_secs += o.btrfs_secs;
        self.compfs_secs += o.compfs_secs;
        self.heuristic_bytes += o.heuristic_bytes;
        self.forced_stored += o.forced_stored;
        self.heuristic_stored += o.heuristic_stored;
        self.btrfs_stored += o.btrfs_stored;
        self.forced_secs += o.forced_secs;
        self.heuristic_secs += o.heuristic_secs;
        self.raw_heuristic_secs += o.raw_heuristic_secs;
        self.raw_forced_secs += o.raw_forced_secs;
        for (k, v) in &o.reasons {
            let e = self.reasons.entry(k.clone()).or_default();
            e.0 += v.0;
            e.1 += v.1;
        }
    }
    fn ratio(&self, stored: u64) -> f64 {
        self.bytes as f64 / stored.max(1) as f64
    }
    fn pct(n: u64, d: u64) -> f64 {
        100.0 * n as f64 / d.max(1) as f64
    }
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub spec: String,
    pub judge: String,
    pub block: u64,
    pub rows: Vec<Row>,
    pub total: Row,
}

fn sectors(len: usize) -> u64 {
    (len.div_ceil(SECTOR) * SECTOR) as u64
}

/// Fastest of `passes` runs of `f`, in seconds.
fn best<T>(passes: u32, mut f: impl FnMut() -> T) -> (T, f64) {
    let mut best = f64::MAX;
    let mut out = None;
    for _ in 0..passes.max(1) {
        let t = Instant::now();
        let v = f();
        best = best.min(t.elapsed().as_secs_f64());
        out = Some(v);
    }
    // passes.max(1) >= 1, so the loop ran and `out` is set.
    (out.unwrap_or_else(|| unreachable!()), best)
}

fn measure(
    label: String,
    extents: &[&[u8]],
    spec: CodecSpec,
    judge: CodecSpec,
    passes: u32,
) -> Result<Row> {
    let mut row = Row {
        input: label,
        bytes: extents.iter().map(|e| e.len() as u64).sum(),
        extents: extents.len() as u64,
        ..Row::default()
    };
    let mut c = Compressor::new();
    let mut buf = Vec::new();
    let mut h = Heuristic::new();
    let mut enc = ExtentEncoder::new();
    let force = ExtentPolicy::new(spec, Mode::Force);
    let heur = ExtentPolicy::new(spec, Mode::Heuristic);
    for e in extents {
        let n = c.compress(judge, e, &mut buf)?;
        let truth = worth_it(e.len(), n, MinSaving::default());
        row.compressible += truth as u64;
        let tiny = !worth_it(e.len(), 1, MinSaving::default());
        row.tiny += tiny as u64;

        let (b, bt) = best(passes, || btrfs_heuristic(e));
        let (v, ct) = best(passes, || h.decide(e));
        if !tiny {
            row.btrfs_agree += (b.compress == truth) as u64;
            row.compfs_agree += (v.compress == truth) as u64;
            row.btrfs_secs += bt;
            row.compfs_secs += ct;
            row.heuristic_bytes += e.len() as u64;
            let r = row.reasons.entry(v.reason.to_string()).or_default();
            r.0 += 1;
            r.1 += truth as u64;
        }

        let (fo, ft) = best(passes, || enc.encode(&force, e, &mut buf));
        let stored = |o: ExtentOutcome| match o {
            ExtentOutcome::Compressed { len } => sectors(len),
            ExtentOutcome::Raw(_) => sectors(e.len()),
        };
        let fo = stored(fo?);
        row.forced_stored += fo;
        row.btrfs_stored += if b.compress && !tiny {
            fo
        } else {
            sectors(e.len())
        };
        row.forced_secs += ft;
        let (ho, ht) = best(passes, || enc.encode(&heur, e, &mut buf));
        let ho = ho?;
        row.heuristic_stored += stored(ho);
        row.heuristic_secs += ht;
        if matches!(
            ho,
            ExtentOutcome::Raw(RawReason::Heuristic(_) | RawReason::NotWorthIt)
        ) {
            row.raw_heuristic_secs += ht;
            row.raw_forced_secs += ft;
        }
    }
    Ok(row)
}

/// Deterministic incompressible bytes (xorshift64*).
fn random_bytes(n: usize) -> Vec<u8> {
    let mut s = 0x9E37_79B9_7F4A_7C15_u64;
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        v.extend_from_slice(&s.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    v.truncate(n);
    v
}

/// Runs `compfs bench heuristic`.
pub fn run(args: Args) -> Result<()> {
    let spec = CodecSpec::parse(&args.spec)?.spec;
    let judge = CodecSpec::parse(&args.judge)?.spec;
    if spec.is_none() || judge.is_none() {
        bail!("--spec and --judge must name a compressing codec, e.g. zstd:3");
    }
    let block = parse_size(&args.block)? as usize;
    check_extent_size(block)?;
    let mut inputs: Vec<(String, Vec<Vec<u8>>)> = Vec::new();
    for p in &args.files {
        // Extents are cut per file, as a filesystem would, so a directory's small files give
        // small extents.
        let mut files = Vec::new();
        list_files(p, &mut files)?;
        let mut datas = Vec::new();
        for f in files {
            datas.push(std::fs::read(&f).with_context(|| format!("cannot read {}", f.display()))?);
        }
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| p.display().to_string());
        inputs.push((name, datas));
    }
    if let Some(r) = &args.random {
        let n = parse_size(r)? as usize;
        inputs.push(("random".into(), vec![random_bytes(n)]));
    }
    if inputs.is_empty() {
        bail!("no inputs: give files or directories, or --random SIZE");
    }

    let bar = ProgressBar::new(inputs.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed_precise}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut rows = Vec::new();
    for (name, datas) in &inputs {
        bar.set_message(name.clone());
        let extents: Vec<&[u8]> = datas.iter().flat_map(|d| d.chunks(block)).collect();
        rows.push(measure(name.clone(), &extents, spec, judge, args.passes)?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut total = Row {
        input: "total".into(),
        ..Row::default()
    };
    for r in &rows {
        total.add(r);
    }
    print_report(&rows, &total, spec, judge, block);
    if let Some(path) = &args.json {
        let report = Report {
            spec: spec.to_string(),
            judge: judge.to_string(),
            block: block as u64,
            rows,
            total,
        };
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

fn print_report(rows: &[Row], total: &Row, spec: CodecSpec, judge: CodecSpec, block: usize) {
    println!(
        "extents of {}; truth: {judge} saves a sector; modes: compress={spec} vs compress-force={spec}",
        human(block as u64)
    );
    println!(
        "{:<14} {:>7} {:>6} | {:>6} {:>6} | {:>7} {:>7} | {:>7} {:>7} {:>6} {:>7} | {:>7}",
        "input",
        "size",
        "compr%",
        "btrfs%",
        "ours%",
        "btrfsGB",
        "oursGB",
        "forced",
        "heur",
        "h/f",
        "btrfs-h",
        "raw cpu"
    );
    for r in rows.iter().chain(std::iter::once(total)) {
        let raw_cpu = if r.raw_forced_secs > 0.0 {
            format!("{:.1}%", 100.0 * r.raw_heuristic_secs / r.raw_forced_secs)
        } else {
            "-".into()
        };
        println!(
            "{:<14} {:>7} {:>6.1} | {:>6.1} {:>6.1} | {:>7.2} {:>7.2} | {:>7.3} {:>7.3} {:>6.3} {:>7.3} | {:>7}",
            r.input,
            human(r.bytes),
            Row::pct(r.compressible, r.extents),
            Row::pct(r.btrfs_agree, r.extents - r.tiny),
            Row::pct(r.compfs_agree, r.extents - r.tiny),
            r.heuristic_bytes as f64 / r.btrfs_secs.max(1e-12) / 1e9,
            r.heuristic_bytes as f64 / r.compfs_secs.max(1e-12) / 1e9,
            r.ratio(r.forced_stored),
            r.ratio(r.heuristic_stored),
            r.forced_stored as f64 / r.heuristic_stored.max(1) as f64,
            r.ratio(r.btrfs_stored),
            raw_cpu,
        );
    }
    println!(
        "compr%: extents {judge} compresses; btrfs%/ours%: heuristic agrees with that (extents of \
         one sector or less, stored raw without asking, left out: {} here); GB: heuristic speed; forced/heur: ratio after sector rounding; h/f: heuristic ratio / forced; btrfs-h: ratio with btrfs's heuristic deciding; \
         raw cpu: heuristic mode's CPU on extents it stores raw / force mode's CPU on them",
        total.tiny
    );
    println!(
        "compfs heuristic decisions over all inputs (reason: extents, of which compressible):"
    );
    for (k, (n, c)) in &total.reasons {
        println!("  {k:<22} {n:>7} {c:>7}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_is_raw_and_text_compresses() {
        let spec = CodecSpec::parse("zstd:3").unwrap().spec;
        let judge = CodecSpec::parse("zstd:1").unwrap().spec;
        let r = random_bytes(4 * 131072);
        let extents: Vec<&[u8]> = r.chunks(131072).collect();
        let row = measure("random".into(), &extents, spec, judge, 1).unwrap();
        assert_eq!(row.compressible, 0);
        assert_eq!(row.compfs_agree, 4);
        assert_eq!(row.forced_stored, row.bytes);
        assert_eq!(row.heuristic_stored, row.bytes);
        let text: Vec<u8> = b"heuristic bench text "
            .iter()
            .cycle()
            .take(262144)
            .copied()
            .collect();
        let extents: Vec<&[u8]> = text.chunks(131072).collect();
        let row = measure("text".into(), &extents, spec, judge, 1).unwrap();
        assert_eq!(
            (row.compressible, row.compfs_agree, row.btrfs_agree),
            (2, 2, 2)
        );
        assert!(row.ratio(row.heuristic_stored) > 10.0);
        assert_eq!(row.raw_forced_secs, 0.0);
    }
}
