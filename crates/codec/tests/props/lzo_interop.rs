//! LZO1X interoperability with the C minilzo reference (the `minilzo-rs` crate builds
//! Oberhumer's minilzo.c): our compressor's output must decode with `lzo1x_decompress_safe`, and
//! minilzo's `lzo1x_1_compress` output must decode with our decompressor, byte for byte.

use compfs_codec::{Algorithm, CodecSpec, Compressor, Decompressor, MAX_EXTENT};
use minilzo_rs::LZO;
use proptest::prelude::*;

use crate::gen::{generate, Kind, KINDS};

fn ours_to_reference(input: &[u8]) {
    let mut out = Vec::new();
    Compressor::new()
        .compress(CodecSpec::default_for(Algorithm::Lzo), input, &mut out)
        .unwrap();
    let lzo = LZO::init().unwrap();
    let back = lzo.decompress_safe(&out, input.len()).unwrap();
    assert!(back == input, "minilzo decoded our stream differently");
}

fn reference_to_ours(input: &[u8]) {
    let mut lzo = LZO::init().unwrap();
    let z = lzo.compress(input).unwrap();
    let mut back = vec![0u8; input.len()];
    Decompressor::new()
        .decompress(Algorithm::Lzo, &z, &mut back)
        .unwrap();
    assert!(back == input, "we decoded minilzo's stream differently");
}

#[test]
fn every_kind_and_max_extent_both_ways() {
    for kind in KINDS {
        for len in [0usize, 1, 3, 4, 5, 17, 4096, 131_072, MAX_EXTENT] {
            let input = generate(kind, len, len as u64 + 1);
            ours_to_reference(&input);
            reference_to_ours(&input);
        }
    }
}

#[test]
fn our_compressor_matches_the_reference_bytes() {
    // rust-lzo is a translation of minilzo's lzo1x_1_compress, so the streams should be equal;
    // this pins that down (a different but valid stream would still interoperate).
    for kind in KINDS {
        let input = generate(kind, 100_000, 3);
        let mut ours = Vec::new();
        Compressor::new()
            .compress(CodecSpec::default_for(Algorithm::Lzo), &input, &mut ours)
            .unwrap();
        let theirs = LZO::init().unwrap().compress(&input).unwrap();
        assert!(ours == theirs, "{kind:?}: streams differ");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn random_inputs_interoperate(
        kind in prop::sample::select(KINDS.to_vec()),
        len in 0usize..200_000,
        seed in any::<u64>(),
    ) {
        let input = generate(kind, len, seed);
        ours_to_reference(&input);
        reference_to_ours(&input);
    }
}

#[test]
fn reference_rejects_nothing_we_accept_on_text() {
    // Also cross-check a realistic text mix the reference compressor produced at max extent.
    let input = generate(Kind::Mixed, MAX_EXTENT, 42);
    reference_to_ours(&input);
    ours_to_reference(&input);
}
