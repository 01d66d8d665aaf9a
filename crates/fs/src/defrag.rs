//! The `compfs.defrag` channel: how `compfs defrag` recompresses files on a mounted filesystem.
//!
//! * **Request**: `setxattr(FILE, "compfs.defrag", SPEC)` runs
//!   [`compfs_store::Store::defrag`] on `FILE` in the daemon and returns when the file is done.
//!   `SPEC` is ASCII, space-separated tokens, each at most once: `codec=ALG[:LEVEL]` (`none`
//!   for `--nocomp`), `level=N` (`-L`), `force` (`--force`), `extent_size=SIZE`
//!   (`--extent-size`, normalised as `128K`); an empty value uses the file's own
//!   policy ([`encode_request`], [`parse_request`]). A malformed value is `EINVAL`, a
//!   directory `EISDIR`.
//! * **Answer**: `getxattr(FILE, "compfs.defrag")` from the same process (any of its threads)
//!   returns the figures of its last request on that file, the running figures while the
//!   request is still being served (so another thread can show progress within a big file),
//!   as a [`DefragRecord`] (`compfs-defrag 1` then `key value` lines). The daemon keeps the
//!   last [`MAX_RESULTS`] answers; a getxattr without a request is `ENODATA`. The name is not
//!   listed by listxattr and cannot be removed (`EPERM`).
//! * **Permission**: any user who may write the file. The kernel calls
//!   `inode_permission(MAY_WRITE)` before passing a setxattr whose name is outside the
//!   `security.`, `system.`, `trusted.` and `user.` namespaces (fs/xattr.c `xattr_permission()`),
//!   and compfs mounts with `default_permissions`, so the kernel already refuses (`EACCES`) a
//!   user without write permission; fuser passes the request through unchecked. The daemon
//!   checks again from the request's uid, gid and the caller's supplementary groups
//!   (`/proc/TID/status`, [`caller_of`]) with the file's mode ([`may_write`]), so the rule does
//!   not depend on the kernel's choice for unknown namespaces. Root (uid 0) may write any file,
//!   as with `CAP_DAC_OVERRIDE`.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::Mutex;

use compfs_codec::CodecSpec;
use compfs_store::{Attr, DefragReport, DefragTarget, Ino};

use crate::error::RecordError;
use crate::procstatus::ProcStatus;

/// The write-to-request, read-for-figures xattr.
pub const DEFRAG_XATTR: &str = "compfs.defrag";

/// Answers the daemon keeps (oldest dropped first).
pub const MAX_RESULTS: usize = 4096;

const MAGIC: &str = "compfs-defrag 1";

/// The setxattr value for a target.
pub fn encode_request(t: &DefragTarget) -> String {
    let mut v = Vec::new();
    if let Some(s) = t.spec {
        v.push(format!("codec={s}"));
    }
    if let Some(l) = t.level {
        v.push(format!("level={l}"));
    }
    if t.force {
        v.push("force".to_string());
    }
    if let Some(n) = t.extent_size {
        v.push(format!(
            "extent_size={}",
            compfs_store::format_extent_size(n)
        ));
    }
    v.join(" ")
}

/// Parses a setxattr value (see the module documentation).
pub fn parse_request(v: &[u8]) -> Result<DefragTarget, RecordError> {
    let text = std::str::from_utf8(v).map_err(|_| RecordError::new("defrag: not UTF-8"))?;
    let mut t = DefragTarget::default();
    let mut seen = std::collections::BTreeSet::new();
    for tok in text.split_ascii_whitespace() {
        let (k, val) = tok.split_once('=').unwrap_or((tok, ""));
        if !seen.insert(k.to_string()) {
            return Err(RecordError::new(format!("defrag: '{k}' given twice")));
        }
        match (k, val) {
            ("codec", s) => {
                let p = CodecSpec::parse(s)
                    .map_err(|e| RecordError::new(format!("defrag: codec: {e}")))?;
                t.spec = Some(p.spec);
            }
            ("level", n) => {
                let l: i32 = n
                    .parse()
                    .map_err(|_| RecordError::new(format!("defrag: bad level '{n}'")))?;
                t.level = Some(l);
            }
            ("force", "") => t.force = true,
            ("extent_size", n) => {
                t.extent_size =
                    Some(compfs_store::parse_extent_size(n).ok_or_else(|| {
                        RecordError::new(format!("defrag: bad extent size '{n}'"))
                    })?);
            }
            _ => return Err(RecordError::new(format!("defrag: unknown token '{tok}'"))),
        }
    }
    Ok(t)
}

/// The figures of one request, as the getxattr answer carries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DefragRecord(pub DefragReport);

impl DefragRecord {
    fn fields(r: &DefragReport) -> [(&'static str, u64); 8] {
        [
            ("files", r.files),
            ("extents_examined", r.extents_examined),
            ("extents_rewritten", r.extents_rewritten),
            ("extents_skipped", r.extents_skipped),
            ("bytes_examined", r.bytes_examined),
            ("bytes_rewritten", r.bytes_rewritten),
            ("disk_before", r.disk_before),
            ("disk_after", r.disk_after),
        ]
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut s = format!("{MAGIC}\n");
        for (k, n) in Self::fields(&self.0) {
            let _ = writeln!(s, "{k} {n}");
        }
        s.into_bytes()
    }

    /// Decodes a record; every field must be present exactly once (unknown keys are ignored,
    /// so a later daemon may add some).
    pub fn decode(v: &[u8]) -> Result<DefragRecord, RecordError> {
        let text = std::str::from_utf8(v).map_err(|_| RecordError::new("defrag: not UTF-8"))?;
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC) {
            return Err(RecordError::new("defrag: missing 'compfs-defrag 1' header"));
        }
        let mut m = BTreeMap::new();
        for l in lines {
            let (k, n) = l
                .split_once(' ')
                .ok_or_else(|| RecordError::new(format!("defrag: bad line '{l}'")))?;
            let n: u64 = n
                .parse()
                .map_err(|_| RecordError::new(format!("defrag: bad number in '{l}'")))?;
            if m.insert(k.to_string(), n).is_some() {
                return Err(RecordError::new(format!("defrag: repeated key '{k}'")));
            }
        }
        let mut get = |k: &str| {
            m.remove(k)
                .ok_or_else(|| RecordError::new(format!("defrag: missing '{k}'")))
        };
        Ok(DefragRecord(DefragReport {
            files: get("files")?,
            extents_examined: get("extents_examined")?,
            extents_rewritten: get("extents_rewritten")?,
            extents_skipped: get("extents_skipped")?,
            bytes_examined: get("bytes_examined")?,
            bytes_rewritten: get("bytes_rewritten")?,
            disk_before: get("disk_before")?,
            disk_after: get("disk_after")?,
        }))
    }
}

/// Whether a caller may write a file with these attributes: root always; else the owner's,
/// group's (primary or supplementary) or others' write bit, the first class that applies
/// deciding, as `generic_permission()` does.
pub fn may_write(attr: &Attr, uid: u32, gid: u32, groups: &[u32]) -> bool {
    if uid == 0 {
        return true;
    }
    if uid == attr.uid {
        return attr.perm & 0o200 != 0;
    }
    if gid == attr.gid || groups.contains(&attr.gid) {
        return attr.perm & 0o020 != 0;
    }
    attr.perm & 0o002 != 0
}

/// The caller's process (thread group) and supplementary groups, from `/proc/TID/status` (the
/// FUSE request carries the calling thread's id): `(tgid, groups)`. Unreadable (the caller
/// exited): the thread id and no groups, which only narrows what [`may_write`] allows.
pub fn caller_of(tid: u32) -> (u32, Vec<u32>) {
    let st = ProcStatus::read(tid);
    (st.tgid.unwrap_or(tid), st.groups.unwrap_or_default())
}

/// The answers waiting to be read, keyed by (inode, requesting process).
#[derive(Debug, Default)]
pub struct Answers {
    inner: Mutex<(BTreeMap<Requester, DefragReport>, VecDeque<Requester>)>,
}

/// (inode, requesting process).
type Requester = (Ino, u32);

impl Answers {
    pub fn put(&self, ino: Ino, pid: u32, r: DefragReport) {
        let mut g = match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if g.0.insert((ino, pid), r).is_none() {
            g.1.push_back((ino, pid));
        }
        while g.1.len() > MAX_RESULTS {
            if let Some(k) = g.1.pop_front() {
                g.0.remove(&k);
            }
        }
    }

    pub fn get(&self, ino: Ino, pid: u32) -> Option<DefragReport> {
        let g = match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        g.0.get(&(ino, pid)).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use compfs_store::{FileKind, Timestamp};

    #[test]
    fn requests_round_trip() {
        let z9 = CodecSpec::parse("zstd:9").unwrap().spec;
        for t in [
            DefragTarget::default(),
            DefragTarget {
                spec: Some(z9),
                level: None,
                force: false,
                extent_size: None,
            },
            DefragTarget {
                spec: Some(CodecSpec::none()),
                level: Some(-3),
                force: true,
                extent_size: Some(32768),
            },
        ] {
            assert_eq!(parse_request(encode_request(&t).as_bytes()).unwrap(), t);
        }
        assert_eq!(encode_request(&DefragTarget::default()), "");
    }

    #[test]
    fn malformed_requests_are_typed_errors() {
        for bad in [
            &b"codec=zip"[..],
            b"level=x",
            b"force=1",
            b"force force",
            b"bogus",
            b"\xff\xfe",
            b"codec=zstd codec=lz4",
            b"extent_size=3K",
            b"extent_size=2M",
            b"extent_size=",
        ] {
            assert!(parse_request(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn records_round_trip_and_reject_damage() {
        let r = DefragRecord(DefragReport {
            files: 1,
            extents_examined: 9,
            extents_rewritten: 4,
            extents_skipped: 5,
            bytes_examined: 1 << 20,
            bytes_rewritten: 1 << 19,
            disk_before: 1000,
            disk_after: 800,
        });
        assert_eq!(DefragRecord::decode(&r.encode()).unwrap(), r);
        let text = String::from_utf8(r.encode()).unwrap();
        for bad in [
            String::new(),
            text.replace("compfs-defrag 1", "compfs-defrag 2"),
            text.replace("files 1\n", ""),
            text.replace("files 1", "files x"),
            text.replace("files 1", "files"),
            format!("{text}files 2\n"),
        ] {
            assert!(DefragRecord::decode(bad.as_bytes()).is_err(), "{bad}");
        }
        assert!(DefragRecord::decode(b"\xff").is_err());
    }

    #[test]
    fn write_permission_follows_the_mode_classes() {
        let t = Timestamp::default();
        let a = |perm: u16| Attr {
            ino: 5,
            kind: FileKind::File,
            perm,
            nlink: 1,
            uid: 1000,
            gid: 100,
            rdev: 0,
            size: 0,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
        };
        assert!(may_write(&a(0o000), 0, 0, &[]));
        assert!(may_write(&a(0o600), 1000, 1, &[]));
        assert!(!may_write(&a(0o466), 1000, 100, &[]), "owner class decides");
        assert!(may_write(&a(0o460), 2000, 100, &[]));
        assert!(may_write(&a(0o460), 2000, 1, &[7, 100]));
        assert!(!may_write(&a(0o446), 2000, 100, &[]), "group class decides");
        assert!(may_write(&a(0o442), 2000, 1, &[]));
        assert!(!may_write(&a(0o644), 2000, 1, &[]));
    }

    #[test]
    fn caller_is_the_thread_group() {
        // This process, asked from the main thread.
        let (tgid, _) = caller_of(std::process::id());
        assert_eq!(tgid, std::process::id());
    }

    #[test]
    fn answers_are_bounded_and_per_process() {
        let a = Answers::default();
        let r = DefragReport {
            files: 1,
            ..DefragReport::default()
        };
        a.put(1, 10, r);
        assert_eq!(a.get(1, 10), Some(r));
        assert_eq!(a.get(1, 11), None);
        for i in 0..MAX_RESULTS as u64 + 10 {
            a.put(100 + i, 1, r);
        }
        assert_eq!(a.get(1, 10), None, "oldest answer dropped");
        assert_eq!(a.get(99 + MAX_RESULTS as u64 + 10, 1), Some(r));
        let g = a.inner.lock().unwrap();
        assert_eq!((g.0.len(), g.1.len()), (MAX_RESULTS, MAX_RESULTS));
    }
}
