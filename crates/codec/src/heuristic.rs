//! Should this extent be compressed at all?
//!
//! [`btrfs_heuristic`] is a faithful port of `btrfs_compress_heuristic()` from
//! fs/btrfs/compression.c: it samples 16 bytes every 256 bytes (at most 8 KiB) and decides by
//! repeated pattern, byte-set size, core-set size and Shannon entropy.
//!
//! [`Heuristic::decide`] is compfs's policy and goes beyond btrfs: where the byte statistics say
//! "incompressible" it runs a cheap LZ4 trial over the extent before giving up, because
//! structured binary data (databases, images, office documents) has high byte entropy yet real
//! LZ-style redundancy. On the Silesia corpus btrfs's heuristic stores osdb, x-ray and most of
//! ooffice raw although zstd compresses them 2.9x, 1.4x and 2.0x.

use std::fmt;

/// btrfs SAMPLING_READ_SIZE.
pub const SAMPLING_READ_SIZE: usize = 16;
/// btrfs SAMPLING_INTERVAL.
pub const SAMPLING_INTERVAL: usize = 256;
/// btrfs MAX_SAMPLE_SIZE for a 128 KiB extent: 8 KiB of samples.
pub const MAX_SAMPLE_SIZE: usize = 128 * 1024 * SAMPLING_READ_SIZE / SAMPLING_INTERVAL;
const BYTE_CORE_SET_LOW: usize = 64;
const BYTE_CORE_SET_HIGH: usize = 200;
const BYTE_SET_THRESHOLD: usize = 64;
const ENTROPY_LVL_ACEPTABLE: u32 = 65;
const ENTROPY_LVL_HIGH: u32 = 80;

/// Which test decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The first half of the sample equals the second half.
    RepeatedPattern,
    /// Fewer than 64 distinct byte values (text-like).
    ByteSetSmall,
    /// At most 64 byte values cover 90% of the sample.
    CoreSetSmall,
    /// At least 200 byte values are needed to cover 90% of the sample.
    CoreSetLarge,
    /// Shannon entropy at most 65% of 8 bits per byte.
    EntropyLow,
    /// Shannon entropy below 80%.
    EntropyMedium,
    /// Shannon entropy of 80% or more.
    EntropyHigh,
    /// compfs: btrfs's statistics said no, but a trial LZ4 compression saved enough.
    TrialCompressible,
    /// compfs: btrfs's statistics said no and a trial LZ4 compression agreed.
    TrialIncompressible,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reason::RepeatedPattern => "repeated-pattern",
            Reason::ByteSetSmall => "byte-set-small",
            Reason::CoreSetSmall => "core-set-small",
            Reason::CoreSetLarge => "core-set-large",
            Reason::EntropyLow => "entropy-low",
            Reason::EntropyMedium => "entropy-medium",
            Reason::EntropyHigh => "entropy-high",
            Reason::TrialCompressible => "trial-compressible",
            Reason::TrialIncompressible => "trial-incompressible",
        })
    }
}

/// A heuristic decision and the test that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub compress: bool,
    pub reason: Reason,
}

impl Verdict {
    fn yes(reason: Reason) -> Verdict {
        Verdict {
            compress: true,
            reason,
        }
    }
    fn no(reason: Reason) -> Verdict {
        Verdict {
            compress: false,
            reason,
        }
    }
}

/// `ilog2(n^4)`, btrfs's `ilog2_w`: a log2 with two extra bits of precision.
fn ilog2_w(n: u64) -> u32 {
    let n4 = n.saturating_mul(n).saturating_mul(n).saturating_mul(n);
    if n4 == 0 {
        0
    } else {
        63 - n4.leading_zeros()
    }
}

/// The btrfs heuristic over one range (normally one extent of at most 128 KiB).
pub fn btrfs_heuristic(data: &[u8]) -> Verdict {
    let mut sample = [0u8; MAX_SAMPLE_SIZE];
    let mut len = 0usize;
    let mut off = 0usize;
    while off + SAMPLING_READ_SIZE <= data.len() && len + SAMPLING_READ_SIZE <= MAX_SAMPLE_SIZE {
        sample[len..len + SAMPLING_READ_SIZE].copy_from_slice(&data[off..off + SAMPLING_READ_SIZE]);
        len += SAMPLING_READ_SIZE;
        off += SAMPLING_INTERVAL;
    }
    let sample = &sample[..len];
    if len == 0 {
        // Too small to sample: let the compressor decide, as btrfs does for tiny ranges.
        return Verdict::yes(Reason::EntropyLow);
    }

    // 1. Repeated pattern.
    let half = len / 2;
    if sample[..half] == sample[half..half * 2] {
        return Verdict::yes(Reason::RepeatedPattern);
    }

    let mut bucket = [0u32; 256];
    for &b in sample {
        bucket[b as usize] += 1;
    }

    // 2. Byte set size.
    let byte_set = bucket.iter().filter(|&&c| c > 0).count();
    if byte_set < BYTE_SET_THRESHOLD {
        return Verdict::yes(Reason::ByteSetSmall);
    }

    // 3. Core set: fewest byte values covering 90% of the sample.
    bucket.sort_unstable_by(|a, b| b.cmp(a));
    let threshold = (len * 90 / 100) as u64;
    // As btrfs's byte_core_set_size(): sum the 64 most frequent values, then go on one by one.
    let mut sum: u64 = bucket[..BYTE_CORE_SET_LOW].iter().map(|&c| c as u64).sum();
    let mut core = BYTE_CORE_SET_LOW;
    if sum <= threshold {
        while core < BYTE_CORE_SET_HIGH && bucket[core] > 0 {
            sum += bucket[core] as u64;
            if sum > threshold {
                break;
            }
            core += 1;
        }
    }
    if core <= BYTE_CORE_SET_LOW {
        return Verdict::yes(Reason::CoreSetSmall);
    }
    if core >= BYTE_CORE_SET_HIGH {
        return Verdict::no(Reason::CoreSetLarge);
    }

    // 4. Shannon entropy as a percentage of 8 bits per byte, integer approximation.
    let entropy_max = 8 * ilog2_w(2) as u64;
    let sz_base = ilog2_w(len as u64) as u64;
    let mut entropy_sum = 0u64;
    for &c in bucket.iter().take_while(|&&c| c > 0) {
        let p = c as u64;
        entropy_sum += p * (sz_base - ilog2_w(p) as u64);
    }
    entropy_sum /= len as u64;
    let entropy = (entropy_sum * 100 / entropy_max) as u32;
    if entropy <= ENTROPY_LVL_ACEPTABLE {
        Verdict::yes(Reason::EntropyLow)
    } else if entropy < ENTROPY_LVL_HIGH {
        Verdict::yes(Reason::EntropyMedium)
    } else {
        Verdict::no(Reason::EntropyHigh)
    }
}

/// compfs's heuristic: btrfs's statistics, then an LZ4 trial where they say no. Holds the trial's
/// scratch buffer so deciding allocates nothing after the first call.
#[derive(Debug, Default)]
pub struct Heuristic {
    scratch: Vec<u8>,
    lz4: Option<crate::lz4::Lz4>,
}

/// The trial must save at least 1/TRIAL_MIN_SAVING_DIV of the input for the extent to be
/// compressed with the real codec (LZ4 saving little usually means zstd saves a few percent, which
/// still often passes the one-sector rule; 1/32 keeps the false-positive cost small).
const TRIAL_MIN_SAVING_DIV: usize = 32;

impl Heuristic {
    pub fn new() -> Heuristic {
        Heuristic::default()
    }

    /// Decide for one extent.
    pub fn decide(&mut self, data: &[u8]) -> Verdict {
        let v = btrfs_heuristic(data);
        if v.compress {
            return v;
        }
        let bound = crate::lz4::compress_bound(data.len());
        if self.scratch.len() < bound {
            self.scratch.resize(bound, 0);
        }
        if self.lz4.is_none() {
            self.lz4 = crate::lz4::Lz4::new();
        }
        let trial = self
            .lz4
            .as_mut()
            .and_then(|c| c.compress(data, &mut self.scratch));
        match trial {
            Some(n) if n + data.len() / TRIAL_MIN_SAVING_DIV <= data.len() => {
                Verdict::yes(Reason::TrialCompressible)
            }
            _ => Verdict::no(Reason::TrialIncompressible),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn ilog2_w_matches_kernel_definition() {
        assert_eq!(ilog2_w(2), 4);
        assert_eq!(ilog2_w(1), 0);
        assert_eq!(ilog2_w(8192), 52);
    }

    #[test]
    fn zeros_are_a_repeated_pattern() {
        assert_eq!(
            btrfs_heuristic(&vec![0u8; 131072]).reason,
            Reason::RepeatedPattern
        );
    }

    #[test]
    fn text_has_a_small_byte_set() {
        let text: Vec<u8> = b"It was the best of times, it was the worst of times. "
            .iter()
            .cycle()
            .take(131072)
            .enumerate()
            .map(|(i, b)| if i % 1013 == 0 { b'x' } else { *b })
            .collect();
        let v = btrfs_heuristic(&text);
        assert!(v.compress);
        assert_eq!(v.reason, Reason::ByteSetSmall);
    }

    #[test]
    fn random_is_rejected_by_btrfs_and_by_the_trial() {
        let r = random(131072, 42);
        let v = btrfs_heuristic(&r);
        assert!(!v.compress);
        assert_eq!(v.reason, Reason::CoreSetLarge);
        let v = Heuristic::new().decide(&r);
        assert!(!v.compress);
        assert_eq!(v.reason, Reason::TrialIncompressible);
    }

    #[test]
    fn structured_binary_is_caught_by_the_trial() {
        // Copies of 48-byte runs from a 16 KiB random dictionary at pseudo-random offsets: wide
        // byte set, high byte entropy, no repeated halves, yet LZ-compressible.
        let dict = random(16384, 7);
        let mut s = 12345u64;
        let mut data = Vec::new();
        while data.len() < 131072 {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let off = (s >> 33) as usize % (dict.len() - 48);
            data.extend_from_slice(&dict[off..off + 48]);
        }
        data.truncate(131072);
        let b = btrfs_heuristic(&data);
        assert!(!b.compress, "{b:?}");
        let v = Heuristic::new().decide(&data);
        assert!(v.compress);
        assert_eq!(v.reason, Reason::TrialCompressible);
    }

    #[test]
    fn mid_entropy_bytes() {
        // 128 distinct values uniformly: core set ~115 (between 64 and 200), entropy 7/8 = 87%.
        let d: Vec<u8> = random(131072, 9).iter().map(|b| b & 0x7f).collect();
        let v = btrfs_heuristic(&d);
        assert_eq!(v.reason, Reason::EntropyHigh);
        // 4 bits per byte: byte set of 16 values.
        let d: Vec<u8> = random(131072, 9).iter().map(|b| b & 0x0f).collect();
        assert_eq!(btrfs_heuristic(&d).reason, Reason::ByteSetSmall);
    }

    #[test]
    fn tiny_and_empty_inputs_do_not_panic() {
        for n in 0..40 {
            let _ = btrfs_heuristic(&random(n, 3));
            let _ = Heuristic::new().decide(&random(n, 3));
        }
    }
}
