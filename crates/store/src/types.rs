//! Public value types of the store API.

use std::collections::BTreeMap;

use compfs_codec::{CodecSpec, MinSaving, Mode, DEFAULT_EXTENT};

/// Inode number. The root directory is [`ROOT_INO`].
pub type Ino = u64;
/// The root directory's inode number.
pub const ROOT_INO: Ino = 1;
/// Longest name of a directory entry, in bytes.
pub const NAME_MAX: usize = 255;
/// The extended attribute that holds a file's or directory's compression property.
pub const COMPRESSION_XATTR: &[u8] = b"compfs.compression";
/// The extended attribute that holds a file's or directory's extent size (the uncompressed
/// size of the extents new writes make), inherited at creation like [`COMPRESSION_XATTR`].
pub const EXTENT_SIZE_XATTR: &[u8] = b"compfs.extent_size";

/// Parses an extent-size property value: `4K`, `32K`, `1M` or plain bytes (`65536`), a power of
/// two from 4 KiB to 1 MiB. `None` for anything else.
pub fn parse_extent_size(s: &str) -> Option<u32> {
    let n = compfs_codec::parse_size(s).ok()?;
    let n = usize::try_from(n).ok()?;
    compfs_codec::check_extent_size(n).ok()?;
    u32::try_from(n).ok()
}

/// The normal spelling of an extent size (`4K`, `128K`, `1M`), as the property stores it.
pub fn format_extent_size(n: u32) -> String {
    if n >= 1 << 20 && n % (1 << 20) == 0 {
        format!("{}M", n >> 20)
    } else if n % 1024 == 0 {
        format!("{}K", n >> 10)
    } else {
        n.to_string()
    }
}

/// Kind of an inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl FileKind {
    /// Stable on-disk code.
    pub fn code(self) -> u8 {
        match self {
            FileKind::File => 1,
            FileKind::Dir => 2,
            FileKind::Symlink => 3,
            FileKind::Fifo => 4,
            FileKind::Socket => 5,
            FileKind::CharDev => 6,
            FileKind::BlockDev => 7,
        }
    }

    /// Inverse of [`FileKind::code`].
    pub fn from_code(c: u8) -> Option<FileKind> {
        Some(match c {
            1 => FileKind::File,
            2 => FileKind::Dir,
            3 => FileKind::Symlink,
            4 => FileKind::Fifo,
            5 => FileKind::Socket,
            6 => FileKind::CharDev,
            7 => FileKind::BlockDev,
            _ => return None,
        })
    }
}

/// A point in time with nanoseconds (seconds since the Unix epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp {
    pub secs: i64,
    pub nsecs: u32,
}

impl Timestamp {
    /// The current wall-clock time.
    pub fn now() -> Timestamp {
        match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Timestamp {
                secs: d.as_secs() as i64,
                nsecs: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                Timestamp {
                    secs: -(d.as_secs() as i64) - 1,
                    nsecs: 1_000_000_000 - d.subsec_nanos().max(1),
                }
            }
        }
    }
}

/// Attributes of an inode, as `stat` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileKind,
    /// `mode & 0o7777`.
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub size: u64,
    /// Disk (compressed) usage in 512-byte units.
    pub blocks: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub crtime: Timestamp,
}

/// A time to set: the current time or a given one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeOrNow {
    Now,
    Time(Timestamp),
}

/// Attribute changes for [`crate::Store::setattr`]; `None` leaves a field alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Truncate (down or up) to this size.
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
    pub ctime: Option<Timestamp>,
}

/// One directory entry returned by [`crate::Store::readdir`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: Ino,
    pub kind: FileKind,
    pub name: Vec<u8>,
    /// Cookie to pass as `offset` to continue after this entry.
    pub offset: u64,
}

/// `renameat2` flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
}

/// `setxattr` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XattrSet {
    Any,
    Create,
    Replace,
}

/// Options for [`crate::Store::create`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateOptions {
    /// Uncompressed extent size: a power of two from 4 KiB to 1 MiB (default 128 KiB).
    pub extent_size: u32,
    /// Default codec of the store (default zstd:3).
    pub compression: CodecSpec,
    /// Default mode (default heuristic).
    pub mode: Mode,
    /// Overwrite an existing store or a non-empty directory.
    pub force: bool,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            extent_size: DEFAULT_EXTENT as u32,
            compression: CodecSpec::default(),
            mode: Mode::Heuristic,
            force: false,
        }
    }
}

/// Options for [`crate::Store::open`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenOptions {
    /// Refuse every change.
    pub read_only: bool,
    /// Mount-option override of the store's default codec and mode.
    pub policy: Option<(CodecSpec, Mode)>,
    /// Bound of the decompressed-extent cache (default 64 MiB).
    pub cache_bytes: usize,
    /// Compression worker threads (default: number of cores).
    pub threads: usize,
    /// When a compressed extent is kept: [`MinSaving::Bytes`] (the default: it must be shorter
    /// than the raw bytes, since extents are packed byte by byte) or [`MinSaving::Sectors`]
    /// (btrfs's rule, for btrfs-identical accounting; mount option `worth_it=sector`).
    pub min_saving: MinSaving,
    /// Background recompression: `background_compression=` and `background_delay=`.
    pub background: crate::BackgroundPolicy,
    /// Store-trained zstd dictionaries for small extents and inline data (mount option
    /// `dict=off` turns them off; extents already using one stay readable).
    pub dict: bool,
    /// With `dict`: packed extents are compressed with the store's dictionary too (when that
    /// is shorter), as small extents and inline data are (the default; mount option
    /// `dict=nopack` turns it off for packs only).
    pub pack_dict: bool,
    /// Small files written together are compressed together into packed extents of up to
    /// this many bytes (see docs/format.md, *Packed extents*); 0 turns packing off (mount
    /// option `pack=off`). Default [`crate::DEFAULT_PACK`].
    pub pack: u32,
}

/// The store's default worth-it rule: a compressed extent is kept when it is at least one byte
/// shorter than its input (both forms carry the same extent header).
pub const DEFAULT_MIN_SAVING: MinSaving = MinSaving::Bytes(1);

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            read_only: false,
            policy: None,
            cache_bytes: 64 << 20,
            threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2),
            min_saving: DEFAULT_MIN_SAVING,
            background: crate::BackgroundPolicy::default(),
            dict: true,
            pack_dict: true,
            pack: crate::DEFAULT_PACK,
        }
    }
}

/// Space figures of the filesystem that holds the store (for `statfs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatFs {
    /// Fundamental block size.
    pub bsize: u32,
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    /// Inodes used by the store plus the free inodes of the host filesystem.
    pub files: u64,
    pub ffree: u64,
    pub namelen: u32,
}

/// compsize figures of one codec (or the total).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CodecUsage {
    /// Bytes on disk (stored extent bytes, without headers).
    pub disk: u64,
    /// Uncompressed bytes of the extents.
    pub uncompressed: u64,
    /// Bytes of files that reference the extents.
    pub referenced: u64,
}

impl CodecUsage {
    pub(crate) fn add(&mut self, o: &CodecUsage) {
        self.disk += o.disk;
        self.uncompressed += o.uncompressed;
        self.referenced += o.referenced;
    }
}

/// A compsize-style report over some files ([`crate::Store::usage`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Usage {
    /// Regular files processed.
    pub files: u64,
    /// Distinct extents.
    pub regular_extents: u64,
    /// References to extents (extent-map entries).
    pub refs: u64,
    /// Files whose data is inline in the metadata.
    pub inline: u64,
    /// Bytes of that inline data (also counted under its codec in `per_codec`).
    pub inline_bytes: CodecUsage,
    /// Bytes of extents and inline data compressed with a store-trained dictionary (also
    /// counted under their codec in `per_codec`).
    pub dict_bytes: CodecUsage,
    /// Keyed by codec name: "none", "zlib", "lzo", "zstd", "lz4".
    pub per_codec: BTreeMap<String, CodecUsage>,
    /// The same figures keyed by codec and level as stored per extent: "zstd:1", "zstd:9",
    /// "zlib:3"; codecs without levels by name alone ("none", "lzo", "lz4").
    pub per_level: BTreeMap<String, CodecUsage>,
    pub total: CodecUsage,
}

/// Counters of one codec kept incrementally in the metadata ([`Stats::per_codec`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CodecCounters {
    pub extents: u64,
    pub disk: u64,
    pub uncompressed: u64,
    pub referenced: u64,
}

/// Live statistics of an open store.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stats {
    /// Bytes written by users through [`crate::Store::write`] since open.
    pub user_bytes_written: u64,
    /// Bytes read by users since open.
    pub user_bytes_read: u64,
    /// Bytes appended to segment files since open (headers included).
    pub segment_bytes_written: u64,
    /// Extents written compressed since open, per codec name.
    pub extents_compressed: BTreeMap<String, u64>,
    /// Extents written raw since open (not worth it, codec none, or heuristic skip).
    pub extents_raw: u64,
    /// Of `extents_raw`, those the heuristic skipped without trying.
    pub heuristic_skips: u64,
    /// Extent-sized blocks that were all zeros and became holes.
    pub zero_blocks: u64,
    pub gc_runs: u64,
    pub gc_bytes_moved: u64,
    pub gc_segments_freed: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Whole-store figures kept in the metadata, per codec name (and "inline").
    pub per_codec: BTreeMap<String, CodecCounters>,
    /// Bytes of all segment files.
    pub segment_bytes: u64,
    /// Bytes of live extents (headers included) in all segments.
    pub live_bytes: u64,
    /// True once the store refused writes after an I/O failure.
    pub read_only: bool,
    /// Bytes of file data buffered in memory, not yet committed (whole extent-sized blocks,
    /// those being compressed included).
    pub dirty_bytes: u64,
    /// Background recompression figures.
    pub background: crate::BackgroundStats,
}

/// What a GC pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GcReport {
    pub segments_examined: u64,
    pub segments_freed: u64,
    pub extents_moved: u64,
    pub bytes_moved: u64,
    /// Segment-file bytes before and after the pass.
    pub bytes_before: u64,
    pub bytes_after: u64,
}

#[cfg(test)]
mod extent_size_tests {
    use super::*;

    #[test]
    fn extent_size_values_parse_and_normalise() {
        for (v, n, norm) in [
            ("4K", 4096, "4K"),
            ("32k", 32768, "32K"),
            ("128K", 131072, "128K"),
            ("1M", 1 << 20, "1M"),
            ("65536", 65536, "64K"),
            (" 512KiB ", 524288, "512K"),
            ("1024K", 1 << 20, "1M"),
        ] {
            assert_eq!(parse_extent_size(v), Some(n), "{v}");
            assert_eq!(format_extent_size(n), norm);
            assert_eq!(parse_extent_size(norm), Some(n));
        }
        for v in [
            "",
            "0",
            "2K",
            "2M",
            "3K",
            "100000",
            "-4K",
            "4X",
            "K",
            "99999999999999999999",
        ] {
            assert_eq!(parse_extent_size(v), None, "{v}");
        }
    }
}
