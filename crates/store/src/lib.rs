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
mod cache;
mod data;
mod error;
pub mod format;
mod fsck;
mod gc;
mod meta;
mod namespace;
mod pool;
pub mod powercut;
mod store;
mod types;

pub use compfs_codec::{CodecSpec, Mode};
pub use error::{Error, Result};
pub use fsck::{fsck, FsckProblem, FsckReport, ProblemKind};
pub use store::{uuid_string, Store, Tuning};
pub use types::*;
