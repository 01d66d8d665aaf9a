//! zstd dictionaries: loading a dictionary file (zram's `algorithm_params dict=`), training one
//! from sample pages, and the digested forms a [`crate::Compressor`] and
//! [`crate::Decompressor`] use.

use zstd::zstd_safe::{CDict, DDict};

/// The first four bytes of a zstd dictionary (`ZSTD_MAGIC_DICTIONARY`, little endian).
pub const DICT_MAGIC: u32 = 0xEC30_A437;
/// The largest dictionary accepted (zstd's own CLI defaults to 110 KiB; this bounds memory).
pub const MAX_DICT: usize = 4 << 20;
/// The smallest: magic, id and the entropy tables take more than this.
pub const MIN_DICT: usize = 16;

/// A dictionary that could not be used or trained.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DictError {
    #[error("dictionary of {len} bytes is too short (at least {MIN_DICT} bytes)")]
    TooShort { len: usize },
    #[error("dictionary of {len} bytes is too large (at most {MAX_DICT} bytes)")]
    TooLarge { len: usize },
    #[error("not a zstd dictionary: magic {found:#010x}, expected {DICT_MAGIC:#010x}")]
    BadMagic { found: u32 },
    #[error("zstd dictionary is damaged: its entropy tables do not load")]
    Damaged,
    #[error("dictionary training failed: {0}")]
    Train(String),
}

/// A zstd dictionary, digested for compression at one level and for decompression.
pub struct Dictionary {
    raw: Vec<u8>,
    id: u32,
    level: i32,
    cdict: CDict<'static>,
    ddict: DDict<'static>,
}

impl std::fmt::Debug for Dictionary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dictionary")
            .field("id", &self.id)
            .field("len", &self.raw.len())
            .field("level", &self.level)
            .finish_non_exhaustive()
    }
}

impl Dictionary {
    /// Checks and digests a dictionary in zstd's format (what `zstd --train` writes). Raw
    /// content without the header is refused, so a damaged or wrong file is an error rather
    /// than a dictionary that silently does nothing.
    pub fn new(raw: Vec<u8>, level: i32) -> Result<Dictionary, DictError> {
        let len = raw.len();
        if len < MIN_DICT {
            return Err(DictError::TooShort { len });
        }
        if len > MAX_DICT {
            return Err(DictError::TooLarge { len });
        }
        let mut m = [0u8; 4];
        m.copy_from_slice(&raw[..4]);
        let found = u32::from_le_bytes(m);
        if found != DICT_MAGIC {
            return Err(DictError::BadMagic { found });
        }
        // With the magic present zstd parses the entropy tables and returns NULL when they
        // are malformed or truncated.
        let ddict = DDict::try_create(&raw).ok_or(DictError::Damaged)?;
        let cdict = CDict::try_create(&raw, level).ok_or(DictError::Damaged)?;
        let id = zstd::zstd_safe::get_dict_id(&raw).map_or(0, |i| i.get());
        Ok(Dictionary {
            raw,
            id,
            level,
            cdict,
            ddict,
        })
    }

    /// Trains a dictionary of at most `max_size` bytes from sample pages (zstd's fastCover
    /// builder, as `zstd --train`) and digests it for `level`.
    pub fn train<S: AsRef<[u8]>>(
        samples: &[S],
        max_size: usize,
        level: i32,
    ) -> Result<Dictionary, DictError> {
        let raw = zstd::dict::from_samples(samples, max_size.min(MAX_DICT))
            .map_err(|e| DictError::Train(e.to_string()))?;
        Dictionary::new(raw, level)
    }

    /// The dictionary as stored in a file.
    pub fn raw(&self) -> &[u8] {
        &self.raw
    }

    /// The id in the dictionary's header (0 if it has none).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The compression level the compression side was digested for.
    pub fn level(&self) -> i32 {
        self.level
    }

    /// Bytes of memory the dictionary holds: the file and both digested forms.
    pub fn memory(&self) -> usize {
        self.raw.capacity() + self.cdict.sizeof() + self.ddict.sizeof()
    }

    pub(crate) fn cdict(&self) -> &CDict<'static> {
        &self.cdict
    }

    pub(crate) fn ddict(&self) -> &DDict<'static> {
        &self.ddict
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Compressor, Decompressor};

    fn pages() -> Vec<Vec<u8>> {
        (0..400)
            .map(|i| compfs_testdata::text(4096, i as u64))
            .collect()
    }

    #[test]
    fn trained_dictionary_round_trips_and_helps() {
        let p = pages();
        let d = Dictionary::train(&p[..300], 16 << 10, 1).unwrap();
        assert!(d.memory() > d.raw().len());
        let again = Dictionary::new(d.raw().to_vec(), 1).unwrap();
        assert_eq!(again.id(), d.id());
        let (mut c, mut x) = (Compressor::new(), Decompressor::new());
        let spec = crate::CodecSpec::with_level(crate::Algorithm::Zstd, 1).spec;
        let (mut with, mut without) = (0, 0);
        let mut out = Vec::new();
        for page in &p[300..] {
            with += c.compress_dict(&d, page, &mut out).unwrap();
            let mut back = vec![0u8; page.len()];
            x.decompress_dict(&again, &out, &mut back).unwrap();
            assert_eq!(&back, page);
            without += c.compress(spec, page, &mut out).unwrap();
        }
        assert!(with < without, "{with} >= {without}");
    }

    /// `ExtentEncoder::encode_dict`: the policy's heuristic and worth-it rule, the
    /// dictionary's codec and level; the output decodes with the dictionary.
    #[test]
    fn extent_encoding_with_a_dictionary() {
        use crate::{ExtentEncoder, ExtentOutcome, ExtentPolicy, Mode, RawReason};
        let p = pages();
        let d = Dictionary::train(&p[..300], 16 << 10, 3).unwrap();
        let mut e = ExtentEncoder::new();
        let mut x = Decompressor::new();
        let zstd = crate::CodecSpec::with_level(crate::Algorithm::Zstd, 3).spec;
        let heur = ExtentPolicy::new(zstd, Mode::Heuristic);
        let src: Vec<u8> = p[300..332].concat();
        let mut dst = Vec::new();
        let n = match e.encode_dict(&heur, &src, &mut dst, &d).unwrap() {
            ExtentOutcome::Compressed { len } => len,
            o => panic!("{o:?}"),
        };
        assert_eq!(n, dst.len());
        let mut back = vec![0u8; src.len()];
        x.decompress_dict(&d, &dst, &mut back).unwrap();
        assert_eq!(back, src);
        let mut plain = Vec::new();
        assert!(matches!(
            e.encode(&heur, &src, &mut plain).unwrap(),
            ExtentOutcome::Compressed { len } if len > n
        ));
        // Incompressible data: the heuristic stores it raw, with or without a dictionary.
        let random = compfs_testdata::generate(compfs_testdata::Kind::Random, 65536, 9);
        assert!(matches!(
            e.encode_dict(&heur, &random, &mut dst, &d).unwrap(),
            ExtentOutcome::Raw(RawReason::Heuristic(_))
        ));
        // Forced: compressed, then kept raw as not worth it.
        let force = ExtentPolicy::new(zstd, Mode::Force);
        assert_eq!(
            e.encode_dict(&force, &random, &mut dst, &d).unwrap(),
            ExtentOutcome::Raw(RawReason::NotWorthIt)
        );
        // No compression asked: raw.
        let none = ExtentPolicy::new(
            crate::CodecSpec::default_for(crate::Algorithm::None),
            Mode::Force,
        );
        assert_eq!(
            e.encode_dict(&none, &src, &mut dst, &d).unwrap(),
            ExtentOutcome::Raw(RawReason::NoCompression)
        );
    }

    #[test]
    fn malformed_dictionaries_are_typed_errors() {
        let p = pages();
        let d = Dictionary::train(&p, 16 << 10, 1).unwrap();
        let raw = d.raw().to_vec();
        assert_eq!(
            Dictionary::new(vec![1, 2, 3], 1).unwrap_err(),
            DictError::TooShort { len: 3 }
        );
        assert!(matches!(
            Dictionary::new(vec![0u8; 4096], 1),
            Err(DictError::BadMagic { found: 0 })
        ));
        assert!(matches!(
            Dictionary::new(vec![0u8; MAX_DICT + 1], 1),
            Err(DictError::TooLarge { .. })
        ));
        // Truncated inside the entropy tables, and tables overwritten with garbage.
        for cut in [20usize, 64, 100] {
            assert_eq!(
                Dictionary::new(raw[..cut].to_vec(), 1).unwrap_err(),
                DictError::Damaged,
                "cut {cut}"
            );
        }
        let mut bad = raw.clone();
        for b in &mut bad[8..200] {
            *b = 0xFF;
        }
        assert_eq!(Dictionary::new(bad, 1).unwrap_err(), DictError::Damaged);
        // Too few samples to train from.
        assert!(matches!(
            Dictionary::train(&[b"abc"], 16 << 10, 1),
            Err(DictError::Train(_))
        ));
    }

    #[test]
    fn wrong_dictionary_is_corrupt_not_wrong_data() {
        let p = pages();
        let a = Dictionary::train(&p[..200], 8 << 10, 1).unwrap();
        let b = Dictionary::train(&p[200..], 8 << 10, 1).unwrap();
        let (mut c, mut x) = (Compressor::new(), Decompressor::new());
        let mut out = Vec::new();
        c.compress_dict(&a, &p[0], &mut out).unwrap();
        let mut back = vec![0u8; 4096];
        if a.id() != b.id() {
            assert!(x.decompress_dict(&b, &out, &mut back).is_err());
        }
        let mut short = vec![0u8; 4095];
        assert!(x.decompress_dict(&a, &out, &mut short).is_err());
        assert!(x
            .decompress_dict(&a, &out[..out.len() - 1], &mut back)
            .is_err());
    }
}
