//! `compfs defrag`: btrfs-progs `filesystem defragment` syntax; the work is in
//! [`compfs_fs::defrag_run`] (mounts through the `compfs.defrag` xattr, unmounted stores
//! directly).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use compfs_codec::CodecSpec;
use compfs_fs::defrag_run;
use compfs_store::object::ObjectOptions;
use compfs_store::{DefragReport, DefragTarget};
use indicatif::{HumanBytes, ProgressBar, ProgressStyle};

#[derive(Args, Debug)]
pub struct DefragArgs {
    /// Recurse into directories.
    #[arg(short = 'r')]
    pub recursive: bool,
    // Help as an attribute: rustdoc would read [:LEVEL] as a link.
    #[arg(
        short = 'c',
        value_name = "ALG[:LEVEL]",
        help = "Recompress with this codec and level (zstd:9, zlib, lzo, lz4); without -c each \
                file's own policy (compfs.compression property, else the mount's)"
    )]
    pub compress: Option<String>,
    /// Compression level (btrfs-progs -L); applies to the -c codec, else to each file's own.
    #[arg(short = 'L', value_name = "LEVEL", allow_negative_numbers = true)]
    pub level: Option<i32>,
    /// Store extents uncompressed.
    #[arg(long, conflicts_with_all = ["compress", "level"])]
    pub nocomp: bool,
    /// Try the codec on every extent (like compress-force); without it the heuristic decides.
    #[arg(long)]
    pub force: bool,
    /// Cut files into extents of SIZE (4K..1M, a power of two) instead of each file's own
    /// (its compfs.extent_size property, else the store's); blocks of another size are
    /// rewritten even when their codec and level match.
    #[arg(long, value_name = "SIZE")]
    pub extent_size: Option<String>,
    /// Also write the summary as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Files or directories on a mounted compfs, an unmounted store directory, a path inside
    /// one (STORE/dir/file), or an unmounted store in a bucket (s3://BUCKET/PREFIX).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

/// The target the options ask for.
pub fn target(a: &DefragArgs) -> Result<DefragTarget> {
    let spec = if a.nocomp {
        Some(CodecSpec::none())
    } else {
        match &a.compress {
            Some(s) => {
                let p = CodecSpec::parse(s).map_err(|e| anyhow!("invalid -c '{s}': {e}"))?;
                if let Some(adj) = p.adjustment {
                    eprintln!("compfs: warning: {adj}");
                }
                Some(p.spec)
            }
            None => None,
        }
    };
    if let (Some(l), Some(s)) = (a.level, spec) {
        if let Some(adj) = CodecSpec::with_level(s.algorithm(), l).adjustment {
            eprintln!("compfs: warning: {adj}");
        }
    }
    let extent_size = match &a.extent_size {
        Some(v) => Some(compfs_store::parse_extent_size(v).ok_or_else(|| {
            anyhow!("invalid --extent-size '{v}': a power of two from 4K to 1M (4K, 32K, 128K, 1M)")
        })?),
        None => None,
    };
    Ok(DefragTarget {
        spec,
        level: a.level,
        force: a.force,
        extent_size,
    })
}

pub fn run(a: DefragArgs) -> Result<ExitCode> {
    let t = target(&a)?;
    // Stores in a bucket (s3://BUCKET/PREFIX, the whole store) are opened here; the rest are
    // mounts, store directories and paths inside them.
    let mut local = Vec::new();
    let mut buckets = Vec::new();
    for p in &a.paths {
        match super::s3::url_of(p)? {
            Some(u) => buckets.push(u),
            None => local.push(p.clone()),
        }
    }
    let mut plan = defrag_run::plan(&local, a.recursive)?;
    // The leases of the stores in buckets: held until the run has closed the stores (their
    // last durable commit uploads through the lease), released after.
    let mut leases = Vec::new();
    for url in buckets {
        let h = super::s3::open(
            &url,
            &ObjectOptions::default(),
            &compfs_store::OpenOptions::default(),
        )?;
        leases.extend(h.lease);
        defrag_run::add_open_store(
            &mut plan,
            h.store,
            PathBuf::from(url.to_string()),
            a.recursive,
        )?;
    }
    for d in &plan.skipped_dirs {
        eprintln!("compfs: {}: is a directory, skipped (use -r)", d.display());
    }
    let (_, bytes) = plan.totals();
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = ProgressBar::new(bytes);
        b.set_style(
            ProgressStyle::with_template(
                "{bar:30} {bytes}/{total_bytes} examined, {msg} rewritten, {bytes_per_sec}, ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b.enable_steady_tick(Duration::from_millis(200));
        b
    });
    let mut failures = 0u64;
    let total = defrag_run::run(
        plan,
        &t,
        &|r| {
            if let Some(b) = &bar {
                b.set_position(r.bytes_examined);
                b.set_message(HumanBytes(r.bytes_rewritten).to_string());
            }
        },
        &mut |e| {
            failures += 1;
            match &bar {
                Some(b) => b.suspend(|| eprintln!("compfs: {e}")),
                None => eprintln!("compfs: {e}"),
            }
        },
    );
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    for l in leases {
        if failures == 0 {
            l.release()?;
        } else {
            // Something failed (perhaps the store's closing upload): the lease is left to
            // expire, as after a failed unmount; a takeover is a decision for --force.
            l.abandon();
        }
    }
    print!("{}", summary(&total));
    if let Some(p) = &a.json {
        std::fs::write(p, total.to_json(failures))
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    if failures > 0 {
        bail!("{failures} file(s) could not be defragmented");
    }
    Ok(ExitCode::SUCCESS)
}

/// The final summary.
pub fn summary(r: &DefragReport) -> String {
    let h = |n: u64| format!("{} ({n} bytes)", HumanBytes(n));
    format!(
        "files              {}\n\
         extents examined   {}\n\
         extents rewritten  {}\n\
         extents skipped    {}\n\
         bytes examined     {}\n\
         bytes rewritten    {}\n\
         disk bytes         {} -> {}\n",
        r.files,
        r.extents_examined,
        r.extents_rewritten,
        r.extents_skipped,
        h(r.bytes_examined),
        h(r.bytes_rewritten),
        h(r.disk_before),
        h(r.disk_after),
    )
}
