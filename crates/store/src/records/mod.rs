//! On-disk structures: superblock, segment header, extent header, and the value encodings of the
//! metadata tables. Every multi-byte integer is little-endian. `docs/format.md` documents each
//! field; keep the two in step.

use compfs_codec::{Algorithm, CodecSpec, Mode};

use crate::types::{FileKind, Timestamp};

/// Current store format version. Version 2 (issue 16) adds a checksum to inline data and a
/// leaner inode record; version 3 (issue 16) a dictionary id in extent headers, extent records
/// and inline data, and the `dicts` table. Older stores open and are upgraded when opened for
/// writing.
pub const FORMAT_VERSION: u32 = 3;
/// Name of the superblock file inside the store directory.
pub const SUPERBLOCK_FILE: &str = "compfs.super";
/// Name of the metadata database inside the store directory.
pub const META_FILE: &str = "meta.redb";
/// Directory of the segment files.
pub const SEGMENT_DIR: &str = "segments";

/// Superblock magic.
pub const SB_MAGIC: [u8; 8] = *b"CMPFS-SB";
/// Encoded superblock length.
pub const SB_LEN: usize = 64;
/// Segment header magic.
pub const SEG_MAGIC: [u8; 8] = *b"CMPFSSEG";
/// Segment header length: extents start at this offset.
pub const SEG_HEADER_LEN: u64 = 64;
/// Extent header magic ("CXT1" little-endian).
pub const EXT_MAGIC: u32 = u32::from_le_bytes(*b"CXT1");
/// Extent header length.
pub const EXT_HEADER_LEN: usize = 48;

pub(crate) fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
pub(crate) fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
pub(crate) fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}
fn i64_at(b: &[u8], o: usize) -> i64 {
    u64_at(b, o) as i64
}

/// Name of segment `id`'s file inside [`SEGMENT_DIR`].
pub fn segment_file_name(id: u64) -> String {
    format!("{id:016x}.seg")
}

/// Parses a segment file name back to its id.
pub fn parse_segment_file_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".seg")?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Encodes a mode as stored: 0 heuristic, 1 force.
pub fn mode_code(m: Mode) -> u8 {
    match m {
        Mode::Heuristic => 0,
        Mode::Force => 1,
    }
}

/// Decodes a codec id and level into a spec (level clamped as the parser does).
pub fn spec_from(id: u8, level: i8) -> Option<CodecSpec> {
    Algorithm::from_id(id).map(|a| CodecSpec::with_level(a, level as i32).spec)
}

/// The identity file of a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    pub version: u32,
    pub uuid: [u8; 16],
    pub extent_size: u32,
    pub codec: CodecSpec,
    pub mode: Mode,
    pub inline_max: u32,
    pub segment_size: u64,
    pub created: i64,
}

impl Superblock {
    /// A fixed superblock for the store's tests (zstd:5 forced, 128 KiB extents).
    #[cfg(any(test, feature = "internals"))]
    #[doc(hidden)]
    pub fn test_fixture() -> Superblock {
        Superblock {
            version: 1,
            uuid: [7; 16],
            extent_size: 131072,
            codec: CodecSpec::with_level(compfs_codec::Algorithm::Zstd, 5).spec,
            mode: Mode::Force,
            inline_max: 2048,
            segment_size: 64 << 20,
            created: 12345,
        }
    }
}

/// Why a segment header, extent header or metadata record could not be decoded. The messages
/// are those fsck prints.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A fixed-size record of the wrong length (or an unknown record version).
    #[error("{what} record of {len} bytes is malformed")]
    Malformed { what: &'static str, len: usize },
    /// A header shorter than its fixed length.
    #[error("{what} truncated to {len} bytes")]
    Truncated { what: &'static str, len: usize },
    #[error("bad {what} magic")]
    BadMagic { what: &'static str },
    #[error("{what} checksum mismatch")]
    BadChecksum { what: &'static str },
    #[error("unknown codec id {0}")]
    UnknownCodec(u8),
    #[error("bad inline codec {0}")]
    BadInlineCodec(u8),
    #[error("bad {what} kind {code}")]
    BadKind { what: &'static str, code: u8 },
    /// Lengths no extent or inline data can have (see [`MAX_STORED`]).
    #[error("implausible {what} lengths raw {raw} stored {stored}")]
    ImplausibleLengths {
        what: &'static str,
        raw: usize,
        stored: usize,
    },
    /// Reserved bytes that are not zero (every version-1 writer leaves them zero).
    #[error("{what}: reserved bytes {start}..{end} are not zero")]
    Reserved {
        what: &'static str,
        start: usize,
        end: usize,
    },
    /// An extent-map entry of length 0.
    #[error("empty extent map entry")]
    EmptyMapEntry,
    /// A preallocated range that is empty or reaches past the largest file offset.
    #[error(
        "preallocated range of {len} bytes at {start} is empty or past the largest file offset"
    )]
    BadPrealloc { start: u64, len: u64 },
    /// An extent-map entry that reaches past the end of its extent (`raw_len`: the extent's
    /// length, or the largest an extent can have when the extent is not known).
    #[error("extent map entry of {len} bytes at extent offset {ext_offset} reaches past the extent's {raw_len} bytes")]
    MapPastExtent {
        ext_offset: u32,
        len: u32,
        raw_len: u64,
    },
}

/// Why a superblock could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SbError {
    Truncated(usize),
    BadMagic,
    FutureVersion(u32),
    BadChecksum { stored: u32, computed: u32 },
    BadField(String),
}

impl Superblock {
    pub fn encode(&self) -> [u8; SB_LEN] {
        let mut b = [0u8; SB_LEN];
        b[0..8].copy_from_slice(&SB_MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&(SB_LEN as u32).to_le_bytes());
        b[16..32].copy_from_slice(&self.uuid);
        b[32..36].copy_from_slice(&self.extent_size.to_le_bytes());
        b[36] = self.codec.algorithm().id();
        b[37] = self.codec.level() as i8 as u8;
        b[38] = mode_code(self.mode);
        b[39] = 0;
        b[40..44].copy_from_slice(&self.inline_max.to_le_bytes());
        b[44..52].copy_from_slice(&self.segment_size.to_le_bytes());
        b[52..60].copy_from_slice(&self.created.to_le_bytes());
        let crc = crc32c::crc32c(&b[0..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Superblock, SbError> {
        if b.len() < 12 {
            if b.len() >= 8 && b[0..8] != SB_MAGIC {
                return Err(SbError::BadMagic);
            }
            return Err(SbError::Truncated(b.len()));
        }
        if b[0..8] != SB_MAGIC {
            return Err(SbError::BadMagic);
        }
        let version = u32_at(b, 8);
        if version > FORMAT_VERSION {
            return Err(SbError::FutureVersion(version));
        }
        if b.len() < SB_LEN {
            return Err(SbError::Truncated(b.len()));
        }
        let stored = u32_at(b, 60);
        let computed = crc32c::crc32c(&b[0..60]);
        if stored != computed {
            return Err(SbError::BadChecksum { stored, computed });
        }
        if version == 0 || u32_at(b, 12) != SB_LEN as u32 {
            return Err(SbError::BadField("version or header length".into()));
        }
        check_reserved("superblock", b, 39..40).map_err(|e| SbError::BadField(e.to_string()))?;
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[16..32]);
        let extent_size = u32_at(b, 32);
        if compfs_codec::check_extent_size(extent_size as usize).is_err() {
            return Err(SbError::BadField(format!("extent size {extent_size}")));
        }
        let codec = spec_from(b[36], b[37] as i8)
            .ok_or_else(|| SbError::BadField(format!("codec id {}", b[36])))?;
        let mode = match b[38] {
            0 => Mode::Heuristic,
            1 => Mode::Force,
            m => return Err(SbError::BadField(format!("mode {m}"))),
        };
        let segment_size = u64_at(b, 44);
        if segment_size < 4096 {
            return Err(SbError::BadField(format!("segment size {segment_size}")));
        }
        Ok(Superblock {
            version,
            uuid,
            extent_size,
            codec,
            mode,
            inline_max: u32_at(b, 40),
            segment_size,
            created: i64_at(b, 52),
        })
    }
}

/// Header at the start of every segment file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    pub version: u32,
    pub uuid: [u8; 16],
    pub id: u64,
}

impl SegmentHeader {
    pub fn encode(&self) -> [u8; SEG_HEADER_LEN as usize] {
        let mut b = [0u8; SEG_HEADER_LEN as usize];
        b[0..8].copy_from_slice(&SEG_MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[16..32].copy_from_slice(&self.uuid);
        b[32..40].copy_from_slice(&self.id.to_le_bytes());
        let crc = crc32c::crc32c(&b[0..40]);
        b[40..44].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<SegmentHeader, DecodeError> {
        if b.len() < SEG_HEADER_LEN as usize {
            return Err(DecodeError::Truncated {
                what: "segment header",
                len: b.len(),
            });
        }
        if b[0..8] != SEG_MAGIC {
            return Err(DecodeError::BadMagic { what: "segment" });
        }
        if crc32c::crc32c(&b[0..40]) != u32_at(b, 40) {
            return Err(DecodeError::BadChecksum {
                what: "segment header",
            });
        }
        check_reserved("segment header", b, 12..16)?;
        check_reserved("segment header", b, 44..64)?;
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[16..32]);
        Ok(SegmentHeader {
            version: u32_at(b, 8),
            uuid,
            id: u64_at(b, 32),
        })
    }
}

/// The self-describing header in front of every extent's stored bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentHeader {
    /// Algorithm id ([`Algorithm::id`]); 0 = stored raw.
    pub codec: u8,
    pub level: i8,
    pub raw_len: u32,
    pub stored_len: u32,
    pub id: u64,
    /// Inode and file offset the extent was written for (informational, for fsck reports).
    pub ino: u64,
    pub file_offset: u64,
    /// crc32c of the stored bytes.
    pub crc: u32,
    /// The dictionary the bytes were compressed with (0 = none; format version 3).
    pub dict: u16,
}

impl ExtentHeader {
    pub fn encode(&self) -> [u8; EXT_HEADER_LEN] {
        let mut b = [0u8; EXT_HEADER_LEN];
        b[0..4].copy_from_slice(&EXT_MAGIC.to_le_bytes());
        b[4] = self.codec;
        b[5] = self.level as u8;
        b[6..8].copy_from_slice(&self.dict.to_le_bytes());
        b[8..12].copy_from_slice(&self.raw_len.to_le_bytes());
        b[12..16].copy_from_slice(&self.stored_len.to_le_bytes());
        b[16..24].copy_from_slice(&self.id.to_le_bytes());
        b[24..32].copy_from_slice(&self.ino.to_le_bytes());
        b[32..40].copy_from_slice(&self.file_offset.to_le_bytes());
        b[40..44].copy_from_slice(&self.crc.to_le_bytes());
        let hcrc = crc32c::crc32c(&b[0..44]);
        b[44..48].copy_from_slice(&hcrc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<ExtentHeader, DecodeError> {
        if b.len() < EXT_HEADER_LEN {
            return Err(DecodeError::Truncated {
                what: "extent header",
                len: b.len(),
            });
        }
        if u32_at(b, 0) != EXT_MAGIC {
            return Err(DecodeError::BadMagic { what: "extent" });
        }
        if crc32c::crc32c(&b[0..44]) != u32_at(b, 44) {
            return Err(DecodeError::BadChecksum {
                what: "extent header",
            });
        }
        let h = ExtentHeader {
            dict: u16_at(b, 6),
            codec: b[4],
            level: b[5] as i8,
            raw_len: u32_at(b, 8),
            stored_len: u32_at(b, 12),
            id: u64_at(b, 16),
            ino: u64_at(b, 24),
            file_offset: u64_at(b, 32),
            crc: u32_at(b, 40),
        };
        if Algorithm::from_id(h.codec).is_none() {
            return Err(DecodeError::UnknownCodec(h.codec));
        }
        check_lengths("extent", h.raw_len as usize, h.stored_len as usize)?;
        Ok(h)
    }
}

/// Largest stored length of an extent or inline data: a codec may expand incompressible input
/// a little before the store gives up and stores it raw.
pub const MAX_STORED: usize = compfs_codec::MAX_EXTENT + 4096;

/// Rejects uncompressed and stored lengths no extent or inline data can have: readers size
/// buffers from them (extent records before the extent header is read), so a damaged value
/// must not make one allocate gigabytes.
fn check_lengths(what: &'static str, raw: usize, stored: usize) -> Result<(), DecodeError> {
    if raw > compfs_codec::MAX_EXTENT || stored > MAX_STORED {
        return Err(DecodeError::ImplausibleLengths { what, raw, stored });
    }
    Ok(())
}

/// Rejects non-zero reserved bytes: every version-1 writer leaves them zero, so anything else
/// is damage (or a newer format this version must not guess at).
pub(crate) fn check_reserved(
    what: &'static str,
    b: &[u8],
    range: std::ops::Range<usize>,
) -> Result<(), DecodeError> {
    match b.get(range.clone()) {
        Some(r) if r.iter().all(|&x| x == 0) => Ok(()),
        _ => Err(DecodeError::Reserved {
            what,
            start: range.start,
            end: range.end,
        }),
    }
}

/// Bad metadata value.
pub(crate) fn short(what: &'static str, len: usize) -> DecodeError {
    DecodeError::Malformed { what, len }
}

/// Inline data kept in an inode record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inline {
    pub codec: u8,
    pub level: i8,
    pub raw_len: u32,
    /// CRC-32C of `bytes` (the stored bytes). Version-2 records store it; for a version-1
    /// record, which has none, it is computed when the record is decoded.
    pub crc: u32,
    /// The dictionary the bytes were compressed with (0 = none; format version 3).
    pub dict: u16,
    pub bytes: Vec<u8>,
}

impl Inline {
    /// Inline data stored as `bytes` (compressed with `codec` at `level`, or raw for codec 0),
    /// with its checksum.
    pub fn new(codec: u8, level: i8, raw_len: u32, bytes: Vec<u8>) -> Inline {
        Inline {
            codec,
            level,
            raw_len,
            crc: crc32c::crc32c(&bytes),
            dict: 0,
            bytes,
        }
    }

    /// The same, compressed with dictionary `dict`.
    pub fn with_dict(mut self, dict: u16) -> Inline {
        self.dict = dict;
        self
    }
}

/// An inode record (value of the `inodes` table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InodeRec {
    pub kind: FileKind,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub size: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub crtime: Timestamp,
    /// Directories: parent directory. Others: 0.
    pub parent: u64,
    /// Directories: next directory-entry sequence number (readdir cookie source).
    pub next_seq: u64,
    /// Stored bytes of this inode's extents (for `st_blocks`).
    pub disk_bytes: u64,
    /// Inline data (small files, symlink targets).
    pub inline: Option<Inline>,
}

/// Fixed part of a version-1 inode record (written by format version 1).
const INODE_V1_FIXED: usize = 112;
/// Fixed part of a version-2 inode record: up to and including the presence byte.
const INODE_V2_FIXED: usize = 73;
/// Presence bits of a version-2 inode record (byte 72) and of a version-3 one (byte 2).
pub(super) const HAS_RDEV: u8 = 1;
pub(super) const HAS_DIR: u8 = 2;
pub(super) const HAS_DISK: u8 = 4;
pub(super) const HAS_INLINE: u8 = 8;
/// Length of the inline-data header of a version-2 record (codec, level, dictionary id u16
/// (format version 3; reserved, 0, before), raw length u32, CRC-32C u32).
const INLINE_V2_HEAD: usize = 12;

#[cfg(any(test, feature = "internals"))]
fn put_ts(b: &mut Vec<u8>, t: Timestamp) {
    b.extend_from_slice(&t.secs.to_le_bytes());
    b.extend_from_slice(&t.nsecs.to_le_bytes());
}
fn ts_at(b: &[u8], o: usize) -> Timestamp {
    Timestamp {
        secs: i64_at(b, o),
        nsecs: u32_at(b, o + 8),
    }
}

impl InodeRec {
    /// The presence bits of the optional fields this inode uses (versions 2 and 3).
    pub(super) fn presence(&self) -> u8 {
        let mut has = 0u8;
        if self.rdev != 0 {
            has |= HAS_RDEV;
        }
        if self.parent != 0 || self.next_seq != 0 {
            has |= HAS_DIR;
        }
        if self.disk_bytes != 0 {
            has |= HAS_DISK;
        }
        if self.inline.is_some() {
            has |= HAS_INLINE;
        }
        has
    }

    /// Encodes the record in the version-2 layout (format version 2; tests of its decoder):
    /// 73 fixed bytes, then only the optional fields the inode uses.
    #[cfg(any(test, feature = "internals"))]
    #[doc(hidden)]
    pub fn encode_v2(&self) -> Vec<u8> {
        let inline_len = self
            .inline
            .as_ref()
            .map_or(0, |i| INLINE_V2_HEAD + i.bytes.len());
        let mut b = Vec::with_capacity(INODE_V2_FIXED + 28 + inline_len);
        b.push(2); // record version
        b.push(self.kind.code());
        b.extend_from_slice(&self.perm.to_le_bytes());
        b.extend_from_slice(&self.nlink.to_le_bytes());
        b.extend_from_slice(&self.uid.to_le_bytes());
        b.extend_from_slice(&self.gid.to_le_bytes());
        b.extend_from_slice(&self.size.to_le_bytes());
        put_ts(&mut b, self.atime);
        put_ts(&mut b, self.mtime);
        put_ts(&mut b, self.ctime);
        put_ts(&mut b, self.crtime);
        let has = self.presence();
        b.push(has);
        if has & HAS_RDEV != 0 {
            b.extend_from_slice(&self.rdev.to_le_bytes());
        }
        if has & HAS_DIR != 0 {
            b.extend_from_slice(&self.parent.to_le_bytes());
            b.extend_from_slice(&self.next_seq.to_le_bytes());
        }
        if has & HAS_DISK != 0 {
            b.extend_from_slice(&self.disk_bytes.to_le_bytes());
        }
        if let Some(i) = &self.inline {
            b.push(i.codec);
            b.push(i.level as u8);
            b.extend_from_slice(&i.dict.to_le_bytes());
            b.extend_from_slice(&i.raw_len.to_le_bytes());
            b.extend_from_slice(&i.crc.to_le_bytes());
            b.extend_from_slice(&i.bytes);
        }
        b
    }

    /// Decodes a version-3 record, or a version-2 or version-1 record as format versions 2
    /// and 1 wrote them.
    pub fn decode(b: &[u8]) -> Result<InodeRec, DecodeError> {
        match b.first() {
            Some(1) => InodeRec::decode_v1(b),
            Some(2) => InodeRec::decode_v2(b),
            Some(3) => InodeRec::decode_v3(b),
            _ => Err(short("inode", b.len())),
        }
    }

    fn decode_v2(b: &[u8]) -> Result<InodeRec, DecodeError> {
        if b.len() < INODE_V2_FIXED {
            return Err(short("inode", b.len()));
        }
        let kind = FileKind::from_code(b[1]).ok_or(DecodeError::BadKind {
            what: "inode",
            code: b[1],
        })?;
        let has = b[72];
        if has & !(HAS_RDEV | HAS_DIR | HAS_DISK | HAS_INLINE) != 0 {
            return Err(DecodeError::Reserved {
                what: "inode",
                start: 72,
                end: 73,
            });
        }
        let mut o = INODE_V2_FIXED;
        let mut take = |n: usize| -> Result<usize, DecodeError> {
            if b.len() < o + n {
                return Err(short("inode", b.len()));
            }
            o += n;
            Ok(o - n)
        };
        let rdev = if has & HAS_RDEV != 0 {
            u32_at(b, take(4)?)
        } else {
            0
        };
        let (parent, next_seq) = if has & HAS_DIR != 0 {
            let p = take(16)?;
            (u64_at(b, p), u64_at(b, p + 8))
        } else {
            (0, 0)
        };
        let disk_bytes = if has & HAS_DISK != 0 {
            u64_at(b, take(8)?)
        } else {
            0
        };
        let inline = if has & HAS_INLINE != 0 {
            let h = take(INLINE_V2_HEAD)?;
            if Algorithm::from_id(b[h]).is_none() {
                return Err(DecodeError::BadInlineCodec(b[h]));
            }
            let raw_len = u32_at(b, h + 4);
            check_lengths("inline", raw_len as usize, b.len() - o)?;
            let i = Inline {
                codec: b[h],
                level: b[h + 1] as i8,
                raw_len,
                crc: u32_at(b, h + 8),
                dict: u16_at(b, h + 2),
                bytes: b[o..].to_vec(),
            };
            o = b.len();
            Some(i)
        } else {
            None
        };
        if o != b.len() {
            return Err(short("inode", b.len()));
        }
        Ok(InodeRec {
            kind,
            perm: u16_at(b, 2),
            nlink: u32_at(b, 4),
            uid: u32_at(b, 8),
            gid: u32_at(b, 12),
            rdev,
            size: u64_at(b, 16),
            atime: ts_at(b, 24),
            mtime: ts_at(b, 36),
            ctime: ts_at(b, 48),
            crtime: ts_at(b, 60),
            parent,
            next_seq,
            disk_bytes,
            inline,
        })
    }

    /// The version-1 layout (112 fixed bytes, inline data without a checksum).
    fn decode_v1(b: &[u8]) -> Result<InodeRec, DecodeError> {
        if b.len() < INODE_V1_FIXED || b[0] != 1 {
            return Err(short("inode", b.len()));
        }
        let kind = FileKind::from_code(b[1]).ok_or(DecodeError::BadKind {
            what: "inode",
            code: b[1],
        })?;
        check_reserved("inode", b, 20..24)?;
        check_reserved("inode", b, 106..108)?;
        let inline = if b[104] == 0xff {
            if b.len() != INODE_V1_FIXED {
                return Err(short("inode", b.len()));
            }
            None
        } else {
            if Algorithm::from_id(b[104]).is_none() {
                return Err(DecodeError::BadInlineCodec(b[104]));
            }
            check_lengths("inline", u32_at(b, 108) as usize, b.len() - INODE_V1_FIXED)?;
            Some(Inline::new(
                b[104],
                b[105] as i8,
                u32_at(b, 108),
                b[INODE_V1_FIXED..].to_vec(),
            ))
        };
        Ok(InodeRec {
            kind,
            perm: u16_at(b, 2),
            nlink: u32_at(b, 4),
            uid: u32_at(b, 8),
            gid: u32_at(b, 12),
            rdev: u32_at(b, 16),
            size: u64_at(b, 24),
            atime: ts_at(b, 32),
            mtime: ts_at(b, 44),
            ctime: ts_at(b, 56),
            crtime: ts_at(b, 68),
            parent: u64_at(b, 80),
            next_seq: u64_at(b, 88),
            disk_bytes: u64_at(b, 96),
            inline,
        })
    }

    /// Encodes the record in the version-1 layout (tests of the version-1 decoder).
    #[cfg(any(test, feature = "internals"))]
    #[doc(hidden)]
    pub fn encode_v1(&self) -> Vec<u8> {
        let mut b =
            Vec::with_capacity(INODE_V1_FIXED + self.inline.as_ref().map_or(0, |i| i.bytes.len()));
        b.push(1); // record version
        b.push(self.kind.code());
        b.extend_from_slice(&self.perm.to_le_bytes());
        b.extend_from_slice(&self.nlink.to_le_bytes());
        b.extend_from_slice(&self.uid.to_le_bytes());
        b.extend_from_slice(&self.gid.to_le_bytes());
        b.extend_from_slice(&self.rdev.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes()); // flags, reserved
        b.extend_from_slice(&self.size.to_le_bytes());
        put_ts(&mut b, self.atime);
        put_ts(&mut b, self.mtime);
        put_ts(&mut b, self.ctime);
        put_ts(&mut b, self.crtime);
        b.extend_from_slice(&self.parent.to_le_bytes());
        b.extend_from_slice(&self.next_seq.to_le_bytes());
        b.extend_from_slice(&self.disk_bytes.to_le_bytes());
        match &self.inline {
            None => {
                b.push(0xff);
                b.push(0);
                b.extend_from_slice(&[0u8; 6]);
            }
            Some(i) => {
                b.push(i.codec);
                b.push(i.level as u8);
                b.extend_from_slice(&[0u8; 2]);
                b.extend_from_slice(&i.raw_len.to_le_bytes());
                b.extend_from_slice(&i.bytes);
            }
        }
        b
    }
}

/// A directory entry (value of the `dirents` table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirentRec {
    pub ino: u64,
    pub kind: FileKind,
    pub seq: u64,
}

impl DirentRec {
    /// The fixed 17-byte layout (format versions 1 and 2; see [`DirentRec::encode`]).
    pub fn encode_fixed(&self) -> [u8; 17] {
        let mut b = [0u8; 17];
        b[0..8].copy_from_slice(&self.ino.to_le_bytes());
        b[8] = self.kind.code();
        b[9..17].copy_from_slice(&self.seq.to_le_bytes());
        b
    }
    /// Decodes the fixed layout (17 bytes) or the compact one (any other length).
    pub fn decode(b: &[u8]) -> Result<DirentRec, DecodeError> {
        if b.len() != 17 {
            return DirentRec::decode_compact(b);
        }
        Ok(DirentRec {
            ino: u64_at(b, 0),
            kind: FileKind::from_code(b[8]).ok_or(DecodeError::BadKind {
                what: "dirent",
                code: b[8],
            })?,
            seq: u64_at(b, 9),
        })
    }
}

/// An extent-map entry: file range `[key offset, key offset + len)` is bytes
/// `[ext_offset, ext_offset + len)` of extent `extent`'s uncompressed data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapRec {
    pub extent: u64,
    pub ext_offset: u32,
    pub len: u32,
}

impl MapRec {
    /// The fixed 16-byte layout (format versions 1 and 2; see [`MapRec::encode`]).
    pub fn encode_fixed(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&self.extent.to_le_bytes());
        b[8..12].copy_from_slice(&self.ext_offset.to_le_bytes());
        b[12..16].copy_from_slice(&self.len.to_le_bytes());
        b
    }
    /// Decodes an entry; one of length 0, or reaching past the largest extent there can be,
    /// is an error (readers compute `offset + len - 1` and `ext_offset + len` from it).
    pub fn decode(b: &[u8]) -> Result<MapRec, DecodeError> {
        if b.len() != 16 {
            let m = MapRec::decode_compact(b)?;
            m.check_within(compfs_codec::MAX_EXTENT as u64)?;
            return Ok(m);
        }
        let m = MapRec {
            extent: u64_at(b, 0),
            ext_offset: u32_at(b, 8),
            len: u32_at(b, 12),
        };
        m.check_within(compfs_codec::MAX_EXTENT as u64)?;
        Ok(m)
    }

    /// Checks that the entry is not empty and lies within an extent of `raw_len` bytes.
    pub fn check_within(&self, raw_len: u64) -> Result<(), DecodeError> {
        if self.len == 0 {
            return Err(DecodeError::EmptyMapEntry);
        }
        if self.ext_offset as u64 + self.len as u64 > raw_len {
            return Err(DecodeError::MapPastExtent {
                ext_offset: self.ext_offset,
                len: self.len,
                raw_len,
            });
        }
        Ok(())
    }
}

/// An extent record (value of the `extents` table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentRec {
    pub segment: u64,
    /// Offset of the extent header in the segment.
    pub seg_offset: u64,
    pub stored_len: u32,
    pub raw_len: u32,
    pub codec: u8,
    pub level: i8,
    pub crc: u32,
    /// Number of extent-map entries referencing this extent.
    pub refs: u32,
    /// The inode whose map references it.
    pub ino: u64,
    /// The dictionary the extent was compressed with (0 = none; format version 3).
    pub dict: u16,
}

impl ExtentRec {
    /// The record of the extent whose header `h` stands at `seg_offset` in `segment`, with no
    /// references yet.
    pub fn from_header(segment: u64, seg_offset: u64, h: &ExtentHeader) -> ExtentRec {
        ExtentRec {
            segment,
            seg_offset,
            stored_len: h.stored_len,
            raw_len: h.raw_len,
            codec: h.codec,
            level: h.level,
            crc: h.crc,
            refs: 0,
            ino: h.ino,
            dict: h.dict,
        }
    }
    /// Bytes the extent occupies in its segment (header included).
    pub fn footprint(&self) -> u64 {
        EXT_HEADER_LEN as u64 + self.stored_len as u64
    }
    /// The fixed 44-byte layout (format versions 1 and 2; see [`ExtentRec::encode`]).
    pub fn encode_fixed(&self) -> [u8; 44] {
        let mut b = [0u8; 44];
        b[0..8].copy_from_slice(&self.segment.to_le_bytes());
        b[8..16].copy_from_slice(&self.seg_offset.to_le_bytes());
        b[16..20].copy_from_slice(&self.stored_len.to_le_bytes());
        b[20..24].copy_from_slice(&self.raw_len.to_le_bytes());
        b[24] = self.codec;
        b[25] = self.level as u8;
        b[26..28].copy_from_slice(&self.dict.to_le_bytes());
        b[28..32].copy_from_slice(&self.crc.to_le_bytes());
        b[32..36].copy_from_slice(&self.refs.to_le_bytes());
        b[36..44].copy_from_slice(&self.ino.to_le_bytes());
        b
    }
    /// Decodes the fixed layout (44 bytes) or the compact one (any other length).
    pub fn decode(b: &[u8]) -> Result<ExtentRec, DecodeError> {
        if b.len() != 44 {
            let x = ExtentRec::decode_compact(b)?;
            check_lengths("extent", x.raw_len as usize, x.stored_len as usize)?;
            return Ok(x);
        }
        check_lengths("extent", u32_at(b, 20) as usize, u32_at(b, 16) as usize)?;
        Ok(ExtentRec {
            segment: u64_at(b, 0),
            seg_offset: u64_at(b, 8),
            stored_len: u32_at(b, 16),
            raw_len: u32_at(b, 20),
            codec: b[24],
            level: b[25] as i8,
            crc: u32_at(b, 28),
            refs: u32_at(b, 32),
            ino: u64_at(b, 36),
            dict: u16_at(b, 26),
        })
    }
}

mod compact;
mod dict;
mod prealloc;
mod segment;
pub use dict::DictRec;
pub use prealloc::PreallocRec;
pub use segment::{SegmentRec, StatRec, STAT_INLINE};

#[cfg(test)]
mod tests;
