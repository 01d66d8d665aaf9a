//! compfs's benchmark harness, the library behind `compfs bench …`.
//!
//! One module per benchmark, each with its command-line [`clap::Args`] and a `run` that prints
//! a table a person can read and, on request, writes a JSON file and an SVG plot beside it:
//!
//! * [`codecs`]: every codec and level on files cut into extent-sized blocks (ratio, speed,
//!   context memory), optionally beside the `zstd -b` / `lz4 -b` figures;
//! * [`fs`]: the mounted filesystem against kernel btrfs (copy, read, untar, fio), bindfs as
//!   the FUSE floor of the untar;
//! * [`bonnie`]: Bonnie++ on compfs, kernel btrfs, ext4 and xfs per method (seed 004), with the
//!   compfs daemon's CPU and the ratio reached;
//! * [`creates`]: empty-file creates, stats and unlinks on compfs, on the null FUSE
//!   filesystem (the floor of any FUSE daemon) and on kernel btrfs;
//! * [`store`]: the store API without FUSE (write scaling, read-back, GC, random overwrites);
//! * [`blk`]: `compfs blk` against kernel zram and nbdkit's memory plugin;
//! * [`heuristic`]: the "compress this extent?" heuristic against real outcomes;
//! * [`recompress`]: `compfs defrag -c zstd:9` of a corpus written at zstd:1 against writing
//!   at zstd:9 directly;
//! * [`extsize`]: ratio against cold 4 KiB random-read IOPS per `compfs.extent_size`.
//!
//! Shared parts: [`corpus`] (the one corpus unpacker and file readers), [`fio`] (the one fio
//! runner) and [`plot`] (every SVG). Temporary directories come from `tempfile` and are removed
//! when a run ends, also on error. `fs`, `bonnie` and `blk` start daemons by running the current
//! executable (`compfs mount`, `compfs blk serve`), so they must be called from `compfs`.

pub mod background;
pub mod blk;
pub mod bonnie;
pub mod codecs;
pub mod corpus;
pub mod creates;
mod error;
pub mod extsize;
pub mod fio;
pub mod fs;
pub mod heuristic;
pub mod mounts;
pub mod objstore;
pub mod plot;
pub mod recompress;
pub mod recompress_mount;
pub mod smallfiles;
pub mod store;

pub use error::{Context, Error, Result};
