//! Typed errors of the FUSE layer.

/// A mount option that could not be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    #[error("mount option '{option}': {detail}")]
    Compression { option: String, detail: String },
    #[error("mount option '{option}': expected {expected}")]
    BadValue {
        option: String,
        expected: &'static str,
    },
    #[error("mount option '{option}' is a kernel btrfs option with no meaning for compfs; valid options: {}", crate::options::VALID_OPTIONS)]
    BtrfsOnly { option: String },
    #[error("mount option '{option}': the extent size is fixed when the store is created (compfs mkfs --extent-size)")]
    ExtentAtMount { option: String },
    #[error(
        "unknown mount option '{option}'; valid options: {}",
        crate::options::VALID_OPTIONS
    )]
    Unknown { option: String },
}

/// A `compfs.usage` record that could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed compfs.usage record: {detail}")]
pub struct RecordError {
    pub detail: String,
}

impl RecordError {
    pub(crate) fn new(detail: impl Into<String>) -> Self {
        RecordError {
            detail: detail.into(),
        }
    }
}
