//! The value of a `prealloc` table row: the length of a reserved file range (the key is the
//! inode and the range's start). See "Preallocated ranges" in `docs/format.md`.

use super::{short, u32_at, u64_at, DecodeError};

/// Encoded length of a [`PreallocRec`].
pub const PREALLOC_LEN: usize = 16;

/// A preallocated (reserved, not yet written) range `[start, start + len)` of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreallocRec {
    pub len: u64,
}

impl PreallocRec {
    /// Byte 0: record version 1; bytes 1..4 reserved (zero); 4..8 reserved (zero); 8..16 the
    /// length.
    pub fn encode(&self) -> [u8; PREALLOC_LEN] {
        let mut b = [0u8; PREALLOC_LEN];
        b[0] = 1;
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes a row whose range starts at `start`; an empty range, or one reaching past the
    /// largest file offset, is an error.
    pub fn decode(start: u64, b: &[u8]) -> Result<PreallocRec, DecodeError> {
        if b.len() != PREALLOC_LEN || b[0] != 1 {
            return Err(short("prealloc", b.len()));
        }
        if b[1..4].iter().any(|&x| x != 0) || u32_at(b, 4) != 0 {
            return Err(DecodeError::Reserved {
                what: "prealloc",
                start: 1,
                end: 8,
            });
        }
        let len = u64_at(b, 8);
        if len == 0 || start.checked_add(len).is_none_or(|e| e > i64::MAX as u64) {
            return Err(DecodeError::BadPrealloc { start, len });
        }
        Ok(PreallocRec { len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let r = PreallocRec { len: 4096 };
        assert_eq!(PreallocRec::decode(8192, &r.encode()), Ok(r));
    }

    #[test]
    fn malformed_rows_are_typed_errors() {
        let good = PreallocRec { len: 4096 }.encode();
        for n in 0..40 {
            let b = vec![1u8; n];
            assert!(PreallocRec::decode(0, &b).is_err(), "{n} bytes");
        }
        let mut v = good;
        v[0] = 2;
        assert!(PreallocRec::decode(0, &v).is_err());
        let mut v = good;
        v[5] = 1;
        assert!(matches!(
            PreallocRec::decode(0, &v),
            Err(DecodeError::Reserved { .. })
        ));
        let zero = PreallocRec { len: 0 }.encode();
        assert!(matches!(
            PreallocRec::decode(0, &zero),
            Err(DecodeError::BadPrealloc { .. })
        ));
        assert!(PreallocRec::decode(u64::MAX - 10, &good).is_err());
        assert!(PreallocRec::decode(i64::MAX as u64 - 4096, &good).is_ok());
        assert!(PreallocRec::decode(i64::MAX as u64 - 4095, &good).is_err());
    }
}
