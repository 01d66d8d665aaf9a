//! The one place that decides how an extent is stored: compressed with its codec, or raw.
//!
//! Policy (compfs differs from btrfs here on purpose): the decision is made per extent. btrfs
//! flags a whole inode NOCOMPRESS after one extent fails to compress; compfs keeps trying every
//! extent, so a file with an incompressible header and a compressible body still compresses.

use crate::codec::{Compressor, SECTOR};
use crate::error::CodecError;
use crate::heuristic::{Heuristic, Reason};
use crate::spec::{CodecSpec, Mode};

/// How much a compressed extent must save to be kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MinSaving {
    /// btrfs: after rounding both lengths up to 4 KiB sectors, at least this many sectors saved.
    /// The right rule for a store that allocates whole sectors; compfs's store offers it for
    /// btrfs-identical accounting (`worth_it=sector`).
    Sectors(u32),
    /// Byte-packed storage (the compfs store, whose extents lie back to back in segments with
    /// the same header whether compressed or not): the compressed form must be at least this
    /// many bytes shorter than the input.
    Bytes(u32),
    /// ZFS: the compressed length must be at most `len - len / div` (ZFS uses div 8, 12.5%).
    Fraction { div: u32 },
}

impl Default for MinSaving {
    fn default() -> Self {
        MinSaving::Sectors(1)
    }
}

/// Whether a compressed length is worth keeping for `raw_len` input bytes.
pub fn worth_it(raw_len: usize, compressed_len: usize, min_saving: MinSaving) -> bool {
    match min_saving {
        MinSaving::Sectors(n) => {
            let round = |x: usize| x.div_ceil(SECTOR) * SECTOR;
            round(compressed_len) + n as usize * SECTOR <= round(raw_len)
        }
        MinSaving::Bytes(n) => compressed_len.saturating_add(n.max(1) as usize) <= raw_len,
        MinSaving::Fraction { div } => {
            let div = div.max(1) as usize;
            compressed_len <= raw_len - raw_len / div
        }
    }
}

/// How a writer compresses extents: codec, force or heuristic, and the minimum saving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentPolicy {
    pub spec: CodecSpec,
    pub mode: Mode,
    pub min_saving: MinSaving,
}

impl ExtentPolicy {
    pub fn new(spec: CodecSpec, mode: Mode) -> ExtentPolicy {
        ExtentPolicy {
            spec,
            mode,
            min_saving: MinSaving::default(),
        }
    }
}

/// Why an extent is stored raw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawReason {
    /// The policy's codec is `none`.
    NoCompression,
    /// The heuristic predicted no gain; compression was not tried.
    Heuristic(Reason),
    /// Compression was tried and did not save enough, or the extent is too small for any
    /// compressed form to save enough (one sector or less under the one-sector rule).
    NotWorthIt,
}

/// How an extent is to be stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtentOutcome {
    /// `dst[..len]` holds the compressed bytes.
    Compressed { len: usize },
    /// Store the input as it is.
    Raw(RawReason),
}

/// A worker's extent encoder: compression contexts plus heuristic scratch space.
#[derive(Debug, Default)]
pub struct ExtentEncoder {
    pub compressor: Compressor,
    heuristic: Heuristic,
}

impl ExtentEncoder {
    pub fn new() -> ExtentEncoder {
        ExtentEncoder::default()
    }

    /// Encode one extent under `policy`. On `Compressed`, `dst` holds exactly the compressed
    /// bytes; on `Raw`, `dst`'s contents are unspecified and the caller stores `src`.
    pub fn encode(
        &mut self,
        policy: &ExtentPolicy,
        src: &[u8],
        dst: &mut Vec<u8>,
    ) -> Result<ExtentOutcome, CodecError> {
        self.encode_with(policy, src, dst, None)
    }

    /// [`ExtentEncoder::encode`] with zstd and `dict` (at the level it was digested for)
    /// instead of `policy`'s codec and level; the heuristic and worth-it rule are `policy`'s.
    pub fn encode_dict(
        &mut self,
        policy: &ExtentPolicy,
        src: &[u8],
        dst: &mut Vec<u8>,
        dict: &crate::Dictionary,
    ) -> Result<ExtentOutcome, CodecError> {
        self.encode_with(policy, src, dst, Some(dict))
    }

    fn encode_with(
        &mut self,
        policy: &ExtentPolicy,
        src: &[u8],
        dst: &mut Vec<u8>,
        dict: Option<&crate::Dictionary>,
    ) -> Result<ExtentOutcome, CodecError> {
        if policy.spec.is_none() {
            return Ok(ExtentOutcome::Raw(RawReason::NoCompression));
        }
        // Even a one-byte compressed form could not pass the rule: don't spend CPU finding out.
        if !worth_it(src.len(), 1, policy.min_saving) {
            return Ok(ExtentOutcome::Raw(RawReason::NotWorthIt));
        }
        if policy.mode == Mode::Heuristic {
            let v = self.heuristic.decide(src);
            if !v.compress {
                return Ok(ExtentOutcome::Raw(RawReason::Heuristic(v.reason)));
            }
        }
        let len = match dict {
            Some(d) => self.compressor.compress_dict(d, src, dst)?,
            None => self.compressor.compress(policy.spec, src, dst)?,
        };
        if worth_it(src.len(), len, policy.min_saving) {
            Ok(ExtentOutcome::Compressed { len })
        } else {
            Ok(ExtentOutcome::Raw(RawReason::NotWorthIt))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Algorithm;

    #[test]
    fn one_sector_rule() {
        let s = MinSaving::Sectors(1);
        assert!(worth_it(131072, 126976, s)); // 31 sectors < 32
        assert!(!worth_it(131072, 126977, s)); // rounds to 32 sectors
        assert!(!worth_it(4096, 1, s)); // a single sector can never save a sector
        assert!(worth_it(8192, 4096, s));
        assert!(worth_it(5000, 4000, s)); // 2 sectors -> 1 sector
        assert!(!worth_it(0, 0, s));
    }

    #[test]
    fn one_sector_extents_are_not_compressed_at_all() {
        let mut e = ExtentEncoder::new();
        let zeros = vec![0u8; SECTOR];
        let mut dst = Vec::new();
        for mode in [Mode::Force, Mode::Heuristic] {
            let p = ExtentPolicy::new(CodecSpec::default_for(Algorithm::Zstd), mode);
            dst.clear();
            assert_eq!(
                e.encode(&p, &zeros, &mut dst).unwrap(),
                ExtentOutcome::Raw(RawReason::NotWorthIt)
            );
            assert!(dst.is_empty(), "the compressor must not have run");
            let two = vec![0u8; SECTOR + 1];
            assert!(matches!(
                e.encode(&p, &two, &mut dst).unwrap(),
                ExtentOutcome::Compressed { .. }
            ));
        }
    }

    #[test]
    fn byte_rule() {
        let b = MinSaving::Bytes(1);
        assert!(worth_it(4096, 4095, b));
        assert!(!worth_it(4096, 4096, b));
        assert!(worth_it(600, 300, b)); // below a sector: the sector rule never compresses it
        assert!(!worth_it(600, 300, MinSaving::Sectors(1)));
        assert!(!worth_it(1, 1, b));
        assert!(!worth_it(0, 0, b));
        // 0 means the same as 1: a compressed form must be strictly shorter.
        assert!(!worth_it(100, 100, MinSaving::Bytes(0)));
        let b64 = MinSaving::Bytes(64);
        assert!(worth_it(1000, 936, b64));
        assert!(!worth_it(1000, 937, b64));
        assert!(!worth_it(10, 0, b64));
    }

    #[test]
    fn small_text_compresses_under_the_byte_rule_only() {
        let mut e = ExtentEncoder::new();
        let text = compfs_testdata::text(2000, 3);
        let mut dst = Vec::new();
        for mode in [Mode::Force, Mode::Heuristic] {
            let mut p = ExtentPolicy::new(CodecSpec::default_for(Algorithm::Zstd), mode);
            assert_eq!(
                e.encode(&p, &text, &mut dst).unwrap(),
                ExtentOutcome::Raw(RawReason::NotWorthIt)
            );
            p.min_saving = MinSaving::Bytes(1);
            match e.encode(&p, &text, &mut dst).unwrap() {
                ExtentOutcome::Compressed { len } => assert!(len < text.len() && len == dst.len()),
                o => panic!("{o:?}"),
            }
            // Random bytes stay raw under the byte rule too.
            let random = compfs_testdata::random(2000, 4);
            assert!(matches!(
                e.encode(&p, &random, &mut dst).unwrap(),
                ExtentOutcome::Raw(_)
            ));
        }
    }

    #[test]
    fn zfs_fraction_rule() {
        let z = MinSaving::Fraction { div: 8 };
        assert!(worth_it(131072, 114688, z));
        assert!(!worth_it(131072, 114689, z));
    }

    #[test]
    fn force_vs_heuristic_on_random_and_text() {
        let mut e = ExtentEncoder::new();
        let random = compfs_testdata::random(131072, 99);
        let text: Vec<u8> = b"lorem ipsum dolor sit amet "
            .iter()
            .cycle()
            .take(131072)
            .copied()
            .collect();
        let zstd = CodecSpec::default_for(Algorithm::Zstd);
        let mut dst = Vec::new();
        let force = ExtentPolicy::new(zstd, Mode::Force);
        let heur = ExtentPolicy::new(zstd, Mode::Heuristic);
        assert_eq!(
            e.encode(&force, &random, &mut dst).unwrap(),
            ExtentOutcome::Raw(RawReason::NotWorthIt)
        );
        assert!(matches!(
            e.encode(&heur, &random, &mut dst).unwrap(),
            ExtentOutcome::Raw(RawReason::Heuristic(_))
        ));
        for p in [force, heur] {
            match e.encode(&p, &text, &mut dst).unwrap() {
                ExtentOutcome::Compressed { len } => assert!(len < 2000 && len == dst.len()),
                o => panic!("{o:?}"),
            }
        }
        let none = ExtentPolicy::new(CodecSpec::none(), Mode::Force);
        assert_eq!(
            e.encode(&none, &text, &mut dst).unwrap(),
            ExtentOutcome::Raw(RawReason::NoCompression)
        );
    }
}
