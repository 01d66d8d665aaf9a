//! Unit tests of the fsck passes (`passes.rs`).
use super::*;

/// A read that fails on the device is an I/O error (the check stops); a segment that ends
/// before the extent is damage (reported, repairable).
#[test]
fn a_device_error_is_not_a_damaged_extent() {
    let x = ExtentRec {
        segment: 1,
        seg_offset: 64,
        stored_len: 10,
        raw_len: 10,
        codec: 0,
        level: 0,
        crc: 0,
        refs: 1,
        ino: 2,
        dict: 0,
    };
    let t = tempfile::tempdir().unwrap();
    // Reading a directory fails with EISDIR: a stand-in for a failing device.
    let dir = std::fs::File::open(t.path()).unwrap();
    use std::os::unix::fs::FileExt;
    let e = verify_stored(&|b, o| dir.read_exact_at(b, o), 1, &x, Ok(None)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EISDIR));
    let short = t.path().join("short");
    std::fs::write(&short, [0u8; 70]).unwrap();
    let f = std::fs::File::open(&short).unwrap();
    let why = verify_stored(&|b, o| f.read_exact_at(b, o), 1, &x, Ok(None))
        .unwrap()
        .unwrap_err();
    assert!(why.starts_with("read failed"), "{why}");
}
