//! Deterministic input generators: random, zeros, text-like, binary-like and mixed extents.

use compfs_codec::{Algorithm, CodecSpec};

/// xorshift64: fast, deterministic, good enough to be incompressible.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Random,
    Zeros,
    Text,
    Binary,
    Mixed,
}

pub const KINDS: [Kind; 5] = [
    Kind::Random,
    Kind::Zeros,
    Kind::Text,
    Kind::Binary,
    Kind::Mixed,
];

const WORDS: [&str; 24] = [
    "the",
    "of",
    "and",
    "compression",
    "extent",
    "sector",
    "btrfs",
    "zstd",
    "level",
    "a",
    "in",
    "to",
    "is",
    "was",
    "that",
    "filesystem",
    "block",
    "heuristic",
    "entropy",
    "\n",
    "ratio",
    "data",
    "with",
    "for",
];

pub fn generate(kind: Kind, len: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut v = Vec::with_capacity(len + 64);
    match kind {
        Kind::Random => {
            while v.len() < len {
                v.extend_from_slice(&r.next().to_le_bytes());
            }
        }
        Kind::Zeros => v.resize(len, 0),
        Kind::Text => {
            while v.len() < len {
                let w = WORDS[r.below(WORDS.len())];
                v.extend_from_slice(w.as_bytes());
                v.push(if r.below(9) == 0 { b'.' } else { b' ' });
            }
        }
        Kind::Binary => {
            // Fixed-size records: a slowly increasing key, a small enum, a float-ish field and
            // occasional copies of earlier records, like a database page or an executable's tables.
            let mut key = r.next() as u32;
            while v.len() < len {
                if v.len() > 64 && r.below(5) == 0 {
                    let from = r.below(v.len() - 32);
                    let run = 8 + r.below(24);
                    let copy: Vec<u8> = v[from..from + run].to_vec();
                    v.extend_from_slice(&copy);
                    continue;
                }
                key = key.wrapping_add(1 + r.below(7) as u32);
                v.extend_from_slice(&key.to_le_bytes());
                v.push(r.below(4) as u8);
                v.extend_from_slice(&((r.next() >> 40) as u32).to_be_bytes()[1..]);
                v.extend_from_slice(&[0, 0, 0x3f, 0x80]);
            }
        }
        Kind::Mixed => {
            let half = len / 2;
            v = generate(Kind::Random, half, seed);
            v.extend_from_slice(&generate(Kind::Text, len - half, seed ^ 0x55));
        }
    }
    v.truncate(len);
    v
}

/// Every codec and level the layer accepts, extensions (zstd 16..19) included.
pub fn all_specs() -> Vec<CodecSpec> {
    let mut v = vec![
        CodecSpec::none(),
        CodecSpec::default_for(Algorithm::Lzo),
        CodecSpec::default_for(Algorithm::Lz4),
    ];
    for l in 1..=9 {
        v.push(CodecSpec::with_level(Algorithm::Zlib, l).spec);
    }
    for l in (-15..=19).filter(|l| *l != 0) {
        let p = CodecSpec::with_level(Algorithm::Zstd, l);
        assert!(p.adjustment.is_none(), "zstd:{l} must be accepted as is");
        v.push(p.spec);
    }
    v
}
