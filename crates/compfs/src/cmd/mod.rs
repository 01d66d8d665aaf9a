//! One module per command family.

pub mod bench_blk;
pub mod bench_codecs;
pub mod bench_fs;
pub mod bench_heuristic;
pub mod blk;
pub mod fs;
pub mod store;
pub mod util;
