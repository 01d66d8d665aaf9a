//! Metadata snapshots in the bucket: `meta.redb` cut in [`PIECE_SIZE`] pieces, each an object
//! named by its index and the generation that wrote it, and a manifest listing the pieces of
//! the latest generation with their CRC-32C. An upload PUTs the pieces that changed, then the
//! manifest (the commit point), then deletes the pieces it replaced; a download verifies
//! every piece against the manifest.
//!
//! An upload is of a [`MetaCopy`] of `meta.redb`, taken while redb's write lock is held (the image
//! of one durable commit) and uploaded once the lock is released. Copies are numbered in the
//! order they were taken; one is uploaded only if no later copy was uploaded first (that later
//! image holds every change of the earlier one), so generations in the bucket follow the order
//! of the commits and never go back.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::layout::{
    parse_piece_key, piece_key, Manifest, ManifestError, Piece, MANIFEST_KEY, PIECE_SIZE,
};
use super::remote::Remote;
use crate::records::META_FILE;

/// The file in the cache directory naming the snapshot the local `meta.redb` was last
/// uploaded as or downloaded from: `UUID-HEX GENERATION`.
pub const LOCAL_GEN_FILE: &str = "remote-generation";

fn hex(u: &[u8; 16]) -> String {
    u.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads the manifest; `None` when the bucket has none.
pub fn fetch_manifest(remote: &Remote) -> io::Result<Option<Manifest>> {
    match remote.get(MANIFEST_KEY)? {
        None => Ok(None),
        Some(b) => Manifest::decode(&b).map(Some).map_err(|e: ManifestError| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}/{MANIFEST_KEY}: {e}", remote.url),
            )
        }),
    }
}

/// The generation recorded in `cache_dir` for store `uuid`, if any.
pub fn local_generation(cache_dir: &Path, uuid: &[u8; 16]) -> Option<u64> {
    let s = std::fs::read_to_string(cache_dir.join(LOCAL_GEN_FILE)).ok()?;
    let (u, g) = s.trim().split_once(' ')?;
    if u != hex(uuid) {
        return None;
    }
    g.parse().ok()
}

fn write_local_generation(cache_dir: &Path, uuid: &[u8; 16], gen: u64) -> io::Result<()> {
    let tmp = cache_dir.join(format!("{LOCAL_GEN_FILE}.tmp"));
    std::fs::write(&tmp, format!("{} {gen}\n", hex(uuid)))?;
    std::fs::rename(&tmp, cache_dir.join(LOCAL_GEN_FILE))
}

/// Downloads the snapshot of `m` into `cache_dir/meta.redb` (through a temporary file renamed
/// into place once every piece checked out).
pub fn download(remote: &Remote, m: &Manifest, cache_dir: &Path) -> io::Result<()> {
    let mut data = Vec::with_capacity(m.file_len.min(1 << 30) as usize);
    for (i, p) in m.pieces.iter().enumerate() {
        let key = piece_key(i as u32, p.gen);
        let b = remote.get(&key)?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{}: no object {key}", remote.url),
            )
        })?;
        let want = (m.file_len - i as u64 * PIECE_SIZE).min(PIECE_SIZE);
        if b.len() as u64 != want || crc32c::crc32c(&b) != p.crc {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: object {key} is damaged (length or checksum)",
                    remote.url
                ),
            ));
        }
        data.extend_from_slice(&b);
    }
    let tmp = cache_dir.join(format!("{META_FILE}.download"));
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&data)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, cache_dir.join(META_FILE))?;
    std::fs::File::open(cache_dir)?.sync_all()?;
    write_local_generation(cache_dir, &m.uuid, m.gen)
}

/// A copy of `meta.redb` taken by [`MetaUploader::take_copy`]: its number in the order the
/// copies were taken, and its bytes.
pub struct MetaCopy {
    seq: u64,
    data: Vec<u8>,
}

impl MetaCopy {
    /// Its number in the order the copies were taken.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

/// The snapshot in the bucket: generation, file length and pieces; and the number of the copy
/// it was uploaded from (none yet).
struct Last {
    gen: u64,
    file_len: u64,
    pieces: Vec<Piece>,
    seq: Option<u64>,
}

/// Uploads copies of `cache_dir/meta.redb`, each taken after a durable commit with redb's
/// write lock held (so the copy is that commit's image) and uploaded after the lock is
/// released.
pub struct MetaUploader {
    remote: Arc<Remote>,
    cache_dir: PathBuf,
    uuid: [u8; 16],
    /// The number of the next copy.
    next_seq: AtomicU64,
    /// The generation of the snapshot in the bucket (`last.gen`, readable during an upload).
    gen: AtomicU64,
    /// The snapshot in the bucket; held for the whole of an upload (one at a time).
    last: Mutex<Last>,
}

impl MetaUploader {
    /// `last`: the manifest in the bucket (none for a new store).
    pub fn new(
        remote: Arc<Remote>,
        cache_dir: &Path,
        uuid: [u8; 16],
        last: Option<&Manifest>,
    ) -> MetaUploader {
        MetaUploader {
            remote,
            cache_dir: cache_dir.to_path_buf(),
            uuid,
            next_seq: AtomicU64::new(0),
            gen: AtomicU64::new(last.map_or(0, |m| m.gen)),
            last: Mutex::new(Last {
                gen: last.map_or(0, |m| m.gen),
                file_len: last.map_or(0, |m| m.file_len),
                pieces: last.map_or_else(Vec::new, |m| m.pieces.clone()),
                seq: None,
            }),
        }
    }

    /// The generation of the snapshot in the bucket.
    pub fn generation(&self) -> u64 {
        self.gen.load(Ordering::SeqCst)
    }

    /// Deletes pieces no manifest references (left by an upload cut short).
    pub fn delete_stray_pieces(&self) -> io::Result<()> {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        for (key, _) in self.remote.list("meta")? {
            if let Some((i, g)) = parse_piece_key(&key) {
                if last.pieces.get(i as usize).map(|p| p.gen) != Some(g) {
                    self.remote.delete(&key)?;
                }
            }
        }
        Ok(())
    }

    /// Copies `meta.redb` (the caller holds redb's write lock: no commit changes the file
    /// meanwhile) and numbers the copy.
    pub fn take_copy(&self) -> io::Result<MetaCopy> {
        let data = std::fs::read(self.cache_dir.join(META_FILE))?;
        Ok(MetaCopy {
            seq: self.next_seq.fetch_add(1, Ordering::SeqCst),
            data,
        })
    }

    /// Uploads copy `c`: the changed pieces, then the manifest, then deletes the replaced
    /// pieces. Returns `false`, uploading nothing, when a copy taken after `c` was uploaded
    /// already (the bucket holds every change of `c`).
    pub fn upload_copy(&self, c: MetaCopy) -> io::Result<bool> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.seq.is_some_and(|s| s >= c.seq) {
            return Ok(false);
        }
        let data = c.data;
        let gen = last.gen + 1;
        let mut pieces = Vec::new();
        let mut replaced = Vec::new();
        for (i, chunk) in data.chunks(PIECE_SIZE as usize).enumerate() {
            let crc = crc32c::crc32c(chunk);
            let old_len = last
                .file_len
                .saturating_sub(i as u64 * PIECE_SIZE)
                .min(PIECE_SIZE);
            match last.pieces.get(i) {
                Some(p) if p.crc == crc && chunk.len() as u64 == old_len => pieces.push(*p),
                old => {
                    if let Some(o) = old {
                        replaced.push(piece_key(i as u32, o.gen));
                    }
                    self.remote.put(&piece_key(i as u32, gen), chunk.to_vec())?;
                    pieces.push(Piece { gen, crc });
                }
            }
        }
        for (i, o) in last.pieces.iter().enumerate().skip(pieces.len()) {
            replaced.push(piece_key(i as u32, o.gen));
        }
        let m = Manifest {
            uuid: self.uuid,
            gen,
            file_len: data.len() as u64,
            pieces,
        };
        self.remote.put(MANIFEST_KEY, m.encode())?;
        *last = Last {
            gen,
            file_len: m.file_len,
            pieces: m.pieces,
            seq: Some(c.seq),
        };
        self.gen.store(gen, Ordering::SeqCst);
        write_local_generation(&self.cache_dir, &self.uuid, gen)?;
        for k in replaced {
            // A piece left behind is garbage only: the next mount deletes it.
            if let Err(e) = self.remote.delete(&k) {
                tracing::warn!("compfs: cannot delete replaced metadata piece {k}: {e}");
            }
        }
        Ok(true)
    }
}
