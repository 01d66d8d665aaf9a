//! `compfs bench recompress`: the corpus written with `compress-force=zstd:1`, then recompressed
//! with `defrag -c zstd:9` (all files, [`Store::defrag`], the call the mount daemon makes for
//! each `compfs.defrag` request and `compfs defrag STORE` makes directly), against writing at
//! zstd:9 directly: ratio, throughput against zstd:9 single-thread compression × cores, and the
//! time of a second identical run (which must rewrite nothing).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use compfs_codec::{human, CodecSpec, Mode};
use compfs_store::{
    CreateOptions, DefragReport, DefragTarget, OpenOptions, Store, Tuning, ROOT_INO,
};
use serde::Serialize;

use crate::corpus;
use crate::error::{Context, Result};
use crate::store::{cpu_time, single_thread, write_corpus};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Corpus: a .tar.zst (unpacked with `zstd -dc | tar x`), a directory or files.
    #[arg(long, default_value = "../shared/corpus/silesia.tar.zst")]
    pub corpus: PathBuf,
    /// Codec the corpus is first written with (compress-force).
    #[arg(long, default_value = "zstd:1")]
    pub from: String,
    /// Codec `defrag -c` recompresses to (and the direct write uses).
    #[arg(long, default_value = "zstd:9")]
    pub to: String,
    /// `defrag --force` (the direct write is compress-force either way).
    #[arg(long)]
    pub force: bool,
    /// Where to create the stores (default: a temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Compression worker threads (default: cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Write results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also measure background recompression (`background_compression=TO`): one pass against
    /// defrag, the worker's ratio over time, and a copy during it against one without.
    #[arg(long)]
    pub background: bool,
    /// Copies with and without background work (each) for `--background`.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// `--background`: draw the ratio over time as an SVG here.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Also run `compfs defrag -r -c TO` through a FUSE mount against the unmounted store, N
    /// runs each, alternating (root; each on a fresh copy of a store written at FROM).
    #[arg(long, value_name = "N")]
    pub mount: Option<usize>,
}

#[derive(Serialize, Debug, Default)]
struct Report {
    from: String,
    to: String,
    force: bool,
    threads: usize,
    input_bytes: u64,
    ratio_from: f64,
    ratio_direct: f64,
    ratio_defrag: f64,
    /// ratio_defrag / ratio_direct (target >= 0.99).
    ratio_vs_direct: f64,
    single_thread_mb_s: f64,
    defrag_secs: f64,
    defrag_mb_s: f64,
    defrag_cores_busy: f64,
    /// defrag_mb_s / (single_thread_mb_s × threads) (target >= 0.8).
    throughput_vs_cores: f64,
    second_run_secs: f64,
    /// second_run_secs / defrag_secs (target <= 0.10).
    second_vs_first: f64,
    first: Figures,
    second: Figures,
    #[serde(skip_serializing_if = "Option::is_none")]
    background: Option<crate::background::BgReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mount: Option<crate::recompress_mount::MountReport>,
}

#[derive(Serialize, Debug, Default, Clone, Copy)]
struct Figures {
    files: u64,
    extents_examined: u64,
    extents_rewritten: u64,
    extents_skipped: u64,
    bytes_examined: u64,
    bytes_rewritten: u64,
    disk_before: u64,
    disk_after: u64,
}

impl From<DefragReport> for Figures {
    fn from(r: DefragReport) -> Figures {
        Figures {
            files: r.files,
            extents_examined: r.extents_examined,
            extents_rewritten: r.extents_rewritten,
            extents_skipped: r.extents_skipped,
            bytes_examined: r.bytes_examined,
            bytes_rewritten: r.bytes_rewritten,
            disk_before: r.disk_before,
            disk_after: r.disk_after,
        }
    }
}

fn spec(s: &str) -> Result<CodecSpec> {
    Ok(CodecSpec::parse(s)?.spec)
}

fn ratio(s: &Store) -> Result<f64> {
    let u = s.usage(&[ROOT_INO])?;
    Ok(u.total.referenced as f64 / u.total.disk.max(1) as f64)
}

/// A store written with `compress-force=SPEC`, synced.
fn written(
    dir: &std::path::Path,
    sp: CodecSpec,
    oo: &OpenOptions,
    files: &[(String, Vec<u8>)],
) -> Result<Store> {
    Store::create_tuned(
        dir,
        &CreateOptions {
            compression: sp,
            mode: Mode::Force,
            ..CreateOptions::default()
        },
        Tuning::default(),
    )?
    .close()?;
    let s = Store::open_tuned(dir, oo, Tuning::default())?;
    write_corpus(&s, files, "")?;
    s.sync()?;
    Ok(s)
}

/// `defrag -r` of every file of the store's root, then a sync; figures and wall time.
fn defrag_all(s: &Store, t: &DefragTarget) -> Result<(DefragReport, Duration, Duration)> {
    let (start, c0) = (Instant::now(), cpu_time());
    let mut total = DefragReport::default();
    for e in s.readdir(ROOT_INO, 0, usize::MAX)?.into_iter().skip(2) {
        total.add(&s.defrag(e.ino, t, &mut |_| {})?);
    }
    s.sync()?;
    Ok((total, start.elapsed(), cpu_time() - c0))
}

/// Runs `compfs bench recompress`.
pub fn run(a: Args) -> Result<()> {
    let threads = corpus::threads_or_cores(a.threads);
    let base = corpus::work_dir(a.dir.as_deref(), "recompress")?;
    let base = base.path();
    let files = corpus::load(&a.corpus, base)?;
    let total: u64 = files.iter().map(|f| f.1.len() as u64).sum();
    let (from, to) = (spec(&a.from)?, spec(&a.to)?);
    println!(
        "corpus: {} files, {}; {threads} compression threads; {from} -> defrag -c {to}{}",
        files.len(),
        human(total),
        if a.force { " --force" } else { "" }
    );
    let oo = OpenOptions {
        threads,
        ..OpenOptions::default()
    };
    let st = single_thread(to, &files)?;
    let direct = written(&base.join("direct"), to, &oo, &files)?;
    let ratio_direct = ratio(&direct)?;
    direct.close()?;
    let s = written(&base.join("defrag"), from, &oo, &files)?;
    let ratio_from = ratio(&s)?;
    let target = DefragTarget {
        spec: Some(to),
        level: None,
        force: a.force,
        extent_size: None,
    };
    let (first, d1, cpu1) = defrag_all(&s, &target)?;
    let ratio_defrag = ratio(&s)?;
    let (second, d2, _) = defrag_all(&s, &target)?;
    s.close()?;
    let mb_s = first.bytes_examined as f64 / 1e6 / d1.as_secs_f64().max(1e-9);
    let rep = Report {
        from: from.to_string(),
        to: to.to_string(),
        force: a.force,
        threads,
        input_bytes: total,
        ratio_from,
        ratio_direct,
        ratio_defrag,
        ratio_vs_direct: ratio_defrag / ratio_direct,
        single_thread_mb_s: st,
        defrag_secs: d1.as_secs_f64(),
        defrag_mb_s: mb_s,
        defrag_cores_busy: cpu1.as_secs_f64() / d1.as_secs_f64().max(1e-9),
        throughput_vs_cores: mb_s / (st * threads as f64),
        second_run_secs: d2.as_secs_f64(),
        second_vs_first: d2.as_secs_f64() / d1.as_secs_f64().max(1e-9),
        first: first.into(),
        second: second.into(),
        background: None,
        mount: None,
    };
    println!(
        "ratio: written at {from} {:.3}, written at {to} {:.3}, after defrag {:.3} ({:.4}x direct; target >= 0.99)",
        rep.ratio_from, rep.ratio_direct, rep.ratio_defrag, rep.ratio_vs_direct
    );
    println!(
        "defrag: {:.2} s, {:.1} MB/s examined, {:.2} cores busy; {to} 1-thread compress {:.1} MB/s x {threads} = {:.1} MB/s -> {:.2}x (target >= 0.8)",
        rep.defrag_secs,
        rep.defrag_mb_s,
        rep.defrag_cores_busy,
        st,
        st * threads as f64,
        rep.throughput_vs_cores
    );
    println!(
        "extents: {} examined, {} rewritten, {} skipped; disk {} -> {}",
        first.extents_examined,
        first.extents_rewritten,
        first.extents_skipped,
        human(first.disk_before),
        human(first.disk_after)
    );
    println!(
        "second identical run: {:.3} s ({:.1}% of the first; target <= 10%), {} extents rewritten",
        rep.second_run_secs,
        100.0 * rep.second_vs_first,
        second.extents_rewritten
    );
    let mut rep = rep;
    if a.background {
        let b = crate::background::measure(
            base,
            &files,
            from,
            to,
            threads,
            rep.defrag_mb_s,
            rep.ratio_direct,
            a.runs.max(1),
        )?;
        print_background(&b, to);
        if let Some(p) = &a.svg {
            crate::plot::ratio_over_time(&b, rep.ratio_direct, p)?;
        }
        rep.background = Some(b);
    }
    if let Some(n) = a.mount {
        let tpl = base.join("mount-template");
        crate::background::prepare(&tpl, from, threads, &files)?;
        let m = crate::recompress_mount::measure(base, &tpl, from, &target, threads, st, n.max(1))?;
        crate::recompress_mount::print(&m, to);
        let _ = std::fs::remove_dir_all(&tpl);
        rep.mount = Some(m);
    }
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&rep)?)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    Ok(())
}

fn print_background(b: &crate::background::BgReport, to: CodecSpec) {
    println!(
        "background pass: {:.2} s, {:.1} MB/s ({:.2}x defrag; target >= 0.9), ratio {:.3}",
        b.pass_secs, b.pass_mb_s, b.pass_vs_defrag, b.ratio_after_pass
    );
    println!(
        "background worker (background_compression={to}, background_delay=0): done in {:.2} s from open, ratio {:.3} ({:.4}x direct; target >= 0.99)",
        b.worker_secs, b.ratio_after_worker, b.worker_ratio_vs_direct
    );
    println!("  seconds  ratio  MB rewritten");
    let mut next = 0.0;
    for (i, &(t, r, mb)) in b.samples.iter().enumerate() {
        if t >= next || i + 1 == b.samples.len() {
            println!("  {t:7.2}  {r:.3}  {mb:8.1}");
            next = t + 0.5;
        }
    }
    println!(
        "copy without background: {:?} s; with: {:?} s ({:?} MB rewritten meanwhile); median ratio {:.3} (target >= 0.9)",
        b.copy_without, b.copy_with, b.rewritten_during_copy, b.copy_ratio
    );
}
