//! The NBD protocol layer against malformed and hostile input, with a raw client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Cursor, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::JoinHandle;

use compfs_blk::nbd::*;
use compfs_blk::server::{control_command, serve_connection};
use compfs_blk::{Config, Export, PageStore, PAGE};
use compfs_codec::CodecSpec;
use proptest::prelude::*;

const SIZE: u64 = 64 * PAGE as u64;

fn store() -> Arc<PageStore> {
    Arc::new(
        PageStore::new(Config {
            size: SIZE,
            algo: CodecSpec::parse("lz4").unwrap().spec,
            recomp: vec![CodecSpec::parse("zstd:3").unwrap().spec],
            mem_limit: 0,
        })
        .unwrap(),
    )
}

fn export() -> Export {
    Export {
        name: "disk".into(),
        description: "test".into(),
        size: SIZE,
    }
}

/// Starts a server connection on one end of a socket pair.
fn start(store: &Arc<PageStore>) -> (UnixStream, JoinHandle<Result<(), compfs_blk::BlkError>>) {
    let (a, b) = UnixStream::pair().unwrap();
    let s = store.clone();
    let h = std::thread::spawn(move || serve_connection(b, &s, &export()));
    a.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    (a, h)
}

fn read_n(c: &mut UnixStream, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    c.read_exact(&mut b).unwrap();
    b
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_be_bytes(b[i..i + 4].try_into().unwrap())
}

fn greet(c: &mut UnixStream, client_flags: u32) {
    let hello = read_n(c, 18);
    assert_eq!(&hello[0..8], b"NBDMAGIC");
    assert_eq!(&hello[8..16], b"IHAVEOPT");
    assert_eq!(
        u16::from_be_bytes([hello[16], hello[17]]),
        FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES
    );
    c.write_all(&client_flags.to_be_bytes()).unwrap();
}

fn send_opt(c: &mut UnixStream, opt: u32, data: &[u8]) {
    let mut h = IHAVEOPT.to_be_bytes().to_vec();
    h.extend_from_slice(&opt.to_be_bytes());
    h.extend_from_slice(&(data.len() as u32).to_be_bytes());
    h.extend_from_slice(data);
    c.write_all(&h).unwrap();
}

/// Reads one option reply: (option, type, data).
fn opt_reply(c: &mut UnixStream) -> (u32, u32, Vec<u8>) {
    let h = read_n(c, 20);
    assert_eq!(
        u64::from_be_bytes(h[0..8].try_into().unwrap()),
        REPLY_MAGIC_OPT
    );
    let len = u32_at(&h, 16) as usize;
    (u32_at(&h, 8), u32_at(&h, 12), read_n(c, len))
}

fn info_payload(name: &str, reqs: &[u16]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(reqs.len() as u16).to_be_bytes());
    for r in reqs {
        d.extend_from_slice(&r.to_be_bytes());
    }
    d
}

/// Handshake through NBD_OPT_GO; returns the connected client.
fn go(store: &Arc<PageStore>) -> (UnixStream, JoinHandle<Result<(), compfs_blk::BlkError>>) {
    let (mut c, h) = start(store);
    greet(&mut c, FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    send_opt(&mut c, OPT_GO, &info_payload("disk", &[INFO_BLOCK_SIZE]));
    let mut saw_export = false;
    loop {
        let (opt, kind, data) = opt_reply(&mut c);
        assert_eq!(opt, OPT_GO);
        if kind == REP_ACK {
            break;
        }
        assert_eq!(kind, REP_INFO);
        if u16::from_be_bytes([data[0], data[1]]) == INFO_EXPORT {
            assert_eq!(u64::from_be_bytes(data[2..10].try_into().unwrap()), SIZE);
            assert_eq!(u16::from_be_bytes([data[10], data[11]]), TRANSMISSION_FLAGS);
            saw_export = true;
        }
    }
    assert!(saw_export);
    (c, h)
}

fn request(c: &mut UnixStream, kind: u16, flags: u16, offset: u64, len: u32, cookie: u64) {
    let r = Request {
        flags,
        kind,
        cookie,
        offset,
        len,
    };
    c.write_all(&r.encode()).unwrap();
}

/// Reads a simple reply; returns (error, cookie).
fn reply(c: &mut UnixStream) -> (u32, u64) {
    let h = read_n(c, 16);
    assert_eq!(u32_at(&h, 0), SIMPLE_REPLY_MAGIC);
    (
        u32_at(&h, 4),
        u64::from_be_bytes(h[8..16].try_into().unwrap()),
    )
}

#[test]
fn option_negotiation() {
    let s = store();
    let (mut c, h) = start(&s);
    greet(&mut c, FLAG_C_FIXED_NEWSTYLE);
    // LIST names the export.
    send_opt(&mut c, OPT_LIST, &[]);
    let (_, kind, data) = opt_reply(&mut c);
    assert_eq!(kind, REP_SERVER);
    assert_eq!(&data[4..], b"disk");
    assert_eq!(opt_reply(&mut c).1, REP_ACK);
    // LIST with data is invalid.
    send_opt(&mut c, OPT_LIST, b"x");
    assert_eq!(opt_reply(&mut c).1, REP_ERR_INVALID);
    // INFO on an unknown export.
    send_opt(&mut c, OPT_INFO, &info_payload("nope", &[]));
    assert_eq!(opt_reply(&mut c).1, REP_ERR_UNKNOWN);
    // INFO with inconsistent lengths.
    let mut bad = info_payload("disk", &[1, 2]);
    bad.pop();
    send_opt(&mut c, OPT_INFO, &bad);
    assert_eq!(opt_reply(&mut c).1, REP_ERR_INVALID);
    // INFO with the name request returns it, and the block sizes.
    send_opt(&mut c, OPT_INFO, &info_payload("", &[INFO_NAME]));
    let mut types = Vec::new();
    loop {
        let (_, kind, data) = opt_reply(&mut c);
        if kind == REP_ACK {
            break;
        }
        let t = u16::from_be_bytes([data[0], data[1]]);
        if t == INFO_BLOCK_SIZE {
            assert_eq!(u32_at(&data, 2), 1);
            assert_eq!(u32_at(&data, 6), 4096);
            assert_eq!(u32_at(&data, 10), 32 << 20);
        }
        if t == INFO_NAME {
            assert_eq!(&data[2..], b"disk");
        }
        types.push(t);
    }
    assert!(types.contains(&INFO_EXPORT) && types.contains(&INFO_BLOCK_SIZE));
    assert!(types.contains(&INFO_NAME));
    // Unknown options and STARTTLS are unsupported; the session continues.
    send_opt(&mut c, 99, b"whatever");
    assert_eq!(opt_reply(&mut c).1, REP_ERR_UNSUP);
    send_opt(&mut c, OPT_STARTTLS, &[]);
    assert_eq!(opt_reply(&mut c).1, REP_ERR_UNSUP);
    // An oversized option is skipped without being buffered.
    send_opt(&mut c, 42, &vec![0u8; MAX_OPTION as usize + 1]);
    assert_eq!(opt_reply(&mut c).1, REP_ERR_TOO_BIG);
    // ABORT is acknowledged and the server ends cleanly.
    send_opt(&mut c, OPT_ABORT, &[]);
    assert_eq!(opt_reply(&mut c).1, REP_ACK);
    assert!(h.join().unwrap().is_ok());
}

#[test]
fn export_name_option_enters_transmission() {
    let s = store();
    let (mut c, h) = start(&s);
    greet(&mut c, FLAG_C_FIXED_NEWSTYLE);
    send_opt(&mut c, OPT_EXPORT_NAME, b"disk");
    let r = read_n(&mut c, 10 + 124);
    assert_eq!(u64::from_be_bytes(r[0..8].try_into().unwrap()), SIZE);
    assert!(r[10..].iter().all(|&b| b == 0));
    request(&mut c, CMD_DISC, 0, 0, 0, 0);
    assert!(h.join().unwrap().is_ok());
    // An unknown name closes the connection.
    let (mut c, h) = start(&s);
    greet(&mut c, FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    send_opt(&mut c, OPT_EXPORT_NAME, b"other");
    assert!(h.join().unwrap().is_err());
    let mut b = [0u8; 1];
    assert_eq!(c.read(&mut b).unwrap(), 0);
}

#[test]
fn malformed_handshakes_close_the_connection() {
    let s = store();
    // Unknown client flags.
    let (mut c, h) = start(&s);
    greet(&mut c, 1 << 7);
    assert!(h.join().unwrap().is_err());
    // Bad option magic.
    let (mut c, h) = start(&s);
    greet(&mut c, 1);
    c.write_all(&[0xAB; 16]).unwrap();
    assert!(h.join().unwrap().is_err());
    // Disconnect in the middle of an option.
    let (mut c, h) = start(&s);
    greet(&mut c, 1);
    c.write_all(&IHAVEOPT.to_be_bytes()).unwrap();
    c.write_all(&OPT_GO.to_be_bytes()).unwrap();
    c.write_all(&100u32.to_be_bytes()).unwrap();
    c.write_all(&[0u8; 10]).unwrap();
    drop(c);
    assert!(h.join().unwrap().is_err());
}

#[test]
fn transmission_commands_and_errors() {
    let s = store();
    let (mut c, h) = go(&s);
    // Write 2 pages of text, read them back.
    let data: Vec<u8> = (0..2 * PAGE).map(|i| b"abcdefgh"[i % 7]).collect();
    request(&mut c, CMD_WRITE, CMD_FLAG_FUA, 4096, data.len() as u32, 1);
    c.write_all(&data).unwrap();
    assert_eq!(reply(&mut c), (0, 1));
    request(&mut c, CMD_READ, 0, 4096, data.len() as u32, 2);
    assert_eq!(reply(&mut c), (0, 2));
    assert_eq!(read_n(&mut c, data.len()), data);
    // Unaligned read across the page boundary.
    request(&mut c, CMD_READ, 0, 4096 + 4000, 200, 3);
    assert_eq!(reply(&mut c), (0, 3));
    assert_eq!(read_n(&mut c, 200), data[4000..4200].to_vec());
    // FLUSH, CACHE.
    request(&mut c, CMD_FLUSH, 0, 0, 0, 4);
    assert_eq!(reply(&mut c), (0, 4));
    request(&mut c, CMD_CACHE, 0, 0, 4096, 5);
    assert_eq!(reply(&mut c), (0, 5));
    // Unknown command and unknown flags: EINVAL, the connection goes on.
    request(&mut c, 77, 0, 0, 0, 6);
    assert_eq!(reply(&mut c), (EINVAL, 6));
    request(&mut c, CMD_READ, 1 << 9, 0, 16, 7);
    assert_eq!(reply(&mut c), (EINVAL, 7));
    // Out of range: EINVAL for reads and trims, ENOSPC for writes (payload consumed).
    request(&mut c, CMD_READ, 0, SIZE - 10, 20, 8);
    assert_eq!(reply(&mut c), (EINVAL, 8));
    request(&mut c, CMD_READ, 0, u64::MAX - 5, 20, 9);
    assert_eq!(reply(&mut c), (EINVAL, 9));
    request(&mut c, CMD_TRIM, 0, SIZE, 4096, 10);
    assert_eq!(reply(&mut c), (EINVAL, 10));
    request(&mut c, CMD_WRITE, 0, SIZE - 2, 4, 11);
    c.write_all(&[1, 2, 3, 4]).unwrap();
    assert_eq!(reply(&mut c), (ENOSPC, 11));
    // A read larger than the maximum payload.
    request(&mut c, CMD_READ, 0, 0, MAX_PAYLOAD + 1, 12);
    assert_eq!(reply(&mut c), (EOVERFLOW, 12));
    // TRIM and WRITE_ZEROES free pages; NO_HOLE keeps an allocated zero page.
    request(&mut c, CMD_TRIM, 0, 4096, 4096, 13);
    assert_eq!(reply(&mut c), (0, 13));
    request(&mut c, CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 8192, 4096, 14);
    assert_eq!(reply(&mut c), (0, 14));
    request(&mut c, CMD_READ, 0, 4096, 8192, 15);
    assert_eq!(reply(&mut c), (0, 15));
    assert!(read_n(&mut c, 8192).iter().all(|&b| b == 0));
    let st = s.stats();
    assert_eq!(st.same_pages, 1);
    assert_eq!(st.orig_data_size, PAGE as u64);
    assert!(st.invalid_io >= 6);
    // A write over the maximum closes the connection after an error reply.
    request(&mut c, CMD_WRITE, 0, 0, MAX_PAYLOAD + 1, 16);
    assert_eq!(reply(&mut c), (EOVERFLOW, 16));
    assert!(h.join().unwrap().is_err());
}

#[test]
fn bad_request_magic_and_abrupt_disconnects_do_not_disturb_others() {
    let s = store();
    let (mut good, gh) = go(&s);
    // Bad magic closes that connection only.
    let (mut bad, bh) = go(&s);
    bad.write_all(&[0x55; REQUEST_LEN]).unwrap();
    assert!(bh.join().unwrap().is_err());
    // Disconnect in the middle of a write payload.
    let (mut cut, ch) = go(&s);
    request(&mut cut, CMD_WRITE, 0, 0, 8192, 1);
    cut.write_all(&[9u8; 100]).unwrap();
    drop(cut);
    assert!(ch.join().unwrap().is_err());
    // The other client still works, and the cut write stored nothing.
    request(&mut good, CMD_READ, 0, 0, 8192, 2);
    assert_eq!(reply(&mut good), (0, 2));
    assert!(read_n(&mut good, 8192).iter().all(|&b| b == 0));
    request(&mut good, CMD_DISC, 0, 0, 0, 3);
    assert!(gh.join().unwrap().is_ok());
}

#[test]
fn control_commands() {
    let s = store();
    let page: Vec<u8> = (0..PAGE).map(|i| (i % 13) as u8 + b'a').collect();
    s.write(0, &page).unwrap();
    let stat = control_command(&s, "stat").unwrap();
    assert!(stat[0].starts_with("mm_stat "));
    assert_eq!(stat[0].split_whitespace().count(), 10);
    assert_eq!(control_command(&s, "mark-idle").unwrap(), vec!["marked 1"]);
    assert!(control_command(&s, "recompress idle 0").is_ok());
    assert!(control_command(&s, "recompress sideways").is_err());
    assert!(control_command(&s, "recompress idle x").is_err());
    assert!(control_command(&s, "writeback huge").is_err()); // no backing file
    assert!(control_command(&s, "compact").is_ok());
    assert!(control_command(&s, "").is_err());
    assert!(control_command(&s, "format c:").is_err());
    assert!(control_command(&s, "reset").is_ok());
    assert_eq!(s.stats().orig_data_size, 0);
}

proptest! {
    #[test]
    fn request_parse_roundtrip(flags in any::<u16>(), kind in any::<u16>(), cookie in any::<u64>(),
                               offset in any::<u64>(), len in any::<u32>()) {
        let r = Request { flags, kind, cookie, offset, len };
        prop_assert_eq!(Request::parse(&r.encode()), Ok(r));
        // validate never panics and accepts only in-range known commands with known flags.
        if r.validate(SIZE, &Session::default()).is_none() && kind != CMD_FLUSH {
            prop_assert!(offset.checked_add(u64::from(len)).is_some_and(|e| e <= SIZE));
            prop_assert!([CMD_READ, CMD_WRITE, CMD_TRIM, CMD_CACHE, CMD_WRITE_ZEROES].contains(&kind));
        }
    }

    #[test]
    fn request_parse_arbitrary(bytes in proptest::collection::vec(any::<u8>(), REQUEST_LEN)) {
        let b: [u8; REQUEST_LEN] = bytes.clone().try_into().unwrap();
        let magic = u32::from_be_bytes(b[0..4].try_into().unwrap());
        prop_assert_eq!(Request::parse(&b).is_ok(), magic == REQUEST_MAGIC);
    }

    #[test]
    fn info_option_arbitrary(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Some(info) = parse_info_option(&bytes) {
            prop_assert_eq!(bytes.len(), 4 + info.name.len() + 2 + 2 * info.requests.len());
        }
    }

    #[test]
    fn info_option_roundtrip(name in "[a-z]{0,20}", reqs in proptest::collection::vec(any::<u16>(), 0..8)) {
        let p = info_payload(&name, &reqs);
        let info = parse_info_option(&p).unwrap();
        prop_assert_eq!(info.name, name.into_bytes());
        prop_assert_eq!(info.requests, reqs);
    }

    /// Arbitrary bytes as a handshake or as a transmission stream: the server answers with
    /// well-formed replies or stops; it never panics.
    #[test]
    fn garbage_streams(bytes in proptest::collection::vec(any::<u8>(), 0..512), valid_prefix in any::<bool>()) {
        let s = store();
        let mut input = Vec::new();
        if valid_prefix {
            // A valid request header with random fields follows, to get past the magic check.
            input.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        }
        input.extend_from_slice(&bytes);
        let mut out = Vec::new();
        let _ = transmission(&mut Cursor::new(&input), &mut out, &s, &Session::default());
        let mut out2 = Vec::new();
        let _ = handshake(&mut Cursor::new(&bytes), &mut out2, &export());
        prop_assert!(out.is_empty() || u32_at(&out, 0) == SIMPLE_REPLY_MAGIC);
        prop_assert_eq!(&out2[0..8], b"NBDMAGIC");
        // Option replies only ever follow the 18-byte greeting in whole 20-byte headers.
        prop_assert!(out2.len() == 18 || u64::from_be_bytes(out2[18..26].try_into().unwrap()) == REPLY_MAGIC_OPT);
    }
}

#[test]
fn payloads_larger_than_a_chunk() {
    let s = Arc::new(
        PageStore::new(Config {
            size: 8 << 20,
            algo: CodecSpec::parse("lz4").unwrap().spec,
            recomp: vec![],
            mem_limit: 0,
        })
        .unwrap(),
    );
    let (a, mut c) = UnixStream::pair().unwrap();
    let s2 = s.clone();
    let h = std::thread::spawn(move || {
        let e = Export {
            name: "big".into(),
            description: String::new(),
            size: 8 << 20,
        };
        serve_connection(a, &s2, &e)
    });
    greet(&mut c, FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    send_opt(&mut c, OPT_EXPORT_NAME, b"");
    let _ = read_n(&mut c, 10);
    let len = 2 * CHUNK + CHUNK / 2 + 100;
    let data: Vec<u8> = (0..len).map(|i| (i / 4096 + i % 251) as u8).collect();
    request(&mut c, CMD_WRITE, 0, 3, len as u32, 1);
    c.write_all(&data).unwrap();
    assert_eq!(reply(&mut c), (0, 1));
    request(&mut c, CMD_READ, 0, 3, len as u32, 2);
    assert_eq!(reply(&mut c), (0, 2));
    assert_eq!(read_n(&mut c, len), data);
    request(&mut c, CMD_DISC, 0, 0, 0, 3);
    assert!(h.join().unwrap().is_ok());
}

// ---- Structured replies and block status ----

use compfs_blk::extents::{STATE_HOLE, STATE_ZERO};
use compfs_blk::meta::{encode_meta_option, BASE_ALLOCATION, BASE_ALLOCATION_ID};

/// One structured reply chunk: (flags, type, cookie, payload).
fn chunk(c: &mut UnixStream) -> (u16, u16, u64, Vec<u8>) {
    let h = read_n(c, 20);
    assert_eq!(
        u32_at(&h, 0),
        STRUCTURED_REPLY_MAGIC,
        "not a structured reply"
    );
    let len = u32_at(&h, 16) as usize;
    (
        u16::from_be_bytes([h[4], h[5]]),
        u16::from_be_bytes([h[6], h[7]]),
        u64::from_be_bytes(h[8..16].try_into().unwrap()),
        read_n(c, len),
    )
}

/// Reads a structured error chunk; returns (errno, message).
fn error_chunk(c: &mut UnixStream, cookie: u64) -> (u32, String) {
    let (flags, kind, ck, p) = chunk(c);
    assert_eq!(ck, cookie);
    assert_eq!(flags, REPLY_FLAG_DONE);
    assert_eq!(kind, REPLY_TYPE_ERROR);
    let mlen = u16::from_be_bytes([p[4], p[5]]) as usize;
    assert_eq!(p.len(), 6 + mlen);
    (u32_at(&p, 0), String::from_utf8(p[6..].to_vec()).unwrap())
}

/// Option replies up to and including the final ACK or error: the list of (type, data).
fn opt_replies(c: &mut UnixStream, opt: u32) -> Vec<(u32, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let (o, kind, data) = opt_reply(c);
        assert_eq!(o, opt);
        out.push((kind, data));
        if kind == REP_ACK || kind & REP_FLAG_ERROR != 0 {
            return out;
        }
    }
}

fn meta_reply(id: u32) -> (u32, Vec<u8>) {
    let mut d = id.to_be_bytes().to_vec();
    d.extend_from_slice(BASE_ALLOCATION.as_bytes());
    (REP_META_CONTEXT, d)
}

/// Handshake with structured replies (and `base:allocation` if `meta`), then NBD_OPT_GO;
/// returns the client and the transmission flags it got.
fn go_structured(
    store: &Arc<PageStore>,
    meta: bool,
) -> (
    UnixStream,
    JoinHandle<Result<(), compfs_blk::BlkError>>,
    u16,
) {
    let (mut c, h) = start(store);
    greet(&mut c, FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    send_opt(&mut c, OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(
        opt_replies(&mut c, OPT_STRUCTURED_REPLY),
        vec![(REP_ACK, vec![])]
    );
    if meta {
        send_opt(
            &mut c,
            OPT_SET_META_CONTEXT,
            &encode_meta_option(b"disk", &[b"base:allocation"]),
        );
        assert_eq!(
            opt_replies(&mut c, OPT_SET_META_CONTEXT),
            vec![meta_reply(BASE_ALLOCATION_ID), (REP_ACK, vec![])]
        );
    }
    send_opt(&mut c, OPT_GO, &info_payload("", &[]));
    let mut flags = None;
    for (kind, data) in opt_replies(&mut c, OPT_GO) {
        if kind == REP_INFO && u16::from_be_bytes([data[0], data[1]]) == INFO_EXPORT {
            flags = Some(u16::from_be_bytes([data[10], data[11]]));
        }
    }
    (c, h, flags.unwrap())
}

/// Sends BLOCK_STATUS and decodes the reply's descriptors.
fn block_status(
    c: &mut UnixStream,
    flags: u16,
    offset: u64,
    len: u32,
    cookie: u64,
) -> Vec<(u32, u32)> {
    request(c, CMD_BLOCK_STATUS, flags, offset, len, cookie);
    let (fl, kind, ck, p) = chunk(c);
    assert_eq!(
        (fl, kind, ck),
        (REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, cookie)
    );
    assert_eq!((p.len() - 4) % 8, 0);
    assert_eq!(u32_at(&p, 0), BASE_ALLOCATION_ID);
    p[4..]
        .chunks_exact(8)
        .map(|d| (u32_at(d, 0), u32_at(d, 4)))
        .collect()
}

#[test]
fn meta_context_negotiation() {
    let s = store();
    let (mut c, h) = start(&s);
    greet(&mut c, FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    let all = encode_meta_option(b"", &[]);
    // SET needs structured replies first; LIST is answered anyway (as nbdkit does).
    send_opt(&mut c, OPT_SET_META_CONTEXT, &all);
    assert_eq!(
        opt_replies(&mut c, OPT_SET_META_CONTEXT)[0].0,
        REP_ERR_INVALID
    );
    send_opt(&mut c, OPT_LIST_META_CONTEXT, &all);
    assert_eq!(
        opt_replies(&mut c, OPT_LIST_META_CONTEXT),
        vec![meta_reply(0), (REP_ACK, vec![])]
    );
    // STRUCTURED_REPLY takes no data; extended headers are not offered.
    send_opt(&mut c, OPT_STRUCTURED_REPLY, b"x");
    assert_eq!(
        opt_replies(&mut c, OPT_STRUCTURED_REPLY)[0].0,
        REP_ERR_INVALID
    );
    send_opt(&mut c, OPT_EXTENDED_HEADERS, &[]);
    assert_eq!(
        opt_replies(&mut c, OPT_EXTENDED_HEADERS)[0].0,
        REP_ERR_UNSUP
    );
    send_opt(&mut c, OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(
        opt_replies(&mut c, OPT_STRUCTURED_REPLY),
        vec![(REP_ACK, vec![])]
    );
    // LIST: no query and the base: wildcard list base:allocation with id 0; other namespaces
    // and unknown leaf names list nothing.
    let list = |c: &mut UnixStream, data: &[u8]| {
        send_opt(c, OPT_LIST_META_CONTEXT, data);
        opt_replies(c, OPT_LIST_META_CONTEXT)
    };
    let found = vec![meta_reply(0), (REP_ACK, vec![])];
    assert_eq!(list(&mut c, &all), found);
    assert_eq!(
        list(&mut c, &encode_meta_option(b"disk", &[b"base:"])),
        found
    );
    assert_eq!(
        list(
            &mut c,
            &encode_meta_option(b"", &[b"x-foo:", b"base:allocation"])
        ),
        found
    );
    assert_eq!(
        list(
            &mut c,
            &encode_meta_option(b"", &[b"qemu:dirty-bitmap:a", b"base:other"])
        ),
        vec![(REP_ACK, vec![])]
    );
    // A query without a namespace is ignored (as nbdkit does); malformed: lengths that do not
    // add up; unknown export.
    assert_eq!(
        list(&mut c, &encode_meta_option(b"", &[b"allocation"])),
        vec![(REP_ACK, vec![])]
    );
    let mut short = encode_meta_option(b"", &[b"base:allocation"]);
    short.truncate(short.len() - 3);
    assert_eq!(list(&mut c, &short)[0].0, REP_ERR_INVALID);
    let mut count = encode_meta_option(b"", &[]);
    count[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(list(&mut c, &count)[0].0, REP_ERR_INVALID);
    assert_eq!(
        list(&mut c, &encode_meta_option(b"nope", &[]))[0].0,
        REP_ERR_UNKNOWN
    );
    // SET: no query and the wildcard select nothing; base:allocation gets id 1.
    let set = |c: &mut UnixStream, data: &[u8]| {
        send_opt(c, OPT_SET_META_CONTEXT, data);
        opt_replies(c, OPT_SET_META_CONTEXT)
    };
    assert_eq!(set(&mut c, &all), vec![(REP_ACK, vec![])]);
    assert_eq!(
        set(&mut c, &encode_meta_option(b"", &[b"base:"])),
        vec![(REP_ACK, vec![])]
    );
    assert_eq!(
        set(&mut c, &encode_meta_option(b"disk", &[b"base:allocation"])),
        vec![meta_reply(BASE_ALLOCATION_ID), (REP_ACK, vec![])]
    );
    // A failed SET clears the selection: BLOCK_STATUS is then refused.
    assert_eq!(
        set(&mut c, &encode_meta_option(b"other", &[b"base:allocation"]))[0].0,
        REP_ERR_UNKNOWN
    );
    send_opt(&mut c, OPT_GO, &info_payload("disk", &[]));
    let replies = opt_replies(&mut c, OPT_GO);
    let export = replies
        .iter()
        .find(|(k, d)| *k == REP_INFO && u16::from_be_bytes([d[0], d[1]]) == INFO_EXPORT)
        .unwrap();
    // DF is offered once structured replies are on.
    assert_eq!(
        u16::from_be_bytes([export.1[10], export.1[11]]),
        TRANSMISSION_FLAGS | TF_SEND_DF
    );
    request(&mut c, CMD_BLOCK_STATUS, 0, 0, 4096, 1);
    assert_eq!(error_chunk(&mut c, 1).0, EINVAL);
    request(&mut c, CMD_DISC, 0, 0, 0, 2);
    assert!(h.join().unwrap().is_ok());
}

#[test]
fn block_status_reports_holes_zeros_and_data() {
    let s = store();
    let (mut c, h, _) = go_structured(&s, true);
    let p = PAGE as u64;
    // Page 2: data; pages 4-5: written zeros (same-filled); page 7: NO_HOLE zeroes;
    // page 9: written then trimmed; page 10: WRITE_ZEROES without NO_HOLE.
    let text: Vec<u8> = (0..PAGE).map(|i| b"hello world"[i % 11]).collect();
    for (page, data) in [
        (2, &text[..]),
        (4, &[0u8; PAGE][..]),
        (5, &[0u8; PAGE][..]),
        (9, &text[..]),
        (10, &text[..]),
    ] {
        request(&mut c, CMD_WRITE, 0, page * p, PAGE as u32, 100 + page);
        c.write_all(data).unwrap();
        assert_eq!(reply(&mut c), (0, 100 + page));
    }
    request(
        &mut c,
        CMD_WRITE_ZEROES,
        CMD_FLAG_NO_HOLE,
        7 * p,
        PAGE as u32,
        3,
    );
    assert_eq!(reply(&mut c), (0, 3));
    request(&mut c, CMD_TRIM, 0, 9 * p, PAGE as u32, 4);
    assert_eq!(reply(&mut c), (0, 4));
    request(&mut c, CMD_WRITE_ZEROES, 0, 10 * p, PAGE as u32, 5);
    assert_eq!(reply(&mut c), (0, 5));
    let hz = STATE_HOLE | STATE_ZERO;
    let page = PAGE as u32;
    assert_eq!(
        block_status(&mut c, 0, 0, SIZE as u32, 6),
        vec![
            (2 * page, hz),
            (page, 0),
            (page, hz),
            (2 * page, STATE_ZERO),
            (page, hz),
            (page, STATE_ZERO),
            (SIZE as u32 - 8 * page, hz),
        ]
    );
    // Unaligned range inside the device, FUA accepted.
    assert_eq!(
        block_status(&mut c, CMD_FLAG_FUA, 2 * p + 100, page, 7),
        vec![(page - 100, 0), (100, hz)]
    );
    // REQ_ONE: exactly one descriptor, no longer than the request.
    assert_eq!(
        block_status(&mut c, CMD_FLAG_REQ_ONE, 0, SIZE as u32, 8),
        vec![(2 * page, hz)]
    );
    assert_eq!(
        block_status(&mut c, CMD_FLAG_REQ_ONE, p, 10, 9),
        vec![(10, hz)]
    );
    // The last bytes of the device.
    assert_eq!(block_status(&mut c, 0, SIZE - 1, 1, 10), vec![(1, hz)]);
    // Errors: past the end, overflowing, length 0, a flag BLOCK_STATUS does not take.
    for (i, (flags, offset, len)) in [
        (0, SIZE - 4096, 8192),
        (0, SIZE, 1),
        (0, u64::MAX - 10, 4096),
        (0, 0, 0),
        (CMD_FLAG_DF, 0, 4096),
        (CMD_FLAG_NO_HOLE, 0, 4096),
    ]
    .into_iter()
    .enumerate()
    {
        let cookie = 20 + i as u64;
        request(&mut c, CMD_BLOCK_STATUS, flags, offset, len, cookie);
        let (errno, msg) = error_chunk(&mut c, cookie);
        assert_eq!(errno, EINVAL, "case {i}");
        assert!(!msg.is_empty());
    }
    // Block status is not an access: it leaves idle marks alone, so the data page is still
    // idle for recompression afterwards (a READ would clear the mark).
    s.mark_idle(None);
    let _ = block_status(&mut c, 0, 0, SIZE as u32, 30);
    assert_eq!(s.recompress(compfs_blk::PageKind::Idle, 0, 0).unwrap(), 1);
    request(&mut c, CMD_DISC, 0, 0, 0, 31);
    assert!(h.join().unwrap().is_ok());
}

#[test]
fn structured_reads_writes_and_errors() {
    let s = Arc::new(
        PageStore::new(Config {
            size: 8 << 20,
            algo: CodecSpec::parse("lz4").unwrap().spec,
            recomp: vec![],
            mem_limit: 0,
        })
        .unwrap(),
    );
    let (a, mut c) = UnixStream::pair().unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let s2 = s.clone();
    let h = std::thread::spawn(move || {
        let e = Export {
            name: "big".into(),
            description: String::new(),
            size: 8 << 20,
        };
        serve_connection(a, &s2, &e)
    });
    greet(&mut c, FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    send_opt(&mut c, OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(opt_replies(&mut c, OPT_STRUCTURED_REPLY)[0].0, REP_ACK);
    send_opt(&mut c, OPT_EXPORT_NAME, b"big");
    let r = read_n(&mut c, 10);
    assert_eq!(
        u16::from_be_bytes([r[8], r[9]]),
        TRANSMISSION_FLAGS | TF_SEND_DF
    );
    let len = 2 * CHUNK + 5000;
    let data: Vec<u8> = (0..len).map(|i| (i / 4096 + i % 251) as u8).collect();
    // A successful write gets a simple reply.
    request(&mut c, CMD_WRITE, CMD_FLAG_FUA, 7, len as u32, 1);
    c.write_all(&data).unwrap();
    assert_eq!(reply(&mut c), (0, 1));
    // A read over several chunks: data chunks in order, only the last one DONE.
    request(&mut c, CMD_READ, 0, 7, len as u32, 2);
    let mut got = Vec::new();
    loop {
        let (flags, kind, cookie, p) = chunk(&mut c);
        assert_eq!((kind, cookie), (REPLY_TYPE_OFFSET_DATA, 2));
        assert_eq!(
            u64::from_be_bytes(p[0..8].try_into().unwrap()),
            7 + got.len() as u64
        );
        assert!(p.len() - 8 <= CHUNK);
        got.extend_from_slice(&p[8..]);
        if flags == REPLY_FLAG_DONE {
            break;
        }
        assert_eq!(flags, 0);
    }
    assert_eq!(got, data);
    // DF: one chunk up to CHUNK bytes, EOVERFLOW beyond.
    request(&mut c, CMD_READ, CMD_FLAG_DF, 7, CHUNK as u32, 3);
    let (flags, kind, _, p) = chunk(&mut c);
    assert_eq!((flags, kind), (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA));
    assert_eq!(&p[8..], &data[..CHUNK]);
    request(&mut c, CMD_READ, CMD_FLAG_DF, 0, CHUNK as u32 + 1, 4);
    assert_eq!(error_chunk(&mut c, 4).0, EOVERFLOW);
    // A read of length 0: a lone NONE chunk.
    request(&mut c, CMD_READ, 0, 0, 0, 5);
    assert_eq!(chunk(&mut c), (REPLY_FLAG_DONE, REPLY_TYPE_NONE, 5, vec![]));
    // Errors are error chunks, never simple replies, for reads and everything else; a write's
    // refused payload is consumed.
    request(&mut c, CMD_READ, 0, (8 << 20) - 10, 20, 6);
    assert_eq!(error_chunk(&mut c, 6).0, EINVAL);
    request(&mut c, CMD_READ, CMD_FLAG_REQ_ONE, 0, 20, 7);
    assert_eq!(error_chunk(&mut c, 7).0, EINVAL);
    request(&mut c, CMD_WRITE, 0, (8 << 20) - 2, 4, 8);
    c.write_all(&[1, 2, 3, 4]).unwrap();
    assert_eq!(error_chunk(&mut c, 8).0, ENOSPC);
    request(&mut c, 99, 0, 0, 0, 9);
    assert_eq!(error_chunk(&mut c, 9).0, EINVAL);
    // No meta context was selected: BLOCK_STATUS is refused.
    request(&mut c, CMD_BLOCK_STATUS, 0, 0, 4096, 10);
    assert_eq!(error_chunk(&mut c, 10).0, EINVAL);
    // Other successful commands keep simple replies.
    request(&mut c, CMD_FLUSH, 0, 0, 0, 11);
    assert_eq!(reply(&mut c), (0, 11));
    request(&mut c, CMD_DISC, 0, 0, 0, 12);
    assert!(h.join().unwrap().is_ok());
}

#[test]
fn read_failure_mid_reply_is_an_error_offset_chunk() {
    let dir = std::env::temp_dir().join(format!("compfs-blk-proto-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let backing = dir.join("backing");
    let s = Arc::new(
        PageStore::new(Config {
            size: 4 << 20,
            algo: CodecSpec::parse("lz4").unwrap().spec,
            recomp: vec![],
            mem_limit: 0,
        })
        .unwrap()
        .with_backing(&backing)
        .unwrap(),
    );
    // A page in the second 1 MiB piece is written back, then the backing file loses it.
    let page: Vec<u8> = (0..PAGE).map(|i| (i % 7) as u8 + b'a').collect();
    let bad = CHUNK as u64 + 3 * PAGE as u64;
    s.write(0, &page).unwrap();
    s.write(bad, &page).unwrap();
    s.mark_idle(None);
    assert_eq!(s.writeback(compfs_blk::PageKind::Idle, 0).unwrap(), 2);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&backing)
        .unwrap()
        .set_len(0)
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let (a, mut c) = UnixStream::pair().unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let s2 = s.clone();
    let h = std::thread::spawn(move || {
        let session = Session {
            structured: true,
            base_allocation: true,
        };
        let mut r = std::io::BufReader::new(a.try_clone().unwrap());
        let mut w = a;
        transmission(&mut r, &mut w, &s2, &session)
    });
    // The first piece fails (page 0 is unreadable): ERROR_OFFSET at 0, nothing else.
    request(&mut c, CMD_READ, 0, 0, 2 * CHUNK as u32, 1);
    let (flags, kind, _, p) = chunk(&mut c);
    assert_eq!((flags, kind), (REPLY_FLAG_DONE, REPLY_TYPE_ERROR_OFFSET));
    assert_eq!(u32_at(&p, 0), EIO);
    let mlen = u16::from_be_bytes([p[4], p[5]]) as usize;
    assert_eq!(p.len(), 6 + mlen + 8);
    assert_eq!(u64::from_be_bytes(p[6 + mlen..].try_into().unwrap()), 0);
    // From page 1 on: the first piece is data, the second fails at its start.
    request(&mut c, CMD_READ, 0, PAGE as u64, 2 * CHUNK as u32, 2);
    let (flags, kind, _, p) = chunk(&mut c);
    assert_eq!((flags, kind), (0, REPLY_TYPE_OFFSET_DATA));
    assert_eq!(p.len(), 8 + CHUNK);
    assert!(p[8..].iter().all(|&b| b == 0));
    let (flags, kind, _, p) = chunk(&mut c);
    assert_eq!((flags, kind), (REPLY_FLAG_DONE, REPLY_TYPE_ERROR_OFFSET));
    let mlen = u16::from_be_bytes([p[4], p[5]]) as usize;
    assert_eq!(
        u64::from_be_bytes(p[6 + mlen..].try_into().unwrap()),
        PAGE as u64 + CHUNK as u64
    );
    // The connection goes on; block status still reports the written-back pages as data.
    assert_eq!(
        block_status(&mut c, 0, 0, 2 * PAGE as u32, 3),
        vec![(PAGE as u32, 0), (PAGE as u32, STATE_HOLE | STATE_ZERO)]
    );
    request(&mut c, CMD_DISC, 0, 0, 0, 4);
    assert!(h.join().unwrap().is_ok());
    assert!(s.stats().failed_reads >= 2);
}

#[test]
fn clients_without_structured_replies_keep_simple_replies() {
    let s = store();
    let (mut c, h) = go(&s);
    // No DF without structured replies, no block status without a context: simple EINVAL.
    request(&mut c, CMD_READ, CMD_FLAG_DF, 0, 4096, 1);
    assert_eq!(reply(&mut c), (EINVAL, 1));
    request(&mut c, CMD_BLOCK_STATUS, 0, 0, 4096, 2);
    assert_eq!(reply(&mut c), (EINVAL, 2));
    request(&mut c, CMD_READ, 0, 0, 4096, 3);
    assert_eq!(reply(&mut c), (0, 3));
    assert_eq!(read_n(&mut c, 4096), vec![0u8; 4096]);
    request(&mut c, CMD_DISC, 0, 0, 0, 4);
    assert!(h.join().unwrap().is_ok());
}

proptest! {
    /// Arbitrary bytes after a structured negotiation: every reply is a well-formed simple
    /// reply or structured chunk, and the server never panics.
    #[test]
    fn garbage_streams_structured(bytes in proptest::collection::vec(any::<u8>(), 0..512), valid_prefix in any::<bool>()) {
        let s = store();
        let mut input = Vec::new();
        if valid_prefix {
            input.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        }
        input.extend_from_slice(&bytes);
        let mut out = Vec::new();
        let session = Session { structured: true, base_allocation: true };
        let _ = transmission(&mut Cursor::new(&input), &mut out, &s, &session);
        let mut i = 0;
        while i < out.len() {
            match u32_at(&out, i) {
                SIMPLE_REPLY_MAGIC => i += 16,
                STRUCTURED_REPLY_MAGIC => i += 20 + u32_at(&out, i + 16) as usize,
                m => prop_assert!(false, "bad reply magic {m:#x}"),
            }
        }
        prop_assert_eq!(i, out.len());
    }
}

#[test]
fn whole_request_buffered_needs_header_and_payload() {
    let read = Request {
        flags: 0,
        kind: CMD_READ,
        cookie: 1,
        offset: 0,
        len: 4096,
    }
    .encode();
    let write = Request {
        kind: CMD_WRITE,
        ..Request::parse(&read).unwrap()
    }
    .encode();
    assert!(!whole_request_buffered(&[]));
    assert!(!whole_request_buffered(&read[..REQUEST_LEN - 1]));
    assert!(whole_request_buffered(&read));
    assert!(!whole_request_buffered(&write));
    let mut w = write.to_vec();
    w.extend_from_slice(&[7u8; 4095]);
    assert!(!whole_request_buffered(&w));
    w.push(7);
    assert!(whole_request_buffered(&w));
    // A bad magic needs nothing more: the server closes on it.
    assert!(whole_request_buffered(&[0u8; REQUEST_LEN]));
}

/// 32 writes, then 32 reads, each burst sent at once (as a client at iodepth 32 does), all get
/// their replies (in any order: several threads may answer, and NBD matches replies by
/// cookie), and a lone request after them is answered too (no reply waits in the buffer).
#[test]
fn pipelined_requests_all_answered() {
    let s = store();
    let (mut c, h) = go(&s);
    let send = |c: &UnixStream, burst: Vec<u8>| {
        let mut w = c.try_clone().unwrap();
        std::thread::spawn(move || w.write_all(&burst).unwrap())
    };
    let mut burst = Vec::new();
    for i in 0..32u64 {
        let r = Request {
            flags: 0,
            kind: CMD_WRITE,
            cookie: i,
            offset: i * PAGE as u64,
            len: PAGE as u32,
        };
        burst.extend_from_slice(&r.encode());
        burst.extend_from_slice(&vec![i as u8 + 1; PAGE]);
    }
    let sender = send(&c, burst);
    let mut cookies: Vec<u64> = (0..32)
        .map(|_| reply(&mut c))
        .map(|(e, k)| {
            assert_eq!(e, 0);
            k
        })
        .collect();
    cookies.sort_unstable();
    assert_eq!(cookies, (0..32).collect::<Vec<u64>>());
    sender.join().unwrap();
    let mut burst = Vec::new();
    for i in 0..32u64 {
        let r = Request {
            flags: 0,
            kind: CMD_READ,
            cookie: 100 + i,
            offset: i * PAGE as u64,
            len: PAGE as u32,
        };
        burst.extend_from_slice(&r.encode());
    }
    let sender = send(&c, burst);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..32 {
        let (e, k) = reply(&mut c);
        assert_eq!(e, 0);
        let i = k - 100;
        assert_eq!(read_n(&mut c, PAGE), vec![i as u8 + 1; PAGE], "cookie {k}");
        assert!(seen.insert(k), "cookie {k} twice");
    }
    assert_eq!(seen.len(), 32);
    sender.join().unwrap();
    request(&mut c, CMD_READ, 0, 0, PAGE as u32, 999);
    assert_eq!(reply(&mut c), (0, 999));
    assert_eq!(read_n(&mut c, PAGE), vec![1u8; PAGE]);
    request(&mut c, CMD_DISC, 0, 0, 0, 1000);
    assert!(h.join().unwrap().is_ok());
}
