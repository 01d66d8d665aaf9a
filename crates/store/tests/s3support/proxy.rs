//! A fault-injecting TCP proxy between a store and a real S3 server: every byte that reaches
//! the server is the client's, every byte the client gets is the server's or a fault the proxy
//! made up. One request per connection (the proxy adds `Connection: close` to each request
//! head, so the server closes after its answer and the client's next request opens a new
//! connection), and for each request a seeded draw decides its fate: answered `503 Slow Down`
//! by the proxy, cut off halfway through its body, forwarded with its answer cut off halfway,
//! delayed, or forwarded untouched. A black-hole mode swallows every request and answers
//! nothing (an unreachable bucket whose connections still open); when it ends, the connections
//! it swallowed are closed (the network is back: the clients see them cut and try again).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Shares of requests (per mille) that meet each fault, drawn from a generator seeded by
/// `seed`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    pub seed: u64,
    /// Answered `HTTP/1.1 503` by the proxy (the server never sees them).
    pub unavailable: u32,
    /// Cut off after the head and half of the body: the server sees a truncated request.
    pub drop_request: u32,
    /// Forwarded whole, the server's answer cut off halfway: the request may have been done.
    pub drop_response: u32,
    /// Forwarded after a delay of up to `max_delay`.
    pub delay: u32,
    pub max_delay: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Unavailable,
    DropRequest,
    DropResponse,
    Delay(Duration),
    Pass,
}

/// What the proxy did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ProxyCounts {
    pub requests: u64,
    pub unavailable: u64,
    pub dropped_requests: u64,
    pub dropped_responses: u64,
    pub delayed: u64,
    pub black_holed: u64,
}

/// A request that met a fault (503 or a cut): when the client learnt of it, and when the
/// next request of the same method and target came in (its retry).
#[derive(Debug, Clone)]
pub struct Retry {
    pub what: String,
    pub fault: &'static str,
    pub failed_at: Instant,
    pub retried_at: Option<Instant>,
}

struct State {
    upstream: SocketAddr,
    faults: Faults,
    rng: Mutex<u64>,
    black_hole: AtomicBool,
    stop: AtomicBool,
    counts: Mutex<ProxyCounts>,
    retries: Mutex<Vec<Retry>>,
}

/// The proxy: listens on 127.0.0.1 (a free port) until dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    state: Arc<State>,
    accept: Option<JoinHandle<()>>,
}

/// splitmix64: a small, good, seedable generator.
fn next(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl FaultProxy {
    pub fn start(upstream: SocketAddr, faults: Faults) -> FaultProxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let state = Arc::new(State {
            upstream,
            faults,
            rng: Mutex::new(faults.seed),
            black_hole: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            counts: Mutex::new(ProxyCounts::default()),
            retries: Mutex::new(Vec::new()),
        });
        let st = state.clone();
        let accept = std::thread::spawn(move || {
            for c in l.incoming() {
                if st.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(c) = c else { continue };
                let st = st.clone();
                std::thread::spawn(move || {
                    let _ = serve(&st, c);
                });
            }
        });
        FaultProxy {
            addr,
            state,
            accept: Some(accept),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Swallows every request from now on (`true`), or serves them again (and closes the
    /// connections swallowed so far).
    pub fn black_hole(&self, on: bool) {
        self.state.black_hole.store(on, Ordering::SeqCst);
    }

    pub fn counts(&self) -> ProxyCounts {
        *self.state.counts.lock().unwrap()
    }

    pub fn retries(&self) -> Vec<Retry> {
        self.state.retries.lock().unwrap().clone()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect(self.addr);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn count(st: &State, f: impl FnOnce(&mut ProxyCounts)) {
    f(&mut st.counts.lock().unwrap());
}

fn draw(st: &State) -> Fate {
    let f = &st.faults;
    let (r, d) = {
        let mut g = st.rng.lock().unwrap();
        (next(&mut g) % 1000, next(&mut g))
    };
    let r = r as u32;
    let mut edge = f.unavailable;
    if r < edge {
        return Fate::Unavailable;
    }
    edge += f.drop_request;
    if r < edge {
        return Fate::DropRequest;
    }
    edge += f.drop_response;
    if r < edge {
        return Fate::DropResponse;
    }
    edge += f.delay;
    if r < edge {
        let ms = f.max_delay.as_millis().max(1) as u64;
        return Fate::Delay(Duration::from_millis(d % ms));
    }
    Fate::Pass
}

/// Reads the request head (through the blank line); returns it and the body bytes read past
/// it. `None` when the client closed first or sent no HTTP head within 64 KiB.
fn read_head(c: &mut TcpStream) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(p + 4);
            return Some((buf, rest));
        }
        if buf.len() > 64 << 10 {
            return None;
        }
        let n = c.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then_some(v.trim())
    })
}

/// The head with `Connection: close` in place of any `Connection` header.
fn close_after(head: &str) -> Vec<u8> {
    let mut out = String::new();
    let mut lines = head.trim_end_matches("\r\n").split("\r\n");
    if let Some(first) = lines.next() {
        out.push_str(first);
        out.push_str("\r\nConnection: close\r\n");
    }
    for l in lines {
        let is_conn = l
            .split_once(':')
            .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("connection"));
        if !is_conn {
            out.push_str(l);
            out.push_str("\r\n");
        }
    }
    out.push_str("\r\n");
    out.into_bytes()
}

/// Reads and discards `n` bytes (fewer if the peer closes).
fn drain(c: &mut TcpStream, mut n: u64) {
    let mut chunk = [0u8; 8192];
    while n > 0 {
        match c.read(&mut chunk[..(n.min(8192)) as usize]) {
            Ok(0) | Err(_) => return,
            Ok(k) => n -= k as u64,
        }
    }
}

fn note_fault(st: &State, what: &str, fault: &'static str) {
    st.retries.lock().unwrap().push(Retry {
        what: what.to_string(),
        fault,
        failed_at: Instant::now(),
        retried_at: None,
    });
}

fn note_request(st: &State, what: &str) {
    let now = Instant::now();
    let mut r = st.retries.lock().unwrap();
    // The client resumes a GET whose answer was cut by asking for the rest of it: the same
    // method and target with another range.
    let target = |w: &str| {
        w.rsplit_once(' ')
            .map_or(String::new(), |x| x.0.to_string())
    };
    for x in r.iter_mut().rev() {
        let resumed =
            x.fault == "answer cut" && what.starts_with("GET ") && target(&x.what) == target(what);
        if (x.what == what || resumed) && x.retried_at.is_none() {
            x.retried_at = Some(now);
            break;
        }
    }
}

fn serve(st: &State, mut c: TcpStream) -> std::io::Result<()> {
    let Some((head, extra)) = read_head(&mut c) else {
        return Ok(());
    };
    let head = String::from_utf8_lossy(&head).into_owned();
    let request_line = head.lines().next().unwrap_or("").to_string();
    // Method and target (with the range asked for): what a retry repeats.
    let what = format!(
        "{} {}",
        request_line.rsplit_once(' ').map_or("", |x| x.0),
        header(&head, "range").unwrap_or("")
    );
    let body_len: u64 = header(&head, "content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if st.black_hole.load(Ordering::SeqCst) {
        count(st, |n| n.black_holed += 1);
        // Swallow what comes until the client gives up, the black hole ends or the proxy stops.
        c.set_read_timeout(Some(Duration::from_millis(50)))?;
        let mut sink = [0u8; 8192];
        while !st.stop.load(Ordering::SeqCst) && st.black_hole.load(Ordering::SeqCst) {
            match c.read(&mut sink) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => break,
            }
        }
        let _ = c.shutdown(Shutdown::Both);
        return Ok(());
    }
    note_request(st, &what);
    count(st, |n| n.requests += 1);
    let fate = draw(st);
    match fate {
        Fate::Unavailable => {
            count(st, |n| n.unavailable += 1);
            drain(&mut c, body_len.saturating_sub(extra.len() as u64));
            let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>\
                        <Message>fault proxy</Message></Error>";
            let resp = format!(
                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            c.write_all(resp.as_bytes())?;
            c.flush()?;
            note_fault(st, &what, "503");
            let _ = c.shutdown(Shutdown::Both);
            return Ok(());
        }
        Fate::Delay(d) => {
            count(st, |n| n.delayed += 1);
            std::thread::sleep(d);
        }
        _ => {}
    }
    let mut up = TcpStream::connect(st.upstream)?;
    up.write_all(&close_after(&head))?;
    if fate == Fate::DropRequest {
        count(st, |n| n.dropped_requests += 1);
        // Half of the body, then both connections cut.
        let half = (body_len / 2) as usize;
        let mut sent = extra.len().min(half);
        up.write_all(&extra[..sent])?;
        let mut chunk = [0u8; 8192];
        while sent < half {
            let want = (half - sent).min(chunk.len());
            let k = c.read(&mut chunk[..want])?;
            if k == 0 {
                break;
            }
            up.write_all(&chunk[..k])?;
            sent += k;
        }
        let _ = up.shutdown(Shutdown::Both);
        note_fault(st, &what, "request cut");
        let _ = c.shutdown(Shutdown::Both);
        return Ok(());
    }
    up.write_all(&extra)?;
    // The rest of the body, client to server, beside the answer, server to client.
    let mut c_in = c.try_clone()?;
    let mut up_out = up.try_clone()?;
    let forward = std::thread::spawn(move || {
        let _ = std::io::copy(&mut c_in, &mut up_out);
        let _ = up_out.shutdown(Shutdown::Write);
    });
    let mut answer = Vec::new();
    if fate == Fate::DropResponse {
        up.read_to_end(&mut answer)?;
        count(st, |n| n.dropped_responses += 1);
        c.write_all(&answer[..answer.len() / 2])?;
        c.flush()?;
        note_fault(st, &what, "answer cut");
    } else {
        std::io::copy(&mut up, &mut c)?;
    }
    let _ = c.shutdown(Shutdown::Both);
    let _ = up.shutdown(Shutdown::Both);
    let _ = forward.join();
    Ok(())
}

#[test]
fn draws_follow_the_seed_and_the_shares() {
    let mk = |seed| State {
        upstream: "127.0.0.1:1".parse().unwrap(),
        faults: Faults {
            seed,
            unavailable: 100,
            drop_request: 100,
            drop_response: 100,
            delay: 100,
            max_delay: Duration::from_millis(10),
        },
        rng: Mutex::new(seed),
        black_hole: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        counts: Mutex::new(ProxyCounts::default()),
        retries: Mutex::new(Vec::new()),
    };
    let (a, b) = (mk(7), mk(7));
    let da: Vec<Fate> = (0..2000).map(|_| draw(&a)).collect();
    let db: Vec<Fate> = (0..2000).map(|_| draw(&b)).collect();
    assert_eq!(da, db);
    let pass = da.iter().filter(|f| **f == Fate::Pass).count();
    assert!((1000..1400).contains(&pass), "{pass} of 2000 passed");
    let h = "PUT /b/k HTTP/1.1\r\nConnection: keep-alive\r\nContent-Length: 5\r\n\r\n";
    assert_eq!(
        close_after(h),
        b"PUT /b/k HTTP/1.1\r\nConnection: close\r\nContent-Length: 5\r\n\r\n".to_vec()
    );
    assert_eq!(header(h, "content-length"), Some("5"));
}
