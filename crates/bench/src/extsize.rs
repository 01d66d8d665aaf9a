//! `compfs bench extsize`: ratio against 4 KiB random-read IOPS per extent size (the
//! `compfs.extent_size` property). For each size the corpus is copied into a fresh store
//! through a real mount whose root directory carries the property; then, in rounds that
//! alternate the sizes (so that the load of a shared machine falls on all of them alike), each
//! store is mounted afresh (the daemon's data cache is empty), the kernel's caches are dropped,
//! and single-threaded 4 KiB reads at random 4 KiB-aligned offsets (the same offsets for every
//! size, files chosen in proportion to their size, readahead off with `POSIX_FADV_RANDOM`)
//! are timed. Each read decompresses the whole extent holding it, which is what the extent size
//! trades against the ratio.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use compfs_codec::human;
use compfs_store::{parse_extent_size, CreateOptions, Store};
use serde::Serialize;

use crate::corpus;
use crate::error::{bail, Context, Result};
use crate::mounts::{compfs_ratio, drop_caches, full_sync, is_root, CompfsMount};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Corpus: a .tar.zst (unpacked with `zstd -dc | tar x`), a directory or files.
    #[arg(long, default_value = "../shared/corpus/silesia.tar.zst")]
    pub corpus: PathBuf,
    /// Extent sizes to compare (comma-separated, 4K..1M).
    #[arg(long, default_value = "32K,128K,512K", value_delimiter = ',')]
    pub extent_sizes: Vec<String>,
    /// Mount options of the copy and the reads.
    #[arg(long, default_value = "compress-force=zstd:3")]
    pub options: String,
    /// Random 4 KiB reads per size and round.
    #[arg(long, default_value_t = 2000)]
    pub reads: usize,
    /// Rounds of reads (the median is reported, with the lowest and highest).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Where to create the stores (default: a temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Write results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Serialize, Debug, Default, Clone)]
struct Row {
    extent_size: String,
    ratio: f64,
    disk_bytes: u64,
    copy_secs: f64,
    /// Median, lowest and highest of the rounds.
    iops: f64,
    iops_min: f64,
    iops_max: f64,
    /// The median's rate in MiB/s (4 KiB per read).
    mib_s: f64,
}

#[derive(Serialize, Debug, Default)]
struct Report {
    options: String,
    input_bytes: u64,
    files: usize,
    reads: usize,
    runs: usize,
    caches_dropped: bool,
    rows: Vec<Row>,
}

/// A 4 KiB read: file index, offset.
type Read = (usize, u64);

/// `n` reads at 4 KiB-aligned offsets, files drawn in proportion to their size (seeded, so
/// every size and round reads the same places).
fn read_plan(sizes: &[u64], n: usize, seed: u64) -> Vec<Read> {
    let total: u64 = sizes.iter().map(|s| s / 4096).sum();
    let mut x = seed | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut v = Vec::with_capacity(n);
    if total == 0 {
        return v;
    }
    for _ in 0..n {
        let mut page = next() % total;
        for (i, s) in sizes.iter().enumerate() {
            let pages = s / 4096;
            if page < pages {
                v.push((i, page * 4096));
                break;
            }
            page -= pages;
        }
    }
    v
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Times the reads of `plan` on the files `rel` under `mnt`: reads per second.
fn random_reads(mnt: &Path, rel: &[PathBuf], plan: &[Read]) -> Result<f64> {
    let mut files = Vec::with_capacity(rel.len());
    for r in rel {
        let f = std::fs::File::open(mnt.join(r))
            .with_context(|| format!("cannot open {}", r.display()))?;
        rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::Random)
            .with_context(|| format!("fadvise {}", r.display()))?;
        files.push(f);
    }
    let mut buf = vec![0u8; 4096];
    let t = Instant::now();
    for &(i, off) in plan {
        files[i]
            .read_at(&mut buf, off)
            .with_context(|| format!("read {} at {off}", rel[i].display()))?;
    }
    Ok(plan.len() as f64 / t.elapsed().as_secs_f64().max(1e-9))
}

/// Runs `compfs bench extsize`.
pub fn run(a: Args) -> Result<()> {
    let mut sizes = Vec::new();
    for s in &a.extent_sizes {
        match parse_extent_size(s) {
            Some(n) => sizes.push(n),
            None => bail!("bad extent size '{s}': a power of two from 4K to 1M"),
        }
    }
    if sizes.is_empty() {
        bail!("no extent sizes given");
    }
    let base = corpus::work_dir(a.dir.as_deref(), "extsize")?;
    let base = base.path();
    let root = if a.corpus.is_dir() || corpus::is_archive(&a.corpus) {
        corpus::unpack(&a.corpus, &base.join("corpus"))?
    } else {
        a.corpus.clone()
    };
    let mut paths = Vec::new();
    corpus::list_files(&root, &mut paths)?;
    paths.sort();
    // Files of at least one page, copied as c/0, c/1, ...
    let mut src = Vec::new();
    let mut rel = Vec::new();
    let mut lens = Vec::new();
    for p in paths {
        let len = std::fs::metadata(&p)?.len();
        if len >= 4096 {
            rel.push(PathBuf::from(format!("c/{}", rel.len())));
            lens.push(len);
            src.push(p);
        }
    }
    if rel.is_empty() {
        bail!(
            "no file of 4 KiB or more in the corpus {}",
            a.corpus.display()
        );
    }
    let total: u64 = lens.iter().sum();
    let can_drop = is_root() && drop_caches();
    if !can_drop {
        eprintln!("warning: cannot drop the kernel's caches (not root): reads are not cold");
    }
    println!(
        "corpus: {} files of 4 KiB or more, {}; -o {}; {} random 4 KiB reads x {} rounds, cold",
        rel.len(),
        human(total),
        a.options,
        a.reads,
        a.runs.max(1)
    );
    let mut rows = Vec::new();
    for &n in &sizes {
        let name = compfs_store::format_extent_size(n);
        let store = base.join(format!("store-{name}"));
        let mnt = base.join(format!("mnt-{name}"));
        std::fs::create_dir_all(&mnt)?;
        Store::create(&store, &CreateOptions::default())?.close()?;
        let m = CompfsMount::new(&store, &mnt, &a.options)?;
        xattr_set(&mnt, &name)?;
        std::fs::create_dir(mnt.join("c"))?;
        let t = Instant::now();
        for (p, r) in src.iter().zip(&rel) {
            std::fs::copy(p, mnt.join(r))
                .with_context(|| format!("cannot copy {}", p.display()))?;
        }
        full_sync(&mnt)?;
        let copy_secs = t.elapsed().as_secs_f64();
        let (ratio, disk) = compfs_ratio(&mnt)?;
        m.unmount()?;
        println!(
            "{name:>5}: ratio {ratio:.3} ({}), copy {copy_secs:.1} s",
            human(disk)
        );
        rows.push(Row {
            extent_size: name,
            ratio,
            disk_bytes: disk,
            copy_secs,
            ..Row::default()
        });
    }
    let plan = read_plan(&lens, a.reads.max(1), 0x5eed);
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    for round in 0..a.runs.max(1) {
        // Alternate the order so that no size always runs first or last.
        let order: Vec<usize> = if round % 2 == 0 {
            (0..rows.len()).collect()
        } else {
            (0..rows.len()).rev().collect()
        };
        for i in order {
            let name = &rows[i].extent_size;
            let store = base.join(format!("store-{name}"));
            let mnt = base.join(format!("mnt-{name}"));
            let m = CompfsMount::new(&store, &mnt, &a.options)?;
            if can_drop {
                drop_caches();
            }
            let iops = random_reads(&mnt, &rel, &plan)?;
            m.unmount()?;
            samples[i].push(iops);
        }
    }
    println!();
    println!(
        "{:>11}  {:>7}  {:>11}  {:>22}  {:>8}",
        "extent size", "ratio", "disk", "4K random read IOPS", "MiB/s"
    );
    for (r, s) in rows.iter_mut().zip(samples.iter_mut()) {
        r.iops_min = s.iter().copied().fold(f64::INFINITY, f64::min);
        r.iops_max = s.iter().copied().fold(0.0, f64::max);
        r.iops = median(s);
        r.mib_s = r.iops * 4096.0 / (1 << 20) as f64;
        println!(
            "{:>11}  {:>7.3}  {:>11}  {:>8.0} ({:>5.0}..{:<5.0})  {:>8.2}",
            r.extent_size,
            r.ratio,
            human(r.disk_bytes),
            r.iops,
            r.iops_min,
            r.iops_max,
            r.mib_s
        );
    }
    let rep = Report {
        options: a.options.clone(),
        input_bytes: total,
        files: rel.len(),
        reads: a.reads,
        runs: a.runs.max(1),
        caches_dropped: can_drop,
        rows,
    };
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&rep)?)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    Ok(())
}

/// Sets `compfs.extent_size` on the mount's root, so that every file copied in inherits it.
fn xattr_set(mnt: &Path, value: &str) -> Result<()> {
    rustix::fs::setxattr(
        mnt,
        "compfs.extent_size",
        value.as_bytes(),
        rustix::fs::XattrFlags::empty(),
    )
    .with_context(|| format!("cannot set compfs.extent_size on {}", mnt.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_plan_stays_inside_the_files_and_is_repeatable() {
        let sizes = [4096u64, 100_000, 0, 1 << 20];
        let plan = read_plan(&sizes, 500, 7);
        assert_eq!(plan.len(), 500);
        for &(i, off) in &plan {
            assert_eq!(off % 4096, 0);
            assert!(off + 4096 <= sizes[i], "{i} {off}");
        }
        assert_eq!(plan, read_plan(&sizes, 500, 7));
        // Files are drawn in proportion to their size.
        let big = plan.iter().filter(|r| r.0 == 3).count();
        assert!(big > 350, "{big}");
        assert!(read_plan(&[0, 100], 10, 1).is_empty());
    }
}
