//! Fuzz compress -> decompress for every algorithm: the first byte picks the codec and level.
#![no_main]

use compfs_codec::{Algorithm, CodecSpec, Compressor, Decompressor};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&sel, input)) = data.split_first() else {
        return;
    };
    let spec = match sel % 5 {
        0 => CodecSpec::default_for(Algorithm::Lzo),
        1 => CodecSpec::default_for(Algorithm::Lz4),
        2 => CodecSpec::with_level(Algorithm::Zlib, 1 + (sel / 5) as i32 % 9).spec,
        3 => CodecSpec::with_level(Algorithm::Zstd, -15 + (sel / 5) as i32 % 31).spec,
        _ => CodecSpec::none(),
    };
    let mut z = Vec::new();
    Compressor::new().compress(spec, input, &mut z).unwrap();
    let mut back = vec![0u8; input.len()];
    Decompressor::new()
        .decompress(spec.algorithm(), &z, &mut back)
        .unwrap();
    assert_eq!(back, input, "{spec}");
});
