//! Fuzz the zstd extent decoder: any input must decode or fail with CodecError::Corrupt.
#![no_main]

mod common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    common::decode(compfs_codec::Algorithm::Zstd, data);
});
