//! The object-store options of a mount's `-o` lists (`cache_dir=`, `cache_size=`,
//! `credentials=`, `timeout=`, `dirty_limit=`, `metadata_interval=`, `lease_timeout=`,
//! `writeback`, `upload_limit=`), and the file where a mount that ended leaves the requests
//! it sent to the bucket.

use std::path::{Path, PathBuf};
use std::time::Duration;

use compfs_codec::parse_size;

use super::{ObjectBackend, ObjectOptions};

/// A `-o` object-store option that cannot be used; the message names the option as given.
#[derive(Debug, thiserror::Error)]
pub enum OptionError {
    /// The value is not what the option takes (`want` says what it takes).
    #[error("{opt}: {want}")]
    BadValue { opt: String, want: &'static str },
    /// `cache_dir=DIR`: DIR has no absolute form.
    #[error("{opt}: {error}")]
    Path { opt: String, error: std::io::Error },
}

/// Takes the object-store options out of `-o` lists: `cache_dir=DIR`, `cache_size=SIZE`,
/// `credentials=FILE`, `timeout=SECONDS` (how long requests are retried before EIO),
/// `dirty_limit=SIZE` (appended bytes held in memory before writes wait for uploads);
/// `metadata_interval=SECONDS` (default 60), `lease_timeout=SECONDS` (default 60);
/// `writeback` (an fsync returns once its bytes are fsynced in the cache directory's upload
/// queue, uploaded in the background), `upload_limit=SIZE` (default 1G: bytes that queue may
/// hold before syncs wait for the uploader);
/// returns the remaining options (for the filesystem's own option parser) and the object
/// options, the others at their defaults.
pub fn split_options(lists: &[String]) -> Result<(Vec<String>, ObjectOptions), OptionError> {
    let mut o = ObjectOptions::default();
    let mut rest = Vec::new();
    for list in lists {
        let mut keep = Vec::new();
        for opt in list.split(',') {
            let (k, v) = match opt.trim().split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt.trim(), None),
            };
            let bad = |want| OptionError::BadValue {
                opt: opt.to_string(),
                want,
            };
            match (k, v) {
                ("cache_dir", Some(v)) if !v.is_empty() => {
                    o.cache_dir =
                        Some(std::path::absolute(v).map_err(|error| OptionError::Path {
                            opt: opt.to_string(),
                            error,
                        })?)
                }
                ("cache_size", Some(v)) => {
                    o.cache_size =
                        parse_size(v).map_err(|_| bad("want a size such as 1G or 512M"))?
                }
                ("dirty_limit", Some(v)) => {
                    o.dirty_limit = parse_size(v)
                        .ok()
                        .filter(|&n| n >= 1 << 20)
                        .ok_or_else(|| bad("want a size of at least 1M, such as 64M"))?
                }
                ("upload_limit", Some(v)) => {
                    o.upload_limit = parse_size(v)
                        .ok()
                        .filter(|&n| n >= 1 << 20)
                        .ok_or_else(|| bad("want a size of at least 1M, such as 1G"))?
                }
                ("credentials", Some(v)) if !v.is_empty() => {
                    o.remote.credentials = Some(PathBuf::from(v))
                }
                ("timeout", Some(v)) => {
                    o.remote.deadline = Duration::from_secs(
                        seconds(v).ok_or_else(|| bad("want a number of seconds"))?,
                    )
                }
                ("metadata_interval", Some(v)) => {
                    o.metadata_interval = Duration::from_secs(
                        seconds(v).ok_or_else(|| bad("want a number of seconds"))?,
                    )
                }
                ("lease_timeout", Some(v)) => {
                    let s = seconds(v).ok_or_else(|| bad("want a number of seconds"))?;
                    if s < 3 {
                        return Err(bad("the lease timeout is at least 3 seconds"));
                    }
                    o.lease.timeout = Duration::from_secs(s)
                }
                ("writeback", None) => o.writeback = true,
                ("writeback", Some(_)) => return Err(bad("writeback takes no value")),
                (
                    "cache_dir" | "cache_size" | "credentials" | "timeout" | "dirty_limit"
                    | "metadata_interval" | "lease_timeout" | "upload_limit",
                    _,
                ) => return Err(bad("wants a value")),
                _ => keep.push(opt),
            }
        }
        if !keep.is_empty() {
            rest.push(keep.join(","));
        }
    }
    Ok((rest, o))
}

/// A positive number of seconds.
fn seconds(v: &str) -> Option<u64> {
    v.parse().ok().filter(|&s: &u64| s > 0)
}

/// The file in the cache directory where a mount leaves the requests it sent to the bucket
/// (read by `compfs bench fs --object-store`).
pub const REQUESTS_FILE: &str = "requests";

/// Writes the request counts of a mount that ended to [`REQUESTS_FILE`] in `cache_dir`:
/// `puts N gets N lists N deletes N put_bytes N get_bytes N`; a failure is logged.
pub fn write_request_counts(cache_dir: &Path, b: &ObjectBackend) {
    let c = b.counts();
    let line = format!(
        "puts {} gets {} lists {} deletes {} put_bytes {} get_bytes {}\n",
        c.puts, c.gets, c.lists, c.deletes, c.put_bytes, c.get_bytes
    );
    if let Err(e) = std::fs::write(cache_dir.join(REQUESTS_FILE), line) {
        tracing::warn!(
            "cannot write {}: {e}",
            cache_dir.join(REQUESTS_FILE).display()
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::object::{S3Url, DEFAULT_DIRTY_LIMIT, DEFAULT_UPLOAD_LIMIT};

    #[test]
    fn object_options_are_taken_out_of_the_lists() {
        let (rest, o) = split_options(&[
            "compress=zstd:3,cache_dir=/x,cache_size=64M".into(),
            "credentials=/c,timeout=5,dirty_limit=16M".into(),
            "ro".into(),
        ])
        .unwrap();
        assert_eq!(rest, vec!["compress=zstd:3".to_string(), "ro".to_string()]);
        assert_eq!(o.cache_dir, Some(PathBuf::from("/x")));
        assert_eq!(o.cache_size, 64 << 20);
        assert_eq!(o.remote.credentials, Some(PathBuf::from("/c")));
        assert_eq!(o.remote.deadline, Duration::from_secs(5));
        assert_eq!(o.dirty_limit, 16 << 20);
        assert_eq!(
            split_options(&[]).unwrap().1.dirty_limit,
            DEFAULT_DIRTY_LIMIT
        );
        assert_eq!(o.metadata_interval, Duration::from_secs(60));
        assert_eq!(o.lease.timeout, Duration::from_secs(60));
        let (rest, o) =
            split_options(&["metadata_interval=5,lease_timeout=9,noatime".into()]).unwrap();
        assert_eq!(rest, vec!["noatime".to_string()]);
        assert_eq!(o.metadata_interval, Duration::from_secs(5));
        assert_eq!(o.lease.timeout, Duration::from_secs(9));
        assert!(!o.writeback);
        let (rest, o) = split_options(&["writeback,noatime".into()]).unwrap();
        assert_eq!(rest, vec!["noatime".to_string()]);
        assert!(o.writeback);
        assert_eq!(o.upload_limit, DEFAULT_UPLOAD_LIMIT);
        let (_, o) = split_options(&["writeback,upload_limit=256M".into()]).unwrap();
        assert_eq!(o.upload_limit, 256 << 20);
        for bad in [
            "cache_size=lots",
            "timeout=0",
            "cache_dir",
            "writeback=1",
            "dirty_limit=4K",
            "dirty_limit",
            "metadata_interval=0",
            "metadata_interval",
            "lease_timeout=2",
            "lease_timeout=x",
            "upload_limit=512K",
            "upload_limit=x",
            "upload_limit",
        ] {
            assert!(split_options(&[bad.into()]).is_err(), "{bad}");
        }
        assert_eq!(
            split_options(&["timeout=0".into()])
                .unwrap_err()
                .to_string(),
            "timeout=0: want a number of seconds"
        );
        assert_eq!(
            split_options(&["lease_timeout=2".into()])
                .unwrap_err()
                .to_string(),
            "lease_timeout=2: the lease timeout is at least 3 seconds"
        );
        assert!(S3Url::from_path(Path::new("/tmp/x")).unwrap().is_none());
        assert!(S3Url::from_path(Path::new("s3://b/p")).unwrap().is_some());
        assert!(S3Url::from_path(Path::new("s3:///p")).is_err());
    }
}
