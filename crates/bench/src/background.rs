//! `compfs bench recompress --background`: background recompression (`background_compression=`)
//! of the corpus written at the `--from` codec, measured three ways in the same run as the defrag
//! figures:
//!
//! * **pass**: one [`Store::background_pass`] (the worker's code path: its `SCHED_IDLE` pool, its
//!   skip rule and commits) timed on an otherwise idle store, against `defrag` of the same data;
//! * **over time**: the worker thread on its own (`background_delay=0`), the store's ratio
//!   sampled every 100 ms from open until nothing is pending (table and SVG);
//! * **copy**: writing a second copy of the corpus (store API, synced) into a store whose first
//!   copy is still pending, with the worker enabled against the same store state without it,
//!   alternating, `runs` times each: medians and spread. Both start 3 s after open (the one
//!   with the worker not before it has written).

use std::path::Path;
use std::time::{Duration, Instant};

use compfs_codec::{CodecSpec, Mode};
use compfs_store::{BackgroundPolicy, CreateOptions, OpenOptions, Store, Tuning, ROOT_INO};
use serde::Serialize;

use crate::error::Result;
use crate::store::write_corpus;

#[derive(Serialize, Debug, Default, Clone)]
pub struct BgReport {
    /// One synchronous pass over the whole corpus.
    pub pass_secs: f64,
    pub pass_mb_s: f64,
    /// pass_mb_s / defrag MB/s of the same run.
    pub pass_vs_defrag: f64,
    pub ratio_after_pass: f64,
    /// The worker thread from open to nothing pending.
    pub worker_secs: f64,
    pub ratio_after_worker: f64,
    /// ratio_after_worker / ratio written at the target directly (target >= 0.99).
    pub worker_ratio_vs_direct: f64,
    /// (seconds since open, ratio, MB rewritten so far) every 100 ms.
    pub samples: Vec<(f64, f64, f64)>,
    /// Copy seconds without and with background work pending, per run.
    pub copy_without: Vec<f64>,
    pub copy_with: Vec<f64>,
    /// MB the worker rewrote during each copy with it enabled.
    pub rewritten_during_copy: Vec<f64>,
    /// median(copy_without) / median(copy_with) (target >= 0.9).
    pub copy_ratio: f64,
}

fn ratio(s: &Store) -> Result<f64> {
    let u = s.usage(&[ROOT_INO])?;
    Ok(u.total.referenced as f64 / u.total.disk.max(1) as f64)
}

pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// A fresh store with the corpus written at `from` (compress-force), closed.
pub(crate) fn prepare(
    dir: &Path,
    from: CodecSpec,
    threads: usize,
    files: &[(String, Vec<u8>)],
) -> Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    Store::create_tuned(
        dir,
        &CreateOptions {
            compression: from,
            mode: Mode::Force,
            ..CreateOptions::default()
        },
        Tuning::default(),
    )?
    .close()?;
    let s = Store::open(
        dir,
        &OpenOptions {
            threads,
            ..OpenOptions::default()
        },
    )?;
    write_corpus(&s, files, "")?;
    s.close()?;
    Ok(())
}

fn open(dir: &Path, threads: usize, bg: Option<CodecSpec>) -> Result<Store> {
    Ok(Store::open(
        dir,
        &OpenOptions {
            threads,
            background: BackgroundPolicy {
                spec: bg,
                delay: Duration::ZERO,
            },
            ..OpenOptions::default()
        },
    )?)
}

/// Runs the three measurements (see the module documentation).
#[allow(clippy::too_many_arguments)]
pub fn measure(
    base: &Path,
    files: &[(String, Vec<u8>)],
    from: CodecSpec,
    to: CodecSpec,
    threads: usize,
    defrag_mb_s: f64,
    ratio_direct: f64,
    runs: usize,
) -> Result<BgReport> {
    let total: u64 = files.iter().map(|f| f.1.len() as u64).sum();
    let mut r = BgReport::default();
    let dir = base.join("bg");

    // One synchronous pass (no worker thread: the flusher-less tuning starts none).
    prepare(&dir, from, threads, files)?;
    let s = Store::open_tuned(
        &dir,
        &OpenOptions {
            threads,
            background: BackgroundPolicy {
                spec: Some(to),
                delay: Duration::ZERO,
            },
            ..OpenOptions::default()
        },
        Tuning {
            flush_interval: None,
            ..Tuning::default()
        },
    )?;
    let t = Instant::now();
    s.background_pass()?;
    s.sync()?;
    r.pass_secs = t.elapsed().as_secs_f64();
    r.pass_mb_s = total as f64 / 1e6 / r.pass_secs.max(1e-9);
    r.pass_vs_defrag = r.pass_mb_s / defrag_mb_s.max(1e-9);
    r.ratio_after_pass = ratio(&s)?;
    s.close()?;

    // The worker thread, sampled.
    prepare(&dir, from, threads, files)?;
    let t = Instant::now();
    let s = open(&dir, threads, Some(to))?;
    loop {
        let st = s.stats().background;
        let el = t.elapsed().as_secs_f64();
        r.samples.push((el, ratio(&s)?, st.bytes_done as f64 / 1e6));
        if st.passes > 0 && st.files_pending == 0 {
            break;
        }
        if el > 600.0 {
            return Err(crate::error::failed!(
                "background worker did not finish in 600 s"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    r.worker_secs = t.elapsed().as_secs_f64();
    r.ratio_after_worker = ratio(&s)?;
    r.worker_ratio_vs_direct = r.ratio_after_worker / ratio_direct.max(1e-9);
    s.close()?;

    // A copy during background recompression against the same copy without it.
    for _ in 0..runs {
        for with in [false, true] {
            prepare(&dir, from, threads, files)?;
            let s = open(&dir, threads, with.then_some(to))?;
            // Both copies start 3 s after open; the one with background work not before the
            // worker has appended its first extents.
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(3)
                || (with
                    && s.stats().segment_bytes_written == 0
                    && t.elapsed() < Duration::from_secs(60))
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            let done0 = s.stats().background.bytes_done;
            let t = Instant::now();
            write_corpus(&s, files, "copy-")?;
            s.sync()?;
            let secs = t.elapsed().as_secs_f64();
            if with {
                r.copy_with.push(secs);
                r.rewritten_during_copy
                    .push((s.stats().background.bytes_done - done0) as f64 / 1e6);
            } else {
                r.copy_without.push(secs);
            }
            s.close()?;
        }
    }
    r.copy_ratio = median(&r.copy_without) / median(&r.copy_with).max(1e-9);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
