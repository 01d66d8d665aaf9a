//! Typed errors of the block device.

use compfs_codec::CodecError;

/// Errors of the page store, the NBD server and the control channel.
#[derive(Debug, thiserror::Error)]
pub enum BlkError {
    /// A request touches bytes past the end of the device.
    #[error("request of {len} bytes at offset {offset} is outside the {size}-byte device")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    /// The memory limit (`--mem-limit`) does not leave room for the write.
    #[error("memory limit of {limit} bytes reached")]
    NoSpace { limit: u64 },
    /// The device size is not usable.
    #[error("device size {0} is not a positive multiple of 4096 bytes")]
    BadSize(u64),
    /// More recompression codecs than zram allows.
    #[error("at most 3 recompression codecs are allowed, got {0}")]
    TooManyRecomp(usize),
    /// `writeback` without a backing file.
    #[error("no backing file configured; start the server with --backing FILE")]
    NoBacking,
    /// `recompress` without secondary codecs.
    #[error("no recompression codec configured; start the server with --recomp-algo ALG")]
    NoRecomp,
    /// A stored page failed to decompress or its object is missing (a bug or memory corruption).
    #[error("page {page} is unreadable: {detail}")]
    Corrupt { page: u64, detail: String },
    /// Compression failed.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// The backing file failed.
    #[error("backing file I/O failed: {0}")]
    BackingIo(std::io::Error),
    /// The pool could not address another object.
    #[error("page pool exhausted: {0}")]
    Pool(crate::pool::PoolError),
    /// A socket or file operation of the server failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// `--dict` with a codec other than zstd.
    #[error("--dict needs a zstd codec (--algo zstd[:LEVEL]); the codec is {0}")]
    DictNeedsZstd(String),
    /// A dictionary file that is not a usable zstd dictionary.
    #[error("dictionary {path}: {source}")]
    DictFile {
        path: String,
        #[source]
        source: compfs_codec::DictError,
    },
    /// The peer broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server's `stat` reply lacks a line or has one it cannot read.
    #[error("the server sent {0}")]
    StatReply(&'static str),
    /// The control channel returned an error.
    #[error("{0}")]
    Remote(String),
}

impl BlkError {
    /// The NBD error number a client sees for this error.
    pub fn errno(&self) -> u32 {
        match self {
            BlkError::OutOfRange { .. } => crate::nbd::EINVAL,
            BlkError::NoSpace { .. } => crate::nbd::ENOSPC,
            _ => crate::nbd::EIO,
        }
    }

    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> BlkError {
        BlkError::Io {
            what: what.into(),
            source,
        }
    }
}
