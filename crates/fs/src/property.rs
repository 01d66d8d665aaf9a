//! The properties of `compfs property get|set` (btrfs's `property` of a file or directory)
//! and the xattrs behind them: `compression`, `background_compression`, `extent_size`.

use compfs_codec::{CodecSpec, SpecError};

/// A file's or directory's property; new files and directories inherit it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Property {
    /// `compfs.compression`: the codec and level writes use.
    Compression,
    /// `compfs.background_compression`: what background recompression rewrites to.
    BackgroundCompression,
    /// `compfs.extent_size`: the size files are cut into extents at.
    ExtentSize,
}

/// A property name or value that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PropertyError {
    #[error(
        "unknown property '{0}'; the properties are 'compression', \
         'background_compression' and 'extent_size'"
    )]
    Unknown(String),
    #[error("invalid {name} '{value}': a power of two from 4K to 1M (4K, 32K, 128K, 1M)")]
    ExtentSize { name: &'static str, value: String },
    #[error("invalid {name}: {error}")]
    Codec {
        name: &'static str,
        error: SpecError,
    },
}

impl Property {
    /// The property a name stands for.
    pub fn from_name(name: &str) -> Result<Property, PropertyError> {
        match name {
            "compression" => Ok(Property::Compression),
            "background_compression" => Ok(Property::BackgroundCompression),
            "extent_size" => Ok(Property::ExtentSize),
            _ => Err(PropertyError::Unknown(name.to_string())),
        }
    }

    /// The property's name.
    pub fn name(self) -> &'static str {
        match self {
            Property::Compression => "compression",
            Property::BackgroundCompression => "background_compression",
            Property::ExtentSize => "extent_size",
        }
    }

    /// The xattr that holds it.
    pub fn xattr(self) -> &'static str {
        match self {
            Property::Compression => "compfs.compression",
            Property::BackgroundCompression => "compfs.background_compression",
            Property::ExtentSize => "compfs.extent_size",
        }
    }

    /// Checks a value to set (`""` clears the property and is always accepted): a codec spec
    /// (`zstd:5`, `lz4`, `none`) or an extent size (4K..1M, a power of two).
    pub fn check(self, value: &str) -> Result<(), PropertyError> {
        if value.is_empty() {
            return Ok(());
        }
        let name = self.name();
        match self {
            Property::ExtentSize => compfs_store::parse_extent_size(value)
                .map(|_| ())
                .ok_or_else(|| PropertyError::ExtentSize {
                    name,
                    value: value.to_string(),
                }),
            _ => CodecSpec::parse(value)
                .map(|_| ())
                .map_err(|error| PropertyError::Codec { name, error }),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_xattrs_and_values() {
        for p in [
            Property::Compression,
            Property::BackgroundCompression,
            Property::ExtentSize,
        ] {
            assert_eq!(Property::from_name(p.name()).unwrap(), p);
            assert_eq!(p.xattr(), format!("compfs.{}", p.name()));
            assert!(p.check("").is_ok());
        }
        let e = Property::from_name("compress").unwrap_err();
        assert!(
            e.to_string().starts_with("unknown property 'compress';"),
            "{e}"
        );
        assert_eq!(
            compfs_store::COMPRESSION_XATTR,
            Property::Compression.xattr().as_bytes()
        );
        assert_eq!(
            compfs_store::EXTENT_SIZE_XATTR,
            Property::ExtentSize.xattr().as_bytes()
        );
        assert_eq!(
            compfs_store::BACKGROUND_XATTR,
            Property::BackgroundCompression.xattr().as_bytes()
        );
        assert!(Property::Compression.check("zstd:5").is_ok());
        assert!(Property::BackgroundCompression.check("none").is_ok());
        let e = Property::Compression.check("zip").unwrap_err();
        assert!(e.to_string().starts_with("invalid compression: "), "{e}");
        assert!(Property::ExtentSize.check("32K").is_ok());
        let e = Property::ExtentSize.check("3K").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid extent_size '3K': a power of two from 4K to 1M (4K, 32K, 128K, 1M)"
        );
        assert!(Property::ExtentSize.check("zstd").is_err());
    }
}
