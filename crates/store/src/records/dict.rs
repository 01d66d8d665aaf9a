//! The dictionary record (value of the `dicts` table, format version 3): a zstd dictionary the
//! store trained, which extents and inline data name by id.

use super::{check_reserved, u32_at, DecodeError};

/// Length of the fixed part of a dictionary record, before the dictionary bytes.
pub const DICT_HEAD: usize = 12;
/// Largest dictionary a record may hold (bounds what a damaged length can make a reader
/// allocate; the store trains dictionaries of about 110 KiB).
pub const MAX_DICT_BYTES: usize = 1 << 20;

/// A trained zstd dictionary: codec 3 (zstd) only, the level its compression side is
/// digested for, and a CRC-32C of the dictionary bytes. The CRC is not checked by
/// [`DictRec::decode`]: a dictionary whose bytes are damaged is a readable record whose users
/// fail with EIO (see [`DictRec::check`]), as a damaged extent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DictRec {
    pub codec: u8,
    pub level: i8,
    pub crc: u32,
    pub bytes: Vec<u8>,
}

impl DictRec {
    /// A zstd dictionary record for `bytes` at `level`, with its checksum.
    pub fn new(level: i8, bytes: Vec<u8>) -> DictRec {
        DictRec {
            codec: compfs_codec::Algorithm::Zstd.id(),
            level,
            crc: crc32c::crc32c(&bytes),
            bytes,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(DICT_HEAD + self.bytes.len());
        b.push(1); // record version
        b.push(self.codec);
        b.push(self.level as u8);
        b.push(0); // reserved
        b.extend_from_slice(&(self.bytes.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.crc.to_le_bytes());
        b.extend_from_slice(&self.bytes);
        b
    }

    pub fn decode(b: &[u8]) -> Result<DictRec, DecodeError> {
        let bad = || DecodeError::Malformed {
            what: "dictionary",
            len: b.len(),
        };
        if b.len() < DICT_HEAD || b[0] != 1 {
            return Err(bad());
        }
        check_reserved("dictionary", b, 3..4)?;
        if b[1] != compfs_codec::Algorithm::Zstd.id() {
            return Err(DecodeError::UnknownCodec(b[1]));
        }
        let len = u32_at(b, 4) as usize;
        if len > MAX_DICT_BYTES {
            return Err(DecodeError::ImplausibleLengths {
                what: "dictionary",
                raw: len,
                stored: b.len() - DICT_HEAD,
            });
        }
        if len != b.len() - DICT_HEAD {
            return Err(bad());
        }
        Ok(DictRec {
            codec: b[1],
            level: b[2] as i8,
            crc: u32_at(b, 8),
            bytes: b[DICT_HEAD..].to_vec(),
        })
    }

    /// Checks the dictionary bytes against the record's CRC-32C.
    pub fn check(&self) -> Result<(), DecodeError> {
        if crc32c::crc32c(&self.bytes) != self.crc {
            return Err(DecodeError::BadChecksum { what: "dictionary" });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_malformed_records() {
        let r = DictRec::new(3, vec![0x37, 0xA4, 0x30, 0xEC, 1, 2, 3, 4, 5]);
        let b = r.encode();
        assert_eq!(b.len(), DICT_HEAD + 9);
        let back = DictRec::decode(&b).unwrap();
        assert_eq!(back, r);
        back.check().unwrap();
        // Every truncation is a typed error, never a panic.
        for n in 0..b.len() {
            assert!(DictRec::decode(&b[..n]).is_err(), "cut {n}");
        }
        let mut x = b.clone();
        x.push(0);
        assert!(matches!(
            DictRec::decode(&x),
            Err(DecodeError::Malformed { .. })
        ));
        let mut x = b.clone();
        x[0] = 2;
        assert!(DictRec::decode(&x).is_err());
        let mut x = b.clone();
        x[1] = 1;
        assert_eq!(DictRec::decode(&x), Err(DecodeError::UnknownCodec(1)));
        let mut x = b.clone();
        x[3] = 1;
        assert!(matches!(
            DictRec::decode(&x),
            Err(DecodeError::Reserved { .. })
        ));
        let mut x = b.clone();
        x[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            DictRec::decode(&x),
            Err(DecodeError::ImplausibleLengths { .. })
        ));
        // Damaged dictionary bytes decode but fail the check.
        let mut x = b.clone();
        x[DICT_HEAD + 5] ^= 1;
        let d = DictRec::decode(&x).unwrap();
        assert_eq!(
            d.check(),
            Err(DecodeError::BadChecksum { what: "dictionary" })
        );
    }
}
