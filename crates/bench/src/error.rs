//! The benchmark harness's error: a failed step, described for the person running it.

use std::fmt::Display;

/// Why a benchmark stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A step failed; the message says which and why (`what: cause`).
    #[error("{0}")]
    Failed(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Codec(#[from] compfs_codec::CodecError),
    #[error(transparent)]
    Spec(#[from] compfs_codec::SpecError),
    #[error(transparent)]
    Size(#[from] compfs_codec::SizeError),
    #[error(transparent)]
    Store(#[from] compfs_store::Error),
    #[error(transparent)]
    Usage(#[from] compfs_fs::UsageError),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `what: cause` for a failed step, the way a person reads it in one line.
pub trait Context<T> {
    fn context(self, what: impl Display) -> Result<T>;
    fn with_context<D: Display>(self, what: impl FnOnce() -> D) -> Result<T>;
}

impl<T, E: Display> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl Display) -> Result<T> {
        self.map_err(|e| Error::Failed(format!("{what}: {e}")))
    }
    fn with_context<D: Display>(self, what: impl FnOnce() -> D) -> Result<T> {
        self.map_err(|e| Error::Failed(format!("{}: {e}", what())))
    }
}

/// An [`Error::Failed`] from a format string.
macro_rules! failed {
    ($($t:tt)*) => { $crate::error::Error::Failed(format!($($t)*)) };
}

/// Returns an [`Error::Failed`] from a format string.
macro_rules! bail {
    ($($t:tt)*) => { return Err($crate::error::failed!($($t)*)) };
}

pub(crate) use {bail, failed};
