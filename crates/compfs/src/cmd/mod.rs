//! One module per command family.

pub mod blk;
pub mod defrag;
pub mod fs;
pub mod s3;
pub mod store;
