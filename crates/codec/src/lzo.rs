//! LZO1X-1 compression, the algorithm of `lzo1x_1_compress()` in Oberhumer's minilzo (the one
//! the kernel's lzo1x_compress.c and btrfs use), in safe Rust with a reusable dictionary.
//!
//! The stream format and the match-finding are minilzo's, so the output is byte-for-byte the
//! reference compressor's (checked against the C minilzo in tests/props/lzo_interop.rs).
//! Decompression is done by the `lzo1x` crate, an independent implementation.

/// minilzo's D_BITS for LZO1X-1: a 16 K-entry dictionary.
const D_BITS: u32 = 14;
const DICT_LEN: usize = 1 << D_BITS;
/// minilzo compresses in blocks of at most 48 KiB so that dictionary entries fit in 16 bits.
const BLOCK: usize = 49_152;

const M2_MAX_LEN: usize = 8;
const M3_MAX_LEN: usize = 33;
const M4_MAX_LEN: usize = 9;
const M2_MAX_OFFSET: usize = 0x0800;
const M3_MAX_OFFSET: usize = 0x4000;
const M3_MARKER: u8 = 32;
const M4_MARKER: u8 = 16;

/// Worst-case compressed size of `len` bytes, as minilzo documents it.
pub const fn worst_compress(len: usize) -> usize {
    len + len / 16 + 64 + 3
}

/// Bytes of dictionary a compression context holds (16 K entries of 16 bits).
pub const DICT_BYTES: usize = DICT_LEN * 2;

/// An LZO1X-1 compression context: only the hash dictionary, reused across calls.
pub struct Lzo1x1 {
    dict: Box<[u16]>,
}

impl Default for Lzo1x1 {
    fn default() -> Self {
        Self::new()
    }
}

fn read_u32(s: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&s[at..at + 4]);
    u32::from_le_bytes(b)
}

fn read_u64(s: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&s[at..at + 8]);
    u64::from_le_bytes(b)
}

/// A cursor over the output buffer.
struct Out<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl Out<'_> {
    fn byte(&mut self, b: u8) {
        self.buf[self.pos] = b;
        self.pos += 1;
    }
    fn bytes(&mut self, s: &[u8]) {
        self.buf[self.pos..self.pos + s.len()].copy_from_slice(s);
        self.pos += s.len();
    }
    /// A run-length extension: zero bytes for each 255, then the remainder.
    fn extension(&mut self, mut n: usize) {
        while n > 255 {
            n -= 255;
            self.byte(0);
        }
        self.byte(n as u8);
    }
    /// A literal run of `lit` after the previous instruction (or at the start of the stream).
    fn literals(&mut self, lit: &[u8]) {
        let t = lit.len();
        match t {
            0 => {}
            // Up to 3 literals ride in the low bits of the previous match's last-but-one byte.
            1..=3 => self.buf[self.pos - 2] |= t as u8,
            4..=18 => self.byte(t as u8 - 3),
            _ => {
                self.byte(0);
                self.extension(t - 18);
            }
        }
        self.bytes(lit);
    }
}

impl Lzo1x1 {
    pub fn new() -> Lzo1x1 {
        Lzo1x1 {
            dict: vec![0u16; DICT_LEN].into_boxed_slice(),
        }
    }

    /// Compresses `src` into `dst`, which must hold at least [`worst_compress`]`(src.len())`
    /// bytes, and returns the compressed length. Panics (index out of bounds) only if `dst` is
    /// shorter than that, which callers guarantee.
    pub fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> usize {
        let mut out = Out { buf: dst, pos: 0 };
        let mut pos = 0usize;
        let mut left = src.len();
        // Literals carried over from the previous block, not yet written.
        let mut pending = 0usize;
        while left > 20 {
            let ll = left.min(BLOCK);
            if (pending + ll) >> 5 == 0 {
                break;
            }
            self.dict.fill(0);
            pending = self.compress_block(src, pos, ll, pending, &mut out);
            pos += ll;
            left -= ll;
        }
        pending += left;
        if pending > 0 {
            let lit = &src[src.len() - pending..];
            if out.pos == 0 && pending <= 238 {
                out.byte(17 + pending as u8);
                out.bytes(lit);
            } else {
                out.literals(lit);
            }
        }
        // End of stream: an M4 match of distance 0.
        out.bytes(&[M4_MARKER | 1, 0, 0]);
        out.pos
    }

    /// minilzo's `lzo1x_1_do_compress` over `src[start..start + len]` with `carried` literals
    /// before `start` still unwritten. Returns the literals left unwritten at the block's end.
    fn compress_block(
        &mut self,
        src: &[u8],
        start: usize,
        len: usize,
        carried: usize,
        out: &mut Out<'_>,
    ) -> usize {
        let ip_end = start + len - 20;
        let mut ip = start;
        let mut ii = start; // start of the current literal run
        let mut ti = carried;
        if ti < 4 {
            ip += 4 - ti;
        }
        ip += 1 + ((ip - ii) >> 5);
        'outer: loop {
            // Find a 4-byte match, skipping faster the longer the literal run gets.
            let m_pos = loop {
                if ip >= ip_end {
                    break 'outer;
                }
                let dv = read_u32(src, ip);
                let di = (0x1824_429d_u32.wrapping_mul(dv) >> (32 - D_BITS)) as usize;
                let m = start + self.dict[di] as usize;
                // ip - start < BLOCK (48 KiB), so it fits in 16 bits.
                self.dict[di] = (ip - start) as u16;
                if dv == read_u32(src, m) {
                    break m;
                }
                ip += 1 + ((ip - ii) >> 5);
            };
            ii -= ti;
            ti = 0;
            out.literals(&src[ii..ip]);

            let mut m_len = 4usize;
            loop {
                let v = read_u64(src, ip + m_len) ^ read_u64(src, m_pos + m_len);
                if v != 0 {
                    m_len += v.trailing_zeros() as usize / 8;
                    break;
                }
                m_len += 8;
                if ip + m_len >= ip_end {
                    break;
                }
            }
            let mut m_off = ip - m_pos;
            ip += m_len;
            ii = ip;
            if m_len <= M2_MAX_LEN && m_off <= M2_MAX_OFFSET {
                m_off -= 1;
                out.byte((((m_len - 1) << 5) | ((m_off & 7) << 2)) as u8);
                out.byte((m_off >> 3) as u8);
            } else if m_off <= M3_MAX_OFFSET {
                m_off -= 1;
                if m_len <= M3_MAX_LEN {
                    out.byte(M3_MARKER | (m_len - 2) as u8);
                } else {
                    out.byte(M3_MARKER);
                    out.extension(m_len - M3_MAX_LEN);
                }
                out.byte((m_off << 2) as u8);
                out.byte((m_off >> 6) as u8);
            } else {
                m_off -= 0x4000;
                let hi = ((m_off >> 11) & 8) as u8;
                if m_len <= M4_MAX_LEN {
                    out.byte(M4_MARKER | hi | (m_len - 2) as u8);
                } else {
                    out.byte(M4_MARKER | hi);
                    out.extension(m_len - M4_MAX_LEN);
                }
                out.byte((m_off << 2) as u8);
                out.byte((m_off >> 6) as u8);
            }
        }
        start + len - (ii - ti)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_stream_for_a_short_run() {
        // 100 x 0xaa: the stream minilzo produces (and the lzo1x crate documents as 34 bytes).
        let mut c = Lzo1x1::new();
        let mut dst = vec![0u8; worst_compress(100)];
        let n = c.compress(&[0xaa; 100], &mut dst);
        assert_eq!(n, 34);
        let mut back = [0u8; 100];
        lzo1x::decompress(&dst[..n], &mut back).unwrap();
        assert_eq!(back, [0xaa; 100]);
    }

    #[test]
    fn tiny_inputs_are_literal_only() {
        let mut c = Lzo1x1::new();
        for len in 0..=21usize {
            let src: Vec<u8> = (0..len as u8).collect();
            let mut dst = vec![0u8; worst_compress(len)];
            let n = c.compress(&src, &mut dst);
            let mut back = vec![0u8; len];
            lzo1x::decompress(&dst[..n], &mut back).unwrap();
            assert_eq!(back, src);
        }
    }
}
