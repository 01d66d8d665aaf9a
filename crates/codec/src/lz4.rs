//! LZ4 block format through the reference C library (liblz4, built by `lz4-sys`), with one
//! compression state per context so compressing an extent allocates nothing. The block format is
//! the same as any other LZ4 implementation's; liblz4 is used for speed and for ratios identical
//! to the `lz4` command-line tool's.

use std::os::raw::{c_char, c_int, c_void};

// Links the static liblz4 that lz4-sys builds; the functions below are declared here because
// lz4-sys does not bind the ext-state API.
use lz4_sys as _;

extern "C" {
    // lz4.h (public since 1.9): the size of LZ4_stream_t.
    fn LZ4_sizeofState() -> c_int;
    // lz4.h: initialises a state once; afterwards `_fastReset` may reuse it.
    fn LZ4_initStream(buffer: *mut c_void, size: usize) -> *mut c_void;
    // lz4.h (static-linking API, exported by the static library lz4-sys builds): compresses
    // with a caller-owned, already-initialised state, resetting only what is needed.
    fn LZ4_compress_fast_extState_fastReset(
        state: *mut c_void,
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        acceleration: c_int,
    ) -> c_int;
    fn LZ4_decompress_safe(
        src: *const c_char,
        dst: *mut c_char,
        compressed_size: c_int,
        dst_capacity: c_int,
    ) -> c_int;
}

/// Worst-case compressed size of `len` bytes (LZ4_COMPRESSBOUND).
pub const fn compress_bound(len: usize) -> usize {
    len + len / 255 + 16
}

/// Bytes one compression state holds (LZ4_sizeofState(), 16 KiB in liblz4 1.10).
pub fn state_bytes() -> usize {
    // SAFETY: a pure function of the library's configuration.
    unsafe { LZ4_sizeofState() }.max(0) as usize
}

/// An LZ4 compression context: one LZ4_stream_t, 8-byte aligned, initialised once.
pub struct Lz4 {
    state: Box<[u64]>,
}

impl std::fmt::Debug for Lz4 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lz4")
            .field("state_bytes", &(self.state.len() * 8))
            .finish()
    }
}

impl Lz4 {
    /// Returns None if liblz4 refuses to initialise the state (it never does for an aligned
    /// buffer of LZ4_sizeofState() bytes).
    pub fn new() -> Option<Lz4> {
        let words = state_bytes().div_ceil(8);
        let mut state = vec![0u64; words].into_boxed_slice();
        // SAFETY: the buffer is 8-byte aligned and at least LZ4_sizeofState() bytes long.
        let p = unsafe { LZ4_initStream(state.as_mut_ptr().cast(), words * 8) };
        if p.is_null() {
            return None;
        }
        Some(Lz4 { state })
    }

    /// Compresses `src` (at most i32::MAX bytes; callers pass at most one extent) into `dst` and
    /// returns the compressed length, or None if `dst` is too small.
    pub fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        let src_len = c_int::try_from(src.len()).ok()?;
        let cap = c_int::try_from(dst.len()).unwrap_or(c_int::MAX);
        // SAFETY: state was initialised by LZ4_initStream and is exclusively borrowed; src and dst
        // are valid for the lengths passed; liblz4 writes at most `cap` bytes into dst.
        let n = unsafe {
            LZ4_compress_fast_extState_fastReset(
                self.state.as_mut_ptr().cast(),
                src.as_ptr().cast(),
                dst.as_mut_ptr().cast(),
                src_len,
                cap,
                1,
            )
        };
        (n > 0 || src.is_empty()).then_some(n.max(0) as usize)
    }
}

/// Decompresses one LZ4 block into `dst`; returns the decoded length or None if the block is
/// malformed or would exceed `dst`. LZ4_decompress_safe never reads or writes out of bounds.
pub fn decompress(src: &[u8], dst: &mut [u8]) -> Option<usize> {
    let src_len = c_int::try_from(src.len()).ok()?;
    let cap = c_int::try_from(dst.len()).ok()?;
    // SAFETY: src and dst are valid for the lengths passed; the _safe decoder checks every read
    // against src_len and every write against cap.
    let n =
        unsafe { LZ4_decompress_safe(src.as_ptr().cast(), dst.as_mut_ptr().cast(), src_len, cap) };
    (n >= 0).then_some(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_format_compatibility_with_lz4_flex() {
        let text: Vec<u8> = b"an lz4 block, an lz4 block, a block"
            .iter()
            .cycle()
            .take(100_000)
            .copied()
            .collect();
        let mut c = Lz4::new().unwrap();
        let mut z = vec![0u8; compress_bound(text.len())];
        let n = c.compress(&text, &mut z).unwrap();
        let mut back = vec![0u8; text.len()];
        assert_eq!(decompress(&z[..n], &mut back), Some(text.len()));
        assert_eq!(back, text);
        // Same block format as an independent implementation, both ways.
        assert_eq!(
            lz4_flex::block::decompress(&z[..n], text.len()).unwrap(),
            text
        );
        let flex = lz4_flex::block::compress(&text);
        assert_eq!(decompress(&flex, &mut back), Some(text.len()));
        assert_eq!(back, text);
    }

    #[test]
    fn empty_and_too_small_destination() {
        let mut c = Lz4::new().unwrap();
        let mut z = vec![0u8; 16];
        let n = c.compress(&[], &mut z).unwrap();
        let mut back = [0u8; 0];
        assert_eq!(decompress(&z[..n], &mut back), Some(0));
        assert_eq!(c.compress(&[7u8; 1000], &mut [0u8; 2]), None);
    }
}
