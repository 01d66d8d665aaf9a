//! The compact (varint) inode record, version 3 (written by format version 3; see
//! docs/format.md, "Inode record, version 3"), and the LEB128 varints it is made of.

use compfs_codec::Algorithm;

use super::{
    check_lengths, short, u32_at, DecodeError, DirentRec, ExtentRec, Inline, InodeRec, MapRec,
    HAS_DIR, HAS_DISK, HAS_INLINE, HAS_RDEV,
};
use crate::types::{FileKind, Timestamp};

/// Appends `v` as an unsigned LEB128 varint (7 bits a byte, low first; 1..=10 bytes).
pub(crate) fn put_uvar(b: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        b.push(v as u8 | 0x80);
        v >>= 7;
    }
    b.push(v as u8);
}

/// Zigzag mapping of a signed value (0, -1, 1, -2 … → 0, 1, 2, 3 …).
fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}
fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// Reads the fields of a record front to back; every read is bounds-checked and fails with
/// the record's decode error (never a panic).
pub(crate) struct Reader<'a> {
    b: &'a [u8],
    pub(crate) o: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(b: &'a [u8], o: usize, what: &'static str) -> Reader<'a> {
        Reader { b, o, what }
    }
    fn bad(&self) -> DecodeError {
        short(self.what, self.b.len())
    }
    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        let v = *self.b.get(self.o).ok_or_else(|| self.bad())?;
        self.o += 1;
        Ok(v)
    }
    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        if self.b.len() < self.o + 4 {
            return Err(self.bad());
        }
        self.o += 4;
        Ok(u32_at(self.b, self.o - 4))
    }
    /// An unsigned varint: at most 10 bytes, and the 10th may only hold the top bit.
    pub(crate) fn uvar(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for i in 0..10 {
            let x = self.u8()?;
            if i == 9 && x > 1 {
                return Err(self.bad());
            }
            v |= ((x & 0x7f) as u64) << (7 * i);
            if x & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.bad())
    }
    /// A varint that must fit 32 bits.
    pub(crate) fn uvar32(&mut self) -> Result<u32, DecodeError> {
        let v = self.uvar()?;
        u32::try_from(v).map_err(|_| self.bad())
    }
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let r = &self.b[self.o.min(self.b.len())..];
        self.o = self.b.len();
        r
    }
    pub(crate) fn at_end(&self) -> bool {
        self.o == self.b.len()
    }
}

/// A time other than the mtime: seconds as a zigzag varint difference from the mtime's
/// (wrapping, so any value round-trips), nanoseconds as a u32.
fn put_rel_ts(b: &mut Vec<u8>, t: Timestamp, base: i64) {
    put_uvar(b, zigzag(t.secs.wrapping_sub(base)));
    b.extend_from_slice(&t.nsecs.to_le_bytes());
}
fn rel_ts(r: &mut Reader<'_>, base: i64) -> Result<Timestamp, DecodeError> {
    let secs = base.wrapping_add(unzigzag(r.uvar()?));
    Ok(Timestamp {
        secs,
        nsecs: r.u32()?,
    })
}

impl InodeRec {
    /// Encodes the record in its version-3 layout (see docs/format.md): varints, the other
    /// times relative to the mtime, and only the optional fields the inode uses.
    pub fn encode(&self) -> Vec<u8> {
        let inline_len = self.inline.as_ref().map_or(0, |i| 16 + i.bytes.len());
        let mut b = Vec::with_capacity(48 + inline_len);
        b.push(3); // record version
        b.push(self.kind.code());
        let has = self.presence();
        b.push(has);
        put_uvar(&mut b, self.perm as u64);
        put_uvar(&mut b, self.nlink as u64);
        put_uvar(&mut b, self.uid as u64);
        put_uvar(&mut b, self.gid as u64);
        put_uvar(&mut b, self.size);
        put_uvar(&mut b, zigzag(self.mtime.secs));
        b.extend_from_slice(&self.mtime.nsecs.to_le_bytes());
        for t in [self.atime, self.ctime, self.crtime] {
            put_rel_ts(&mut b, t, self.mtime.secs);
        }
        if has & HAS_RDEV != 0 {
            put_uvar(&mut b, self.rdev as u64);
        }
        if has & HAS_DIR != 0 {
            put_uvar(&mut b, self.parent);
            put_uvar(&mut b, self.next_seq);
        }
        if has & HAS_DISK != 0 {
            put_uvar(&mut b, self.disk_bytes);
        }
        if let Some(i) = &self.inline {
            b.push(i.codec);
            b.push(i.level as u8);
            put_uvar(&mut b, i.dict as u64);
            put_uvar(&mut b, i.raw_len as u64);
            b.extend_from_slice(&i.crc.to_le_bytes());
            b.extend_from_slice(&i.bytes);
        }
        b
    }

    /// The version-3 layout (byte 0 already checked).
    pub(super) fn decode_v3(b: &[u8]) -> Result<InodeRec, DecodeError> {
        let mut r = Reader::new(b, 1, "inode");
        let code = r.u8()?;
        let kind = FileKind::from_code(code).ok_or(DecodeError::BadKind {
            what: "inode",
            code,
        })?;
        let has = r.u8()?;
        if has & !(HAS_RDEV | HAS_DIR | HAS_DISK | HAS_INLINE) != 0 {
            return Err(DecodeError::Reserved {
                what: "inode",
                start: 2,
                end: 3,
            });
        }
        let perm = u16::try_from(r.uvar()?).map_err(|_| short("inode", b.len()))?;
        let nlink = r.uvar32()?;
        let uid = r.uvar32()?;
        let gid = r.uvar32()?;
        let size = r.uvar()?;
        let msecs = unzigzag(r.uvar()?);
        let mtime = Timestamp {
            secs: msecs,
            nsecs: r.u32()?,
        };
        let atime = rel_ts(&mut r, msecs)?;
        let ctime = rel_ts(&mut r, msecs)?;
        let crtime = rel_ts(&mut r, msecs)?;
        let rdev = if has & HAS_RDEV != 0 { r.uvar32()? } else { 0 };
        let (parent, next_seq) = if has & HAS_DIR != 0 {
            (r.uvar()?, r.uvar()?)
        } else {
            (0, 0)
        };
        let disk_bytes = if has & HAS_DISK != 0 { r.uvar()? } else { 0 };
        let inline = if has & HAS_INLINE != 0 {
            let codec = r.u8()?;
            if Algorithm::from_id(codec).is_none() {
                return Err(DecodeError::BadInlineCodec(codec));
            }
            let level = r.u8()? as i8;
            let dict = u16::try_from(r.uvar()?).map_err(|_| short("inode", b.len()))?;
            let raw_len = r.uvar32()?;
            let crc = r.u32()?;
            let bytes = r.rest();
            check_lengths("inline", raw_len as usize, bytes.len())?;
            Some(Inline {
                codec,
                level,
                raw_len,
                crc,
                dict,
                bytes: bytes.to_vec(),
            })
        } else {
            None
        };
        if !r.at_end() {
            return Err(short("inode", b.len()));
        }
        Ok(InodeRec {
            kind,
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
    }
}

impl DirentRec {
    /// Encodes the entry compactly (format version 3): ino and sequence number as varints
    /// around the kind byte. A value that would take 17 bytes or more is written in the fixed
    /// layout instead, so the length tells the layouts apart.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(12);
        put_uvar(&mut b, self.ino);
        b.push(self.kind.code());
        put_uvar(&mut b, self.seq);
        if b.len() >= 17 {
            return self.encode_fixed().to_vec();
        }
        b
    }

    pub(super) fn decode_compact(b: &[u8]) -> Result<DirentRec, DecodeError> {
        let mut r = Reader::new(b, 0, "dirent");
        let ino = r.uvar()?;
        let code = r.u8()?;
        let kind = FileKind::from_code(code).ok_or(DecodeError::BadKind {
            what: "dirent",
            code,
        })?;
        let seq = r.uvar()?;
        if !r.at_end() {
            return Err(short("dirent", b.len()));
        }
        Ok(DirentRec { ino, kind, seq })
    }
}

impl MapRec {
    /// Encodes the entry compactly (format version 3): extent id, extent offset and length as
    /// varints; the fixed 16-byte layout when that would not be shorter.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(10);
        put_uvar(&mut b, self.extent);
        put_uvar(&mut b, self.ext_offset as u64);
        put_uvar(&mut b, self.len as u64);
        if b.len() >= 16 {
            return self.encode_fixed().to_vec();
        }
        b
    }

    pub(super) fn decode_compact(b: &[u8]) -> Result<MapRec, DecodeError> {
        let mut r = Reader::new(b, 0, "extent map");
        let m = MapRec {
            extent: r.uvar()?,
            ext_offset: r.uvar32()?,
            len: r.uvar32()?,
        };
        if !r.at_end() {
            return Err(short("extent map", b.len()));
        }
        Ok(m)
    }
}

impl ExtentRec {
    /// Encodes the record compactly (format version 3): segment, offset, lengths as varints,
    /// codec and level bytes, dictionary id varint, CRC-32C u32, reference count and owner
    /// varints; the fixed 44-byte layout when that would not be shorter.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(24);
        put_uvar(&mut b, self.segment);
        put_uvar(&mut b, self.seg_offset);
        put_uvar(&mut b, self.stored_len as u64);
        put_uvar(&mut b, self.raw_len as u64);
        b.push(self.codec);
        b.push(self.level as u8);
        put_uvar(&mut b, self.dict as u64);
        b.extend_from_slice(&self.crc.to_le_bytes());
        put_uvar(&mut b, self.refs as u64);
        put_uvar(&mut b, self.ino);
        if b.len() >= 44 {
            return self.encode_fixed().to_vec();
        }
        b
    }

    pub(super) fn decode_compact(b: &[u8]) -> Result<ExtentRec, DecodeError> {
        let mut r = Reader::new(b, 0, "extent");
        let segment = r.uvar()?;
        let seg_offset = r.uvar()?;
        let stored_len = r.uvar32()?;
        let raw_len = r.uvar32()?;
        let codec = r.u8()?;
        let level = r.u8()? as i8;
        let dict = u16::try_from(r.uvar()?).map_err(|_| short("extent", b.len()))?;
        let crc = r.u32()?;
        let refs = r.uvar32()?;
        let ino = r.uvar()?;
        if !r.at_end() {
            return Err(short("extent", b.len()));
        }
        Ok(ExtentRec {
            segment,
            seg_offset,
            stored_len,
            raw_len,
            codec,
            level,
            crc,
            refs,
            ino,
            dict,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_and_reject_overlong_input() {
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX - 1, u64::MAX] {
            let mut b = Vec::new();
            put_uvar(&mut b, v);
            let mut r = Reader::new(&b, 0, "t");
            assert_eq!(r.uvar(), Ok(v));
            assert!(r.at_end());
            // Every prefix is truncated.
            for n in 0..b.len() {
                assert!(Reader::new(&b[..n], 0, "t").uvar().is_err());
            }
        }
        for v in [0, -1, 1, i64::MIN, i64::MAX] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
        assert_eq!(zigzag(-1), 1);
        // Eleven continuation bytes, or a tenth byte with more than the top bit: not a u64.
        assert!(Reader::new(&[0x80; 11], 0, "t").uvar().is_err());
        let mut big = vec![0xff; 9];
        big.push(2);
        assert!(Reader::new(&big, 0, "t").uvar().is_err());
        let mut r = Reader::new(&[0x80, 0x80, 0x80, 0x80, 0x10], 0, "t");
        assert!(r.uvar32().is_err());
    }

    #[test]
    fn a_plain_file_record_is_small() {
        let t = Timestamp {
            secs: 1_780_000_000,
            nsecs: 123_456_789,
        };
        let r = InodeRec {
            kind: FileKind::File,
            perm: 0o644,
            nlink: 1,
            uid: 1000,
            gid: 1000,
            rdev: 0,
            size: 12_345,
            atime: t,
            mtime: t,
            ctime: Timestamp {
                secs: t.secs + 1,
                nsecs: 5,
            },
            crtime: t,
            parent: 0,
            next_seq: 0,
            disk_bytes: 4_000,
            inline: None,
        };
        let b = r.encode();
        assert_eq!(b.len(), 38, "{b:?}");
        assert_eq!(InodeRec::decode(&b).unwrap(), r);
        // Trailing bytes, a truncated record and a reserved presence bit are errors.
        let mut long = b.clone();
        long.push(0);
        assert!(InodeRec::decode(&long).is_err());
        for n in 0..b.len() {
            assert!(InodeRec::decode(&b[..n]).is_err(), "{n}");
        }
        let mut res = b.clone();
        res[2] |= 0x10;
        assert!(matches!(
            InodeRec::decode(&res),
            Err(DecodeError::Reserved { start: 2, .. })
        ));
        let mut kind = b;
        kind[1] = 99;
        assert!(matches!(
            InodeRec::decode(&kind),
            Err(DecodeError::BadKind { code: 99, .. })
        ));
    }

    #[test]
    fn compact_records_round_trip_and_fall_back_to_the_fixed_layouts() {
        let d = DirentRec {
            ino: 300,
            kind: FileKind::File,
            seq: 5,
        };
        assert_eq!(d.encode().len(), 4);
        assert_eq!(DirentRec::decode(&d.encode()), Ok(d));
        assert_eq!(DirentRec::decode(&d.encode_fixed()), Ok(d));
        let big = DirentRec {
            ino: u64::MAX,
            seq: u64::MAX,
            ..d
        };
        assert_eq!(big.encode().len(), 17);
        assert_eq!(DirentRec::decode(&big.encode()), Ok(big));
        let m = MapRec {
            extent: 70_000,
            ext_offset: 0,
            len: 131_072,
        };
        assert_eq!(m.encode().len(), 7);
        assert_eq!(MapRec::decode(&m.encode()), Ok(m));
        assert_eq!(MapRec::decode(&m.encode_fixed()), Ok(m));
        let far = MapRec {
            extent: u64::MAX,
            ..m
        };
        assert_eq!(MapRec::decode(&far.encode()), Ok(far));
        // The compact form is checked as the fixed one is.
        let empty = MapRec { len: 0, ..m };
        assert_eq!(
            MapRec::decode(&empty.encode()),
            Err(DecodeError::EmptyMapEntry)
        );
        let x = ExtentRec {
            segment: 3,
            seg_offset: 40_000_000,
            stored_len: 1_000,
            raw_len: 3_000,
            codec: 3,
            level: -5,
            crc: 0xdead_beef,
            refs: 1,
            ino: 9_000,
            dict: 2,
        };
        assert_eq!(x.encode().len(), 19);
        assert_eq!(ExtentRec::decode(&x.encode()), Ok(x));
        assert_eq!(ExtentRec::decode(&x.encode_fixed()), Ok(x));
        let wide = ExtentRec {
            segment: u64::MAX,
            seg_offset: u64::MAX,
            refs: u32::MAX,
            ino: u64::MAX,
            dict: u16::MAX,
            ..x
        };
        assert_eq!(wide.encode().len(), 44);
        assert_eq!(ExtentRec::decode(&wide.encode()), Ok(wide));
        let huge = ExtentRec {
            raw_len: compfs_codec::MAX_EXTENT as u32 + 1,
            ..x
        };
        assert!(matches!(
            ExtentRec::decode(&huge.encode()),
            Err(DecodeError::ImplausibleLengths { .. })
        ));
        // Every truncation and a trailing byte are decode errors, never a panic.
        for n in 0..x.encode().len() {
            assert!(ExtentRec::decode(&x.encode()[..n]).is_err(), "{n}");
        }
        for n in 0..m.encode().len() {
            assert!(MapRec::decode(&m.encode()[..n]).is_err(), "{n}");
        }
        for n in 0..d.encode().len() {
            assert!(DirentRec::decode(&d.encode()[..n]).is_err(), "{n}");
        }
        let mut long = x.encode();
        long.push(0);
        assert!(ExtentRec::decode(&long).is_err());
    }
}
