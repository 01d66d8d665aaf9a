//! Opening the files of a store: the superblock, the metadata database (checked to be a
//! compfs one before redb sees it, with optional fault injection) and the store's identity.

use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable};

use crate::backend::{FaultBackend, MetaFile, SegSync};
use crate::error::{Error, Result};
use crate::meta::{self};
use crate::records::{SbError, Superblock, FORMAT_VERSION, META_FILE, SUPERBLOCK_FILE};
use crate::store::Inner;

pub(crate) fn random_uuid() -> Result<[u8; 16]> {
    use std::io::Read;
    let mut u = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut u)?;
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    Ok(u)
}

/// Formats a UUID the usual way.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

pub(crate) fn sync_dir(p: &Path) -> Result<()> {
    std::fs::File::open(p)?.sync_all()?;
    Ok(())
}

/// Reads and checks the superblock of `dir`.
pub(crate) fn read_superblock(dir: &Path) -> Result<Superblock> {
    let not_store = |reason: String| Error::NotAStore {
        path: dir.to_path_buf(),
        reason,
    };
    if !dir.is_dir() {
        return Err(not_store("not a directory".into()));
    }
    let p = dir.join(SUPERBLOCK_FILE);
    let bytes = match std::fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(not_store(format!("it has no {SUPERBLOCK_FILE}")))
        }
        Err(e) => return Err(Error::Io(e)),
    };
    Superblock::decode(&bytes).map_err(|e| match e {
        SbError::BadMagic => not_store(format!(
            "{SUPERBLOCK_FILE} has no compfs magic (written by another program?)"
        )),
        SbError::FutureVersion(v) => Error::UnsupportedVersion {
            path: dir.to_path_buf(),
            found: v,
            supported: FORMAT_VERSION,
        },
        SbError::Truncated(n) => Error::BadSuperblock {
            path: p.clone(),
            reason: format!("truncated to {n} bytes"),
        },
        SbError::BadChecksum { stored, computed } => Error::BadSuperblock {
            path: p.clone(),
            reason: format!("checksum mismatch (stored {stored:08x}, computed {computed:08x})"),
        },
        SbError::BadField(f) => Error::BadSuperblock {
            path: p.clone(),
            reason: format!("invalid {f}"),
        },
    })
}

/// Opens the metadata database after checking that it is one (redb may write to a file it
/// opens, so a foreign file is rejected before redb sees it).
pub(crate) fn open_db(dir: &Path) -> Result<Database> {
    open_db_with(dir, None, None, None)
}

/// [`open_db`] with `faults` injected into redb's I/O of the file and the segments of `gate`
/// synced before redb writes its header (see [`meta_db`]).
pub(crate) fn open_db_with(
    dir: &Path,
    faults: Option<&FaultBackend>,
    cache: Option<usize>,
    gate: Option<Arc<SegSync>>,
) -> Result<Database> {
    let p = dir.join(META_FILE);
    let mut head = [0u8; 9];
    {
        use std::io::Read;
        let mut f = std::fs::File::open(&p).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::NotAStore {
                path: dir.to_path_buf(),
                reason: format!("it has no {META_FILE}"),
            },
            _ => Error::Io(e),
        })?;
        let n = f.read(&mut head)?;
        if n < 4 || &head[0..4] != b"redb" {
            return Err(Error::NotAStore {
                path: dir.to_path_buf(),
                reason: format!(
                    "{META_FILE} is not a compfs metadata database (another program's file?)"
                ),
            });
        }
    }
    meta_db(&p, false, faults, cache, gate).map_err(|e| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => Error::InUse(dir.to_path_buf()),
        // A failing device (EIO, ENOSPC while redb repairs) does not make the file foreign.
        redb::DatabaseError::Storage(redb::StorageError::Io(e)) if e.raw_os_error().is_some() => {
            Error::from_io(e)
        }
        other => Error::NotAStore {
            path: dir.to_path_buf(),
            reason: format!("{META_FILE} cannot be opened: {other}"),
        },
    })
}

/// Opens (with `create`: creates) the redb database `p`. The file goes through [`MetaFile`]:
/// redb's own `FileBackend`, with the segments of `gate` synced before any write of redb's
/// header (so no commit redb can come back at references unsynced segment bytes) and, in
/// tests, `faults`. It forwards redb's lock calls to the `FileBackend`, so a second open of a
/// store in use fails with `DatabaseAlreadyOpen` ([`Error::InUse`]; tested in
/// `tests/meta_faults.rs`).
pub(crate) fn meta_db(
    p: &Path,
    create: bool,
    faults: Option<&FaultBackend>,
    cache: Option<usize>,
    gate: Option<Arc<SegSync>>,
) -> std::result::Result<Database, redb::DatabaseError> {
    let mut b = Database::builder();
    if let Some(c) = cache {
        b.set_cache_size(c);
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .open(p)?;
    b.create_with_backend(MetaFile::new(f, faults.cloned(), gate)?)
}

/// Writes the superblock atomically: temp file, fsync, rename, fsync of the directory.
pub(crate) fn write_superblock(dir: &Path, sb: &Superblock) -> Result<()> {
    let tmp = dir.join(format!("{SUPERBLOCK_FILE}.tmp"));
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&sb.encode())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(SUPERBLOCK_FILE))?;
    sync_dir(dir)
}

/// Upgrades an older store that is about to be written to the current format version, before
/// anything in the new format is written: the `format` value of the metadata (one durable
/// commit), then the superblock (atomically). Every structure of the older version stays valid
/// in the new one (readers decode both record versions), so nothing else is rewritten; a
/// crash between the two steps leaves a store that this version opens and upgrades again.
pub(crate) fn upgrade_format(dir: &Path, db: &Database, sb: &mut Superblock) -> Result<()> {
    if sb.version >= FORMAT_VERSION {
        return Ok(());
    }
    let txn = db.begin_write()?;
    {
        let mut t = txn.open_table(meta::META)?;
        t.insert("format", FORMAT_VERSION.to_le_bytes().as_slice())?;
    }
    txn.commit()?;
    let old = sb.version;
    sb.version = FORMAT_VERSION;
    write_superblock(dir, sb)?;
    tracing::info!(
        "compfs: store {} upgraded from format version {old} to {FORMAT_VERSION}",
        dir.display()
    );
    Ok(())
}

/// Checks that the metadata belongs to the superblock's store.
pub(crate) fn check_identity(dir: &Path, db: &Database, sb: &Superblock) -> Result<()> {
    let bad = |reason: &str| Error::NotAStore {
        path: dir.to_path_buf(),
        reason: reason.to_string(),
    };
    let txn = db.begin_read()?;
    let t = txn
        .open_table(meta::META)
        .map_err(|_| bad("metadata has no compfs tables"))?;
    let uuid = t
        .get("uuid")?
        .ok_or_else(|| bad("metadata has no store UUID"))?;
    if uuid.value() != sb.uuid {
        return Err(bad("metadata belongs to another store (UUID mismatch)"));
    }
    Ok(())
}

impl Inner {
    pub(crate) fn free_orphans(&self) -> Result<()> {
        let orphans: Vec<u64> = {
            let txn = self.read_txn()?;
            let t = txn.open_table(meta::ORPHANS)?;
            t.iter()?
                .map(|r| r.map(|(k, _)| k.value()))
                .collect::<std::result::Result<_, _>>()?
        };
        if orphans.is_empty() {
            return Ok(());
        }
        self.write(true, |w| {
            for ino in orphans {
                match w.free_inode(ino) {
                    Ok(()) | Err(Error::NotFound) => {}
                    Err(e) => return Err(e),
                }
                w.orphans_mut()?.remove(ino)?;
            }
            Ok(())
        })
    }
}
