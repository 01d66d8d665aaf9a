//! `compfs defrag` on paths: which files a command line names, and the rewrite of each, on a
//! mount (through the [`crate::defrag`] xattr channel) or in an unmounted store (directly with
//! [`Store::defrag`]).
//!
//! A PATH is, in this order: an existing path on a compfs mount; a store directory (its root
//! directory); or a path *inside* a store directory that does not exist on the host, such as
//! `STORE/docs/a.txt`, resolved through the store's own directories. Directories are walked
//! with `-r` (without following symlinks or leaving the mount) and skipped otherwise, as
//! btrfs-progs does; each inode is processed once (hard links, overlapping paths).

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use compfs_store::{DefragReport, DefragTarget, FileKind, Ino, OpenOptions, Store, ROOT_INO};

use crate::defrag::{encode_request, DefragRecord, DEFRAG_XATTR};
use crate::error::RecordError;
use crate::mount::is_on_compfs;

/// Why `compfs defrag` could not process a path.
#[derive(Debug, thiserror::Error)]
pub enum DefragError {
    #[error("{} is not on a mounted compfs filesystem, not a compfs store directory and not inside one", path.display())]
    NotCompfs { path: PathBuf },
    #[error("{}: permission denied (defrag needs write permission on the file)", path.display())]
    Denied { path: PathBuf },
    #[error("{}: {err}", path.display())]
    Io { path: PathBuf, err: io::Error },
    #[error("store {}: {err}", dir.display())]
    Store {
        dir: PathBuf,
        err: compfs_store::Error,
    },
    #[error("{}: {err}", path.display())]
    File {
        path: PathBuf,
        err: compfs_store::Error,
    },
    #[error("store {} is mounted; run `compfs defrag` on its mount point instead", dir.display())]
    Mounted { dir: PathBuf },
    #[error("{}: no such file in store {}", path.display(), dir.display())]
    NotInStore { path: PathBuf, dir: PathBuf },
    #[error(transparent)]
    Record(#[from] RecordError),
}

/// An unmounted store and the files of it to process.
pub struct StoreJob {
    pub dir: PathBuf,
    store: Store,
    /// (inode, size, path shown in messages).
    files: Vec<(Ino, u64, PathBuf)>,
    seen: HashSet<Ino>,
}

/// The files a command line names.
#[derive(Default)]
pub struct Plan {
    /// Regular files on mounts and their sizes.
    pub mounted: Vec<(PathBuf, u64)>,
    pub stores: Vec<StoreJob>,
    /// Directories named without `-r` (skipped).
    pub skipped_dirs: Vec<PathBuf>,
}

impl Plan {
    /// Files and bytes (file sizes) to examine.
    pub fn totals(&self) -> (u64, u64) {
        let mut n = self.mounted.len() as u64;
        let mut b: u64 = self.mounted.iter().map(|f| f.1).sum();
        for s in &self.stores {
            n += s.files.len() as u64;
            b += s.files.iter().map(|f| f.1).sum::<u64>();
        }
        (n, b)
    }
}

fn io_err(p: &Path) -> impl FnOnce(io::Error) -> DefragError {
    let path = p.to_path_buf();
    move |err| DefragError::Io { path, err }
}

/// Resolves the command line's paths into files (see the module documentation).
pub fn plan(paths: &[PathBuf], recursive: bool) -> Result<Plan, DefragError> {
    let mut plan = Plan::default();
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let mut stores: BTreeMap<PathBuf, StoreJob> = BTreeMap::new();
    for path in paths {
        if Store::is_store(path) {
            let job = store_job(&mut stores, path)?;
            add_store_tree(
                job,
                ROOT_INO,
                path.clone(),
                recursive,
                &mut plan.skipped_dirs,
            )?;
            continue;
        }
        match std::fs::symlink_metadata(path) {
            Ok(md) => {
                if !is_on_compfs(md.dev()) {
                    return Err(DefragError::NotCompfs { path: path.clone() });
                }
                add_mounted_tree(&mut plan, &mut seen, path, md.dev(), recursive)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let Some((dir, rel)) = inside_store(path) else {
                    return Err(DefragError::NotCompfs { path: path.clone() });
                };
                let job = store_job(&mut stores, &dir)?;
                let ino = resolve(&job.store, &rel).ok_or_else(|| DefragError::NotInStore {
                    path: path.clone(),
                    dir: dir.clone(),
                })?;
                add_store_tree(job, ino, path.clone(), recursive, &mut plan.skipped_dirs)?;
            }
            Err(e) => return Err(io_err(path)(e)),
        }
    }
    plan.stores = stores.into_values().collect();
    Ok(plan)
}

/// Adds a store opened by the caller (a store in a bucket, `name` its URL) to `plan`: its root
/// directory, walked with `recursive` (and skipped without it, as a store directory is). The
/// store is synced and closed by [`run`].
pub fn add_open_store(
    plan: &mut Plan,
    store: Store,
    name: PathBuf,
    recursive: bool,
) -> Result<(), DefragError> {
    let mut job = StoreJob {
        dir: name.clone(),
        store,
        files: Vec::new(),
        seen: HashSet::new(),
    };
    add_store_tree(&mut job, ROOT_INO, name, recursive, &mut plan.skipped_dirs)?;
    plan.stores.push(job);
    Ok(())
}

/// The store directory among `path`'s ancestors and the rest of the path inside it.
fn inside_store(path: &Path) -> Option<(PathBuf, PathBuf)> {
    path.ancestors()
        .skip(1)
        .filter(|a| !a.as_os_str().is_empty())
        .find(|a| Store::is_store(a))
        .and_then(|a| {
            let rel = path.strip_prefix(a).ok()?.to_path_buf();
            Some((a.to_path_buf(), rel))
        })
}

/// The inode at a relative path inside a store (`..` and symlinks are not followed).
fn resolve(store: &Store, rel: &Path) -> Option<Ino> {
    let mut ino = ROOT_INO;
    for c in rel.components() {
        match c {
            Component::Normal(n) => ino = store.lookup(ino, n.as_bytes()).ok()?.ino,
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(ino)
}

fn store_job<'a>(
    stores: &'a mut BTreeMap<PathBuf, StoreJob>,
    dir: &Path,
) -> Result<&'a mut StoreJob, DefragError> {
    let key = std::fs::canonicalize(dir).map_err(io_err(dir))?;
    if !stores.contains_key(&key) {
        let store = Store::open(dir, &OpenOptions::default()).map_err(|err| match err {
            compfs_store::Error::InUse(_) => DefragError::Mounted {
                dir: dir.to_path_buf(),
            },
            err => DefragError::Store {
                dir: dir.to_path_buf(),
                err,
            },
        })?;
        stores.insert(
            key.clone(),
            StoreJob {
                dir: dir.to_path_buf(),
                store,
                files: Vec::new(),
                seen: HashSet::new(),
            },
        );
    }
    stores.get_mut(&key).ok_or_else(|| DefragError::NotCompfs {
        path: dir.to_path_buf(),
    })
}

fn add_store_tree(
    job: &mut StoreJob,
    top: Ino,
    shown: PathBuf,
    recursive: bool,
    skipped: &mut Vec<PathBuf>,
) -> Result<(), DefragError> {
    let serr = |dir: &Path| {
        let dir = dir.to_path_buf();
        move |err| DefragError::Store { dir, err }
    };
    let mut stack = vec![(top, shown, true)];
    while let Some((ino, p, is_top)) = stack.pop() {
        let a = job.store.getattr(ino).map_err(serr(&job.dir))?;
        match a.kind {
            FileKind::File if job.seen.insert(ino) => job.files.push((ino, a.size, p)),
            FileKind::Dir if is_top && !recursive => skipped.push(p),
            FileKind::Dir => {
                let mut off = 0;
                loop {
                    let es = job.store.readdir(ino, off, 256).map_err(serr(&job.dir))?;
                    let Some(last) = es.last() else { break };
                    off = last.offset;
                    for e in es {
                        if e.name != b"." && e.name != b".." {
                            let name = std::ffi::OsStr::from_bytes(&e.name);
                            stack.push((e.ino, p.join(name), false));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn add_mounted_tree(
    plan: &mut Plan,
    seen: &mut HashSet<(u64, u64)>,
    root: &Path,
    dev: u64,
    recursive: bool,
) -> Result<(), DefragError> {
    let mut stack = vec![(root.to_path_buf(), true)];
    while let Some((p, is_top)) = stack.pop() {
        let md = std::fs::symlink_metadata(&p).map_err(io_err(&p))?;
        if md.dev() != dev {
            continue;
        }
        if md.is_dir() {
            if is_top && !recursive {
                plan.skipped_dirs.push(p);
                continue;
            }
            for e in std::fs::read_dir(&p).map_err(io_err(&p))? {
                stack.push((e.map_err(io_err(&p))?.path(), false));
            }
        } else if md.is_file() && seen.insert((md.dev(), md.ino())) {
            plan.mounted.push((p, md.size()));
        }
    }
    Ok(())
}

/// Asks the daemon to defrag one file on a mount and returns its figures.
pub fn defrag_mounted(path: &Path, target: &DefragTarget) -> Result<DefragReport, DefragError> {
    let classify = |e: io::Error| match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => DefragError::Denied {
            path: path.to_path_buf(),
        },
        Some(libc::ENOTSUP) => DefragError::NotCompfs {
            path: path.to_path_buf(),
        },
        _ => DefragError::Io {
            path: path.to_path_buf(),
            err: e,
        },
    };
    xattr::set(path, DEFRAG_XATTR, encode_request(target).as_bytes()).map_err(classify)?;
    let rec = xattr::get(path, DEFRAG_XATTR)
        .map_err(classify)?
        .ok_or_else(|| RecordError::new("defrag: the daemon kept no answer"))?;
    Ok(DefragRecord::decode(&rec)?.0)
}

/// How often the running figures of a file on a mount are fetched while it is defragged.
const POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Processes a plan: `progress` gets the running total after each batch (unmounted stores; on
/// mounts, from a second thread that polls the daemon's running figures every 100 ms while a
/// file is served) and after each file; `failed` gets each file that failed (the others go on).
/// Stores are synced and closed at the end.
pub fn run(
    plan: Plan,
    target: &DefragTarget,
    progress: &(dyn Fn(&DefragReport) + Sync),
    failed: &mut dyn FnMut(DefragError),
) -> DefragReport {
    let mut total = DefragReport::default();
    for (p, _) in &plan.mounted {
        let done = std::sync::atomic::AtomicBool::new(false);
        let res = std::thread::scope(|sc| {
            let base = total;
            let (done, path) = (&done, p.as_path());
            sc.spawn(move || {
                let mut waited = std::time::Duration::ZERO;
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    waited += std::time::Duration::from_millis(10);
                    if waited < POLL {
                        continue;
                    }
                    waited = std::time::Duration::ZERO;
                    let rec = xattr::get(path, DEFRAG_XATTR).ok().flatten();
                    if let Some(Ok(DefragRecord(r))) = rec.map(|v| DefragRecord::decode(&v)) {
                        if !done.load(std::sync::atomic::Ordering::SeqCst) {
                            let mut t = base;
                            t.add(&r);
                            progress(&t);
                        }
                    }
                }
            });
            let res = defrag_mounted(p, target);
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            res
        });
        match res {
            Ok(r) => total.add(&r),
            Err(e) => failed(e),
        }
        progress(&total);
    }
    for job in plan.stores {
        for (ino, _, p) in &job.files {
            let base = total;
            let r = job.store.defrag(*ino, target, &mut |r| {
                let mut t = base;
                t.add(r);
                progress(&t);
            });
            match r {
                Ok(r) => total.add(&r),
                Err(err) => failed(DefragError::File {
                    path: p.clone(),
                    err,
                }),
            }
            progress(&total);
        }
        let dir = job.dir.clone();
        if let Err(err) = job.store.sync().and_then(|()| job.store.close()) {
            failed(DefragError::Store { dir, err });
        }
    }
    total
}
