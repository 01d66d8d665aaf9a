//! Store commands: `compfs mkfs`, `compfs fsck`, `compfs gc`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use compfs_codec::{human, parse_size, CodecSpec, Mode};
use compfs_store::object::ObjectOptions;
use compfs_store::{fsck, uuid_string, CreateOptions, OpenOptions, Store};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(clap::Args, Debug)]
pub struct MkfsArgs {
    /// Directory to hold the store (created if missing; must be empty unless --force).
    pub store: PathBuf,
    /// Extent size: a power of two from 4K to 1M.
    #[arg(long, default_value = "128K", allow_hyphen_values = true)]
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
    /// The store directory (not in use by a mount), or s3://BUCKET/PREFIX.
    pub store: PathBuf,
    /// Do the safe repairs: drop references to corrupt extents, fix counts, free orphans.
    #[arg(long)]
    pub repair: bool,
    /// For a store in a bucket: also read every chunk object and walk it extent header by
    /// extent header, without the metadata (a local store's check always walks its segments).
    #[arg(long)]
    pub full: bool,
}

#[derive(clap::Args, Debug)]
pub struct GcArgs {
    /// The store directory (not in use by a mount).
    pub store: PathBuf,
    /// A store in a bucket: take over the lease of a mount that expired without being
    /// released (an unexpired lease is never taken).
    #[arg(long)]
    pub force: bool,
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
    if let Some(url) = super::s3::url_of(&a.store)? {
        super::s3::create(&url, &ObjectOptions::default(), &opts)?;
        println!(
            "created compfs store {url} (extent size {}, {}={})",
            human(opts.extent_size as u64),
            mode,
            compression
        );
        return Ok(ExitCode::SUCCESS);
    }
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
    if let Some(url) = super::s3::url_of(&a.store)? {
        return fsck_bucket(&url, &a);
    }
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
    match r {
        Ok(r) => Ok(print_report(&a.store.display().to_string(), &r)),
        Err(e) => {
            eprintln!("compfs fsck: {e}");
            Ok(ExitCode::from(8))
        }
    }
}

/// `compfs fsck s3://… [--full]`: the metadata snapshot's checks, and with `--full` the walk
/// of every object without the metadata.
fn fsck_bucket(url: &compfs_store::object::S3Url, a: &FsckArgs) -> Result<ExitCode> {
    if a.repair {
        eprintln!("compfs fsck: --repair of a store in a bucket is not supported");
        return Ok(ExitCode::from(8));
    }
    let r =
        compfs_store::object::fsck_bucket(url, &ObjectOptions::default(), a.full, &mut |_, _| {});
    match r {
        Ok(r) => {
            if a.full {
                println!(
                    "{url}: walked {} objects ({}), {} extents, without the metadata",
                    r.objects,
                    human(r.object_bytes),
                    r.walked_extents
                );
            }
            Ok(print_report(&url.to_string(), &r.report))
        }
        Err(e) => {
            eprintln!("compfs fsck: {e}");
            Ok(ExitCode::from(8))
        }
    }
}

/// Prints what fsck found; the exit code of e2fsck for it.
fn print_report(name: &str, r: &compfs_store::FsckReport) -> ExitCode {
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
        name,
        r.inodes,
        r.extents,
        human(r.bytes_verified),
        r.segments,
        human(r.dead_bytes),
        r.errors(),
        r.repaired()
    );
    // e2fsck exit codes: 0 clean, 1 errors corrected, 4 errors left uncorrected.
    ExitCode::from(if r.unrepaired() > 0 {
        4
    } else if r.repaired() > 0 {
        1
    } else {
        0
    })
}

pub fn gc(a: GcArgs) -> Result<ExitCode> {
    let r = if let Some(url) = super::s3::url_of(&a.store)? {
        let mut o = ObjectOptions::default();
        o.lease.force = a.force;
        let h = super::s3::open(&url, &o, &OpenOptions::default())?;
        let r = h.store.gc().map_err(|e| anyhow::anyhow!("{e}"))?;
        h.close()?;
        r
    } else {
        if a.force {
            anyhow::bail!("--force applies to stores in a bucket (s3://…) only");
        }
        let s =
            Store::open(&a.store, &OpenOptions::default()).map_err(|e| anyhow::anyhow!("{e}"))?;
        let r = s.gc().map_err(|e| anyhow::anyhow!("{e}"))?;
        s.close()?;
        r
    };
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
