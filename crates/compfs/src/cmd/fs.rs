//! `compfs mount`, the `mount.fuse.compfs` helper, `compfs usage`, `compfs property`,
//! `compfs stats`.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use compfs_fs::daemon::{self, start_detached, Std};
use compfs_fs::helper::{parse_helper_args, HelperCall};
use compfs_fs::mount::{
    block_termination_signals, check_mountpoint, open_options, open_store, serve,
};
use compfs_fs::property::Property;
use compfs_fs::report::{report_from_usage, StatsRecord, STATS_XATTR};
use compfs_fs::{MountOptions, UsageReport};
use compfs_store::object::ObjectOptions;
use compfs_store::{OpenOptions, Store, ROOT_INO};

#[derive(Args, Debug)]
pub struct MountArgs {
    /// Store directory (created by `compfs mkfs`).
    pub store: PathBuf,
    /// Directory to mount on.
    pub mountpoint: PathBuf,
    // Mount options (help text as an attribute: rustdoc would read [=ALG] as a link).
    #[arg(
        short = 'o',
        value_name = "OPTIONS",
        help = "Mount options, comma-separated, btrfs names: compress[=ALG[:LEVEL]], \
                compress-force[=ALG[:LEVEL]], compress=no, ro, allow_other, cache=SIZE, \
                threads=N, fuse_threads=N, noexec, nosuid, nodev, noatime, acl (default), noacl, \
                worth_it=bytes (default: keep an extent compressed if it is shorter) or \
                worth_it=sector (btrfs: only if it saves a 4 KiB sector), \
                background_compression=ALG[:LEVEL], background_delay=SECS (default 60), \
                dict=on (default: store-trained zstd dictionaries for small files and packs), \
                dict=nopack (not for packs) or dict=off, \
                pack=on (default: small files compressed together in packs of 256K), pack=SIZE or pack=off, \
                uring=auto (default: FUSE over io_uring when the kernel offers it, i.e. \
                /sys/module/fuse/parameters/enable_uring is Y; /dev/fuse otherwise), nouring \
                (/dev/fuse only), uring (required; as root sets enable_uring to Y), \
                uring_depth=N (entries per CPU, default 2)"
    )]
    pub options: Vec<String>,
    /// Stay in the foreground (otherwise the daemon detaches once the mount is ready).
    #[arg(short = 'f', long)]
    pub foreground: bool,
    /// Where the detached daemon logs (corruption reports, errors) once the mount is ready.
    /// Default: /var/log/compfs.log for root, nowhere for other users. With --foreground the
    /// log goes to stderr unless this is given.
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Internal: print "ready" on stdout once mounted (used by the detaching parent).
    #[arg(long, hide = true)]
    pub notify_ready: bool,
    /// A store in a bucket: take over the lease of another mount that expired without being
    /// released (that mount crashed or lost the bucket). An unexpired lease is never taken.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct UsageArgs {
    /// Print sizes in bytes instead of human units.
    #[arg(short = 'b', long = "bytes")]
    pub bytes: bool,
    /// Files or directories inside a mounted compfs, or an unmounted store directory.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum PropertyCommand {
    /// Print a property (`compression`, `background_compression` or `extent_size`); prints
    /// nothing when it is not set.
    Get {
        path: PathBuf,
        #[arg(default_value = "compression")]
        name: String,
    },
    /// Set a property: `compression VALUE` or `background_compression VALUE` (zstd:5, lz4,
    /// none, ...), `extent_size SIZE` (4K..1M: 32K, 128K, 1M); "" clears it. All are inherited
    /// by new files and directories.
    Set {
        path: PathBuf,
        name: String,
        value: String,
    },
}

#[derive(Args, Debug)]
pub struct StatsArgs {
    /// Mount point of a compfs filesystem.
    pub mountpoint: PathBuf,
}

#[derive(Args, Debug)]
pub struct UmountArgs {
    /// Mount point of a compfs filesystem.
    pub mountpoint: PathBuf,
    /// Seconds to wait for the daemon to write everything back and close the store.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
}

#[derive(Args, Debug)]
pub struct SyncArgs {
    /// Also upload the metadata snapshot of a store in a bucket now (normally uploaded at
    /// every fsync and at most metadata_interval after other changes), and wait for it.
    #[arg(long)]
    pub remote: bool,
    /// Mount point of a compfs filesystem.
    pub mountpoint: PathBuf,
}

/// `compfs sync [--remote] MNT`: makes everything on the mount durable (an fsync of its root
/// directory, which commits the whole store durably; for a store in a bucket that uploads the
/// metadata snapshot and returns once it is in the bucket), then prints the snapshot's line.
pub fn sync(a: SyncArgs) -> Result<ExitCode> {
    use compfs_fs::report::REMOTE_XATTR;
    let not_root = || {
        anyhow!(
            "{} is not the root of a mounted compfs filesystem",
            a.mountpoint.display()
        )
    };
    // Refuse what is not a compfs root before syncing anything.
    xattr::get(&a.mountpoint, STATS_XATTR)
        .map_err(|e| not_compfs(&a.mountpoint, &e))?
        .ok_or_else(not_root)?;
    let remote =
        xattr::get(&a.mountpoint, REMOTE_XATTR).map_err(|e| not_compfs(&a.mountpoint, &e))?;
    if a.remote && remote.is_none() {
        bail!(
            "{} has no metadata snapshot to upload: --remote applies to read-write mounts of \
             stores in a bucket (s3://…)",
            a.mountpoint.display()
        );
    }
    let d = std::fs::File::open(&a.mountpoint)
        .with_context(|| format!("cannot open {}", a.mountpoint.display()))?;
    d.sync_all()
        .with_context(|| format!("sync of {} failed", a.mountpoint.display()))?;
    if a.remote {
        // The snapshot now, also under `-o writeback` (whose fsync uploads nothing).
        xattr::set(&a.mountpoint, REMOTE_XATTR, b"upload")
            .with_context(|| format!("upload of {}'s snapshot failed", a.mountpoint.display()))?;
        let line = xattr::get(&a.mountpoint, REMOTE_XATTR)
            .map_err(|e| not_compfs(&a.mountpoint, &e))?
            .ok_or_else(not_root)?;
        println!("{}", String::from_utf8_lossy(&line));
    }
    Ok(ExitCode::SUCCESS)
}

/// `compfs umount`: unmounts, then waits until the daemon has made everything durable and
/// closed the store (see [`compfs_fs::mount::unmount_and_wait`]).
pub fn umount(a: UmountArgs) -> Result<ExitCode> {
    compfs_fs::mount::unmount_and_wait(&a.mountpoint, Duration::from_secs(a.timeout))?;
    Ok(ExitCode::SUCCESS)
}

/// `compfs mount`.
pub fn mount(a: MountArgs) -> Result<ExitCode> {
    let url = super::s3::url_of(&a.store)?;
    let (fuse_opts, mut object_opts) = match &url {
        Some(_) => compfs_store::object::split_options(&a.options)?,
        None => (a.options.clone(), ObjectOptions::default()),
    };
    if a.force && url.is_none() {
        bail!("--force applies to stores in a bucket (s3://…) only");
    }
    object_opts.lease.force = a.force;
    let opts = MountOptions::parse(&fuse_opts)?;
    // The daemon started by spawn_daemon parses the same options: the parent warns once.
    if !a.notify_ready {
        for w in &opts.warnings {
            eprintln!("compfs: warning: {w}");
        }
    }
    if url.is_none() && !Store::is_store(&a.store) {
        bail!(
            "{} is not a compfs store; create one with `compfs mkfs {}`",
            a.store.display(),
            a.store.display()
        );
    }
    check_mountpoint(&a.mountpoint)?;
    if !a.foreground {
        return spawn_daemon(&a);
    }
    if let Some(url) = &url {
        block_termination_signals();
        let h = super::s3::open(url, &object_opts, &open_options(&opts))?;
        let compfs_store::object::ObjectStoreHandle {
            store,
            cache_dir,
            backend,
            lease,
        } = h;
        // The cache directory stands for the store in the mount table and the serve lock.
        let r = serve_mounted(&a, store, &cache_dir, &opts);
        // The store is closed (its last snapshot uploaded): only now is the lease released.
        if let Some(l) = lease {
            if r.is_ok() {
                if let Err(e) = l.release() {
                    tracing::error!("compfs: store {url}: cannot release the lease: {e}");
                }
            } else {
                l.abandon();
            }
        }
        compfs_store::object::write_request_counts(&cache_dir, &backend);
        return r;
    }
    let store_dir = a
        .store
        .canonicalize()
        .with_context(|| format!("store {}", a.store.display()))?;
    block_termination_signals();
    let store = open_store(&store_dir, &open_options(&opts)).map_err(|e| match e {
        compfs_store::Error::InUse(_) => anyhow!(
            "store {} is in use (already mounted?): a store is served by one mount; to see it \
             at a second place, bind-mount the first mount point (mount --bind FIRST SECOND), \
             or unmount it first",
            store_dir.display()
        ),
        e => anyhow!("cannot open store {}: {e}", store_dir.display()),
    })?;
    serve_mounted(&a, store, &store_dir, &opts)
}

/// Serves `store` on the mount point until unmounted (the foreground part of `mount`).
fn serve_mounted(
    a: &MountArgs,
    store: Store,
    store_dir: &Path,
    opts: &MountOptions,
) -> Result<ExitCode> {
    let notify = a.notify_ready;
    let log = a.log.clone();
    serve(store, store_dir, &a.mountpoint, opts, move || {
        if notify {
            let mut out = std::io::stdout();
            let _ = writeln!(out, "{}", daemon::READY);
            let _ = out.flush();
            // Stop holding the parent's pipe open.
            daemon::redirect(Std::Out, Path::new("/dev/null"));
        }
        // From now on errors go to the log, not to the terminal (or pipe) that started us:
        // `mount` and scripts reading its output must not wait for the daemon to exit.
        if let Some(log) = &log {
            daemon::redirect(Std::Err, log);
        }
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Starts `compfs mount --foreground` in a new session and returns once the mount is ready,
/// or with the child's failure.
fn spawn_daemon(a: &MountArgs) -> Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find the compfs executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount")
        .arg(&a.store)
        .arg(&a.mountpoint)
        .arg("--foreground")
        .arg("--notify-ready");
    if a.force {
        cmd.arg("--force");
    }
    for o in &a.options {
        cmd.arg("-o").arg(o);
    }
    let log = a.log.clone().unwrap_or_else(daemon::default_log);
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .with_context(|| format!("cannot open log file {}", log.display()))?;
    cmd.arg("--log").arg(&log);
    let Some(status) = start_detached(cmd)? else {
        return Ok(ExitCode::SUCCESS);
    };
    bail!(
        "mounting {} on {} failed (daemon {status}); see the message above",
        a.store.display(),
        a.mountpoint.display()
    )
}

/// The `mount.fuse.compfs` / `mount.compfs` entry point that `mount -t fuse.compfs` and fstab
/// use: `mount.fuse.compfs STORE MOUNTPOINT [-sfnv] [-o OPTIONS] [-t TYPE]`.
pub fn mount_helper(args: Vec<String>) -> Result<ExitCode> {
    match parse_helper_args(args)? {
        HelperCall::Nothing => {}
        HelperCall::Remount {
            mountpoint,
            options,
        } => compfs_fs::mount::remount(&mountpoint, &options)?,
        HelperCall::Mount {
            store,
            mountpoint,
            options,
        } => {
            return mount(MountArgs {
                store,
                mountpoint,
                options,
                foreground: false,
                log: None,
                notify_ready: false,
                force: false,
            })
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn not_compfs(path: &Path, e: &std::io::Error) -> anyhow::Error {
    match e.raw_os_error() {
        Some(libc::ENOTSUP) | Some(libc::ENODATA) => anyhow!(
            "{} is not on a mounted compfs filesystem (and is not a compfs store directory)",
            path.display()
        ),
        Some(libc::EACCES) | Some(libc::EPERM) => anyhow!(
            "{}: permission denied (usage is reported only for files you can read)",
            path.display()
        ),
        _ => anyhow!("{}: {e}", path.display()),
    }
}

/// `compfs usage`.
pub fn usage(a: UsageArgs) -> Result<ExitCode> {
    let mut total = UsageReport::default();
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    for path in &a.paths {
        if let Some(url) = super::s3::url_of(path)? {
            let opts = OpenOptions {
                read_only: true,
                ..OpenOptions::default()
            };
            let h = super::s3::open(&url, &ObjectOptions::default(), &opts)?;
            let u = h.store.usage(&[ROOT_INO])?;
            h.store.close()?;
            total.merge(&report_from_usage(&u));
            continue;
        }
        if Store::is_store(path) {
            total.merge(&store_usage(path)?);
            continue;
        }
        compfs_fs::add_tree_usage(path, &mut seen, &mut total)?;
    }
    print!("{}", total.render(a.bytes));
    Ok(ExitCode::SUCCESS)
}

/// Usage of a whole unmounted store: every regular file, each inode once.
fn store_usage(dir: &Path) -> Result<UsageReport> {
    let opts = OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    };
    let store = Store::open(dir, &opts).map_err(|e| match e {
        compfs_store::Error::InUse(_) => anyhow!(
            "store {} is mounted; run `compfs usage` on its mount point instead",
            dir.display()
        ),
        e => anyhow!("cannot open store {}: {e}", dir.display()),
    })?;
    // The store walks directories itself and counts each inode and extent once.
    let u = store.usage(&[ROOT_INO])?;
    store.close()?;
    Ok(report_from_usage(&u))
}

/// `compfs property get|set`.
pub fn property(c: PropertyCommand) -> Result<ExitCode> {
    match c {
        PropertyCommand::Get { path, name } => {
            match xattr::get(&path, Property::from_name(&name)?.xattr()) {
                Ok(Some(v)) => println!("{name}={}", String::from_utf8_lossy(&v)),
                Ok(None) => {}
                Err(e) => return Err(not_compfs(&path, &e)),
            }
        }
        PropertyCommand::Set { path, name, value } => {
            let p = Property::from_name(&name)?;
            p.check(&value)?;
            xattr::set(&path, p.xattr(), value.as_bytes()).map_err(|e| {
                if e.raw_os_error() == Some(libc::EINVAL) {
                    anyhow!(
                        "{}: compfs refused {name} '{value}' (EINVAL)",
                        path.display()
                    )
                } else {
                    not_compfs(&path, &e)
                }
            })?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `compfs stats`.
pub fn stats(a: StatsArgs) -> Result<ExitCode> {
    let not_root = || {
        anyhow!(
            "{} is not the root of a mounted compfs filesystem",
            a.mountpoint.display()
        )
    };
    let rec = xattr::get(&a.mountpoint, STATS_XATTR)
        .map_err(|e| not_compfs(&a.mountpoint, &e))?
        .ok_or_else(not_root)?;
    print!("{}", StatsRecord::decode(&rec)?.render());
    // A store in a bucket: its snapshot and upload queue (bytes against upload_limit).
    if let Ok(Some(remote)) = xattr::get(&a.mountpoint, compfs_fs::report::REMOTE_XATTR) {
        println!("remote: {}", String::from_utf8_lossy(&remote).trim_end());
    }
    Ok(ExitCode::SUCCESS)
}
