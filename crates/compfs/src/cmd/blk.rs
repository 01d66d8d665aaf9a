//! `compfs blk`: a compressed RAM block device (like zram) served over NBD, and the client
//! side of its control channel.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use compfs_blk::server::{self, control_path, control_request};
use compfs_blk::statfmt::format_stat;
use compfs_blk::store::{load_dict, DictSetup, PolicyConfig};
use compfs_blk::{Config, Export, PageStore};
use compfs_codec::CodecSpec;

use compfs_codec::{human, parse_size};

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Start the server in the foreground: a compressed RAM disk exported over NBD.
    Serve(Box<ServeArgs>),
    /// Print zram's mm_stat, io_stat and bd_stat lines and a summary with the ratio.
    Stat(SocketArg),
    /// Re-compress idle, huge or incompressible pages with the --recomp-algo codecs (kept only
    /// if smaller).
    Recompress(RecompressArgs),
    /// Move idle, huge or incompressible pages to the --backing file.
    Writeback(WritebackArgs),
    /// Set the writeback budget: BYTES per --period seconds (0 bytes: no limit).
    WritebackLimit(WritebackLimitArgs),
    /// Set how many pages one writeback batch holds (zram's writeback_batch_size).
    WritebackBatchSize(BatchArgs),
    /// Mark stored pages idle (all, or those untouched for --age seconds); pages read or
    /// written later lose the mark.
    MarkIdle(MarkIdleArgs),
    /// Move objects out of sparse pool pages and free them.
    Compact(SocketArg),
    /// Drop every page and reset the statistics.
    Reset(SocketArg),
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Device size (K, M, G, T suffixes; rounded up to 4 KiB).
    #[arg(long, default_value = "4G", allow_hyphen_values = true)]
    size: String,
    // Primary codec (help text as an attribute: rustdoc would read [:N] as a link).
    #[arg(
        long,
        default_value = "lzo",
        help = "Primary codec: lz4, lzo, zstd[:N], zlib[:N]"
    )]
    algo: String,
    /// Memory limit for stored pages (0: none); writes past it fail with ENOSPC.
    #[arg(long, default_value = "0", allow_hyphen_values = true)]
    mem_limit: String,
    /// Backing file for `writeback` (created if missing).
    #[arg(long)]
    backing: Option<PathBuf>,
    /// Recompression codec, repeatable, in priority order (up to 3), e.g. zstd:9.
    #[arg(long = "recomp-algo")]
    recomp_algo: Vec<String>,
    /// Unix socket to serve NBD on (default: $XDG_RUNTIME_DIR or /tmp, compfs-blk.sock).
    #[arg(long, conflicts_with = "listen")]
    socket: Option<PathBuf>,
    /// Serve NBD over TCP at ADDR (e.g. 127.0.0.1:10809). NBD has no authentication.
    #[arg(long)]
    listen: Option<String>,
    /// Export name clients may ask for (the empty name selects it too).
    #[arg(long, default_value = "compfs")]
    name: String,
    /// zstd dictionary: a file from `zstd --train` (zram's algorithm_params dict=), or `auto`
    /// to train one from the pages written and retrain as they grow. zstd codecs only.
    #[arg(long)]
    dict: Option<String>,
    /// Control socket (default: the NBD socket path plus `.ctl`).
    #[arg(long)]
    control: Option<PathBuf>,
    /// Run the memory policy: pages idle for --idle-age are recompressed with the
    /// --recomp-algo codecs, those idle for twice as long are written to --backing (coldest
    /// first, within the writeback budget), and the pool is compacted, continuously at idle
    /// CPU priority.
    #[arg(long)]
    policy: bool,
    /// Seconds without a read or write after which the policy treats a page as idle.
    #[arg(long, default_value = "300", requires = "policy")]
    idle_age: u32,
    /// Writeback budget in bytes per --writeback-period (K, M, G suffixes; 0: no limit).
    #[arg(long, default_value = "0")]
    writeback_limit: String,
    /// Seconds after which the writeback budget refills (0: never, as zram's writeback_limit).
    #[arg(long, default_value = "86400")]
    writeback_period: u32,
    /// Pages per writeback batch (zram's writeback_batch_size).
    #[arg(long, default_value = "32")]
    writeback_batch_size: usize,
    /// Threads answering one connection's requests when the client keeps several in flight
    /// (1: strictly one request at a time; default 1 + min(2, CPUs - 2): 1 on 2 cores, 3 on 4).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=16))]
    conn_threads: Option<u16>,
}

#[derive(Args, Debug)]
pub struct MarkIdleArgs {
    /// The server's NBD socket path (its control socket is PATH.ctl), or the control socket.
    socket: PathBuf,
    /// Only pages not read or written for this many seconds.
    #[arg(long)]
    age: Option<u32>,
}

#[derive(Args, Debug)]
pub struct WritebackLimitArgs {
    /// The server's NBD socket path (its control socket is PATH.ctl), or the control socket.
    socket: PathBuf,
    /// Bytes per period (K, M, G suffixes; 0: no limit).
    bytes: String,
    /// Seconds after which the budget refills (0: never).
    #[arg(long, default_value = "0")]
    period: u32,
}

#[derive(Args, Debug)]
pub struct BatchArgs {
    /// The server's NBD socket path (its control socket is PATH.ctl), or the control socket.
    socket: PathBuf,
    /// Pages per batch.
    pages: usize,
}

#[derive(Args, Debug)]
pub struct SocketArg {
    /// The server's NBD socket path (its control socket is PATH.ctl), or the control socket.
    socket: PathBuf,
}

#[derive(Args, Debug)]
pub struct RecompressArgs {
    /// The server's NBD socket path (its control socket is PATH.ctl), or the control socket.
    socket: PathBuf,
    /// Which pages: idle, huge or incompressible.
    #[arg(long = "type")]
    kind: String,
    /// Only pages whose compressed size is at least this many bytes.
    #[arg(long)]
    threshold: Option<u64>,
    /// At most this many pages are tried.
    #[arg(long)]
    max_pages: Option<u64>,
}

#[derive(Args, Debug)]
pub struct WritebackArgs {
    /// The server's NBD socket path (its control socket is PATH.ctl), or the control socket.
    socket: PathBuf,
    /// Which pages: idle, huge or incompressible.
    #[arg(long = "type")]
    kind: String,
    /// At most this many pages are written.
    #[arg(long)]
    max_pages: Option<u64>,
}

pub fn run(cmd: Command) -> Result<ExitCode> {
    match cmd {
        Command::Serve(a) => serve(*a),
        Command::Stat(a) => {
            let lines = request(&a.socket, "stat")?;
            print!("{}", format_stat(&lines)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Recompress(a) => {
            check_kind(&a.kind)?;
            let cmd = format!(
                "recompress {} {} {}",
                a.kind,
                a.threshold.unwrap_or(0),
                a.max_pages.unwrap_or(0)
            );
            print_lines(request(&a.socket, &cmd)?)
        }
        Command::Writeback(a) => {
            check_kind(&a.kind)?;
            let cmd = format!("writeback {} {}", a.kind, a.max_pages.unwrap_or(0));
            print_lines(request(&a.socket, &cmd)?)
        }
        Command::WritebackLimit(a) => {
            let bytes = parse_size(&a.bytes)?;
            let cmd = format!("writeback-limit {bytes} {}", a.period);
            print_lines(request(&a.socket, &cmd)?)
        }
        Command::WritebackBatchSize(a) => print_lines(request(
            &a.socket,
            &format!("writeback-batch-size {}", a.pages),
        )?),
        Command::MarkIdle(a) => {
            let cmd = match a.age {
                Some(age) => format!("mark-idle {age}"),
                None => "mark-idle".to_string(),
            };
            print_lines(request(&a.socket, &cmd)?)
        }
        Command::Compact(a) => print_lines(request(&a.socket, "compact")?),
        Command::Reset(a) => print_lines(request(&a.socket, "reset")?),
    }
}

fn check_kind(kind: &str) -> Result<()> {
    kind.parse::<compfs_blk::PageKind>()
        .map(|_| ())
        .map_err(|e| anyhow!("{e}"))
}

fn print_lines(lines: Vec<String>) -> Result<ExitCode> {
    for l in lines {
        println!("{l}");
    }
    Ok(ExitCode::SUCCESS)
}

fn request(socket: &Path, cmd: &str) -> Result<Vec<String>> {
    control_request(&control_path(socket), cmd).map_err(|e| anyhow!("{e}"))
}

fn parse_spec(s: &str) -> Result<CodecSpec> {
    let p = CodecSpec::parse(s).map_err(|e| anyhow!("{e}"))?;
    if let Some(adj) = p.adjustment {
        eprintln!("compfs: {adj}");
    }
    Ok(p.spec)
}

fn default_socket() -> PathBuf {
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    dir.join("compfs-blk.sock")
}

fn serve(a: ServeArgs) -> Result<ExitCode> {
    // First, before any thread exists; the socket paths are added once they are bound.
    let sockets = Arc::new(Mutex::new(Vec::new()));
    server::exit_on_signal(sockets.clone()).map_err(|e| anyhow!("{e}"))?;
    let size = parse_size(&a.size)?;
    if size == 0 {
        bail!("--size must be larger than 0");
    }
    let size = size.div_ceil(4096) * 4096;
    let algo = parse_spec(&a.algo)?;
    if algo.is_none() {
        bail!("--algo none stores nothing compressed; use lz4, lzo, zstd or zlib");
    }
    if a.recomp_algo.len() > 3 {
        bail!("at most 3 --recomp-algo codecs are allowed (zram's limit)");
    }
    let recomp = a
        .recomp_algo
        .iter()
        .map(|s| parse_spec(s))
        .collect::<Result<Vec<_>>>()?;
    let mem_limit = parse_size(&a.mem_limit)?;
    let mut store = PageStore::new(Config {
        size,
        algo,
        recomp,
        mem_limit,
    })
    .map_err(|e| anyhow!("{e}"))?;
    if let Some(b) = &a.backing {
        store = store.with_backing(b).map_err(|e| anyhow!("{e}"))?;
    }
    if let Some(d) = &a.dict {
        if algo.algorithm() != compfs_codec::Algorithm::Zstd {
            bail!("--dict needs --algo zstd[:N] (the codec is {algo})");
        }
        let setup = if d == "auto" {
            DictSetup::Auto
        } else {
            DictSetup::Fixed(load_dict(Path::new(d), algo.level()).map_err(|e| anyhow!("{e}"))?)
        };
        store = store.with_dict(setup).map_err(|e| anyhow!("{e}"))?;
    }
    store.set_writeback_limit(parse_size(&a.writeback_limit)?, a.writeback_period);
    store
        .set_writeback_batch_size(a.writeback_batch_size)
        .map_err(|e| anyhow!("--writeback-batch-size: {e}"))?;
    let policy = a.policy.then_some(PolicyConfig {
        idle_age: a.idle_age,
    });
    if let Some(p) = policy {
        if a.recomp_algo.is_empty() && a.backing.is_none() {
            eprintln!("compfs: warning: --policy without --recomp-algo or --backing only compacts the pool");
        }
        store = store.with_policy(p);
    }
    compfs_blk::conn::HELPERS.store(
        a.conn_threads
            .map_or_else(compfs_blk::conn::default_helpers, |n| usize::from(n) - 1),
        std::sync::atomic::Ordering::Relaxed,
    );
    let store = Arc::new(store);
    if a.dict.is_some() {
        server::spawn_dict_worker(store.clone()).map_err(|e| anyhow!("{e}"))?;
    }
    if let Some(p) = policy {
        server::spawn_policy_worker(store.clone(), p).map_err(|e| anyhow!("{e}"))?;
    }
    let export = Export {
        name: a.name.clone(),
        description: format!("compfs blk, {algo}"),
        size,
    };
    let (ctl, nbd_desc, serve_nbd): (PathBuf, String, Box<dyn FnOnce() + Send>) = match &a.listen {
        Some(addr) => {
            let sa: SocketAddr = addr
                .parse()
                .with_context(|| format!("bad --listen address '{addr}': use IP:PORT"))?;
            if !sa.ip().is_loopback() {
                eprintln!(
                        "compfs: warning: serving NBD on non-loopback {sa}: NBD has no authentication or encryption; anyone who can reach it can read and write the device"
                    );
            }
            let l = TcpListener::bind(sa).with_context(|| format!("cannot listen on {sa}"))?;
            let ctl = a.control.clone().unwrap_or_else(|| {
                std::env::temp_dir().join(format!("compfs-blk-{}.ctl", sa.port()))
            });
            let s = store.clone();
            let e = export.clone();
            (
                ctl,
                format!("nbd://{sa}/{}", a.name),
                Box::new(move || server::serve_tcp(l, s, e)),
            )
        }
        None => {
            let path = a.socket.clone().unwrap_or_else(default_socket);
            let l = server::bind_unix(&path).map_err(|e| anyhow!("{e}"))?;
            let ctl = a.control.clone().unwrap_or_else(|| control_path(&path));
            let s = store.clone();
            let e = export.clone();
            (
                ctl,
                format!("nbd+unix:///{}?socket={}", a.name, path.display()),
                Box::new(move || server::serve_unix(l, s, e)),
            )
        }
    };
    let ctl_listener = server::bind_unix(&ctl).map_err(|e| anyhow!("{e}"))?;
    if let Ok(mut v) = sockets.lock() {
        v.push(ctl.clone());
        if a.listen.is_none() {
            v.push(a.socket.clone().unwrap_or_else(default_socket));
        }
    }
    let s = store.clone();
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || server::serve_control(ctl_listener, s))
        .context("cannot start the control thread")?;
    eprintln!(
        "compfs blk: serving {} ({}, {algo}) at {nbd_desc}; control socket {}",
        human(size),
        size,
        ctl.display()
    );
    serve_nbd();
    Ok(ExitCode::SUCCESS)
}
