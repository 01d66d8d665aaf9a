//! The NBD protocol (<https://github.com/NetworkBlockDevice/nbd/blob/master/doc/proto.md>),
//! server side: fixed newstyle handshake with NBD_OPT_GO/INFO/LIST/ABORT/EXPORT_NAME,
//! NBD_OPT_STRUCTURED_REPLY and the `base:allocation` metadata context, and the transmission
//! phase with simple replies, or structured replies and NBD_CMD_BLOCK_STATUS for clients that
//! negotiate them. docs/nbd.md lists what is implemented and why this is not built on the `nbd`
//! crate.
//!
//! Parsing is split from I/O: [`Request::parse`], [`parse_info_option`],
//! [`crate::meta::parse_meta_option`] and [`crate::extents::extents`] are pure functions, tested
//! with malformed input; [`handshake`] and [`transmission`] do the I/O over any `Read`/`Write`
//! pair.

use std::io::{self, Read, Write};

use crate::error::BlkError;
use crate::extents::{allocation_flags, extents};
use crate::meta::{self, BASE_ALLOCATION, BASE_ALLOCATION_ID};
use crate::store::PageStore;

pub use crate::nbd_consts::*;

/// Block size constraints sent in NBD_INFO_BLOCK_SIZE: any alignment works (partial pages are
/// read-modify-written), 4 KiB is the page size, 32 MiB the largest payload.
pub const MIN_BLOCK: u32 = 1;
pub const PREFERRED_BLOCK: u32 = 4096;
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// Largest option payload read in the handshake: an export name is at most 4096 bytes, plus
/// the name length and up to a few info requests. Longer options are skipped unread.
pub const MAX_OPTION: u32 = 8192;

/// What the client negotiated in the handshake.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Session {
    /// NBD_OPT_STRUCTURED_REPLY was acknowledged: READ and BLOCK_STATUS get structured replies.
    pub structured: bool,
    /// The last NBD_OPT_SET_META_CONTEXT selected `base:allocation`: BLOCK_STATUS is allowed.
    pub base_allocation: bool,
}

impl Session {
    /// Transmission flags for this session: [`TRANSMISSION_FLAGS`], plus `SEND_DF` once
    /// structured replies are negotiated (the spec forbids it before; a READ with DF gets one
    /// data chunk, and EOVERFLOW if it is longer than [`CHUNK`]).
    pub fn transmission_flags(&self) -> u16 {
        if self.structured {
            TRANSMISSION_FLAGS | TF_SEND_DF
        } else {
            TRANSMISSION_FLAGS
        }
    }
}

/// Length of a request header on the wire.
pub const REQUEST_LEN: usize = 28;

/// A transmission request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
}

/// Why a request header cannot be used; the connection is closed since framing is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("bad request magic {0:#010x}")]
    BadMagic(u32),
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

impl Request {
    /// Parses a 28-byte request header.
    pub fn parse(b: &[u8; REQUEST_LEN]) -> Result<Request, RequestError> {
        let magic = be32(&b[0..4]);
        if magic != REQUEST_MAGIC {
            return Err(RequestError::BadMagic(magic));
        }
        Ok(Request {
            flags: be16(&b[4..6]),
            kind: be16(&b[6..8]),
            cookie: be64(&b[8..16]),
            offset: be64(&b[16..24]),
            len: be32(&b[24..28]),
        })
    }

    /// Encodes the header (for clients and tests).
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Whether the client sends `len` payload bytes after this header.
    pub fn has_payload(&self) -> bool {
        self.kind == CMD_WRITE
    }

    /// The flags this command may carry in `session`; anything else is EINVAL.
    fn allowed_flags(&self, session: &Session) -> u16 {
        match self.kind {
            CMD_WRITE | CMD_TRIM => CMD_FLAG_FUA,
            CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
            CMD_READ if session.structured => CMD_FLAG_FUA | CMD_FLAG_DF,
            CMD_BLOCK_STATUS => CMD_FLAG_FUA | CMD_FLAG_REQ_ONE,
            _ => CMD_FLAG_FUA,
        }
    }

    /// The error the request gets before touching the store, if any: unknown command or flags,
    /// BLOCK_STATUS without a selected metadata context or of length 0, a payload over the
    /// maximum (or a READ with DF over one chunk), or a range outside the export (ENOSPC for
    /// writes, as the spec and nbdkit do; EINVAL otherwise).
    pub fn validate(&self, size: u64, session: &Session) -> Option<u32> {
        match self.kind {
            CMD_READ | CMD_WRITE | CMD_FLUSH | CMD_TRIM | CMD_CACHE | CMD_WRITE_ZEROES => {}
            CMD_BLOCK_STATUS if session.base_allocation => {}
            _ => return Some(EINVAL),
        }
        if self.flags & !self.allowed_flags(session) != 0 {
            return Some(EINVAL);
        }
        if self.kind == CMD_FLUSH {
            return (self.offset != 0 || self.len != 0).then_some(EINVAL);
        }
        if self.kind == CMD_BLOCK_STATUS && self.len == 0 {
            return Some(EINVAL);
        }
        if (self.kind == CMD_READ || self.kind == CMD_WRITE) && self.len > MAX_PAYLOAD {
            return Some(EOVERFLOW);
        }
        if self.kind == CMD_READ && self.flags & CMD_FLAG_DF != 0 && self.len as usize > CHUNK {
            return Some(EOVERFLOW);
        }
        match self.offset.checked_add(u64::from(self.len)) {
            Some(end) if end <= size => None,
            _ if self.kind == CMD_WRITE || self.kind == CMD_WRITE_ZEROES => Some(ENOSPC),
            _ => Some(EINVAL),
        }
    }
}

/// A parsed NBD_OPT_INFO / NBD_OPT_GO payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoOption {
    pub name: Vec<u8>,
    pub requests: Vec<u16>,
}

/// Parses the NBD_OPT_INFO/GO payload: u32 name length, name, u16 count, count × u16. The
/// lengths must add up exactly.
pub fn parse_info_option(data: &[u8]) -> Option<InfoOption> {
    if data.len() < 6 {
        return None;
    }
    let nlen = be32(&data[0..4]) as usize;
    if nlen > 4096 || data.len() < 4 + nlen + 2 {
        return None;
    }
    let name = data[4..4 + nlen].to_vec();
    let rest = &data[4 + nlen..];
    let n = be16(&rest[0..2]) as usize;
    if rest.len() != 2 + 2 * n {
        return None;
    }
    let requests = rest[2..].chunks_exact(2).map(be16).collect();
    Some(InfoOption { name, requests })
}

/// The export this server offers.
#[derive(Debug, Clone)]
pub struct Export {
    pub name: String,
    pub description: String,
    pub size: u64,
}

impl Export {
    /// The empty name selects the default (only) export.
    fn matches(&self, name: &[u8]) -> bool {
        name.is_empty() || name == self.name.as_bytes()
    }
}

fn opt_reply<W: Write>(w: &mut W, opt: u32, kind: u32, data: &[u8]) -> io::Result<()> {
    let mut h = [0u8; 20];
    h[0..8].copy_from_slice(&REPLY_MAGIC_OPT.to_be_bytes());
    h[8..12].copy_from_slice(&opt.to_be_bytes());
    h[12..16].copy_from_slice(&kind.to_be_bytes());
    h[16..20].copy_from_slice(&(data.len() as u32).to_be_bytes());
    w.write_all(&h)?;
    w.write_all(data)
}

fn info_export(size: u64, flags: u16) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[0..2].copy_from_slice(&INFO_EXPORT.to_be_bytes());
    b[2..10].copy_from_slice(&size.to_be_bytes());
    b[10..12].copy_from_slice(&flags.to_be_bytes());
    b
}

/// Answers NBD_OPT_LIST_META_CONTEXT (`list`) or NBD_OPT_SET_META_CONTEXT. SET needs structured
/// replies first (the spec's SHOULD); LIST is answered either way, as nbdkit does (the spec
/// lets a server refuse it). SET replaces the selection even when it fails, as the spec asks.
fn meta_context_option<W: Write>(
    w: &mut W,
    opt: u32,
    data: &[u8],
    export: &Export,
    session: &mut Session,
) -> io::Result<()> {
    let list = opt == OPT_LIST_META_CONTEXT;
    if !list {
        session.base_allocation = false;
    }
    if !list && !session.structured {
        return opt_reply(
            w,
            opt,
            REP_ERR_INVALID,
            b"negotiate NBD_OPT_STRUCTURED_REPLY first",
        );
    }
    let m = match meta::parse_meta_option(data) {
        Ok(m) => m,
        Err(e) => return opt_reply(w, opt, REP_ERR_INVALID, e.to_string().as_bytes()),
    };
    if !export.matches(&m.name) {
        return opt_reply(w, opt, REP_ERR_UNKNOWN, b"no such export");
    }
    let found = meta::selects_base_allocation(&m.queries, list);
    if found {
        // LIST replies carry id 0 (reserved), SET replies the id BLOCK_STATUS will use.
        let id = if list { 0 } else { BASE_ALLOCATION_ID };
        let mut d = id.to_be_bytes().to_vec();
        d.extend_from_slice(BASE_ALLOCATION.as_bytes());
        opt_reply(w, opt, REP_META_CONTEXT, &d)?;
    }
    if !list {
        session.base_allocation = found;
    }
    opt_reply(w, opt, REP_ACK, &[])
}

fn info_block_size() -> [u8; 14] {
    let mut b = [0u8; 14];
    b[0..2].copy_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    b[2..6].copy_from_slice(&MIN_BLOCK.to_be_bytes());
    b[6..10].copy_from_slice(&PREFERRED_BLOCK.to_be_bytes());
    b[10..14].copy_from_slice(&MAX_PAYLOAD.to_be_bytes());
    b
}

fn proto(msg: impl Into<String>) -> BlkError {
    BlkError::Protocol(msg.into())
}

fn io_err(what: &str) -> impl FnOnce(io::Error) -> BlkError + '_ {
    move |e| BlkError::io(what, e)
}

/// How the handshake ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handshake {
    /// The client selected the export: go on to transmission with what it negotiated.
    Transmission(Session),
    /// The client aborted or left cleanly.
    Closed,
}

/// Runs the fixed newstyle handshake. Malformed input ends it with an error (the caller closes
/// the connection); nothing the client sends is buffered beyond [`MAX_OPTION`] bytes.
pub fn handshake<R: Read, W: Write>(
    r: &mut R,
    w: &mut W,
    export: &Export,
) -> Result<Handshake, BlkError> {
    let mut hello = [0u8; 18];
    hello[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    hello[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    hello[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    w.write_all(&hello).map_err(io_err("handshake write"))?;
    w.flush().map_err(io_err("handshake write"))?;
    let mut cf = [0u8; 4];
    r.read_exact(&mut cf).map_err(io_err("client flags"))?;
    let client_flags = be32(&cf);
    if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(proto(format!("unknown client flags {client_flags:#x}")));
    }
    let no_zeroes = client_flags & FLAG_C_NO_ZEROES != 0;
    let mut session = Session::default();
    let mut data = Vec::new();
    loop {
        let mut h = [0u8; 16];
        match r.read_exact(&mut h) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(Handshake::Closed),
            Err(e) => return Err(BlkError::io("option header", e)),
        }
        let magic = be64(&h[0..8]);
        if magic != IHAVEOPT {
            return Err(proto(format!("bad option magic {magic:#018x}")));
        }
        let opt = be32(&h[8..12]);
        let len = be32(&h[12..16]);
        if len > MAX_OPTION {
            // Skip the payload without keeping it, then refuse.
            let skipped = io::copy(&mut r.by_ref().take(u64::from(len)), &mut io::sink())
                .map_err(io_err("option payload"))?;
            if skipped != u64::from(len) || opt == OPT_EXPORT_NAME {
                return Err(proto("oversized option"));
            }
            if opt == OPT_SET_META_CONTEXT {
                // A failed SET still replaces the selection.
                session.base_allocation = false;
            }
            opt_reply(w, opt, REP_ERR_TOO_BIG, b"option too large")
                .map_err(io_err("option reply"))?;
            w.flush().map_err(io_err("option reply"))?;
            continue;
        }
        data.resize(len as usize, 0);
        r.read_exact(&mut data).map_err(io_err("option payload"))?;
        match opt {
            OPT_EXPORT_NAME => {
                if !export.matches(&data) {
                    // The spec's only answer to an unknown name here is to close.
                    return Err(proto("unknown export name"));
                }
                let mut b = [0u8; 10 + 124];
                b[0..8].copy_from_slice(&export.size.to_be_bytes());
                b[8..10].copy_from_slice(&session.transmission_flags().to_be_bytes());
                let n = if no_zeroes { 10 } else { 10 + 124 };
                w.write_all(&b[..n]).map_err(io_err("export reply"))?;
                w.flush().map_err(io_err("export reply"))?;
                return Ok(Handshake::Transmission(session));
            }
            OPT_ABORT => {
                // Best effort: the client may already have gone.
                let _ = opt_reply(w, opt, REP_ACK, &[]).and_then(|_| w.flush());
                return Ok(Handshake::Closed);
            }
            OPT_LIST => {
                if !data.is_empty() {
                    opt_reply(w, opt, REP_ERR_INVALID, b"NBD_OPT_LIST takes no data")
                } else {
                    let mut d = (export.name.len() as u32).to_be_bytes().to_vec();
                    d.extend_from_slice(export.name.as_bytes());
                    opt_reply(w, opt, REP_SERVER, &d).and_then(|_| opt_reply(w, opt, REP_ACK, &[]))
                }
                .map_err(io_err("option reply"))?;
            }
            OPT_INFO | OPT_GO => match parse_info_option(&data) {
                None => opt_reply(w, opt, REP_ERR_INVALID, b"malformed NBD_OPT_INFO/GO")
                    .map_err(io_err("option reply"))?,
                Some(info) if !export.matches(&info.name) => {
                    opt_reply(w, opt, REP_ERR_UNKNOWN, b"no such export")
                        .map_err(io_err("option reply"))?
                }
                Some(info) => {
                    let mut send = || -> io::Result<()> {
                        let flags = session.transmission_flags();
                        opt_reply(w, opt, REP_INFO, &info_export(export.size, flags))?;
                        opt_reply(w, opt, REP_INFO, &info_block_size())?;
                        if info.requests.contains(&INFO_NAME) {
                            let mut d = INFO_NAME.to_be_bytes().to_vec();
                            d.extend_from_slice(export.name.as_bytes());
                            opt_reply(w, opt, REP_INFO, &d)?;
                        }
                        if info.requests.contains(&INFO_DESCRIPTION) {
                            let mut d = INFO_DESCRIPTION.to_be_bytes().to_vec();
                            d.extend_from_slice(export.description.as_bytes());
                            opt_reply(w, opt, REP_INFO, &d)?;
                        }
                        opt_reply(w, opt, REP_ACK, &[])
                    };
                    send().map_err(io_err("option reply"))?;
                    if opt == OPT_GO {
                        w.flush().map_err(io_err("option reply"))?;
                        return Ok(Handshake::Transmission(session));
                    }
                }
            },
            OPT_STRUCTURED_REPLY => if data.is_empty() {
                session.structured = true;
                opt_reply(w, opt, REP_ACK, &[])
            } else {
                opt_reply(
                    w,
                    opt,
                    REP_ERR_INVALID,
                    b"NBD_OPT_STRUCTURED_REPLY takes no data",
                )
            }
            .map_err(io_err("option reply"))?,
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                meta_context_option(w, opt, &data, export, &mut session)
                    .map_err(io_err("option reply"))?
            }
            OPT_STARTTLS => opt_reply(w, opt, REP_ERR_UNSUP, b"TLS is not supported")
                .map_err(io_err("option reply"))?,
            _ => opt_reply(w, opt, REP_ERR_UNSUP, b"unsupported option")
                .map_err(io_err("option reply"))?,
        }
        w.flush().map_err(io_err("option reply"))?;
    }
}

/// Largest piece of a READ or WRITE payload held in memory at once.
pub const CHUNK: usize = 1 << 20;

fn reply_header<W: Write>(w: &mut W, error: u32, cookie: u64) -> io::Result<()> {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    h[4..8].copy_from_slice(&error.to_be_bytes());
    h[8..16].copy_from_slice(&cookie.to_be_bytes());
    w.write_all(&h)
}

/// Writes the success reply of a request that carries no data (e.g. a WRITE), unflushed.
pub fn ok_reply<W: Write>(w: &mut W, cookie: u64) -> io::Result<()> {
    simple_reply(w, 0, cookie, &[])
}

fn simple_reply<W: Write>(w: &mut W, error: u32, cookie: u64, data: &[u8]) -> io::Result<()> {
    reply_header(w, error, cookie)?;
    w.write_all(data)
}

/// Writes a structured reply chunk header; `len` payload bytes must follow.
fn chunk_header<W: Write>(
    w: &mut W,
    flags: u16,
    kind: u16,
    cookie: u64,
    len: u32,
) -> io::Result<()> {
    let mut h = [0u8; 20];
    h[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    h[4..6].copy_from_slice(&flags.to_be_bytes());
    h[6..8].copy_from_slice(&kind.to_be_bytes());
    h[8..16].copy_from_slice(&cookie.to_be_bytes());
    h[16..20].copy_from_slice(&len.to_be_bytes());
    w.write_all(&h)
}

/// The final error chunk of a structured reply: NBD_REPLY_TYPE_ERROR_OFFSET when the failing
/// offset is known, else NBD_REPLY_TYPE_ERROR, with a message for the user.
fn error_chunk<W: Write>(
    w: &mut W,
    cookie: u64,
    errno: u32,
    msg: &str,
    offset: Option<u64>,
) -> io::Result<()> {
    // At most 4096 bytes (the spec's string limit), cut at a character boundary.
    let mut n = msg.len().min(meta::MAX_STRING);
    while !msg.is_char_boundary(n) {
        n -= 1;
    }
    let msg = &msg.as_bytes()[..n];
    let (kind, extra) = match offset {
        Some(_) => (REPLY_TYPE_ERROR_OFFSET, 8),
        None => (REPLY_TYPE_ERROR, 0),
    };
    chunk_header(
        w,
        REPLY_FLAG_DONE,
        kind,
        cookie,
        (6 + msg.len() + extra) as u32,
    )?;
    w.write_all(&errno.to_be_bytes())?;
    w.write_all(&(msg.len() as u16).to_be_bytes())?;
    w.write_all(msg)?;
    if let Some(o) = offset {
        w.write_all(&o.to_be_bytes())?;
    }
    Ok(())
}

/// An error reply: a structured error chunk when structured replies are negotiated (required
/// for READ, preferred by the spec for the rest because it carries a message), else simple.
fn error_reply<W: Write>(
    w: &mut W,
    session: &Session,
    cookie: u64,
    errno: u32,
    msg: &str,
) -> io::Result<()> {
    if session.structured {
        error_chunk(w, cookie, errno, msg, None)
    } else {
        simple_reply(w, errno, cookie, &[])
    }
}

/// The message sent with a request refused by [`Request::validate`].
fn refusal_message(req: &Request, errno: u32) -> &'static str {
    match (errno, req.kind) {
        (EOVERFLOW, _) => "request length over the maximum payload",
        (ENOSPC, _) => "write past the end of the device",
        (_, CMD_BLOCK_STATUS) => {
            "block status needs base:allocation negotiated, a nonzero length and a range inside the device"
        }
        (_, CMD_READ | CMD_WRITE | CMD_TRIM | CMD_CACHE | CMD_WRITE_ZEROES | CMD_FLUSH) => {
            "invalid flags or range"
        }
        _ => "unknown command",
    }
}

/// Serves requests until the client disconnects (NBD_CMD_DISC or EOF). A bad request magic or a
/// write larger than [`MAX_PAYLOAD`] closes the connection (the payload cannot be trusted);
/// everything else gets an error reply and the connection goes on. Payloads move in chunks of
/// [`CHUNK`] bytes, so a connection holds at most one chunk whatever the request length.
/// Without structured replies every reply is simple; with them, READ and BLOCK_STATUS replies
/// and all errors are structured, other successes stay simple (as nbdkit does).
pub fn transmission<R: Read + Pending, W: Write>(
    r: &mut R,
    w: &mut W,
    store: &PageStore,
    session: &Session,
) -> Result<(), BlkError> {
    let result = serve_requests(r, w, store, session);
    // Replies still buffered go out however the connection ends (best effort on error).
    let flushed = w.flush();
    match result {
        Ok(()) => flushed.map_err(io_err("reply")),
        Err(e) => Err(e),
    }
}

/// Bytes a reader has already received and buffered, so the server can tell whether the next
/// request can be read without blocking.
pub trait Pending {
    fn pending(&self) -> &[u8];
}

impl<R: Read> Pending for std::io::BufReader<R> {
    fn pending(&self) -> &[u8] {
        self.buffer()
    }
}

impl<T: AsRef<[u8]>> Pending for std::io::Cursor<T> {
    fn pending(&self) -> &[u8] {
        let all = self.get_ref().as_ref();
        let pos = usize::try_from(self.position()).unwrap_or(usize::MAX);
        all.get(pos..).unwrap_or(&[])
    }
}

/// Whether `pending` holds a whole request (header and, for a WRITE, its payload), so that
/// serving it cannot block on the socket. While it does, replies stay in the write buffer and
/// go out together: a client with many requests in flight gets them in a few `sendto` calls
/// instead of one per request, and a client waiting for its only request never waits on a
/// buffered reply.
pub fn whole_request_buffered(pending: &[u8]) -> bool {
    let Some(h) = pending.first_chunk::<REQUEST_LEN>() else {
        return false;
    };
    match Request::parse(h) {
        Ok(req) if req.has_payload() => pending.len() - REQUEST_LEN >= req.len as usize,
        // A bad magic is answered by closing; nothing to wait for.
        _ => true,
    }
}

fn serve_requests<R: Read + Pending, W: Write>(
    r: &mut R,
    w: &mut W,
    store: &PageStore,
    session: &Session,
) -> Result<(), BlkError> {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        if !whole_request_buffered(r.pending()) {
            w.flush().map_err(io_err("reply"))?;
        }
        let Some(incoming) = read_request(r, store, session, &mut buf)? else {
            return Ok(());
        };
        if let Incoming::Write(req) = &incoming {
            // Nothing else waits: reply before compressing (`PageStore::write_early`).
            if !whole_request_buffered(r.pending()) {
                let data = buf.get(..req.len as usize).unwrap_or_default();
                let ack = || {
                    ok_reply(w, req.cookie)
                        .and_then(|()| w.flush())
                        .map_err(io_err("reply"))
                };
                if store.write_early(req.offset, data, ack)? {
                    continue;
                }
            }
        }
        answer(w, store, session, incoming, &mut buf)?;
    }
}

/// A request as read from the stream, ready to be answered by [`answer`].
#[derive(Debug)]
pub enum Incoming {
    /// Refused before reaching the store (its payload, if any, was skipped).
    Refused { req: Request, errno: u32 },
    /// A WRITE over [`MAX_PAYLOAD`]: its payload cannot be skipped safely, so [`answer`]
    /// sends the error reply and ends the connection.
    Oversized { req: Request, errno: u32 },
    /// A WRITE of at most [`CHUNK`] bytes whose payload is in the caller's buffer.
    Write(Request),
    /// A longer WRITE, stored chunk by chunk as it was read, with its outcome.
    Stored(Request, Result<(), BlkError>),
    /// Any other command.
    Other(Request),
}

/// Reads the next request (and a WRITE's payload) from `r`; `None` at the end of the session
/// (NBD_CMD_DISC or EOF). A bad magic is an error that ends the connection.
pub fn read_request<R: Read>(
    r: &mut R,
    store: &PageStore,
    session: &Session,
    buf: &mut Vec<u8>,
) -> Result<Option<Incoming>, BlkError> {
    let mut h = [0u8; REQUEST_LEN];
    match r.read_exact(&mut h) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(BlkError::io("request header", e)),
    }
    let req = Request::parse(&h).map_err(|e| proto(e.to_string()))?;
    if req.kind == CMD_DISC {
        return Ok(None);
    }
    let len = req.len as usize;
    if let Some(errno) = req.validate(store.size(), session) {
        store.count_invalid();
        if req.has_payload() {
            if req.len > MAX_PAYLOAD {
                return Ok(Some(Incoming::Oversized { req, errno }));
            }
            let got = io::copy(&mut r.by_ref().take(u64::from(req.len)), &mut io::sink())
                .map_err(io_err("write payload"))?;
            if got != u64::from(req.len) {
                return Ok(None);
            }
        }
        return Ok(Some(Incoming::Refused { req, errno }));
    }
    if req.kind != CMD_WRITE {
        return Ok(Some(Incoming::Other(req)));
    }
    if len <= CHUNK {
        buf.resize(len, 0);
        r.read_exact(&mut buf[..len])
            .map_err(io_err("write payload"))?;
        return Ok(Some(Incoming::Write(req)));
    }
    // Stored chunk by chunk as it arrives; after a failed chunk the rest of the payload is
    // still read (to keep the stream in step) but not stored, and the first error is the
    // reply.
    let mut done = 0usize;
    let mut result = Ok(());
    while done < len {
        let n = (len - done).min(CHUNK);
        buf.resize(n, 0);
        r.read_exact(&mut buf[..n])
            .map_err(io_err("write payload"))?;
        if result.is_ok() {
            result = store.write(req.offset + done as u64, &buf[..n]);
        }
        done += n;
    }
    Ok(Some(Incoming::Stored(req, result)))
}

/// Answers a request read by [`read_request`] (a WRITE's payload in `buf`), writing the reply
/// to `w` without flushing it.
pub fn answer<W: Write>(
    w: &mut W,
    store: &PageStore,
    session: &Session,
    incoming: Incoming,
    buf: &mut Vec<u8>,
) -> Result<(), BlkError> {
    let (req, result) = match incoming {
        Incoming::Refused { req, errno } => {
            return error_reply(w, session, req.cookie, errno, refusal_message(&req, errno))
                .map_err(io_err("reply"));
        }
        Incoming::Oversized { req, errno } => {
            // Best effort: the connection ends whatever happens to the reply.
            let _ = error_reply(w, session, req.cookie, errno, refusal_message(&req, errno));
            return Err(proto(format!(
                "write of {} bytes exceeds the maximum",
                req.len
            )));
        }
        Incoming::Write(req) => {
            let r = store.write(req.offset, &buf[..req.len as usize]);
            (req, r)
        }
        Incoming::Stored(req, r) => (req, r),
        Incoming::Other(req) => {
            let len = req.len as usize;
            let r = match req.kind {
                CMD_READ if session.structured => return structured_read(w, store, &req, buf),
                CMD_READ => {
                    // Served in chunks of at most CHUNK bytes, so a connection never holds
                    // more than one chunk whatever the request length. The reply header goes
                    // out with the first chunk; an error after that can only close the
                    // connection.
                    let first = len.min(CHUNK);
                    buf.resize(first, 0);
                    match store.read(req.offset, &mut buf[..first]) {
                        Err(e) => Err(e),
                        Ok(()) => {
                            reply_header(w, 0, req.cookie).map_err(io_err("reply"))?;
                            w.write_all(&buf[..first]).map_err(io_err("reply"))?;
                            let mut done = first;
                            while done < len {
                                let n = (len - done).min(CHUNK);
                                store.read(req.offset + done as u64, &mut buf[..n])?;
                                w.write_all(&buf[..n]).map_err(io_err("reply"))?;
                                done += n;
                            }
                            return Ok(());
                        }
                    }
                }
                CMD_FLUSH | CMD_CACHE => Ok(()),
                CMD_TRIM => store.trim(req.offset, u64::from(req.len)),
                CMD_WRITE_ZEROES => store.write_zeroes(
                    req.offset,
                    u64::from(req.len),
                    req.flags & CMD_FLAG_NO_HOLE != 0,
                ),
                CMD_BLOCK_STATUS => {
                    return block_status(w, store, &req, buf).map_err(io_err("reply"));
                }
                // validate() lets only the kinds above through.
                _ => Ok(()),
            };
            (req, r)
        }
    };
    match &result {
        Ok(()) => simple_reply(w, 0, req.cookie, &[]),
        Err(e) => {
            tracing::debug!("request {:?} failed: {e}", req);
            error_reply(w, session, req.cookie, e.errno(), &e.to_string())
        }
    }
    .map_err(io_err("reply"))
}

/// A READ answered with structured replies: one NBD_REPLY_TYPE_OFFSET_DATA chunk per piece of
/// at most [`CHUNK`] bytes, each read from the store before its header is sent, the last one
/// flagged DONE. A piece that fails ends the reply with an NBD_REPLY_TYPE_ERROR_OFFSET chunk at
/// its offset (the pieces before it are valid), and the connection goes on. A read of length 0
/// gets a lone NBD_REPLY_TYPE_NONE.
fn structured_read<W: Write>(
    w: &mut W,
    store: &PageStore,
    req: &Request,
    buf: &mut Vec<u8>,
) -> Result<(), BlkError> {
    let len = req.len as usize;
    if len == 0 {
        chunk_header(w, REPLY_FLAG_DONE, REPLY_TYPE_NONE, req.cookie, 0)
            .map_err(io_err("reply"))?;
        return Ok(());
    }
    let mut done = 0usize;
    while done < len {
        let n = (len - done).min(CHUNK);
        let offset = req.offset + done as u64;
        buf.resize(n, 0);
        if let Err(e) = store.read(offset, &mut buf[..n]) {
            tracing::debug!("request {:?} failed: {e}", req);
            error_chunk(w, req.cookie, e.errno(), &e.to_string(), Some(offset))
                .map_err(io_err("reply"))?;
            return Ok(());
        }
        let flags = if done + n == len { REPLY_FLAG_DONE } else { 0 };
        let mut send = || -> io::Result<()> {
            chunk_header(w, flags, REPLY_TYPE_OFFSET_DATA, req.cookie, 8 + n as u32)?;
            w.write_all(&offset.to_be_bytes())?;
            w.write_all(&buf[..n])
        };
        send().map_err(io_err("reply"))?;
        done += n;
    }
    Ok(())
}

/// A BLOCK_STATUS reply for `base:allocation`: one NBD_REPLY_TYPE_BLOCK_STATUS chunk (DONE)
/// with the descriptors from [`extents`]; with REQ_ONE exactly one descriptor. `buf` is reused
/// for the payload.
fn block_status<W: Write>(
    w: &mut W,
    store: &PageStore,
    req: &Request,
    buf: &mut Vec<u8>,
) -> io::Result<()> {
    let max = if req.flags & CMD_FLAG_REQ_ONE != 0 {
        1
    } else {
        MAX_EXTENTS
    };
    let ext = extents(req.offset, req.len, max, |page, pages| {
        let (state, n) = store.page_run(page, pages);
        (allocation_flags(state), n)
    });
    buf.clear();
    buf.extend_from_slice(&BASE_ALLOCATION_ID.to_be_bytes());
    for (len, flags) in &ext {
        buf.extend_from_slice(&len.to_be_bytes());
        buf.extend_from_slice(&flags.to_be_bytes());
    }
    chunk_header(
        w,
        REPLY_FLAG_DONE,
        REPLY_TYPE_BLOCK_STATUS,
        req.cookie,
        buf.len() as u32,
    )?;
    w.write_all(buf)
}
