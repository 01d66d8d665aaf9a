//! Round trips for every codec and level.

use compfs_codec::{
    max_compressed_len, Algorithm, Compressor, Decompressor, ExtentEncoder, ExtentOutcome,
    ExtentPolicy, Mode, RawReason, MAX_EXTENT,
};
use proptest::prelude::*;

use crate::gen::{all_specs, generate, Kind, KINDS};

fn check_round_trip(c: &mut Compressor, d: &mut Decompressor, input: &[u8]) {
    let mut out = Vec::new();
    let mut back = vec![0u8; input.len()];
    for spec in all_specs() {
        let n = c.compress(spec, input, &mut out).unwrap();
        assert_eq!(n, out.len(), "{spec}");
        assert!(
            n <= max_compressed_len(spec.algorithm(), input.len()),
            "{spec}"
        );
        back.fill(0xA5);
        d.decompress(spec.algorithm(), &out, &mut back).unwrap();
        assert!(back == input, "{spec}: round trip differs");
    }
}

fn kind() -> impl Strategy<Value = Kind> {
    prop::sample::select(KINDS.to_vec())
}

fn len() -> impl Strategy<Value = usize> {
    prop_oneof![0usize..=64, 65usize..=8192, 8193usize..=(256 * 1024)]
}

proptest! {
    // Each case runs all 46 codec/level combinations, so a handful of cases covers a lot.
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn every_codec_and_level_round_trips(kind in kind(), len in len(), seed in any::<u64>()) {
        let input = generate(kind, len, seed);
        let mut c = Compressor::new();
        let mut d = Decompressor::new();
        check_round_trip(&mut c, &mut d, &input);
    }

    #[test]
    fn extent_encoder_output_decodes(kind in kind(), len in len(), seed in any::<u64>()) {
        // Whatever ExtentEncoder decides, a Compressed outcome must decode to the input and must
        // save at least one sector; Raw must come with a reason consistent with the mode.
        let input = generate(kind, len, seed);
        let mut e = ExtentEncoder::new();
        let mut d = Decompressor::new();
        let mut dst = Vec::new();
        for spec in all_specs().into_iter().step_by(3) {
            for mode in [Mode::Force, Mode::Heuristic] {
                let policy = ExtentPolicy::new(spec, mode);
                match e.encode(&policy, &input, &mut dst).unwrap() {
                    ExtentOutcome::Compressed { len } => {
                        prop_assert_eq!(len, dst.len());
                        prop_assert!(len.div_ceil(4096) < input.len().div_ceil(4096));
                        let mut back = vec![0u8; input.len()];
                        d.decompress(spec.algorithm(), &dst, &mut back).unwrap();
                        prop_assert!(back == input);
                    }
                    ExtentOutcome::Raw(RawReason::NoCompression) => {
                        prop_assert_eq!(spec.algorithm(), Algorithm::None)
                    }
                    ExtentOutcome::Raw(RawReason::Heuristic(_)) => {
                        prop_assert_eq!(mode, Mode::Heuristic)
                    }
                    ExtentOutcome::Raw(RawReason::NotWorthIt) => {}
                }
            }
        }
    }
}

#[test]
fn max_size_extents_round_trip_at_every_level() {
    let mut c = Compressor::new();
    let mut d = Decompressor::new();
    // Random max-size extents are covered by the unit tests in codec.rs.
    for kind in [Kind::Zeros, Kind::Text, Kind::Binary] {
        check_round_trip(&mut c, &mut d, &generate(kind, MAX_EXTENT, 7));
    }
}

#[test]
fn empty_input_round_trips() {
    check_round_trip(&mut Compressor::new(), &mut Decompressor::new(), &[]);
}

#[test]
fn contexts_survive_level_and_algorithm_switches() {
    // One context pair, levels visited in a scrambled order with different inputs each time:
    // a stale parameter or dictionary carried across calls would break a round trip.
    let mut c = Compressor::new();
    let mut d = Decompressor::new();
    let specs = all_specs();
    let mut out = Vec::new();
    for i in 0..specs.len() * 2 {
        let spec = specs[(i * 17) % specs.len()];
        let input = generate(KINDS[i % KINDS.len()], 1000 + i * 997, i as u64);
        c.compress(spec, &input, &mut out).unwrap();
        let mut back = vec![0u8; input.len()];
        d.decompress(spec.algorithm(), &out, &mut back).unwrap();
        assert!(back == input, "{spec} at step {i}");
    }
}
