//! compfs codec layer: codec specs in btrfs syntax with one level table, reusable per-thread
//! compression contexts, the "is it worth it" rule, and the compression heuristic.
//!
//! Everything above this crate (the extent store, the filesystem, the block device) compresses
//! through [`ExtentEncoder`] and decompresses through [`Decompressor`].

pub mod codec;
pub mod dict;
pub mod error;
pub mod extent;
pub mod heuristic;
pub mod lz4;
pub mod lzo;
pub mod size;
pub mod spec;

pub use codec::{
    check_extent_size, context_memory, max_compressed_len, Compressor, Decompressor,
    DEFAULT_EXTENT, MAX_EXTENT, MIN_EXTENT, SECTOR,
};
pub use dict::{DictError, Dictionary};
pub use error::{CodecError, SpecError};
pub use extent::{worth_it, ExtentEncoder, ExtentOutcome, ExtentPolicy, MinSaving, RawReason};
pub use heuristic::{btrfs_heuristic, Heuristic, Reason, Verdict};
pub use size::{human, parse_size, SizeError};
pub use spec::{
    bare_compress, parse_level_list, Algorithm, AlgorithmInfo, CodecSpec, LevelAdjustment, Mode,
    Parsed, ALGORITHMS, VALID_FORMS,
};
