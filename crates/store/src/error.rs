//! Typed errors of the store, each with its errno.

use std::path::PathBuf;

use crate::types::Ino;

/// Result with the store's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("file name longer than 255 bytes")]
    NameTooLong,
    #[error("operation not permitted: {0}")]
    NotPermitted(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("no such extended attribute")]
    NoXattr,
    /// `SEEK_DATA`/`SEEK_HOLE` beyond the end of file (ENXIO).
    #[error("no data at or after the offset")]
    NoData,
    #[error("store is read-only: {0}")]
    ReadOnly(String),
    #[error("no space left on the device holding the store")]
    NoSpace,
    /// An extent failed its checksum, header check or decompression.
    #[error("corrupt extent of inode {ino} at file offset {offset}: segment {segment} offset {seg_offset}: {detail}")]
    Corrupt {
        ino: Ino,
        offset: u64,
        segment: u64,
        seg_offset: u64,
        detail: String,
    },
    /// The metadata database is damaged or inconsistent.
    #[error("corrupt store metadata: {0}")]
    CorruptMetadata(String),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("{} is not a compfs store: {reason}", path.display())]
    NotAStore { path: PathBuf, reason: String },
    #[error("{} has store format version {found}; this compfs reads versions up to {supported}", path.display())]
    UnsupportedVersion {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("bad superblock {}: {reason}", path.display())]
    BadSuperblock { path: PathBuf, reason: String },
    #[error("{} already holds a compfs store or other files; use --force to overwrite it", .0.display())]
    AlreadyExists(PathBuf),
    #[error("store {} is in use by another process (mounted?); unmount it first", .0.display())]
    InUse(PathBuf),
    /// A store in a bucket whose lease another mount holds (the message names it).
    #[error("{0}")]
    LeaseHeld(String),
}

impl Error {
    /// The errno a filesystem should return for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound => libc::ENOENT,
            Error::Exists | Error::AlreadyExists(_) => libc::EEXIST,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::NotEmpty => libc::ENOTEMPTY,
            Error::NameTooLong => libc::ENAMETOOLONG,
            Error::NotPermitted(_) => libc::EPERM,
            Error::InvalidArgument(_) => libc::EINVAL,
            Error::NoXattr => libc::ENODATA,
            Error::NoData => libc::ENXIO,
            Error::ReadOnly(_) => libc::EROFS,
            Error::NoSpace => libc::ENOSPC,
            Error::InUse(_) | Error::LeaseHeld(_) => libc::EBUSY,
            Error::Io(e) => match e.raw_os_error() {
                Some(n) => n,
                None => libc::EIO,
            },
            Error::Corrupt { .. }
            | Error::CorruptMetadata(_)
            | Error::NotAStore { .. }
            | Error::UnsupportedVersion { .. }
            | Error::BadSuperblock { .. } => libc::EIO,
        }
    }

    /// Whether this error comes from the storage under the store (an I/O error, a full disk,
    /// metadata redb could not read or write) rather than from the operation's arguments. A
    /// storage error during a write latches the store read-only.
    pub fn is_storage(&self) -> bool {
        matches!(
            self,
            Error::Io(_) | Error::NoSpace | Error::CorruptMetadata(_)
        )
    }

    /// Turns an I/O error into [`Error::NoSpace`] when it is ENOSPC.
    pub(crate) fn from_io(e: std::io::Error) -> Error {
        if e.raw_os_error() == Some(libc::ENOSPC) {
            Error::NoSpace
        } else {
            Error::Io(e)
        }
    }
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Error {
                Error::from(redb::Error::from(e))
            }
        }
    )*};
}
from_redb!(
    redb::StorageError,
    redb::TableError,
    redb::TransactionError,
    redb::CommitError,
    redb::DatabaseError,
    redb::SetDurabilityError
);

impl From<redb::Error> for Error {
    fn from(e: redb::Error) -> Error {
        match e {
            redb::Error::Io(io) => Error::from_io(io),
            // redb refuses every call after an I/O error on its file until it is reopened.
            redb::Error::PreviousIo => Error::Io(std::io::Error::other(
                "an earlier I/O error on the metadata database (meta.redb); reopen the store",
            )),
            other => Error::CorruptMetadata(other.to_string()),
        }
    }
}
