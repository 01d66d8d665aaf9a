//! Reserved bytes of every on-disk structure must be zero when decoded (docs/format.md,
//! "Reserved bytes").

#![allow(clippy::unwrap_used, clippy::expect_used)]

use compfs_store::format::{
    ExtentHeader, ExtentRec, Inline, InodeRec, SbError, SegmentHeader, Superblock,
};
use compfs_store::{FileKind, Timestamp};

/// Sets byte `i` of an encoding to 1 and, where a CRC covers it, fixes the CRC so that only
/// the reserved-byte check can reject it.
fn poke(b: &mut [u8], i: usize, crc: Option<(std::ops::Range<usize>, usize)>) {
    b[i] = 1;
    if let Some((covered, at)) = crc {
        let c = crc32c::crc32c(&b[covered]);
        b[at..at + 4].copy_from_slice(&c.to_le_bytes());
    }
}

#[test]
fn reserved_bytes_must_be_zero() {
    let sb = Superblock::test_fixture();
    let mut b = sb.encode();
    poke(&mut b, 39, Some((0..60, 60)));
    assert!(matches!(Superblock::decode(&b), Err(SbError::BadField(_))));

    let seg = SegmentHeader {
        version: 1,
        uuid: [1; 16],
        id: 4,
    };
    for i in (12..16).chain(44..64) {
        let mut b = seg.encode();
        assert!(SegmentHeader::decode(&b).is_ok());
        poke(&mut b, i, Some((0..40, 40)));
        assert!(
            SegmentHeader::decode(&b).is_err(),
            "segment header byte {i}"
        );
    }

    let h = ExtentHeader {
        codec: 3,
        level: 1,
        raw_len: 4096,
        stored_len: 100,
        id: 1,
        ino: 2,
        file_offset: 0,
        crc: 5,
        dict: 0,
    };
    // Format version 3 gave the extent header's reserved bytes 6..8 a meaning: the dictionary
    // id. They round-trip instead of being refused.
    for i in 6..8 {
        let mut b = h.encode();
        poke(&mut b, i, Some((0..44, 44)));
        let d = ExtentHeader::decode(&b).expect("dictionary id");
        assert_eq!(d.dict, 1 << (8 * (i - 6)), "extent header byte {i}");
    }

    let t = Timestamp { secs: 1, nsecs: 2 };
    let inode = InodeRec {
        kind: FileKind::File,
        perm: 0o644,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        size: 3,
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        parent: 0,
        next_seq: 0,
        disk_bytes: 0,
        inline: Some(Inline::new(0, 0, 3, b"abc".to_vec())),
    };
    // Version-1 inode records (format version 1).
    for i in (20..24).chain(106..108) {
        let mut b = inode.encode_v1();
        assert!(InodeRec::decode(&b).is_ok());
        poke(&mut b, i, None);
        assert!(InodeRec::decode(&b).is_err(), "v1 inode byte {i}");
    }
    // Version 2: the unused presence bits (byte 72). The inline data's u16 at bytes 75..77
    // (when inline data is the only optional part), reserved in format version 2, is the
    // dictionary id in version 3.
    let b = inode.encode_v2();
    assert_eq!(b[72], 8);
    for bit in 4..8 {
        let mut c = b.clone();
        c[72] |= 1 << bit;
        assert!(InodeRec::decode(&c).is_err(), "v2 presence bit {bit}");
    }
    for i in 75..77 {
        let mut c = b.clone();
        assert!(InodeRec::decode(&c).is_ok());
        poke(&mut c, i, None);
        let r = InodeRec::decode(&c).expect("dictionary id");
        assert_eq!(r.inline.map(|i| i.dict), Some(1 << (8 * (i - 75))));
    }
    // Version 3 (format version 3): the unused presence bits (byte 2).
    let b = inode.encode();
    assert_eq!((b[0], b[2]), (3, 8));
    for bit in 4..8 {
        let mut c = b.clone();
        c[2] |= 1 << bit;
        assert!(InodeRec::decode(&c).is_err(), "v3 presence bit {bit}");
    }

    let e = ExtentRec {
        segment: 1,
        seg_offset: 64,
        stored_len: 100,
        raw_len: 4096,
        codec: 3,
        level: 1,
        crc: 5,
        refs: 1,
        ino: 2,
        dict: 0,
    };
    for i in 26..28 {
        let mut b = e.encode_fixed();
        assert!(ExtentRec::decode(&b).is_ok());
        poke(&mut b, i, None);
        let d = ExtentRec::decode(&b).expect("dictionary id");
        assert_eq!(d.dict, 1 << (8 * (i - 26)), "extent record byte {i}");
    }
}
