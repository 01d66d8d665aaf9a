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
