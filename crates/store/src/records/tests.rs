//! Round trips, damage and arbitrary input for every record decoder.

use super::*;

#[test]
fn superblock_round_trip_and_damage() {
    let sb = Superblock::test_fixture();
    let b = sb.encode();
    assert_eq!(Superblock::decode(&b).unwrap(), sb);
    assert_eq!(Superblock::decode(&b[..30]), Err(SbError::Truncated(30)));
    assert_eq!(Superblock::decode(&[]), Err(SbError::Truncated(0)));
    assert_eq!(
        Superblock::decode(b"hello world, this is text"),
        Err(SbError::BadMagic)
    );
    for i in 0..SB_LEN {
        let mut c = b;
        c[i] ^= 0x10;
        assert!(Superblock::decode(&c).is_err(), "flip at {i} accepted");
    }
    let mut fut = sb;
    fut.version = FORMAT_VERSION + 1;
    assert_eq!(
        Superblock::decode(&fut.encode()),
        Err(SbError::FutureVersion(FORMAT_VERSION + 1))
    );
}

#[test]
fn extent_header_round_trip_and_damage() {
    let h = ExtentHeader {
        codec: 3,
        level: -5,
        raw_len: 131072,
        stored_len: 4000,
        id: 99,
        ino: 5,
        file_offset: 1 << 40,
        crc: 0xdeadbeef,
        dict: 7,
    };
    let b = h.encode();
    assert_eq!(ExtentHeader::decode(&b).unwrap(), h);
    for i in 0..EXT_HEADER_LEN {
        let mut c = b;
        c[i] ^= 1;
        assert!(ExtentHeader::decode(&c).is_err());
    }
    assert!(ExtentHeader::decode(&b[..47]).is_err());
    let mut bad = h;
    bad.codec = 9;
    assert!(ExtentHeader::decode(&bad.encode()).is_err());
}

#[test]
fn decoders_give_typed_errors() {
    assert_eq!(
        ExtentHeader::decode(&[0u8; 10]),
        Err(DecodeError::Truncated {
            what: "extent header",
            len: 10
        })
    );
    assert_eq!(
        ExtentHeader::decode(&[0u8; EXT_HEADER_LEN]),
        Err(DecodeError::BadMagic { what: "extent" })
    );
    assert_eq!(
        SegmentHeader::decode(&[0u8; SEG_HEADER_LEN as usize]),
        Err(DecodeError::BadMagic { what: "segment" })
    );
    // Any length but 17 is the compact layout (format version 3).
    assert_eq!(
        DirentRec::decode(&[0u8; 16]),
        Err(DecodeError::BadKind {
            what: "dirent",
            code: 0
        })
    );
    assert_eq!(
        DirentRec::decode(&[1, 1, 1, 0]),
        Err(DecodeError::Malformed {
            what: "dirent",
            len: 4
        })
    );
    let mut de = [0u8; 17];
    de[8] = 200;
    assert_eq!(
        DirentRec::decode(&de),
        Err(DecodeError::BadKind {
            what: "dirent",
            code: 200
        })
    );
    let x = ExtentRec {
        segment: 1,
        seg_offset: 64,
        stored_len: 10,
        raw_len: u32::MAX,
        codec: 0,
        level: 0,
        crc: 0,
        refs: 1,
        ino: 2,
        dict: 0,
    };
    assert!(matches!(
        ExtentRec::decode(&x.encode()),
        Err(DecodeError::ImplausibleLengths { what: "extent", .. })
    ));
    // The messages fsck prints are unchanged.
    assert_eq!(
        DecodeError::BadChecksum {
            what: "extent header"
        }
        .to_string(),
        "extent header checksum mismatch"
    );
}

/// Map entries of length 0, or reaching past any extent, do not decode: readers compute
/// `offset + len - 1` and `ext_offset + len` from them.
#[test]
fn map_records_with_impossible_lengths_are_decode_errors() {
    let max = compfs_codec::MAX_EXTENT as u32;
    let ok = MapRec {
        extent: 7,
        ext_offset: 0,
        len: max,
    };
    assert_eq!(MapRec::decode(&ok.encode()), Ok(ok));
    let empty = MapRec { len: 0, ..ok };
    assert_eq!(
        MapRec::decode(&empty.encode()),
        Err(DecodeError::EmptyMapEntry)
    );
    for (ext_offset, len) in [(1, max), (max, 1), (u32::MAX, u32::MAX), (u32::MAX, 1)] {
        let past = MapRec {
            extent: 7,
            ext_offset,
            len,
        };
        assert!(
            matches!(
                MapRec::decode(&past.encode()),
                Err(DecodeError::MapPastExtent { .. })
            ),
            "{past:?}"
        );
    }
    // Within a known extent.
    let m = MapRec {
        extent: 7,
        ext_offset: 100,
        len: 50,
    };
    assert_eq!(m.check_within(150), Ok(()));
    assert!(matches!(
        m.check_within(149),
        Err(DecodeError::MapPastExtent { raw_len: 149, .. })
    ));
}

#[test]
fn records_round_trip_and_reject_garbage() {
    let t = Timestamp {
        secs: -3,
        nsecs: 999_999_999,
    };
    for inline in [None, Some(Inline::new(0, 0, 3, b"abc".to_vec()))] {
        let r = InodeRec {
            kind: FileKind::Symlink,
            perm: 0o7777,
            nlink: 3,
            uid: 1,
            gid: 2,
            rdev: 77,
            size: u64::MAX,
            atime: t,
            mtime: Timestamp { secs: 5, nsecs: 6 },
            ctime: t,
            crtime: t,
            parent: 9,
            next_seq: 10,
            disk_bytes: 11,
            inline,
        };
        assert_eq!(InodeRec::decode(&r.encode()).unwrap(), r);
        // The version-1 layout still decodes (checksum computed for its inline data).
        assert_eq!(InodeRec::decode(&r.encode_v1()).unwrap(), r);
        // So does the version-2 layout.
        assert_eq!(InodeRec::decode(&r.encode_v2()).unwrap(), r);
        // Every optional field absent: the shortest record.
        let bare = InodeRec {
            rdev: 0,
            parent: 0,
            next_seq: 0,
            disk_bytes: 0,
            inline: None,
            ..r.clone()
        };
        assert_eq!(bare.encode_v2().len(), 73);
        assert!(bare.encode().len() < 73);
        assert_eq!(InodeRec::decode(&bare.encode()).unwrap(), bare);
    }
    assert!(InodeRec::decode(&[1, 2, 3]).is_err());
    assert!(InodeRec::decode(&[2, 1, 3]).is_err());
    assert!(InodeRec::decode(&[]).is_err());
    assert!(InodeRec::decode(&[0u8; 200]).is_err());
    let e = ExtentRec {
        segment: 1,
        seg_offset: 64,
        stored_len: 5,
        raw_len: 9,
        codec: 3,
        level: 3,
        crc: 4,
        refs: 2,
        ino: 8,
        dict: 513,
    };
    assert_eq!(ExtentRec::decode(&e.encode()).unwrap(), e);
    assert!(ExtentRec::decode(&[0; 43]).is_err());
    let m = MapRec {
        extent: 3,
        ext_offset: 4,
        len: 5,
    };
    assert_eq!(MapRec::decode(&m.encode()).unwrap(), m);
    assert!(MapRec::decode(&[0; 3]).is_err());
    let d = DirentRec {
        ino: 3,
        kind: FileKind::Dir,
        seq: 4,
    };
    assert_eq!(DirentRec::decode(&d.encode()).unwrap(), d);
    assert!(DirentRec::decode(&[0; 17]).is_err());
    let s = SegmentHeader {
        version: 1,
        uuid: [1; 16],
        id: 42,
    };
    assert_eq!(SegmentHeader::decode(&s.encode()).unwrap(), s);
    let mut sb = s.encode();
    sb[33] ^= 1;
    assert!(SegmentHeader::decode(&sb).is_err());
    assert_eq!(parse_segment_file_name(&segment_file_name(42)), Some(42));
    assert_eq!(parse_segment_file_name("junk.seg"), None);
}

mod props {
    use super::super::*;
    use compfs_codec::MAX_EXTENT;
    use proptest::prelude::*;

    /// Every decoder, on any bytes: a value or an error, never a panic, and never lengths
    /// a reader would allocate unboundedly from.
    fn decode_all(b: &[u8]) {
        let bounded = |raw: u32, stored: usize| {
            assert!(
                raw as usize <= MAX_EXTENT && stored <= MAX_STORED,
                "{raw} {stored}"
            );
        };
        let _ = Superblock::decode(b);
        let _ = SegmentHeader::decode(b);
        if let Ok(h) = ExtentHeader::decode(b) {
            bounded(h.raw_len, h.stored_len as usize);
        }
        if let Ok(InodeRec {
            inline: Some(i), ..
        }) = InodeRec::decode(b)
        {
            bounded(i.raw_len, i.bytes.len());
        }
        let _ = DirentRec::decode(b);
        let _ = MapRec::decode(b);
        if let Ok(x) = ExtentRec::decode(b) {
            bounded(x.raw_len, x.stored_len as usize);
        }
        let _ = SegmentRec::decode(b);
        let _ = StatRec::decode(b);
        if let Ok(s) = std::str::from_utf8(b) {
            let _ = parse_segment_file_name(s);
        }
    }

    fn ts() -> impl Strategy<Value = Timestamp> {
        (any::<i64>(), 0u32..1_000_000_000).prop_map(|(secs, nsecs)| Timestamp { secs, nsecs })
    }

    fn inode() -> impl Strategy<Value = InodeRec> {
        let inline = proptest::option::of(
            (
                0u8..4,
                any::<i8>(),
                0u32..=MAX_EXTENT as u32,
                proptest::collection::vec(any::<u8>(), 0..64),
            )
                .prop_map(|(codec, level, raw_len, bytes)| {
                    Inline::new(codec, level, raw_len, bytes)
                }),
        );
        (
            (
                1u8..=7,
                any::<u16>(),
                any::<u32>(),
                any::<u32>(),
                any::<u32>(),
                any::<u32>(),
            ),
            (any::<u64>(), ts(), ts(), ts(), ts()),
            (any::<u64>(), any::<u64>(), any::<u64>(), inline),
        )
            .prop_filter_map(
                "kind code",
                |(
                    (k, perm, nlink, uid, gid, rdev),
                    (size, atime, mtime, ctime, crtime),
                    (parent, next_seq, disk_bytes, inline),
                )| {
                    Some(InodeRec {
                        kind: FileKind::from_code(k)?,
                        perm,
                        nlink,
                        uid,
                        gid,
                        rdev,
                        size,
                        atime,
                        mtime,
                        ctime,
                        crtime,
                        parent,
                        next_seq,
                        disk_bytes,
                        inline,
                    })
                },
            )
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            decode_all(&b);
        }

        #[test]
        fn damaged_records_never_panic(r in inode(), at in any::<prop::sample::Index>(), bit in 0u8..8, cut in any::<prop::sample::Index>()) {
            for b in [r.encode(), r.encode_v2(), r.encode_v1()] {
                prop_assert_eq!(&InodeRec::decode(&b).unwrap(), &r);
                let mut c = b.clone();
                let i = at.index(c.len());
                c[i] ^= 1 << bit;
                decode_all(&c);
                decode_all(&b[..cut.index(b.len())]);
            }
        }

        #[test]
        fn extent_records_round_trip_within_bounds(
            segment in any::<u64>(), seg_offset in any::<u64>(), stored_len in 0u32..=MAX_STORED as u32,
            raw_len in 0u32..=MAX_EXTENT as u32, codec in any::<u8>(), level in any::<i8>(), crc in any::<u32>(),
            refs in any::<u32>(), ino in any::<u64>(), dict in any::<u16>(),
        ) {
            let x = ExtentRec { segment, seg_offset, stored_len, raw_len, codec, level, crc, refs, ino, dict };
            prop_assert_eq!(ExtentRec::decode(&x.encode()).unwrap(), x);
            prop_assert_eq!(ExtentRec::decode(&x.encode_fixed()).unwrap(), x);
            let mut big = x.encode_fixed();
            big[20..24].copy_from_slice(&(MAX_EXTENT as u32 + 1).to_le_bytes());
            prop_assert!(ExtentRec::decode(&big).is_err());
        }

        #[test]
        fn extent_headers_detect_every_bit_flip(
            raw_len in 0u32..=MAX_EXTENT as u32, stored_len in 0u32..=MAX_EXTENT as u32, id in any::<u64>(),
            ino in any::<u64>(), file_offset in any::<u64>(), crc in any::<u32>(),
            at in 0..EXT_HEADER_LEN, bit in 0u8..8, dict in any::<u16>(),
        ) {
            let h = ExtentHeader { codec: 1, level: 3, raw_len, stored_len, id, ino, file_offset, crc, dict };
            let mut b = h.encode();
            prop_assert_eq!(ExtentHeader::decode(&b).unwrap(), h);
            b[at] ^= 1 << bit;
            prop_assert!(ExtentHeader::decode(&b).is_err());
        }
    }
}
