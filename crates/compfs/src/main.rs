//! The `compfs` command: a thin layer over the library crates. Library errors are typed; this
//! binary turns them into one-line messages.

mod cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Transparent compression from userspace: a compressing FUSE filesystem, usage reports, and a
/// compressed RAM block device served over NBD.
#[derive(Parser, Debug)]
#[command(name = "compfs", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Benchmarks: codecs on files, the filesystem against kernel btrfs, the block device.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Mount a store with FUSE; -o takes btrfs options (compress=zstd:3, compress-force=...).
    Mount(cmd::fs::MountArgs),
    /// Unmount a compfs mount and wait until its daemon has made everything durable.
    Umount(cmd::fs::UmountArgs),
    /// compsize-style report of disk usage for files on a mount (or a whole unmounted store).
    Usage(cmd::fs::UsageArgs),
    /// Recompress files to a codec and level (btrfs filesystem defragment -r -c ALG -L LEVEL),
    /// on a mount or in an unmounted store; extents already stored so are skipped.
    Defrag(cmd::defrag::DefragArgs),
    /// Get or set a file's or directory's compression property.
    #[command(subcommand)]
    Property(cmd::fs::PropertyCommand),
    /// Live statistics of a mounted compfs.
    Stats(cmd::fs::StatsArgs),
    /// Make a mount durable; with --remote, upload the metadata snapshot of a store in a
    /// bucket now and wait for it.
    Sync(cmd::fs::SyncArgs),
    /// Create a store (refuses a non-empty directory or an existing store unless --force).
    Mkfs(cmd::store::MkfsArgs),
    /// Check a store: every metadata invariant and extent checksum (exit 0 clean, 1 corrected,
    /// 4 errors left, 8 operational error).
    Fsck(cmd::store::FsckArgs),
    /// Reclaim space in a store: compact mostly-dead segments.
    Gc(cmd::store::GcArgs),
    /// Compressed RAM block device (like zram) served over NBD.
    #[command(subcommand)]
    Blk(cmd::blk::Command),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Compress files in extent-sized blocks with every codec and level; print ratio and speed.
    Codecs(compfs_bench::codecs::Args),
    /// The filesystem against kernel btrfs: copy/read MB/s and ratio per method, untar, fio.
    Fs(compfs_bench::fs::Args),
    /// Bonnie++ on compfs per method, kernel btrfs per method, ext4 and xfs (seed 004).
    Bonnie(compfs_bench::bonnie::Args),
    /// Empty-file creates, stats and unlinks on compfs, the null FUSE filesystem (the FUSE
    /// floor) and kernel btrfs, alternating in one run.
    Creates(compfs_bench::creates::Args),
    /// compfs blk against kernel zram and nbdkit memory: ratio, memory, fio IOPS.
    Blk(compfs_bench::blk::Args),
    /// The store: sequential write speed vs single-thread compression, GC, random 4K overwrites.
    Store(compfs_bench::store::Args),
    /// Judge the compression heuristic: agreement with real outcomes, speed, ratio vs force mode.
    Heuristic(compfs_bench::heuristic::Args),
    /// Recompression: the corpus written at zstd:1, then defrag -c zstd:9, against writing at
    /// zstd:9 directly (ratio, throughput, second identical run).
    Recompress(compfs_bench::recompress::Args),
    /// Extent size: ratio and cold 4 KiB random-read IOPS per compfs.extent_size, on a mount.
    Extsize(compfs_bench::extsize::Args),
}

/// `compfs bench …`: the harness lives in the compfs-bench library.
fn bench(b: BenchCommand) -> anyhow::Result<ExitCode> {
    match b {
        BenchCommand::Codecs(a) => compfs_bench::codecs::run(a),
        BenchCommand::Fs(a) => compfs_bench::fs::run(a),
        BenchCommand::Bonnie(a) => compfs_bench::bonnie::run(a),
        BenchCommand::Creates(a) => compfs_bench::creates::run(a),
        BenchCommand::Blk(a) => compfs_bench::blk::run(a),
        BenchCommand::Store(a) => compfs_bench::store::run(a),
        BenchCommand::Heuristic(a) => compfs_bench::heuristic::run(a),
        BenchCommand::Recompress(a) => compfs_bench::recompress::run(a),
        BenchCommand::Extsize(a) => compfs_bench::extsize::run(a),
    }?;
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("warn,fuser::session=error")
            }),
        )
        .with_writer(std::io::stderr)
        // No colour codes in log files (the mount daemon's --log) or pipes.
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none(),
        )
        .init();
    // `mount -t fuse.compfs` and fstab run /sbin/mount.fuse.compfs (a link to this binary).
    let argv: Vec<String> = std::env::args().collect();
    let argv0 = argv
        .first()
        .map(|a| a.rsplit('/').next().unwrap_or(a).to_string());
    if matches!(argv0.as_deref(), Some("mount.fuse.compfs" | "mount.compfs")) {
        return match cmd::fs::mount_helper(argv) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("compfs: {e:#}");
                ExitCode::from(1)
            }
        };
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(b) => bench(b),
        Command::Mount(a) => cmd::fs::mount(a),
        Command::Usage(a) => cmd::fs::usage(a),
        Command::Defrag(a) => cmd::defrag::run(a),
        Command::Property(c) => cmd::fs::property(c),
        Command::Stats(a) => cmd::fs::stats(a),
        Command::Sync(a) => cmd::fs::sync(a),
        Command::Umount(a) => cmd::fs::umount(a),
        Command::Mkfs(a) => cmd::store::mkfs(a),
        Command::Fsck(a) => cmd::store::fsck_cmd(a),
        Command::Gc(a) => cmd::store::gc(a),
        Command::Blk(c) => cmd::blk::run(c),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("compfs: {e:#}");
            ExitCode::from(1)
        }
    }
}
