//! Compression contexts. A [`Compressor`] or [`Decompressor`] is owned by one worker thread and
//! reused for every extent it handles, so the hot path allocates nothing once the contexts for
//! the levels in use exist (zstd CCtx/DCtx, deflate streams, the LZO work memory).

use crate::error::CodecError;
use crate::spec::{Algorithm, CodecSpec};

/// Largest extent the codec layer accepts (1 MiB), matching the store's maximum extent size.
pub const MAX_EXTENT: usize = 1 << 20;
/// Smallest extent size a store may choose (4 KiB, one sector).
pub const MIN_EXTENT: usize = 4096;
/// btrfs's default extent size (128 KiB of uncompressed data).
pub const DEFAULT_EXTENT: usize = 128 * 1024;
/// The sector size that compressed lengths are rounded up to (btrfs: one 4 KiB sector).
pub const SECTOR: usize = 4096;

/// Checks that an extent size is a power of two in `MIN_EXTENT..=MAX_EXTENT`.
pub fn check_extent_size(size: usize) -> Result<(), CodecError> {
    if size.is_power_of_two() && (MIN_EXTENT..=MAX_EXTENT).contains(&size) {
        Ok(())
    } else {
        Err(CodecError::BadExtentSize(size))
    }
}

/// Upper bound of the compressed size of `len` input bytes with `algorithm`.
pub fn max_compressed_len(algorithm: Algorithm, len: usize) -> usize {
    match algorithm {
        Algorithm::None => len,
        Algorithm::Zstd => zstd::zstd_safe::compress_bound(len),
        Algorithm::Lz4 => crate::lz4::compress_bound(len),
        // zlib-rs level 1 ("deflate_quick", as in zlib-ng) emits static-Huffman blocks, where a
        // literal costs up to 9 bits: 12.5% expansion plus block headers and the zlib wrapper.
        Algorithm::Zlib => len + len / 8 + 128,
        // LZO1X worst case as documented by minilzo: len + len/16 + 64 + 3.
        Algorithm::Lzo => crate::lzo::worst_compress(len),
    }
}

fn backend(algorithm: Algorithm, e: impl std::fmt::Display) -> CodecError {
    CodecError::Backend {
        algorithm,
        detail: e.to_string(),
    }
}

/// A per-thread compression context for every algorithm.
pub struct Compressor {
    zstd: Option<(i32, zstd::bulk::Compressor<'static>)>,
    /// Context for compressing with a digested dictionary (the level is the dictionary's).
    zstd_dict: Option<zstd::zstd_safe::CCtx<'static>>,
    /// One deflate stream per zlib level used (a level is fixed when a stream is created), so
    /// alternating levels resets streams instead of reallocating them.
    zlib: Vec<(i32, flate2::Compress)>,
    lzo: Option<crate::lzo::Lzo1x1>,
    lz4: Option<crate::lz4::Lz4>,
}

impl std::fmt::Debug for Compressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compressor")
            .field("zstd_level", &self.zstd.as_ref().map(|z| z.0))
            .field(
                "zlib_levels",
                &self.zlib.iter().map(|z| z.0).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Default for Compressor {
    fn default() -> Self {
        Self::new()
    }
}

impl Compressor {
    /// Contexts are created lazily on first use of each algorithm.
    pub fn new() -> Compressor {
        Compressor {
            zstd: None,
            zstd_dict: None,
            zlib: Vec::new(),
            lzo: None,
            lz4: None,
        }
    }

    /// Compresses `src` into `dst` (cleared first; its capacity is reused) and returns the
    /// compressed length. This does not decide whether the result is worth keeping: see
    /// [`crate::ExtentEncoder::encode`].
    pub fn compress(
        &mut self,
        spec: CodecSpec,
        src: &[u8],
        dst: &mut Vec<u8>,
    ) -> Result<usize, CodecError> {
        let algorithm = spec.algorithm();
        if src.len() > MAX_EXTENT {
            return Err(CodecError::TooLarge {
                len: src.len(),
                max: MAX_EXTENT,
            });
        }
        dst.clear();
        let bound = max_compressed_len(algorithm, src.len());
        dst.reserve(bound);
        match algorithm {
            Algorithm::None => {
                dst.extend_from_slice(src);
            }
            Algorithm::Zstd => {
                let level = spec.level();
                let c = match &mut self.zstd {
                    Some((l, c)) => {
                        if *l != level {
                            c.set_compression_level(level)
                                .map_err(|e| backend(algorithm, e))?;
                            *l = level;
                        }
                        c
                    }
                    slot @ None => {
                        let c = zstd::bulk::Compressor::new(level)
                            .map_err(|e| backend(algorithm, e))?;
                        &mut slot.insert((level, c)).1
                    }
                };
                c.compress_to_buffer(src, dst)
                    .map_err(|e| backend(algorithm, e))?;
            }
            Algorithm::Lz4 => {
                dst.resize(bound, 0);
                let ctx = match &mut self.lz4 {
                    Some(c) => c,
                    slot @ None => slot.insert(
                        crate::lz4::Lz4::new()
                            .ok_or_else(|| backend(algorithm, "cannot initialise LZ4 state"))?,
                    ),
                };
                // dst holds LZ4_COMPRESSBOUND(len) bytes, so compression cannot run out of room.
                let n = ctx
                    .compress(src, dst)
                    .ok_or_else(|| backend(algorithm, "LZ4_compress_fast_extState failed"))?;
                dst.truncate(n);
            }
            Algorithm::Zlib => {
                let level = spec.level();
                let i = match self.zlib.iter().position(|(l, _)| *l == level) {
                    Some(i) => {
                        self.zlib[i].1.reset();
                        i
                    }
                    None => {
                        let c = flate2::Compress::new(flate2::Compression::new(level as u32), true);
                        self.zlib.push((level, c));
                        self.zlib.len() - 1
                    }
                };
                let c = &mut self.zlib[i].1;
                let status = c
                    .compress_vec(src, dst, flate2::FlushCompress::Finish)
                    .map_err(|e| backend(algorithm, e))?;
                if status != flate2::Status::StreamEnd {
                    return Err(backend(
                        algorithm,
                        "deflate did not finish within its bound",
                    ));
                }
            }
            Algorithm::Lzo => {
                dst.resize(bound, 0);
                let ctx = self.lzo.get_or_insert_with(crate::lzo::Lzo1x1::new);
                // dst holds exactly worst_compress(len) bytes, the most LZO1X-1 can write.
                let n = ctx.compress(src, dst);
                dst.truncate(n);
            }
        }
        Ok(dst.len())
    }

    /// Compresses `src` into `dst` (cleared first) with zstd and a dictionary, at the level the
    /// dictionary was digested for; returns the compressed length.
    pub fn compress_dict(
        &mut self,
        dict: &crate::Dictionary,
        src: &[u8],
        dst: &mut Vec<u8>,
    ) -> Result<usize, CodecError> {
        if src.len() > MAX_EXTENT {
            return Err(CodecError::TooLarge {
                len: src.len(),
                max: MAX_EXTENT,
            });
        }
        dst.clear();
        dst.reserve(max_compressed_len(Algorithm::Zstd, src.len()));
        let c = self
            .zstd_dict
            .get_or_insert_with(zstd::zstd_safe::CCtx::create);
        c.compress_using_cdict(dst, src, dict.cdict())
            .map_err(|code| backend(Algorithm::Zstd, zstd::zstd_safe::get_error_name(code)))?;
        Ok(dst.len())
    }

    /// Bytes of memory held by the zstd compression context at its current level (0 if none).
    pub fn zstd_context_bytes(&mut self) -> usize {
        match &mut self.zstd {
            Some((_, c)) => c.context_mut().sizeof(),
            None => 0,
        }
    }
}

/// Memory a compression context needs for one spec, measured by building the context and
/// compressing one extent of `extent` bytes (zstd sizes its tables to the input).
pub fn context_memory(spec: CodecSpec, extent: usize) -> usize {
    match spec.algorithm() {
        Algorithm::None => 0,
        Algorithm::Zstd => {
            let mut c = Compressor::new();
            let sample: Vec<u8> = (0..extent).map(|i| (i % 251) as u8).collect();
            let mut out = Vec::new();
            if c.compress(spec, &sample, &mut out).is_err() {
                return 0;
            }
            c.zstd_context_bytes()
        }
        // miniz/zlib-rs deflate state: window (2 * 32 KiB) + hash chains (2 * 32 KiB * 2 bytes)
        // + pending buffer, as zlib's deflateInit2 documents: (1 << (windowBits+2)) +
        // (1 << (memLevel+9)) with windowBits 15, memLevel 8.
        Algorithm::Zlib => (1 << 17) + (1 << 17),
        // LZO1X-1 work memory: 16 K dictionary entries of 2 bytes.
        Algorithm::Lzo => crate::lzo::DICT_BYTES,
        // liblz4's LZ4_stream_t (a 4 K-entry u32 hash table plus a small header).
        Algorithm::Lz4 => crate::lz4::state_bytes(),
    }
}

/// A per-thread decompression context.
pub struct Decompressor {
    zstd: Option<zstd::bulk::Decompressor<'static>>,
    zstd_dict: Option<zstd::zstd_safe::DCtx<'static>>,
    zlib: Option<flate2::Decompress>,
}

impl std::fmt::Debug for Decompressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decompressor").finish_non_exhaustive()
    }
}

impl Default for Decompressor {
    fn default() -> Self {
        Self::new()
    }
}

impl Decompressor {
    pub fn new() -> Decompressor {
        Decompressor {
            zstd: None,
            zstd_dict: None,
            zlib: None,
        }
    }

    /// Decompresses a zstd frame made with `dict` into exactly `dst.len()` bytes; anything else
    /// (another dictionary, malformed input, another length) is a [`CodecError::Corrupt`].
    pub fn decompress_dict(
        &mut self,
        dict: &crate::Dictionary,
        src: &[u8],
        dst: &mut [u8],
    ) -> Result<(), CodecError> {
        let algorithm = Algorithm::Zstd;
        if dst.len() > MAX_EXTENT {
            return Err(CodecError::TooLarge {
                len: dst.len(),
                max: MAX_EXTENT,
            });
        }
        let d = match &mut self.zstd_dict {
            Some(d) => d,
            slot @ None => {
                let mut d = zstd::zstd_safe::DCtx::create();
                d.set_parameter(zstd::zstd_safe::DParameter::WindowLogMax(20))
                    .map_err(|code| backend(algorithm, zstd::zstd_safe::get_error_name(code)))?;
                slot.insert(d)
            }
        };
        let want = dst.len();
        let n = d
            .decompress_using_ddict(dst, src, dict.ddict())
            .map_err(|code| {
                CodecError::corrupt(algorithm, zstd::zstd_safe::get_error_name(code))
            })?;
        if n != want {
            return Err(CodecError::corrupt(
                algorithm,
                format!("decoded {n} bytes, expected {want}"),
            ));
        }
        Ok(())
    }

    /// Decompresses `src` into exactly `dst.len()` bytes. Input that is malformed, truncated, or
    /// decodes to any other length is a [`CodecError::Corrupt`]; nothing beyond `dst` is ever
    /// allocated or written.
    pub fn decompress(
        &mut self,
        algorithm: Algorithm,
        src: &[u8],
        dst: &mut [u8],
    ) -> Result<(), CodecError> {
        if dst.len() > MAX_EXTENT {
            return Err(CodecError::TooLarge {
                len: dst.len(),
                max: MAX_EXTENT,
            });
        }
        let want = dst.len();
        let wrong_len = |got: usize| {
            CodecError::corrupt(algorithm, format!("decoded {got} bytes, expected {want}"))
        };
        match algorithm {
            Algorithm::None => {
                if src.len() != want {
                    return Err(wrong_len(src.len()));
                }
                dst.copy_from_slice(src);
            }
            Algorithm::Zstd => {
                let d = match &mut self.zstd {
                    Some(d) => d,
                    slot @ None => {
                        let mut d =
                            zstd::bulk::Decompressor::new().map_err(|e| backend(algorithm, e))?;
                        // Bound the window a hostile frame may ask for to the largest extent.
                        d.set_parameter(zstd::zstd_safe::DParameter::WindowLogMax(20))
                            .map_err(|e| backend(algorithm, e))?;
                        slot.insert(d)
                    }
                };
                let n = d
                    .decompress_to_buffer(src, dst)
                    .map_err(|e| CodecError::corrupt(algorithm, e))?;
                if n != want {
                    return Err(wrong_len(n));
                }
            }
            Algorithm::Lz4 => {
                let n = crate::lz4::decompress(src, dst).ok_or_else(|| {
                    CodecError::corrupt(algorithm, "malformed block or longer than the extent")
                })?;
                if n != want {
                    return Err(wrong_len(n));
                }
            }
            Algorithm::Zlib => {
                let d = self
                    .zlib
                    .get_or_insert_with(|| flate2::Decompress::new(true));
                d.reset(true);
                let status = d
                    .decompress(src, dst, flate2::FlushDecompress::Finish)
                    .map_err(|e| CodecError::corrupt(algorithm, e))?;
                let n = d.total_out() as usize;
                if status != flate2::Status::StreamEnd {
                    return Err(CodecError::corrupt(
                        algorithm,
                        format!("stream did not end within {want} bytes (decoded {n})"),
                    ));
                }
                if n != want {
                    return Err(wrong_len(n));
                }
                if d.total_in() as usize != src.len() {
                    return Err(CodecError::corrupt(
                        algorithm,
                        "trailing bytes after the stream",
                    ));
                }
            }
            Algorithm::Lzo => {
                lzo1x::decompress(src, dst).map_err(|e| CodecError::corrupt(algorithm, e))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Algorithm;

    fn all_specs() -> Vec<CodecSpec> {
        let mut v = vec![
            CodecSpec::none(),
            CodecSpec::default_for(Algorithm::Lzo),
            CodecSpec::default_for(Algorithm::Lz4),
        ];
        for l in 1..=9 {
            v.push(CodecSpec::with_level(Algorithm::Zlib, l).spec);
        }
        for l in (-15..=19).filter(|l| *l != 0) {
            v.push(CodecSpec::with_level(Algorithm::Zstd, l).spec);
        }
        v
    }

    fn text(n: usize) -> Vec<u8> {
        compfs_testdata::text(n, 1)
    }

    #[test]
    fn round_trip_all_levels_fixed_inputs() {
        let mut c = Compressor::new();
        let mut d = Decompressor::new();
        let mut rng = 0x1234_5678_u64;
        let random: Vec<u8> = (0..MAX_EXTENT)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng as u8
            })
            .collect();
        let inputs: Vec<Vec<u8>> = vec![
            vec![],
            vec![0; DEFAULT_EXTENT],
            text(DEFAULT_EXTENT),
            random[..DEFAULT_EXTENT].to_vec(),
            random.clone(),
            vec![7],
        ];
        let mut out = Vec::new();
        for spec in all_specs() {
            for input in &inputs {
                let n = c.compress(spec, input, &mut out).unwrap();
                assert_eq!(n, out.len());
                let bound = max_compressed_len(spec.algorithm(), input.len());
                assert!(
                    n <= bound,
                    "{spec}: {n} > {bound} for {} bytes",
                    input.len()
                );
                let mut back = vec![0xAA; input.len()];
                d.decompress(spec.algorithm(), &out, &mut back).unwrap();
                assert_eq!(&back, input, "{spec}");
            }
        }
    }

    #[test]
    fn wrong_length_is_corrupt() {
        let mut c = Compressor::new();
        let mut d = Decompressor::new();
        let input = text(10_000);
        let mut out = Vec::new();
        for spec in all_specs() {
            c.compress(spec, &input, &mut out).unwrap();
            for len in [9_999usize, 10_001, 0] {
                let mut back = vec![0; len];
                let r = d.decompress(spec.algorithm(), &out, &mut back);
                assert!(
                    matches!(r, Err(CodecError::Corrupt { .. })),
                    "{spec} {len}: {r:?}"
                );
            }
        }
    }

    #[test]
    fn too_large_input_is_refused() {
        let mut c = Compressor::new();
        let big = vec![0u8; MAX_EXTENT + 1];
        let mut out = Vec::new();
        assert!(matches!(
            c.compress(CodecSpec::default(), &big, &mut out),
            Err(CodecError::TooLarge { .. })
        ));
    }

    #[test]
    fn extent_sizes() {
        assert!(check_extent_size(4096).is_ok());
        assert!(check_extent_size(128 * 1024).is_ok());
        assert!(check_extent_size(1 << 20).is_ok());
        assert!(check_extent_size(2048).is_err());
        assert!(check_extent_size(2 << 20).is_err());
        assert!(check_extent_size(100_000).is_err());
    }

    #[test]
    fn context_memory_grows_with_level() {
        let m1 = context_memory(
            CodecSpec::with_level(Algorithm::Zstd, 1).spec,
            DEFAULT_EXTENT,
        );
        let m15 = context_memory(
            CodecSpec::with_level(Algorithm::Zstd, 15).spec,
            DEFAULT_EXTENT,
        );
        assert!(m1 > 0 && m15 > m1, "{m1} {m15}");
    }
}
