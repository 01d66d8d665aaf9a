//! Typed errors of the codec layer.

use crate::spec::{Algorithm, VALID_FORMS};

/// A codec spec that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("unknown compression '{spec}'; valid forms: {}", VALID_FORMS)]
    UnknownAlgorithm { spec: String },
    #[error("bad compression level in '{spec}'; valid forms: {}", VALID_FORMS)]
    BadLevel { spec: String },
}

/// Compression or decompression failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The compressed input is malformed, truncated, or decodes to a length other than the
    /// expected one.
    #[error("corrupt {algorithm} data: {detail}")]
    Corrupt {
        algorithm: Algorithm,
        detail: String,
    },
    /// The input is larger than the codec layer accepts.
    #[error("input of {len} bytes exceeds the maximum extent size of {max} bytes")]
    TooLarge { len: usize, max: usize },
    /// The extent size is not a power of two in 4 KiB..=1 MiB.
    #[error("invalid extent size {0}: must be a power of two from 4 KiB to 1 MiB")]
    BadExtentSize(usize),
    /// The compression library reported an internal failure (out of memory, bad parameter).
    #[error("{algorithm} compressor failed: {detail}")]
    Backend {
        algorithm: Algorithm,
        detail: String,
    },
}

impl CodecError {
    pub(crate) fn corrupt(algorithm: Algorithm, detail: impl std::fmt::Display) -> Self {
        CodecError::Corrupt {
            algorithm,
            detail: detail.to_string(),
        }
    }
}
