//! Listening sockets: the NBD listener (one thread per connection) and the control channel.
//!
//! The control channel is a Unix socket (by default `<nbd socket>.ctl`) speaking a line
//! protocol: the client sends one command line, the server answers with zero or more lines and
//! then `ok` or `error <message>`, and closes. docs/nbd.md documents the commands.

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::conn;
use crate::error::BlkError;
use crate::nbd::{self, Export, Handshake};
use crate::store::{PageKind, PageStore, PolicyConfig};

/// Connections served at once; more are closed at accept so a flood cannot exhaust memory
/// (each connection may hold one payload buffer of up to 32 MiB).
pub const MAX_CONNECTIONS: usize = 64;
/// A client has this long to finish each handshake step.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest control command line accepted.
const MAX_CONTROL_LINE: u64 = 1024;

/// The control socket that belongs to an NBD socket path: `PATH.ctl` (a path that already ends
/// in `.ctl` is taken as the control socket itself).
pub fn control_path(socket: &Path) -> PathBuf {
    if socket.extension().is_some_and(|e| e == "ctl") {
        socket.to_path_buf()
    } else {
        let mut s = socket.as_os_str().to_owned();
        s.push(".ctl");
        PathBuf::from(s)
    }
}

/// Binds a Unix socket, replacing a stale socket file that nothing listens on and refusing to
/// steal one a live server owns.
pub fn bind_unix(path: &Path) -> Result<UnixListener, BlkError> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(BlkError::Remote(format!(
                "{} is in use by a running server; stop it or choose another --socket",
                path.display()
            )));
        }
        std::fs::remove_file(path)
            .map_err(|e| BlkError::io(format!("cannot remove stale {}", path.display()), e))?;
    }
    UnixListener::bind(path).map_err(|e| BlkError::io(format!("cannot bind {}", path.display()), e))
}

/// A stream the server can serve NBD on.
pub trait Conn: Read + Write + Send + Sync + Sized + 'static {
    fn try_clone_conn(&self) -> std::io::Result<Self>;
    fn set_timeout(&self, t: Option<Duration>) -> std::io::Result<()>;
    /// Ends reading: a thread blocked in a read returns end of stream.
    fn shutdown_read(&self);
}

impl Conn for UnixStream {
    fn try_clone_conn(&self) -> std::io::Result<Self> {
        self.try_clone()
    }
    fn set_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        self.set_read_timeout(t)
    }
    fn shutdown_read(&self) {
        let _ = self.shutdown(std::net::Shutdown::Read);
    }
}

impl Conn for TcpStream {
    fn try_clone_conn(&self) -> std::io::Result<Self> {
        self.try_clone()
    }
    fn set_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        self.set_read_timeout(t)
    }
    fn shutdown_read(&self) {
        let _ = self.shutdown(std::net::Shutdown::Read);
    }
}

/// Serves one NBD connection to its end (requests in flight are answered by up to
/// 1 + [`conn::HELPERS`] threads, see [`crate::conn`]).
pub fn serve_connection<S: Conn>(
    stream: S,
    store: &PageStore,
    export: &Export,
) -> Result<(), BlkError> {
    stream
        .set_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(|e| BlkError::io("socket timeout", e))?;
    let reader = stream
        .try_clone_conn()
        .map_err(|e| BlkError::io("socket clone", e))?;
    let control = stream
        .try_clone_conn()
        .map_err(|e| BlkError::io("socket clone", e))?;
    let mut r = BufReader::with_capacity(64 * 1024, reader);
    let mut w = BufWriter::with_capacity(64 * 1024, stream);
    let session = match nbd::handshake(&mut r, &mut w, export)? {
        Handshake::Closed => return Ok(()),
        Handshake::Transmission(session) => session,
    };
    r.get_ref()
        .set_timeout(None)
        .map_err(|e| BlkError::io("socket timeout", e))?;
    conn::transmission_parallel(r, w, store, &session, || control.shutdown_read())
}

fn spawn_connection<S: Conn>(
    stream: S,
    store: &Arc<PageStore>,
    export: &Arc<Export>,
    active: &Arc<AtomicUsize>,
) {
    if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
        active.fetch_sub(1, Ordering::SeqCst);
        tracing::warn!("refusing connection: {MAX_CONNECTIONS} already open");
        return;
    }
    let (store, export, active) = (store.clone(), export.clone(), active.clone());
    let spawned = std::thread::Builder::new()
        .name("nbd-conn".into())
        .spawn(move || {
            if let Err(e) = serve_connection(stream, &store, &export) {
                tracing::info!("connection closed: {e}");
            }
            active.fetch_sub(1, Ordering::SeqCst);
            release_free_memory();
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start connection thread: {e}");
    }
}

/// Hands memory that the allocator holds but nobody uses (a closed connection's buffers, holes
/// left by zspages that grew or were freed) back to the kernel, so resident memory tracks
/// `mem_used_total`.
pub fn release_free_memory() {
    // SAFETY: malloc_trim only walks glibc's own arenas; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Accepts NBD connections on a Unix socket forever.
pub fn serve_unix(listener: UnixListener, store: Arc<PageStore>, export: Export) {
    let export = Arc::new(export);
    let active = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        match stream {
            Ok(s) => spawn_connection(s, &store, &export, &active),
            Err(e) => tracing::warn!("accept failed: {e}"),
        }
    }
}

/// Accepts NBD connections on a TCP socket forever.
pub fn serve_tcp(listener: TcpListener, store: Arc<PageStore>, export: Export) {
    let export = Arc::new(export);
    let active = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        match stream {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                spawn_connection(s, &store, &export, &active)
            }
            Err(e) => tracing::warn!("accept failed: {e}"),
        }
    }
}

/// Runs one control command against the store and returns the reply lines (without the final
/// `ok`).
pub fn control_command(store: &PageStore, line: &str) -> Result<Vec<String>, BlkError> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let bad = |msg: &str| Err(BlkError::Remote(msg.to_string()));
    match words.as_slice() {
        ["stat"] => {
            let s = store.stats();
            let codecs: Vec<String> = store.codecs().iter().map(|c| c.to_string()).collect();
            let mut lines = vec![
                format!("mm_stat {}", s.mm_stat()),
                format!("io_stat {}", s.io_stat()),
                format!("bd_stat {}", s.bd_stat()),
                format!("disksize {}", s.disksize),
                format!("table_bytes {}", s.table_bytes),
                format!("algorithms {}", codecs.join(" ")),
            ];
            if let Some(d) = store.dict_status() {
                lines.push(format!("dict {}", d.line()));
            }
            lines.push(format!("writeback_limit {}", store.writeback_limit().line()));
            if let Some(p) = store.policy_config() {
                lines.push(format!(
                    "policy idle_age {} {}",
                    p.idle_age,
                    store.policy_status().line()
                ));
            }
            Ok(lines)
        }
        ["mark-idle", rest @ ..] if rest.len() <= 1 => {
            let age = match rest.first() {
                Some(a) => Some(
                    a.parse::<u32>()
                        .map_err(|_| BlkError::Remote(format!("bad age '{a}': use seconds")))?,
                ),
                None => None,
            };
            Ok(vec![format!("marked {}", store.mark_idle(age))])
        }
        ["compact"] => {
            let n = store.compact();
            release_free_memory();
            Ok(vec![format!("compacted {n}")])
        }
        ["reset"] => {
            store.reset();
            release_free_memory();
            Ok(vec![])
        }
        ["recompress", kind, rest @ ..] if rest.len() <= 2 => {
            let kind: PageKind = kind.parse().map_err(BlkError::Remote)?;
            let threshold = number(rest.first(), "threshold", "a byte count")?;
            let max_pages = number(rest.get(1), "max_pages", "a page count")?;
            Ok(vec![format!(
                "recompressed {}",
                store.recompress(kind, threshold, max_pages)?
            )])
        }
        ["writeback", kind, rest @ ..] if rest.len() <= 1 => {
            let kind: PageKind = kind.parse().map_err(BlkError::Remote)?;
            let max_pages = number(rest.first(), "max_pages", "a page count")?;
            Ok(vec![format!(
                "written {}",
                store.writeback(kind, max_pages)?
            )])
        }
        ["writeback-limit", bytes, rest @ ..] if rest.len() <= 1 => {
            let bytes = number(Some(bytes), "limit", "a byte count")?;
            let period = number(rest.first(), "period", "seconds")?;
            let period = u32::try_from(period)
                .map_err(|_| BlkError::Remote(format!("period {period} is too long")))?;
            store.set_writeback_limit(bytes, period);
            Ok(vec![format!(
                "writeback_limit {}",
                store.writeback_limit().line()
            )])
        }
        ["writeback-batch-size", n] => {
            let n = number(Some(n), "batch size", "a page count")?;
            store.set_writeback_batch_size(usize::try_from(n).unwrap_or(usize::MAX))?;
            Ok(vec![format!(
                "writeback_limit {}",
                store.writeback_limit().line()
            )])
        }
        [] => bad("empty command"),
        _ => bad("unknown command; use stat, mark-idle [AGE], compact, reset, recompress idle|huge|incompressible [THRESHOLD [MAX_PAGES]], writeback idle|huge|incompressible [MAX_PAGES], writeback-limit BYTES [PERIOD], writeback-batch-size PAGES"),
    }
}

/// An optional numeric control argument (absent: 0).
fn number(word: Option<&&str>, what: &str, unit: &str) -> Result<u64, BlkError> {
    match word {
        Some(w) => w
            .parse::<u64>()
            .map_err(|_| BlkError::Remote(format!("bad {what} '{w}': use {unit}"))),
        None => Ok(0),
    }
}

fn handle_control(stream: UnixStream, store: &PageStore) -> std::io::Result<()> {
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_CONTROL_LINE)).read_line(&mut line)?;
    let mut w = BufWriter::new(&stream);
    match control_command(store, line.trim()) {
        Ok(lines) => {
            for l in lines {
                writeln!(w, "{l}")?;
            }
            writeln!(w, "ok")?;
        }
        Err(e) => writeln!(w, "error {}", e.to_string().replace('\n', " "))?,
    }
    w.flush()
}

/// Serves the control channel forever (one short-lived thread per command).
pub fn serve_control(listener: UnixListener, store: Arc<PageStore>) {
    for stream in listener.incoming() {
        match stream {
            Ok(s) => {
                let store = store.clone();
                let _ = std::thread::Builder::new()
                    .name("nbd-control".into())
                    .spawn(move || {
                        if let Err(e) = handle_control(s, &store) {
                            tracing::info!("control connection: {e}");
                        }
                    });
            }
            Err(e) => tracing::warn!("control accept failed: {e}"),
        }
    }
}

/// Runs the store's background dictionary work (training, recompression onto the newest
/// dictionary) on a thread at the lowest CPU priority, pausing while there is nothing to do.
pub fn spawn_dict_worker(store: Arc<PageStore>) -> Result<(), BlkError> {
    std::thread::Builder::new()
        .name("dict".into())
        .spawn(move || {
            // SAFETY: setpriority with who = 0 changes the calling thread's nice value on
            // Linux (nice values are per thread there); it reads no memory of ours.
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, 0, 19);
            }
            let mut worked = false;
            loop {
                match store.dict_maintain() {
                    Ok(true) => {
                        worked = true;
                        std::thread::yield_now()
                    }
                    Ok(false) => {
                        // Training's buffers and the pages moved leave free heap behind.
                        if std::mem::take(&mut worked) {
                            release_free_memory();
                        }
                        std::thread::sleep(Duration::from_millis(100))
                    }
                    Err(e) => {
                        tracing::warn!("dictionary maintenance: {e}");
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            }
        })
        .map(|_| ())
        .map_err(|e| BlkError::io("cannot start the dictionary thread", e))
}

/// Runs the memory policy (`--policy`) on a thread at the lowest CPU priority (nice 19 and
/// SCHED_IDLE: it only gets a core nothing else wants), one step every
/// [`PolicyConfig::interval`].
pub fn spawn_policy_worker(store: Arc<PageStore>, cfg: PolicyConfig) -> Result<(), BlkError> {
    std::thread::Builder::new()
        .name("policy".into())
        .spawn(move || {
            lowest_priority();
            loop {
                std::thread::sleep(cfg.interval());
                match store.policy_step(&cfg) {
                    Ok(true) => release_free_memory(),
                    Ok(false) => {}
                    Err(e) => tracing::warn!("memory policy: {e}"),
                }
            }
        })
        .map(|_| ())
        .map_err(|e| BlkError::io("cannot start the policy thread", e))
}

/// Puts the calling thread at nice 19 under SCHED_IDLE.
fn lowest_priority() {
    // SAFETY: setpriority and sched_setscheduler with pid 0 change the calling thread's
    // nice value and policy on Linux (both are per thread there); the sched_param is a
    // local initialised here and only read.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, 19);
        let p = libc::sched_param { sched_priority: 0 };
        libc::sched_setscheduler(0, libc::SCHED_IDLE, &p);
    }
}

/// On SIGINT or SIGTERM, removes the socket files and exits, so a stopped server leaves nothing
/// behind (those in `paths` when the signal comes). Must run before any other thread
/// starts: the signals are blocked here and every later thread inherits the mask, so only
/// the waiting thread receives them.
pub fn exit_on_signal(paths: Arc<Mutex<Vec<PathBuf>>>) -> Result<(), BlkError> {
    // SAFETY: the set is a local, initialised by sigemptyset before use; pthread_sigmask only
    // changes the calling thread's mask.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut sig = 0;
            // SAFETY: `set` is initialised and blocked in every thread; sigwait only reads it.
            unsafe { libc::sigwait(&set, &mut sig) };
            if let Ok(paths) = paths.lock() {
                for p in paths.iter() {
                    let _ = std::fs::remove_file(p);
                }
            }
            eprintln!("compfs blk: stopped by signal {sig}");
            std::process::exit(0);
        })
        .map_err(|e| BlkError::io("cannot start the signal thread", e))?;
    Ok(())
}

/// Sends one command to a server's control socket; returns its reply lines or its error.
pub fn control_request(path: &Path, command: &str) -> Result<Vec<String>, BlkError> {
    let mut s = UnixStream::connect(path).map_err(|e| {
        BlkError::io(
            format!(
                "cannot connect to control socket {} (is `compfs blk serve` running?)",
                path.display()
            ),
            e,
        )
    })?;
    // Recompression or writeback of a large device can take a while; do not hang forever.
    s.set_read_timeout(Some(Duration::from_secs(3600)))
        .map_err(|e| BlkError::io("control socket", e))?;
    writeln!(s, "{command}").map_err(|e| BlkError::io("control socket write", e))?;
    let mut lines = Vec::new();
    for l in BufReader::new(s.take(1 << 20)).lines() {
        let l = l.map_err(|e| BlkError::io("control socket read", e))?;
        if l == "ok" {
            return Ok(lines);
        }
        if let Some(msg) = l.strip_prefix("error ") {
            return Err(BlkError::Remote(msg.to_string()));
        }
        lines.push(l);
    }
    Err(BlkError::Protocol(
        "control socket closed without a status line".into(),
    ))
}
