//! Deterministic test data shared by every compfs test suite (a dev-dependency only): the same
//! seed gives the same bytes on every machine and run, so a failure replays exactly.
//!
//! * [`random`]: incompressible bytes (no codec saves a sector on them);
//! * [`text`]: text-like bytes (words, spaces, sentence ends), compressible about 3x by zstd;
//! * [`generate`] with a [`Kind`]: the above plus zeros, binary-like records and a mix, for
//!   tests that run over every kind ([`KINDS`]).
//!
//! Data a frozen fixture was made from does not come from here (it must never change); the
//! fixture's test keeps its own copy of that generator.

/// xorshift64: fast, deterministic, and good enough to be incompressible.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// What the bytes look like to a compressor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Random,
    Zeros,
    Text,
    Binary,
    Mixed,
}

/// Every [`Kind`].
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

/// Incompressible bytes.
pub fn random(len: usize, seed: u64) -> Vec<u8> {
    generate(Kind::Random, len, seed)
}

/// Text-like, compressible bytes.
pub fn text(len: usize, seed: u64) -> Vec<u8> {
    generate(Kind::Text, len, seed)
}

/// `len` bytes of `kind` for `seed`.
pub fn generate(kind: Kind, len: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut v = Vec::with_capacity(len + 64);
    match kind {
        Kind::Random => {
            while v.len() < len {
                v.extend_from_slice(&r.next_u64().to_le_bytes());
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
            // occasional copies of earlier records, like a database page or an executable's
            // tables.
            let mut key = r.next_u64() as u32;
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
                v.extend_from_slice(&((r.next_u64() >> 40) as u32).to_be_bytes()[1..]);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_of_the_asked_length() {
        for k in KINDS {
            for len in [0, 1, 7, 4096, 10_001] {
                let a = generate(k, len, 42);
                assert_eq!(a.len(), len);
                assert_eq!(a, generate(k, len, 42));
            }
        }
        assert_ne!(random(64, 1), random(64, 2));
        assert_ne!(text(64, 1), text(64, 2));
    }

    #[test]
    fn kinds_look_like_their_names() {
        let distinct = |v: &[u8]| {
            let mut seen = [false; 256];
            v.iter().for_each(|&b| seen[b as usize] = true);
            seen.iter().filter(|&&s| s).count()
        };
        assert_eq!(distinct(&random(1 << 16, 3)), 256);
        assert!(distinct(&text(1 << 16, 3)) < 40);
        assert!(generate(Kind::Zeros, 100, 3).iter().all(|&b| b == 0));
    }
}
