//! `compfs usage` on paths inside a mount: walk the tree (without following symlinks or leaving
//! the file system) and add up every regular file's `compfs.usage` record, each inode once.

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::RecordError;
use crate::mount::is_on_compfs;
use crate::report::USAGE_XATTR;
use crate::usage::UsageReport;

/// Why the usage of a path could not be reported.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// The path (as given: the directory, not a file inside it) is not on a compfs mount.
    #[error("{} is not on a mounted compfs filesystem (and is not a compfs store directory)", path.display())]
    NotCompfs { path: PathBuf },
    #[error("{}: permission denied (usage is reported only for files you can read)", path.display())]
    Denied { path: PathBuf },
    #[error("{}: {err}", path.display())]
    Io { path: PathBuf, err: io::Error },
    #[error(transparent)]
    Record(#[from] RecordError),
}

/// Adds the usage of every regular file under `root` (a file or a directory on a compfs mount)
/// to `total`, skipping inodes already in `seen` (hard links, overlapping paths).
pub fn add_tree_usage(
    root: &Path,
    seen: &mut HashSet<(u64, u64)>,
    total: &mut UsageReport,
) -> Result<(), UsageError> {
    let io_err = |p: &Path| {
        let path = p.to_path_buf();
        move |err| UsageError::Io { path, err }
    };
    let md = std::fs::symlink_metadata(root).map_err(io_err(root))?;
    if !is_on_compfs(md.dev()) {
        return Err(UsageError::NotCompfs {
            path: root.to_path_buf(),
        });
    }
    let dev = md.dev();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let md = std::fs::symlink_metadata(&p).map_err(io_err(&p))?;
        if md.dev() != dev {
            continue;
        }
        if md.is_dir() {
            for e in std::fs::read_dir(&p).map_err(io_err(&p))? {
                stack.push(e.map_err(io_err(&p))?.path());
            }
        } else if md.is_file() && seen.insert((md.dev(), md.ino())) {
            let rec = match xattr::get(&p, USAGE_XATTR) {
                Ok(Some(rec)) => rec,
                // Only a file on another file system mounted below would lack the record, and
                // the walk does not leave the file system.
                Ok(None) => return Err(UsageError::NotCompfs { path: root.into() }),
                Err(e) => return Err(classify(root, &p, e)),
            };
            total.merge(&UsageReport::from_record(&rec)?);
        }
    }
    Ok(())
}

/// The error for a failed read of `file`'s record during the walk of `root`.
fn classify(root: &Path, file: &Path, err: io::Error) -> UsageError {
    match err.raw_os_error() {
        Some(libc::ENOTSUP) => UsageError::NotCompfs {
            path: root.to_path_buf(),
        },
        Some(libc::EACCES | libc::EPERM) => UsageError::Denied {
            path: file.to_path_buf(),
        },
        _ => UsageError::Io {
            path: file.to_path_buf(),
            err,
        },
    }
}
