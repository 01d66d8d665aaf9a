//! The segment record (value of the `segments` table) and the per-codec statistics record
//! (value of the `stats` table).

use super::{short, u64_at, DecodeError};

/// A segment record (value of the `segments` table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SegmentRec {
    /// Committed length: end of the last extent a committed transaction references.
    pub len: u64,
    /// Footprint (header + stored bytes) of the live extents.
    pub live: u64,
}

impl SegmentRec {
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..16].copy_from_slice(&self.live.to_le_bytes());
        b
    }
    pub fn decode(b: &[u8]) -> Result<SegmentRec, DecodeError> {
        if b.len() != 16 {
            return Err(short("segment", b.len()));
        }
        Ok(SegmentRec {
            len: u64_at(b, 0),
            live: u64_at(b, 8),
        })
    }
}

/// Per-codec counters (value of the `stats` table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatRec {
    pub extents: u64,
    pub disk: u64,
    pub uncompressed: u64,
    pub referenced: u64,
}

impl StatRec {
    pub fn encode(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[0..8].copy_from_slice(&self.extents.to_le_bytes());
        b[8..16].copy_from_slice(&self.disk.to_le_bytes());
        b[16..24].copy_from_slice(&self.uncompressed.to_le_bytes());
        b[24..32].copy_from_slice(&self.referenced.to_le_bytes());
        b
    }
    pub fn decode(b: &[u8]) -> Result<StatRec, DecodeError> {
        if b.len() != 32 {
            return Err(short("stats", b.len()));
        }
        Ok(StatRec {
            extents: u64_at(b, 0),
            disk: u64_at(b, 8),
            uncompressed: u64_at(b, 16),
            referenced: u64_at(b, 24),
        })
    }
}

/// Key of the `stats` table row that counts inline data.
pub const STAT_INLINE: u8 = 0xff;
