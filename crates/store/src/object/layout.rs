//! The object layout of a store in a bucket (see docs/format.md, "Stores on object storage"):
//! key names, their parsing, and the metadata manifest's encoding. Pure functions, tested alone.

use crate::records::{segment_file_name, u32_at, u64_at};

/// Key of the store's superblock (the same bytes as the local `superblock` file).
pub const SUPERBLOCK_KEY: &str = "superblock";
/// Key of the manifest of the latest metadata snapshot.
pub const MANIFEST_KEY: &str = "meta/manifest";
/// Folder of the segment chunks.
pub const SEGS_FOLDER: &str = "segs";
/// Size of one piece of the metadata database snapshot.
pub const PIECE_SIZE: u64 = 1 << 20;

/// `PREFIX/NAME`, or `NAME` when the prefix is empty.
pub fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}/{name}")
    }
}

/// Key (below the prefix) of the chunk holding bytes `start..start + len` of segment `id`.
pub fn chunk_key(id: u64, start: u64, len: u64) -> String {
    format!(
        "{SEGS_FOLDER}/{}/{start:016x}-{len:016x}",
        segment_file_name(id)
    )
}

/// Parses a chunk key (below the prefix) back to (segment, start, length).
pub fn parse_chunk_key(key: &str) -> Option<(u64, u64, u64)> {
    let rest = key.strip_prefix(SEGS_FOLDER)?.strip_prefix('/')?;
    let (seg, chunk) = rest.split_once('/')?;
    let id = crate::records::parse_segment_file_name(seg)?;
    let (s, l) = chunk.split_once('-')?;
    if s.len() != 16 || l.len() != 16 {
        return None;
    }
    let start = u64::from_str_radix(s, 16).ok()?;
    let len = u64::from_str_radix(l, 16).ok()?;
    if len == 0 || start.checked_add(len).is_none() {
        return None;
    }
    Some((id, start, len))
}

/// Key (below the prefix) of piece `index` of the metadata snapshot, written at generation
/// `gen`.
pub fn piece_key(index: u32, gen: u64) -> String {
    format!("meta/piece-{index:08x}-{gen:016x}")
}

/// Parses a piece key back to (index, generation).
pub fn parse_piece_key(key: &str) -> Option<(u32, u64)> {
    let rest = key.strip_prefix("meta/piece-")?;
    let (i, g) = rest.split_once('-')?;
    if i.len() != 8 || g.len() != 16 {
        return None;
    }
    Some((
        u32::from_str_radix(i, 16).ok()?,
        u64::from_str_radix(g, 16).ok()?,
    ))
}

/// One piece of a snapshot: the generation that wrote it and the CRC-32C of its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub gen: u64,
    pub crc: u32,
}

/// The manifest of a metadata snapshot: which pieces make up `meta.redb` of generation `gen`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub uuid: [u8; 16],
    pub gen: u64,
    pub file_len: u64,
    pub pieces: Vec<Piece>,
}

const MANIFEST_MAGIC: &[u8; 8] = b"CFSMANI1";
const MANIFEST_HEAD: usize = 8 + 16 + 8 + 8 + 4 + 4;
const PIECE_REC: usize = 12;

/// Why a manifest does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("no compfs manifest magic")]
    BadMagic,
    #[error("truncated to {0} bytes")]
    Truncated(usize),
    #[error("checksum mismatch")]
    BadChecksum,
    #[error("invalid {0}")]
    BadField(&'static str),
}

impl Manifest {
    /// Number of pieces a file of `len` bytes has.
    pub fn pieces_for(len: u64) -> u64 {
        len.div_ceil(PIECE_SIZE)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(MANIFEST_HEAD + self.pieces.len() * PIECE_REC + 4);
        v.extend_from_slice(MANIFEST_MAGIC);
        v.extend_from_slice(&self.uuid);
        v.extend_from_slice(&self.gen.to_le_bytes());
        v.extend_from_slice(&self.file_len.to_le_bytes());
        v.extend_from_slice(&(PIECE_SIZE as u32).to_le_bytes());
        v.extend_from_slice(&(self.pieces.len() as u32).to_le_bytes());
        for p in &self.pieces {
            v.extend_from_slice(&p.gen.to_le_bytes());
            v.extend_from_slice(&p.crc.to_le_bytes());
        }
        let crc = crc32c::crc32c(&v);
        v.extend_from_slice(&crc.to_le_bytes());
        v
    }

    pub fn decode(b: &[u8]) -> Result<Manifest, ManifestError> {
        if b.len() < 8 || &b[..8] != MANIFEST_MAGIC {
            return Err(ManifestError::BadMagic);
        }
        if b.len() < MANIFEST_HEAD + 4 {
            return Err(ManifestError::Truncated(b.len()));
        }
        let (body, tail) = b.split_at(b.len() - 4);
        let stored = u32_at(tail, 0);
        if crc32c::crc32c(body) != stored {
            return Err(ManifestError::BadChecksum);
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&body[8..24]);
        let gen = u64_at(body, 24);
        let file_len = u64_at(body, 32);
        if u32_at(body, 40) as u64 != PIECE_SIZE {
            return Err(ManifestError::BadField("piece size"));
        }
        let n = u32_at(body, 44) as usize;
        if Manifest::pieces_for(file_len) != n as u64 {
            return Err(ManifestError::BadField("piece count"));
        }
        if body.len() != MANIFEST_HEAD + n * PIECE_REC {
            return Err(ManifestError::Truncated(b.len()));
        }
        let pieces = (0..n)
            .map(|i| {
                let o = MANIFEST_HEAD + i * PIECE_REC;
                Piece {
                    gen: u64_at(body, o),
                    crc: u32_at(body, o + 8),
                }
            })
            .collect();
        Ok(Manifest {
            uuid,
            gen,
            file_len,
            pieces,
        })
    }
}

/// Joins pending writes (offset -> bytes, never overlapping) into runs of contiguous bytes:
/// (start, the offsets of the writes in the run, total length).
pub fn contiguous_runs(writes: &[(u64, usize)]) -> Vec<(u64, Vec<u64>, u64)> {
    let mut runs: Vec<(u64, Vec<u64>, u64)> = Vec::new();
    for &(off, len) in writes {
        match runs.last_mut() {
            Some((start, offs, l)) if *start + *l == off => {
                offs.push(off);
                *l += len as u64;
            }
            _ => runs.push((off, vec![off], len as u64)),
        }
    }
    runs
}

/// The cache blocks (index, offset in the block, length) that bytes `off..off + len` of a
/// chunk touch, for blocks of `block` bytes.
pub fn block_spans(off: u64, len: u64, block: u64) -> Vec<(u64, u64, u64)> {
    let mut v = Vec::new();
    let mut pos = off;
    let end = off + len;
    while pos < end {
        let b = pos / block;
        let in_block = pos - b * block;
        let n = (block - in_block).min(end - pos);
        v.push((b, in_block, n));
        pos += n;
    }
    v
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn chunk_keys_round_trip_and_reject_junk() {
        let k = chunk_key(7, 64, 1 << 20);
        assert_eq!(
            k,
            "segs/0000000000000007.seg/0000000000000040-0000000000100000"
        );
        assert_eq!(parse_chunk_key(&k), Some((7, 64, 1 << 20)));
        for bad in [
            "segs/0000000000000007.seg/0000000000000040",
            "segs/x.seg/0000000000000040-0000000000100000",
            "segs/0000000000000007.seg/0000000000000040-0000000000000000",
            "segs/0000000000000007.seg/ffffffffffffffff-0000000000000002",
            "segs/0000000000000007.seg/40-100000",
            "meta/manifest",
            "",
        ] {
            assert_eq!(parse_chunk_key(bad), None, "{bad}");
        }
        assert_eq!(parse_piece_key(&piece_key(3, 9)), Some((3, 9)));
        assert_eq!(parse_piece_key("meta/piece-3-9"), None);
        assert_eq!(join("", "a"), "a");
        assert_eq!(join("p/q", "a"), "p/q/a");
    }

    #[test]
    fn manifest_round_trips_and_malformed_ones_give_typed_errors() {
        let m = Manifest {
            uuid: [5; 16],
            gen: 42,
            file_len: 2 * PIECE_SIZE + 1,
            pieces: vec![
                Piece { gen: 1, crc: 2 },
                Piece { gen: 3, crc: 4 },
                Piece { gen: 42, crc: 6 },
            ],
        };
        let b = m.encode();
        assert_eq!(Manifest::decode(&b).unwrap(), m);
        assert_eq!(Manifest::decode(b"nope"), Err(ManifestError::BadMagic));
        assert!(matches!(
            Manifest::decode(&b[..20]),
            Err(ManifestError::Truncated(_))
        ));
        // Every truncation and every flipped bit is refused, never a panic.
        for n in 0..b.len() {
            assert!(Manifest::decode(&b[..n]).is_err());
        }
        for i in 8..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x10;
            assert!(Manifest::decode(&c).is_err(), "flip at {i}");
        }
        // A consistent checksum over an inconsistent count.
        let mut bad = m.clone();
        bad.pieces.pop();
        assert_eq!(
            Manifest::decode(&bad.encode()),
            Err(ManifestError::BadField("piece count"))
        );
        // A huge count in a short manifest allocates nothing.
        let mut huge = m.encode();
        huge.truncate(huge.len() - 4);
        huge[32..40].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        huge[44..48].copy_from_slice(&u32::MAX.to_le_bytes());
        let crc = crc32c::crc32c(&huge);
        huge.extend_from_slice(&crc.to_le_bytes());
        assert!(Manifest::decode(&huge).is_err());
    }

    #[test]
    fn runs_join_only_contiguous_writes() {
        assert_eq!(
            contiguous_runs(&[(0, 64), (64, 100), (200, 10), (210, 5)]),
            vec![(0, vec![0, 64], 164), (200, vec![200, 210], 15)]
        );
        assert!(contiguous_runs(&[]).is_empty());
    }

    #[test]
    fn block_spans_cover_the_range_exactly() {
        assert_eq!(block_spans(0, 0, 10), vec![]);
        assert_eq!(
            block_spans(5, 20, 10),
            vec![(0, 5, 5), (1, 0, 10), (2, 0, 5)]
        );
        assert_eq!(block_spans(10, 10, 10), vec![(1, 0, 10)]);
        for off in 0..40u64 {
            for len in 0..40u64 {
                let s = block_spans(off, len, 7);
                assert_eq!(s.iter().map(|x| x.2).sum::<u64>(), len);
                let mut pos = off;
                for (b, o, n) in s {
                    assert_eq!(b * 7 + o, pos);
                    assert!(o + n <= 7 && n > 0);
                    pos += n;
                }
            }
        }
    }
}
