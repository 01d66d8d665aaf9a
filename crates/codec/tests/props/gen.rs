//! Inputs of the property tests: the shared generators of compfs-testdata, and every codec spec.

use compfs_codec::{Algorithm, CodecSpec};
pub use compfs_testdata::{generate, Kind, Rng, KINDS};

/// Every codec and level the layer accepts, extensions (zstd 16..19) included.
pub fn all_specs() -> Vec<CodecSpec> {
    let mut v = vec![
        CodecSpec::none(),
        CodecSpec::default_for(Algorithm::Lzo),
        CodecSpec::default_for(Algorithm::Lz4),
    ];
    for l in 1..=9 {
        v.push(CodecSpec::with_level(Algorithm::Zlib, l).spec);
    }
    for l in (-15..=19).filter(|l| *l != 0) {
        let p = CodecSpec::with_level(Algorithm::Zstd, l);
        assert!(p.adjustment.is_none(), "zstd:{l} must be accepted as is");
        v.push(p.spec);
    }
    v
}
