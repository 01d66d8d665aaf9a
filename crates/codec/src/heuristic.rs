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
    /// compfs: a quick 2 KiB sample looks like random bytes (already compressed or encrypted).
    NearRandom,
    /// compfs: btrfs's statistics said no, but the sample's Shannon entropy predicts that
    /// entropy coding alone saves space (e.g. 12-bit samples stored in 16 bits).
    EntropyModerate,
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
            Reason::NearRandom => "near-random",
            Reason::EntropyModerate => "entropy-moderate",
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
    btrfs_core(data, &mut [0u32; 256]).0
}

/// btrfs_compress_heuristic(): the verdict and the sample length; `bucket` is left holding the
/// sample's byte histogram (sorted, once the byte-set test has passed) for further tests.
fn btrfs_core(data: &[u8], bucket: &mut [u32; 256]) -> (Verdict, usize) {
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
        return (Verdict::yes(Reason::EntropyLow), 0);
    }

    // 1. Repeated pattern.
    let half = len / 2;
    if sample[..half] == sample[half..half * 2] {
        return (Verdict::yes(Reason::RepeatedPattern), len);
    }

    bucket.fill(0);
    for &b in sample {
        bucket[b as usize] += 1;
    }

    // 2. Byte set size.
    let byte_set = bucket.iter().filter(|&&c| c > 0).count();
    if byte_set < BYTE_SET_THRESHOLD {
        return (Verdict::yes(Reason::ByteSetSmall), len);
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
        return (Verdict::yes(Reason::CoreSetSmall), len);
    }
    if core >= BYTE_CORE_SET_HIGH {
        return (Verdict::no(Reason::CoreSetLarge), len);
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
    let v = if entropy <= ENTROPY_LVL_ACEPTABLE {
        Verdict::yes(Reason::EntropyLow)
    } else if entropy < ENTROPY_LVL_HIGH {
        Verdict::yes(Reason::EntropyMedium)
    } else {
        Verdict::no(Reason::EntropyHigh)
    };
    (v, len)
}

/// `n * log2(n)` for n in 0..=MAX_SAMPLE_SIZE, so entropy costs one lookup per byte value.
fn nlog2n() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Box<[f32]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=MAX_SAMPLE_SIZE)
            .map(|n| {
                if n == 0 {
                    0.0
                } else {
                    (n as f64 * (n as f64).log2()) as f32
                }
            })
            .collect()
    })
}

/// Shannon entropy in bits per byte of a histogram over `n` bytes, with the Miller-Madow bias
/// correction (+ (m - 1) / 2n ln 2 for m byte values seen) so that small samples of random data
/// estimate close to 8 bits rather than below it.
pub fn sample_entropy(bucket: &[u32; 256], n: usize) -> f32 {
    if n == 0 || n > MAX_SAMPLE_SIZE {
        return 0.0;
    }
    let t = nlog2n();
    let mut sum = 0.0f32;
    let mut seen = 0u32;
    for &c in bucket {
        sum += t[c as usize];
        seen += (c > 0) as u32;
    }
    let nf = n as f32;
    nf.log2() - sum / nf + (seen.max(1) - 1) as f32 / (2.0 * nf * std::f32::consts::LN_2)
}

/// Histogram of 16-byte reads every `stride` bytes, at most `max` bytes; returns bytes counted.
fn sample_histogram(data: &[u8], stride: usize, max: usize, bucket: &mut [u32; 256]) -> usize {
    bucket.fill(0);
    let mut n = 0;
    let mut off = 0;
    while off + SAMPLING_READ_SIZE <= data.len() && n + SAMPLING_READ_SIZE <= max {
        for &b in &data[off..off + SAMPLING_READ_SIZE] {
            bucket[b as usize] += 1;
        }
        n += SAMPLING_READ_SIZE;
        off += stride;
    }
    n
}

/// Quick look: 2 KiB of 16-byte samples spread over the extent (128 reads).
const QUICK_SAMPLE: usize = 2048;
/// Bits per byte from which a quick sample counts as random. Random bytes estimate 8.00 +- 0.03;
/// entropy coding needs about 7.75 bits or less to save the 3% (one sector in 32) an extent must
/// save, and data with byte entropy this high rarely has LZ matches either.
const NEAR_RANDOM_BITS: f32 = 7.9;
/// At or below this many bits per byte (8 KiB sample), Huffman coding alone saves more than 8%,
/// comfortably past the one-sector rule, so compress without a trial.
const ENTROPY_COMPRESS_BITS: f32 = 7.3;
/// The trial must save at least 1/TRIAL_MIN_SAVING_DIV of the extent (LZ4 saving a little
/// usually means zstd saves more, enough for the one-sector rule).
const TRIAL_MIN_SAVING_DIV: usize = 32;

/// compfs's heuristic, the policy of compress (not compress-force) mode:
///
/// 1. a quick 2 KiB sample whose entropy is that of random bytes: store raw (costs ~1 us per
///    128 KiB, a few percent of what zstd spends finding out the same);
/// 2. btrfs's tests ([`btrfs_heuristic`]): if they say compress, compress;
/// 3. where btrfs says no, an entropy estimate from the same 8 KiB sample: at most 7.3 bits per
///    byte means entropy coding alone pays (btrfs rejects such data when the byte values are
///    spread evenly, as in 16-bit images);
/// 4. otherwise an LZ4 trial over the whole extent catches structured binary data (databases,
///    executables) that has high byte entropy but real repetition. (A trial on a window missed
///    executables whose middle holds an incompressible blob; LZ4 skips quickly through such
///    parts, and data reaching this step has byte entropy below 7.9 bits, so it is mostly
///    compressible anyway.)
///
/// Holds the trial's scratch buffer and LZ4 state so deciding allocates nothing after the first
/// call.
#[derive(Debug, Default)]
pub struct Heuristic {
    scratch: Vec<u8>,
    lz4: Option<crate::lz4::Lz4>,
}

impl Heuristic {
    pub fn new() -> Heuristic {
        Heuristic::default()
    }

    /// Decide for one extent.
    pub fn decide(&mut self, data: &[u8]) -> Verdict {
        let mut bucket = [0u32; 256];
        // 1. Quick random check.
        // 128 reads spread over the extent; small extents are sampled more densely so that they
        // get the same 2 KiB (the check costs less than compressing them by far either way).
        let stride = (data.len() / (QUICK_SAMPLE / SAMPLING_READ_SIZE)).max(SAMPLING_READ_SIZE);
        let n = sample_histogram(data, stride, QUICK_SAMPLE, &mut bucket);
        if n >= QUICK_SAMPLE / 2 && sample_entropy(&bucket, n) >= NEAR_RANDOM_BITS {
            return Verdict::no(Reason::NearRandom);
        }
        // 2. btrfs.
        let (v, n) = btrfs_core(data, &mut bucket);
        if v.compress {
            return v;
        }
        // 3. Entropy of btrfs's sample (bucket holds its histogram, sorted).
        if sample_entropy(&bucket, n) <= ENTROPY_COMPRESS_BITS {
            return Verdict::yes(Reason::EntropyModerate);
        }
        // 4. LZ4 trial.
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
            Some(z) if z + data.len() / TRIAL_MIN_SAVING_DIV <= data.len() => {
                Verdict::yes(Reason::TrialCompressible)
            }
            _ => Verdict::no(Reason::TrialIncompressible),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use compfs_testdata::random;

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
        assert_eq!(v.reason, Reason::NearRandom);
    }

    #[test]
    fn structured_binary_is_caught_by_the_trial() {
        // Copies of 48-byte runs from a 16 KiB dictionary of 200 byte values at pseudo-random
        // offsets: wide byte set, byte entropy 7.6 bits (too high for btrfs and for entropy
        // coding to pay), no repeated halves, yet LZ-compressible.
        let dict: Vec<u8> = random(16384, 7).iter().map(|b| b % 200).collect();
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
    fn sixteen_bit_samples_pass_on_entropy() {
        // 12-bit samples in little-endian 16-bit words, like x-ray: the low bytes are spread over
        // all 256 values so btrfs's core-set test says no, but the high bytes take 16 values and
        // the entropy is about 6 bits per byte.
        let mut s = 5u64;
        let d: Vec<u8> = (0..65536)
            .flat_map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 20) as u16 & 0x0fff).to_le_bytes()
            })
            .collect();
        assert!(!btrfs_heuristic(&d).compress);
        let v = Heuristic::new().decide(&d);
        assert_eq!(v, Verdict::yes(Reason::EntropyModerate));
    }

    #[test]
    fn already_compressed_data_is_near_random() {
        // zstd output of text-like data: what a .zst or .gz file holds.
        let text = compfs_testdata::text(1 << 20, 77);
        let mut c = crate::codec::Compressor::new();
        let mut z = Vec::new();
        let mut packed = Vec::new();
        for chunk in text.chunks(1 << 20) {
            c.compress(crate::spec::CodecSpec::default(), chunk, &mut z)
                .unwrap();
            packed.extend_from_slice(&z);
        }
        assert!(packed.len() >= 131072, "{}", packed.len());
        let v = Heuristic::new().decide(&packed[..131072]);
        assert_eq!(v, Verdict::no(Reason::NearRandom));
    }

    #[test]
    fn entropy_estimates() {
        let mut b = [0u32; 256];
        b[7] = 4096;
        assert_eq!(sample_entropy(&b, 4096), 0.0);
        let r = random(8192, 1);
        let n = sample_histogram(&r, 16, 8192, &mut b);
        assert_eq!(n, 8192);
        let h = sample_entropy(&b, n);
        assert!((7.95..=8.05).contains(&h), "{h}");
        let n = sample_histogram(&r, 64, 2048, &mut b);
        let h = sample_entropy(&b, n);
        assert!((7.9..=8.1).contains(&h), "{h}");
        // Two values equally likely: one bit.
        let two: Vec<u8> = r.iter().map(|x| x & 1).collect();
        let n = sample_histogram(&two, 16, 8192, &mut b);
        assert!((sample_entropy(&b, n) - 1.0).abs() < 0.01);
        assert_eq!(sample_entropy(&b, 0), 0.0);
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
