//! compfs store: a crash-safe, compressed extent store holding a whole POSIX-like tree.
//!
//! The store keeps inodes (regular files, directories, symlinks, device nodes, FIFOs, sockets),
//! directory entries, extended attributes and file data. File data lives in compressed extents
//! appended to segment files; all metadata lives in a [redb] database. The on-disk format and the
//! commit protocol are described in `docs/format.md` of the repository; the short version:
//!
//! * extent bytes are appended to a segment before the metadata transaction that references
//!   them commits, and every segment with unsynced bytes is `fdatasync`ed **before** any
//!   durable commit (inside its write lock), so durable metadata never references unsynced data;
//! * ordinary operations commit metadata with redb's non-durable commits (rolled back by a
//!   crash); [`Store::fsync`], [`Store::sync`], [`Store::close`] and the background flusher
//!   (every 5 s) finish with a durable commit, which makes everything acknowledged before it
//!   durable;
//! * redb may also come back at a non-durable commit (its close makes one durable), so no write
//!   that can carry redb's header reaches `meta.redb` while a segment has unsynced bytes
//!   ([`backend::SegSync`]); simulated power cuts ([`powercut`], `tests/power_loss.rs`) check
//!   both outcomes;
//! * after any failed segment write, sync or commit the store turns read-only
//!   ([`Error::ReadOnly`]) instead of guessing what reached the disk.
//!
//! All methods take `&self`; a [`Store`] is `Send + Sync` and is meant to be shared in an `Arc`.
//!
//! Differences from `notes/store-api.md`: the per-inode open is [`Store::open_file`] (Rust has
//! no overloading, and `Store::open` opens a store); [`Error::ReadOnly`] carries the reason.
//! Additions: [`Tuning`] with
//! [`Store::create_tuned`] / [`Store::open_tuned`] (segment size, inline limit, flush interval,
//! storage backend for fault injection), [`Error::NotPermitted`] (EPERM, e.g. hard link to a
//! directory), [`Error::InUse`] (another process has the store open), [`Error::BadSuperblock`].

mod attrs;
pub mod backend;
mod background;
mod bgcomp;
mod cache;
mod defrag;
mod dict;
mod encode;
mod error;
mod file;
mod fileops;
mod flush;
mod fsck;
mod gc;
mod meta;
mod namespace;
pub mod object;
mod open;
mod pack;
mod pool;
pub mod powercut;
mod prealloc;
mod prefetch;
mod read;
mod records;
mod segment;
pub mod serve_lock;
mod span;
mod stats;
mod store;
mod txn;
mod types;
mod writeback;

/// The parts of the on-disk layout that tools outside the store need: file names, header sizes
/// and the superblock (see `docs/format.md`). The record encodings stay private to the store.
pub mod format {
    /// Every record encoding, for the store's own tests (feature `internals`); not API.
    #[cfg(feature = "internals")]
    #[doc(hidden)]
    pub use crate::records::*;
    pub use crate::records::{
        Superblock, EXT_HEADER_LEN, FORMAT_VERSION, META_FILE, SEGMENT_DIR, SEG_HEADER_LEN,
        SUPERBLOCK_FILE,
    };
}

pub use bgcomp::{
    BackgroundPolicy, BackgroundStats, BACKGROUND_XATTR, DEFAULT_BACKGROUND_DELAY, IDLE_AFTER,
};
pub use compfs_codec::{CodecSpec, MinSaving, Mode};
pub use defrag::{DefragReport, DefragTarget};
pub use error::{Error, Result};
pub use fsck::{fsck, FsckProblem, FsckReport, ProblemKind};
pub use open::uuid_string;
pub use pack::DEFAULT_PACK;
pub use serve_lock::{wait_until_released, ServeLock};
pub use stats::codec_level_label;
pub use store::{Store, Tuning};
pub use types::*;
