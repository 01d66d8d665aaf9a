//! Mount options: btrfs names and semantics for compression, plus the FUSE and compfs ones.
//!
//! btrfs (Documentation/filesystems/btrfs, fs/btrfs/super.c) accepts `compress`,
//! `compress=ALG[:LEVEL]`, `compress-force[=ALG[:LEVEL]]` and `compress=no`; a bare `compress`
//! means zlib at level 3. Options that `mount(8)` and fstab add (`defaults`, `noauto`, `user`,
//! `_netdev`, `x-*`, ...) are accepted and ignored, as every `mount.fuse` helper does.

use std::time::Duration;

use compfs_codec::{bare_compress, CodecSpec, LevelAdjustment, MinSaving, Mode};

use crate::atime::{AtimeMode, AtimePolicy};
use crate::error::OptionError;

/// Default size of the decompressed-extent cache (issue 5: 64 MiB).
pub const DEFAULT_CACHE_BYTES: usize = 64 << 20;

/// Default readahead of the mount (`readahead=SIZE`): 4 MiB, what btrfs sets on its own
/// backing device (`open_ctree`: at least 4 MiB). The kernel's default for a FUSE mount is
/// 128 KiB, one extent per read request; 4 MiB lets it send 1 MiB reads, several in flight,
/// which took the cold read of the Silesia corpus here from 480 to 770-860 MB/s.
pub const DEFAULT_READAHEAD: u32 = 4 << 20;

/// Default number of FUSE worker threads (each reads requests from its own cloned fd): one per
/// core, at most 4. More threads than cores made metadata-bound work slower here (untar of
/// /usr/include on 2 cores: 3.3 s with 1 thread, 5.1 s with 2, 6.7 s with 4) while copy
/// throughput wants at least 2 (compression and reads run in parallel).
pub fn default_fuse_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(1, 4)
}

/// Default ring entries per CPU (`uring_depth=N`).
pub const DEFAULT_URING_DEPTH: u16 = 2;

/// Everything `-o` can say about one mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    /// `compress=`/`compress-force=`: overrides the store's default policy for this mount.
    pub policy: Option<(CodecSpec, Mode)>,
    /// `ro`.
    pub read_only: bool,
    /// `allow_other`: other users may use the mount (otherwise it is private to the mounter).
    pub allow_other: bool,
    /// `allow_root`: root may use the mount besides the mounter.
    pub allow_root: bool,
    /// `cache=SIZE`: bytes of decompressed extents kept in memory.
    pub cache_bytes: usize,
    /// `threads=N`: compression workers of the store (`None` = number of cores).
    pub workers: Option<usize>,
    /// `fuse_threads=N`: threads serving FUSE requests.
    pub fuse_threads: usize,
    /// `readahead=SIZE`: the mount's readahead (0 keeps the kernel's default). Raising it past
    /// the kernel's 128 KiB needs root (it is set through sysfs after mounting).
    pub readahead: u32,
    /// Kernel mount flags passed through to the FUSE mount (`noexec`, `nosuid`, `nodev`,
    /// `noatime`, ...).
    pub flags: Vec<KernelFlag>,
    /// `relatime` (default), `strictatime`, `noatime`, `nodiratime`: when reads update atime.
    pub atime: AtimePolicy,
    /// `acl` (default, as ext4 and btrfs) / `noacl`: POSIX ACLs enforced and kept in step with
    /// the mode ([`crate::acl`]); with `noacl` the ACL xattrs are refused (EOPNOTSUPP).
    pub acl: bool,
    /// `worth_it=bytes` (default) / `worth_it=sector`: when a compressed extent is kept
    /// ([`compfs_codec::MinSaving`]): when it is shorter than the raw bytes, or, as btrfs, when
    /// it saves a whole 4 KiB sector.
    pub min_saving: MinSaving,
    /// `background_compression=ALG[:LEVEL]` (bcachefs's name; `none` turns it off) and
    /// `background_delay=SECS` (default 60): background recompression of cold files.
    pub background: compfs_store::BackgroundPolicy,
    /// `dict=on` (default) / `dict=off`: store-trained zstd dictionaries for small extents,
    /// inline data and packed extents (see docs/format.md, "Dictionaries"); `dict=nopack`:
    /// for small extents and inline data only (`pack_dict` false).
    pub dict: bool,
    /// Packed extents use the dictionary too (`dict=on`); false with `dict=nopack`.
    pub pack_dict: bool,
    /// `pack=on` (default, packs of 256K) / `pack=off` / `pack=SIZE` (4K to 1M): small files
    /// written together are compressed together into packed extents of up to SIZE bytes
    /// (see docs/format.md, "Packed extents"); 0 = off.
    pub pack: u32,
    /// `uring` / `nouring` / `uring=auto` (default): the FUSE transport ([`UringOption`]).
    pub uring: UringOption,
    /// `uring_depth=N` (1 to 64, default 2): ring entries per CPU, i.e. requests from one CPU
    /// that the daemon can hold at once.
    pub uring_depth: u16,
    /// Level adjustments made while parsing `compress=` (printed as warnings).
    pub warnings: Vec<String>,
}

/// How requests reach the daemon: FUSE over io_uring (Linux 6.14+; one queue per CPU, served
/// by a daemon thread pinned to that CPU, so a request is answered on the CPU that made it) or
/// the classic `/dev/fuse` reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UringOption {
    /// `uring=auto` (default): the ring when the kernel offers it, i.e. when root has set
    /// `/sys/module/fuse/parameters/enable_uring` to `Y`; `/dev/fuse` otherwise.
    #[default]
    Auto,
    /// `uring`: the ring or no mount. Run by root, the daemon sets `enable_uring` to `Y` first
    /// if it is not (logging it): the user asked for it by name.
    On,
    /// `nouring`: `/dev/fuse` only. (With the ring, requests that can take long are handed
    /// to helper threads, [`crate::ring`], so that they do not hold up the other requests
    /// of their CPU's queue.)
    Off,
}

/// Generic VFS mount flags that FUSE honours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelFlag {
    Dev,
    NoDev,
    Suid,
    NoSuid,
    Exec,
    NoExec,
    Atime,
    NoAtime,
    DirSync,
    Sync,
    /// `lazytime` (SB_LAZYTIME): the kernel may keep time updates in memory.
    LazyTime,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            policy: None,
            read_only: false,
            allow_other: false,
            allow_root: false,
            cache_bytes: DEFAULT_CACHE_BYTES,
            workers: None,
            fuse_threads: default_fuse_threads(),
            readahead: DEFAULT_READAHEAD,
            flags: Vec::new(),
            atime: AtimePolicy::default(),
            acl: true,
            min_saving: compfs_store::DEFAULT_MIN_SAVING,
            background: compfs_store::BackgroundPolicy::default(),
            dict: true,
            pack_dict: true,
            pack: compfs_store::DEFAULT_PACK,
            uring: UringOption::Auto,
            uring_depth: DEFAULT_URING_DEPTH,
            warnings: Vec::new(),
        }
    }
}

/// Options `mount(8)`/fstab pass along that mean nothing to compfs itself.
const IGNORED: &[&str] = &[
    "defaults",
    "auto",
    "noauto",
    "user",
    "users",
    "nouser",
    "owner",
    "group",
    "_netdev",
    "nofail",
    "default_permissions",
    "async",
    "loop",
];

/// btrfs options that exist on the kernel filesystem but have no meaning here; named so the
/// error says why rather than "unknown".
const BTRFS_ONLY: &[&str] = &[
    "autodefrag",
    "noautodefrag",
    "commit",
    "datacow",
    "nodatacow",
    "datasum",
    "nodatasum",
    "degraded",
    "device",
    "discard",
    "nodiscard",
    "space_cache",
    "nospace_cache",
    "ssd",
    "nossd",
    "ssd_spread",
    "subvol",
    "subvolid",
    "thread_pool",
    "flushoncommit",
    "noflushoncommit",
    "max_inline",
    "barrier",
    "nobarrier",
    "rescue",
    "skip_balance",
    "clear_cache",
    "user_subvol_rm_allowed",
    "fatal_errors",
    "enospc_debug",
    "check_int",
];

/// Every option compfs understands, for error messages.
pub const VALID_OPTIONS: &str =
    "compress, compress=ALG[:LEVEL], compress=no, compress-force[=ALG[:LEVEL]], \
background_compression=ALG[:LEVEL], background_delay=SECS, \
ro, rw, allow_other, allow_root, cache=SIZE, readahead=SIZE, threads=N, fuse_threads=N, \
nodev, nosuid, noexec, relatime, strictatime, noatime, nodiratime, dirsync, sync, acl, noacl, \
worth_it=bytes, worth_it=sector, dict=on, dict=off, dict=nopack, pack=on, pack=off, pack=SIZE, \
uring, nouring, uring=auto, uring_depth=N";

impl MountOptions {
    /// Parses one or more comma-separated option strings (each `-o` argument), left to right;
    /// later options override earlier ones, as in `mount(8)`.
    pub fn parse<S: AsRef<str>>(lists: &[S]) -> Result<MountOptions, OptionError> {
        let mut o = MountOptions::default();
        for list in lists {
            for opt in list.as_ref().split(',') {
                let opt = opt.trim();
                if opt.is_empty() {
                    continue;
                }
                o.apply(opt)?;
            }
        }
        Ok(o)
    }

    fn apply(&mut self, opt: &str) -> Result<(), OptionError> {
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        match (key, value) {
            ("compress", None) => self.policy = Some((bare_compress(), Mode::Heuristic)),
            ("compress-force", None) => self.policy = Some((bare_compress(), Mode::Force)),
            ("compress", Some(v)) | ("compress-force", Some(v)) => {
                let mode = if key == "compress" {
                    Mode::Heuristic
                } else {
                    Mode::Force
                };
                let parsed = CodecSpec::parse(v).map_err(|e| OptionError::Compression {
                    option: opt.to_string(),
                    detail: e.to_string(),
                })?;
                if let Some(adj) = parsed.adjustment {
                    self.warnings.push(describe_adjustment(&adj));
                }
                self.policy = Some((parsed.spec, mode));
            }
            ("background_compression", Some(v)) => {
                let parsed = CodecSpec::parse(v).map_err(|e| OptionError::Compression {
                    option: opt.to_string(),
                    detail: e.to_string(),
                })?;
                if let Some(adj) = parsed.adjustment {
                    self.warnings.push(describe_adjustment(&adj));
                }
                self.background.spec = Some(parsed.spec).filter(|s| !s.is_none());
            }
            ("background_delay", Some(v)) => {
                let secs = v.trim().parse::<u64>().ok().filter(|&n| n <= 1 << 32);
                self.background.delay =
                    secs.map(Duration::from_secs)
                        .ok_or_else(|| OptionError::BadValue {
                            option: opt.to_string(),
                            expected: "a number of seconds such as background_delay=60",
                        })?;
            }
            ("ro", None) => self.read_only = true,
            ("rw", None) => self.read_only = false,
            ("allow_other", None) => self.allow_other = true,
            ("allow_root", None) => self.allow_root = true,
            ("cache", Some(v)) => {
                let n = compfs_codec::parse_size(v).map_err(|_| OptionError::BadValue {
                    option: opt.to_string(),
                    expected: "a size such as 64M, 512K or 1G",
                })?;
                self.cache_bytes = usize::try_from(n).map_err(|_| OptionError::BadValue {
                    option: opt.to_string(),
                    expected: "a size that fits in memory",
                })?;
            }
            ("readahead", Some(v)) => {
                const MAX: u64 = 64 << 20;
                self.readahead = compfs_codec::parse_size(v)
                    .ok()
                    .filter(|&n| n <= MAX)
                    .map(|n| n as u32)
                    .ok_or_else(|| OptionError::BadValue {
                        option: opt.to_string(),
                        expected: "a size from 0 to 64M such as 4M or 512K",
                    })?;
            }
            ("threads", Some(v)) => self.workers = Some(parse_count(opt, v)?),
            ("fuse_threads", Some(v)) => self.fuse_threads = parse_count(opt, v)?,
            ("dev", None) => self.flags.push(KernelFlag::Dev),
            ("nodev", None) => self.flags.push(KernelFlag::NoDev),
            ("suid", None) => self.flags.push(KernelFlag::Suid),
            ("nosuid", None) => self.flags.push(KernelFlag::NoSuid),
            ("exec", None) => self.flags.push(KernelFlag::Exec),
            ("noexec", None) => self.flags.push(KernelFlag::NoExec),
            ("atime", None) => {
                self.flags.push(KernelFlag::Atime);
                if self.atime.mode == AtimeMode::Never {
                    self.atime.mode = AtimeMode::Relatime;
                }
            }
            ("noatime", None) => {
                self.flags.push(KernelFlag::NoAtime);
                self.atime.mode = AtimeMode::Never;
            }
            ("relatime" | "nostrictatime", None) => self.atime.mode = AtimeMode::Relatime,
            ("strictatime" | "norelatime", None) => self.atime.mode = AtimeMode::Strict,
            ("nodiratime", None) => self.atime.nodiratime = true,
            ("diratime", None) => self.atime.nodiratime = false,
            ("acl", None) => self.acl = true,
            ("noacl", None) => self.acl = false,
            ("worth_it", Some("bytes")) => self.min_saving = compfs_store::DEFAULT_MIN_SAVING,
            ("worth_it", Some("sector")) => self.min_saving = MinSaving::Sectors(1),
            ("worth_it", _) => {
                return Err(OptionError::BadValue {
                    option: opt.to_string(),
                    expected: "worth_it=bytes or worth_it=sector",
                })
            }
            ("pack", Some("on")) => self.pack = compfs_store::DEFAULT_PACK,
            ("pack", Some("off")) => self.pack = 0,
            ("pack", Some(v)) => {
                self.pack = compfs_codec::parse_size(v)
                    .ok()
                    .filter(|&n| (4 << 10..=1 << 20).contains(&n))
                    .map(|n| n as u32)
                    .ok_or_else(|| OptionError::BadValue {
                        option: opt.to_string(),
                        expected: "pack=on, pack=off or a size from 4K to 1M such as 64K",
                    })?;
            }
            ("pack", None) => {
                return Err(OptionError::BadValue {
                    option: opt.to_string(),
                    expected: "pack=on, pack=off or a size from 4K to 1M such as 64K",
                })
            }
            ("dict", Some("on")) => (self.dict, self.pack_dict) = (true, true),
            ("dict", Some("off")) => self.dict = false,
            ("dict", Some("nopack")) => (self.dict, self.pack_dict) = (true, false),
            ("dict", _) => {
                return Err(OptionError::BadValue {
                    option: opt.to_string(),
                    expected: "dict=on, dict=off or dict=nopack",
                })
            }
            ("uring", None | Some("on")) => self.uring = UringOption::On,
            ("nouring", None) | ("uring", Some("off")) => self.uring = UringOption::Off,
            ("uring", Some("auto")) => self.uring = UringOption::Auto,
            ("uring", Some(_)) => {
                return Err(OptionError::BadValue {
                    option: opt.to_string(),
                    expected: "uring, nouring or uring=auto",
                })
            }
            ("uring_depth", Some(v)) => {
                let n = parse_count_upto(opt, v, 64, "a count from 1 to 64 such as uring_depth=2")?;
                // At most 64: fits.
                self.uring_depth = n as u16;
            }
            ("dirsync", None) => self.flags.push(KernelFlag::DirSync),
            ("sync", None) => self.flags.push(KernelFlag::Sync),
            // As ext4: the kernel gets SB_LAZYTIME (see docs/kernel-features.md).
            ("lazytime", None) => {
                if !self.flags.contains(&KernelFlag::LazyTime) {
                    self.flags.push(KernelFlag::LazyTime);
                }
            }
            ("nolazytime", None) => self.flags.retain(|f| *f != KernelFlag::LazyTime),
            (k, _) if IGNORED.contains(&k) => {}
            (k, _) if k.starts_with("x-") || k == "comment" => {}
            (k, _) if BTRFS_ONLY.contains(&k) => {
                return Err(OptionError::BtrfsOnly {
                    option: opt.to_string(),
                })
            }
            ("extent" | "extent_size" | "extent-size", _) => {
                return Err(OptionError::ExtentAtMount {
                    option: opt.to_string(),
                })
            }
            ("ro" | "rw" | "allow_other" | "allow_root", Some(_))
            | (
                "cache"
                | "threads"
                | "fuse_threads"
                | "background_compression"
                | "background_delay"
                | "uring_depth",
                None,
            ) => {
                return Err(OptionError::BadValue {
                    option: opt.to_string(),
                    expected: match key {
                        "cache" => "cache=SIZE, e.g. cache=64M",
                        "background_compression" => "background_compression=ALG[:LEVEL]",
                        "background_delay" => "background_delay=SECS",
                        "threads" | "fuse_threads" => "a count such as threads=2",
                        "uring_depth" => "a count such as uring_depth=2",
                        _ => "no value",
                    },
                })
            }
            _ => {
                return Err(OptionError::Unknown {
                    option: opt.to_string(),
                })
            }
        }
        Ok(())
    }

    /// The option string that describes this mount in `/proc/mounts`-style form (used by
    /// `compfs stats` and logs): e.g. `compress-force=zstd:3,cache=64M`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        match self.policy {
            Some((spec, Mode::Heuristic)) if spec.is_none() => parts.push("compress=no".into()),
            Some((spec, mode)) => parts.push(format!("{mode}={spec}")),
            None => {}
        }
        if let Some(s) = self.background.spec {
            parts.push(format!("background_compression={s}"));
            parts.push(format!(
                "background_delay={}",
                self.background.delay.as_secs()
            ));
        }
        parts.push(if self.read_only { "ro" } else { "rw" }.to_string());
        if self.allow_other {
            parts.push("allow_other".into());
        }
        parts.push(format!("cache={}K", self.cache_bytes >> 10));
        if let MinSaving::Sectors(_) = self.min_saving {
            parts.push("worth_it=sector".into());
        }
        if !self.dict {
            parts.push("dict=off".into());
        } else if !self.pack_dict {
            parts.push("dict=nopack".into());
        }
        if self.pack == 0 {
            parts.push("pack=off".into());
        } else if self.pack != compfs_store::DEFAULT_PACK {
            parts.push(format!("pack={}K", self.pack >> 10));
        }
        match self.uring {
            UringOption::Auto => {}
            UringOption::On => parts.push("uring".into()),
            UringOption::Off => parts.push("nouring".into()),
        }
        if self.uring_depth != DEFAULT_URING_DEPTH {
            parts.push(format!("uring_depth={}", self.uring_depth));
        }
        parts.join(",")
    }
}

fn describe_adjustment(adj: &LevelAdjustment) -> String {
    adj.to_string()
}

fn parse_count(opt: &str, v: &str) -> Result<usize, OptionError> {
    parse_count_upto(opt, v, 256, "a count from 1 to 256")
}

/// A count from 1 to `max`; `expected` names the accepted values in the error.
fn parse_count_upto(
    opt: &str,
    v: &str,
    max: usize,
    expected: &'static str,
) -> Result<usize, OptionError> {
    match v.trim().parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(OptionError::BadValue {
            option: opt.to_string(),
            expected,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use compfs_codec::Algorithm;

    fn parse(s: &str) -> Result<MountOptions, OptionError> {
        MountOptions::parse(&[s])
    }

    #[test]
    fn btrfs_compression_forms() {
        let o = parse("compress").unwrap();
        assert_eq!(o.policy, Some((bare_compress(), Mode::Heuristic)));
        assert_eq!(o.policy.unwrap().0.algorithm(), Algorithm::Zlib);
        assert_eq!(o.policy.unwrap().0.level(), 3);

        let o = parse("compress=zstd:3").unwrap();
        let (spec, mode) = o.policy.unwrap();
        assert_eq!(
            (spec.algorithm(), spec.level(), mode),
            (Algorithm::Zstd, 3, Mode::Heuristic)
        );

        let o = parse("compress-force=zstd:-5").unwrap();
        let (spec, mode) = o.policy.unwrap();
        assert_eq!(
            (spec.algorithm(), spec.level(), mode),
            (Algorithm::Zstd, -5, Mode::Force)
        );

        let o = parse("compress-force").unwrap();
        assert_eq!(o.policy, Some((bare_compress(), Mode::Force)));

        let o = parse("compress=no").unwrap();
        assert!(o.policy.unwrap().0.is_none());
        let o = parse("compress=lzo").unwrap();
        assert_eq!(o.policy.unwrap().0.algorithm(), Algorithm::Lzo);
        // zlib without a level means zlib:3, zstd means zstd:3, as in btrfs.
        assert_eq!(parse("compress=zlib").unwrap().policy.unwrap().0.level(), 3);
        assert_eq!(parse("compress=zstd").unwrap().policy.unwrap().0.level(), 3);
    }

    #[test]
    fn uring_options() {
        let o = parse("").unwrap();
        assert_eq!(
            (o.uring, o.uring_depth),
            (UringOption::Auto, DEFAULT_URING_DEPTH)
        );
        assert!(!o.describe().contains("uring"));
        assert_eq!(parse("uring").unwrap().uring, UringOption::On);
        assert_eq!(parse("uring=on").unwrap().uring, UringOption::On);
        assert_eq!(parse("uring,nouring").unwrap().uring, UringOption::Off);
        assert_eq!(parse("uring=off").unwrap().uring, UringOption::Off);
        assert_eq!(
            parse("nouring,uring=auto").unwrap().uring,
            UringOption::Auto
        );
        let o = parse("uring,uring_depth=4").unwrap();
        assert_eq!(o.uring_depth, 4);
        assert!(o.describe().contains("uring,uring_depth=4"));
        assert!(parse("nouring").unwrap().describe().contains("nouring"));
        assert!(!parse("uring=auto").unwrap().describe().contains("uring"));
        for bad in [
            "uring=yes",
            "uring_depth",
            "uring_depth=0",
            "uring_depth=65",
            "nouring=1",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn acl_is_the_default_and_noacl_turns_it_off() {
        assert!(parse("").unwrap().acl);
        assert!(!parse("noacl").unwrap().acl);
        assert_eq!(parse("rw").unwrap().min_saving, MinSaving::Bytes(1));
        assert_eq!(
            parse("worth_it=sector").unwrap().min_saving,
            MinSaving::Sectors(1)
        );
        assert_eq!(
            parse("worth_it=sector,worth_it=bytes").unwrap().min_saving,
            MinSaving::Bytes(1)
        );
        assert!(parse("").unwrap().dict);
        assert!(!parse("dict=off").unwrap().dict);
        assert!(parse("dict=off,dict=on").unwrap().dict);
        let o = parse("dict=nopack").unwrap();
        assert!(o.dict && !o.pack_dict);
        assert!(o.describe().contains("dict=nopack"));
        let o = parse("dict=nopack,dict=on").unwrap();
        assert!(o.dict && o.pack_dict);
        assert!(!parse("dict=nopack,dict=off").unwrap().dict);
        assert_eq!(parse("").unwrap().pack, compfs_store::DEFAULT_PACK);
        assert_eq!(parse("pack=off").unwrap().pack, 0);
        assert_eq!(
            parse("pack=off,pack=on").unwrap().pack,
            compfs_store::DEFAULT_PACK
        );
        assert_eq!(parse("pack=64K").unwrap().pack, 64 << 10);
        for bad in ["pack", "pack=2K", "pack=2M", "pack=yes"] {
            assert!(
                matches!(parse(bad), Err(OptionError::BadValue { .. })),
                "{bad}"
            );
        }
        for bad in [
            "worth_it",
            "worth_it=4k",
            "worth_it=Sector",
            "dict",
            "dict=no",
        ] {
            assert!(
                matches!(parse(bad), Err(OptionError::BadValue { .. })),
                "{bad}"
            );
        }
        assert!(parse("noacl,acl").unwrap().acl);
        assert!(matches!(parse("acl=1"), Err(OptionError::Unknown { .. })));
    }

    #[test]
    fn later_options_win_and_lists_combine() {
        let o = MountOptions::parse(&["compress=zlib:9,ro", "compress-force=lzo,rw"]).unwrap();
        assert_eq!(o.policy.unwrap().0.algorithm(), Algorithm::Lzo);
        assert_eq!(o.policy.unwrap().1, Mode::Force);
        assert!(!o.read_only);
    }

    #[test]
    fn out_of_range_level_is_clamped_with_a_warning() {
        let o = parse("compress=zlib:12").unwrap();
        assert_eq!(o.policy.unwrap().0.level(), 9);
        assert_eq!(o.warnings.len(), 1);
        assert!(o.warnings[0].contains("zlib"), "{:?}", o.warnings);
    }

    #[test]
    fn fuse_and_compfs_options() {
        let o = parse("allow_other,ro,cache=128M,threads=2,fuse_threads=3,noexec,nosuid").unwrap();
        assert!(o.allow_other && o.read_only);
        assert_eq!(o.cache_bytes, 128 << 20);
        assert_eq!(o.workers, Some(2));
        assert_eq!(o.fuse_threads, 3);
        assert_eq!(o.flags, vec![KernelFlag::NoExec, KernelFlag::NoSuid]);
        let d = MountOptions::default();
        assert_eq!(d.cache_bytes, DEFAULT_CACHE_BYTES);
        assert!(!d.allow_other && !d.read_only && d.policy.is_none());
    }

    #[test]
    fn fstab_noise_is_ignored() {
        let o =
            parse("defaults,noauto,user,_netdev,nofail,x-systemd.automount,comment=foo,relatime")
                .unwrap();
        assert_eq!(o, MountOptions::default());
        assert_eq!(parse(",,").unwrap(), MountOptions::default());
    }

    #[test]
    fn bad_options_fail_clearly() {
        let e = parse("compress=brotli").unwrap_err();
        assert!(e.to_string().contains("brotli"), "{e}");
        assert!(matches!(
            parse("compress=zstd:x"),
            Err(OptionError::Compression { .. })
        ));
        assert!(matches!(
            parse("frobnicate"),
            Err(OptionError::Unknown { .. })
        ));
        assert!(parse("frobnicate")
            .unwrap_err()
            .to_string()
            .contains("compress="));
        assert!(matches!(
            parse("autodefrag"),
            Err(OptionError::BtrfsOnly { .. })
        ));
        assert!(matches!(parse("ssd"), Err(OptionError::BtrfsOnly { .. })));
        assert!(matches!(
            parse("extent=512K"),
            Err(OptionError::ExtentAtMount { .. })
        ));
        assert!(matches!(
            parse("cache=lots"),
            Err(OptionError::BadValue { .. })
        ));
        assert!(matches!(parse("cache"), Err(OptionError::BadValue { .. })));
        assert!(matches!(
            parse("cache=99999999999G"),
            Err(OptionError::BadValue { .. })
        ));
        assert!(matches!(
            parse("threads=0"),
            Err(OptionError::BadValue { .. })
        ));
        assert!(matches!(
            parse("threads=-1"),
            Err(OptionError::BadValue { .. })
        ));
        assert!(matches!(parse("ro=1"), Err(OptionError::BadValue { .. })));
    }

    #[test]
    fn sizes_use_the_one_parser() {
        assert_eq!(parse("cache=64M").unwrap().cache_bytes, 64 << 20);
        assert_eq!(parse("cache=1GiB").unwrap().cache_bytes, 1 << 30);
        assert!(matches!(
            parse("cache=-1M"),
            Err(OptionError::BadValue { .. })
        ));
        assert!(matches!(
            parse("cache=12Q"),
            Err(OptionError::BadValue { .. })
        ));
    }

    #[test]
    fn background_options() {
        let d = parse("").unwrap().background;
        assert_eq!((d.spec, d.delay), (None, Duration::from_secs(60)));
        let o = parse("compress-force=zstd:1,background_compression=zstd:9,background_delay=5")
            .unwrap();
        assert_eq!(o.background.spec.unwrap().to_string(), "zstd:9");
        assert_eq!(o.background.delay, Duration::from_secs(5));
        assert_eq!(o.policy.unwrap().0.level(), 1);
        assert_eq!(
            o.describe(),
            "compress-force=zstd:1,background_compression=zstd:9,background_delay=5,rw,cache=65536K"
        );
        assert_eq!(
            parse("background_compression=lz4")
                .unwrap()
                .background
                .spec
                .unwrap()
                .to_string(),
            "lz4"
        );
        // none turns it off again (bcachefs); a clamped level warns like compress=.
        let o = parse("background_compression=zstd:9,background_compression=none").unwrap();
        assert_eq!(o.background.spec, None);
        let o = parse("background_compression=zlib:12").unwrap();
        assert_eq!(o.background.spec.unwrap().level(), 9);
        assert_eq!(o.warnings.len(), 1);
        for bad in [
            "background_compression=brotli",
            "background_compression",
            "background_delay",
            "background_delay=-1",
            "background_delay=1m",
            "background_delay=99999999999",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn readahead_option() {
        assert_eq!(parse("").unwrap().readahead, DEFAULT_READAHEAD);
        assert_eq!(parse("readahead=1M").unwrap().readahead, 1 << 20);
        assert_eq!(parse("readahead=0").unwrap().readahead, 0);
        assert!(parse("readahead=65M").is_err());
        assert!(parse("readahead=lots").is_err());
        assert!(parse("readahead").is_err());
    }

    #[test]
    fn describe_round_trips_policy() {
        let o = parse("compress-force=zstd:9,cache=32M").unwrap();
        assert_eq!(o.describe(), "compress-force=zstd:9,rw,cache=32768K");
        let back = parse(&o.describe().replace("32768K", "32M")).unwrap();
        assert_eq!(back.policy, o.policy);
        assert_eq!(
            parse("compress=no").unwrap().describe(),
            "compress=no,rw,cache=65536K"
        );
    }

    #[test]
    fn lazytime_is_a_kernel_flag() {
        let has = |s: &str| parse(s).unwrap().flags.contains(&KernelFlag::LazyTime);
        assert!(!has(""));
        assert!(has("lazytime"));
        assert!(!has("lazytime,nolazytime"));
        assert!(has("nolazytime,lazytime"));
        let o = parse("lazytime,lazytime").unwrap();
        assert_eq!(o.flags, vec![KernelFlag::LazyTime]);
    }

    #[test]
    fn atime_options() {
        assert_eq!(parse("").unwrap().atime, AtimePolicy::default());
        assert_eq!(parse("relatime").unwrap().atime.mode, AtimeMode::Relatime);
        assert_eq!(parse("strictatime").unwrap().atime.mode, AtimeMode::Strict);
        let o = parse("noatime,nodiratime").unwrap();
        assert_eq!(o.atime.mode, AtimeMode::Never);
        assert!(o.atime.nodiratime);
        assert!(o.flags.contains(&KernelFlag::NoAtime));
        assert_eq!(
            parse("noatime,atime").unwrap().atime.mode,
            AtimeMode::Relatime
        );
        assert_eq!(
            parse("noatime,relatime").unwrap().atime.mode,
            AtimeMode::Relatime
        );
        assert!(!parse("nodiratime,diratime").unwrap().atime.nodiratime);
    }
}
