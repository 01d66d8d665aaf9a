//! Malformed input for every decoder: truncations, bit flips, garbage, wrong lengths and huge
//! claimed sizes must give typed errors, never a panic.

use compfs_codec::{Algorithm, CodecError, CodecSpec, Compressor, Decompressor, MAX_EXTENT};

use crate::gen::{generate, Kind, Rng};

const DECODERS: [Algorithm; 5] = [
    Algorithm::Zstd,
    Algorithm::Lz4,
    Algorithm::Zlib,
    Algorithm::Lzo,
    Algorithm::None,
];

fn compressed(alg: Algorithm, input: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    Compressor::new()
        .compress(CodecSpec::default_for(alg), input, &mut out)
        .unwrap();
    out
}

/// Decoding may fail only with `Corrupt` (or `TooLarge` for an oversized destination); success
/// is allowed for damaged input only where the format has no checksum.
fn decode(
    d: &mut Decompressor,
    alg: Algorithm,
    src: &[u8],
    len: usize,
) -> Result<Vec<u8>, CodecError> {
    let mut dst = vec![0u8; len];
    d.decompress(alg, src, &mut dst).map(|()| dst)
}

fn assert_corrupt(r: &Result<Vec<u8>, CodecError>, what: &str) {
    match r {
        Err(CodecError::Corrupt { .. }) => {}
        other => panic!(
            "{what}: expected Corrupt, got {:?}",
            other.as_ref().map(|v| v.len())
        ),
    }
}

fn inputs() -> Vec<Vec<u8>> {
    vec![
        generate(Kind::Text, 20_000, 1),
        generate(Kind::Binary, 20_000, 2),
        generate(Kind::Random, 5_000, 3),
        generate(Kind::Zeros, 20_000, 4),
    ]
}

#[test]
fn every_truncation_is_corrupt() {
    let mut d = Decompressor::new();
    for alg in DECODERS {
        for input in inputs() {
            let z = compressed(alg, &input);
            // Every prefix near both ends, and a stride through the middle.
            let cuts = (0..z.len().min(64))
                .chain((64..z.len()).step_by(37))
                .chain(z.len().saturating_sub(64)..z.len());
            for cut in cuts {
                let r = decode(&mut d, alg, &z[..cut], input.len());
                assert_corrupt(&r, &format!("{alg} truncated to {cut} of {}", z.len()));
            }
        }
    }
}

#[test]
fn bit_flips_never_panic_and_checked_formats_detect_them() {
    let mut d = Decompressor::new();
    for alg in DECODERS {
        let input = generate(Kind::Text, 20_000, 11);
        let z = compressed(alg, &input);
        let mut rng = Rng::new(alg.id() as u64 + 100);
        let mut wrong = 0;
        let flips = 400;
        for _ in 0..flips {
            let mut bad = z.clone();
            let bit = rng.below(bad.len() * 8);
            bad[bit / 8] ^= 1 << (bit % 8);
            match decode(&mut d, alg, &bad, input.len()) {
                Err(CodecError::Corrupt { .. }) => {}
                Err(e) => panic!("{alg}: bit flip gave a non-Corrupt error {e:?}"),
                Ok(out) => {
                    if out != input {
                        wrong += 1;
                    }
                }
            }
        }
        // zlib (adler32) detects every flip that changes the output. zstd's frame checksum is off
        // (as in btrfs), so zstd, LZ4, LZO and raw may decode a flipped literal without noticing;
        // they must still never panic or overrun, which the loop above shows.
        if alg == Algorithm::Zlib {
            assert_eq!(wrong, 0, "zlib accepted {wrong} corrupted streams");
        }
    }
}

#[test]
fn random_garbage_is_rejected_or_bounded() {
    let mut d = Decompressor::new();
    let mut rng = Rng::new(77);
    for alg in DECODERS {
        for i in 0..300 {
            let n = rng.below(if i % 10 == 0 { 70_000 } else { 300 });
            let garbage: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            for len in [0usize, 1, 4096, 131_072] {
                match decode(&mut d, alg, &garbage, len) {
                    Ok(out) => assert_eq!(out.len(), len),
                    Err(CodecError::Corrupt { .. }) => {}
                    Err(e) => panic!("{alg}: garbage gave {e:?}"),
                }
            }
        }
    }
}

#[test]
fn garbage_after_a_valid_stream_or_wrong_lengths_are_corrupt() {
    let mut d = Decompressor::new();
    for alg in DECODERS {
        let input = generate(Kind::Binary, 30_000, 5);
        let z = compressed(alg, &input);
        assert_eq!(decode(&mut d, alg, &z, input.len()).unwrap(), input);
        for len in [
            0,
            1,
            input.len() - 1,
            input.len() + 1,
            input.len() * 2,
            MAX_EXTENT,
        ] {
            assert_corrupt(
                &decode(&mut d, alg, &z, len),
                &format!("{alg} with length {len}"),
            );
        }
        // The same stream with trailing bytes: zstd, zlib and LZO must notice. LZ4 blocks have
        // no end marker, so trailing bytes are read as another sequence and change the length.
        let mut longer = z.clone();
        longer.extend_from_slice(&[0x11, 0x22, 0x33, 0x44]);
        assert_corrupt(
            &decode(&mut d, alg, &longer, input.len()),
            &format!("{alg} + trailing"),
        );
    }
}

#[test]
fn destination_beyond_the_largest_extent_is_refused() {
    let mut d = Decompressor::new();
    for alg in DECODERS {
        let mut dst = vec![0u8; MAX_EXTENT + 1];
        assert!(matches!(
            d.decompress(alg, &[0u8; 16], &mut dst),
            Err(CodecError::TooLarge { .. })
        ));
    }
}

#[test]
fn huge_claimed_sizes_are_corrupt() {
    let mut d = Decompressor::new();
    let len = 131_072;

    // zstd: a frame whose header declares 1 TiB of content.
    let mut frame = vec![0x28, 0xB5, 0x2F, 0xFD];
    frame.push(0b1110_0000); // FCS field 8 bytes, single segment
    frame.extend_from_slice(&(1u64 << 40).to_le_bytes());
    frame.extend_from_slice(&[0x01, 0x00, 0x00]); // last raw block of 0 bytes
    assert_corrupt(
        &decode(&mut d, Algorithm::Zstd, &frame, len),
        "zstd 1 TiB frame",
    );

    // zstd: a frame asking for a 1 GiB window (beyond the 1 MiB limit set for extents).
    let mut frame = vec![0x28, 0xB5, 0x2F, 0xFD, 0x00, 20 << 3];
    frame.extend_from_slice(&[0x01, 0x00, 0x00]);
    assert_corrupt(
        &decode(&mut d, Algorithm::Zstd, &frame, len),
        "zstd 1 GiB window",
    );

    // zstd: a real frame of 1 MiB decoded into a 128 KiB extent.
    let big = compressed(Algorithm::Zstd, &vec![0u8; MAX_EXTENT]);
    assert_corrupt(&decode(&mut d, Algorithm::Zstd, &big, len), "zstd too long");

    // LZ4: a literal run whose length extension claims ~16 MB.
    let mut block = vec![0xF0];
    block.extend(std::iter::repeat_n(0xFF, 65_536));
    block.push(0x00);
    assert_corrupt(
        &decode(&mut d, Algorithm::Lz4, &block, len),
        "lz4 huge literal run",
    );

    // LZ4: a match whose length extension claims ~16 MB copied from offset 1.
    let mut block = vec![0x1F, b'a', 0x01, 0x00];
    block.extend(std::iter::repeat_n(0xFF, 65_536));
    block.push(0x00);
    assert_corrupt(
        &decode(&mut d, Algorithm::Lz4, &block, len),
        "lz4 huge match",
    );

    // LZ4: a match reaching before the start of the output.
    let block = [0x14, b'a', 0x00, 0x10, 0x50, b'x', b'y', b'z', b'w', b'v'];
    assert_corrupt(
        &decode(&mut d, Algorithm::Lz4, &block, len),
        "lz4 offset before start",
    );

    // LZO: a first literal run with a long length extension, then the end marker.
    let mut lzo = vec![0x00];
    lzo.extend(std::iter::repeat_n(0x00, 70_000));
    lzo.push(0xFF);
    lzo.extend_from_slice(&[0x11, 0x00, 0x00]);
    assert_corrupt(
        &decode(&mut d, Algorithm::Lzo, &lzo, len),
        "lzo huge literal run",
    );

    // LZO: a match before the start of the output.
    let lzo = [
        0x12,
        b'a',
        b'b',
        b'c',
        0x20 | 0x1F,
        0xFC,
        0xFF,
        0x11,
        0x00,
        0x00,
    ];
    assert_corrupt(
        &decode(&mut d, Algorithm::Lzo, &lzo, len),
        "lzo offset before start",
    );

    // zlib: a stored block declaring 65535 bytes with only a few present.
    let zlib = [0x78, 0x01, 0x01, 0xFF, 0xFF, 0x00, 0x00, b'a', b'b'];
    assert_corrupt(
        &decode(&mut d, Algorithm::Zlib, &zlib, len),
        "zlib short stored block",
    );

    // zlib: 2 MiB of zeros (a valid stream) into a 128 KiB extent.
    let mut enc = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(6));
    std::io::Write::write_all(&mut enc, &vec![0u8; 2 * MAX_EXTENT]).unwrap();
    let zlib = enc.finish().unwrap();
    assert_corrupt(
        &decode(&mut d, Algorithm::Zlib, &zlib, len),
        "zlib too long",
    );
}

#[test]
fn a_decoder_recovers_after_an_error() {
    // Contexts are reused per thread: a failed decode must not poison the next one.
    let mut d = Decompressor::new();
    for alg in DECODERS {
        let input = generate(Kind::Text, 10_000, 9);
        let z = compressed(alg, &input);
        let _ = decode(&mut d, alg, &z[..z.len() / 2], input.len());
        let _ = decode(&mut d, alg, &[0xFF; 100], input.len());
        assert_eq!(
            decode(&mut d, alg, &z, input.len()).unwrap(),
            input,
            "{alg}"
        );
    }
}
