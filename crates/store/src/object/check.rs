//! `compfs fsck s3://…`: the checks of a local store run on the metadata snapshot in the
//! bucket, each extent read by a ranged GET; with `full`, a walk of every chunk object without
//! the metadata too: its name against its size, chunks of a segment against each other, and
//! header by header (the segment header at offset 0, then the self-describing extent headers:
//! magic, codec, level, lengths, CRC-32C of the header and of the stored bytes, which must
//! decode to their length).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::layout::{chunk_key, parse_chunk_key, SEGS_FOLDER, SUPERBLOCK_KEY};
use super::remote::Remote;
use super::snapshot::{download, fetch_manifest};
use super::{scratch_beside, ObjectBackend, ObjectOptions, S3Url, DEFAULT_DIRTY_LIMIT};
use crate::error::{Error, Result};
use crate::fsck::{fsck_with, FsckProblem, FsckReport, ProblemKind};
use crate::open::read_superblock;
use crate::records::{
    ExtentHeader, ExtentRec, SegmentHeader, EXT_HEADER_LEN, SEGMENT_DIR, SEG_HEADER_LEN,
    SUPERBLOCK_FILE,
};

/// What [`fsck_bucket`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BucketReport {
    /// The metadata checks, and the problems of the walk (when `full`).
    pub report: FsckReport,
    /// Chunk objects walked (with `full`).
    pub objects: u64,
    /// Their bytes.
    pub object_bytes: u64,
    /// Extents found in them.
    pub walked_extents: u64,
}

/// What a walk of one chunk found: extents that check out, and the problems.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChunkWalk {
    pub extents: u64,
    pub problems: Vec<String>,
}

/// Walks chunk object `key` (bytes `start..` of segment `id`) header by header, without the
/// metadata. A chunk starting the segment opens with the segment header; every other chunk
/// starts at an extent (a run of whole appends). Stops at the first damaged header (there is
/// no telling where the next extent starts); a damaged payload is reported and skipped.
pub fn walk_chunk(
    key: &str,
    id: u64,
    start: u64,
    data: &[u8],
    uuid: &[u8; 16],
    extent_size: u32,
) -> ChunkWalk {
    let mut w = ChunkWalk::default();
    let mut pos = 0usize;
    if start == 0 {
        match SegmentHeader::decode(data) {
            Ok(h) if h.id == id && &h.uuid == uuid => {}
            Ok(h) => w.problems.push(format!(
                "object {key}: segment header names segment {} of another store or segment",
                h.id
            )),
            Err(e) => {
                w.problems.push(format!("object {key} offset 0: {e}"));
                return w;
            }
        }
        pos = SEG_HEADER_LEN as usize;
    }
    while pos < data.len() {
        let at = start + pos as u64;
        let h = match ExtentHeader::decode(&data[pos..]) {
            Ok(h) => h,
            Err(e) => {
                w.problems.push(format!(
                    "object {key} (segment offset {at}): {e}; the {} bytes after it not walked",
                    data.len() - pos
                ));
                return w;
            }
        };
        let end = pos + EXT_HEADER_LEN + h.stored_len as usize;
        if end > data.len() {
            w.problems.push(format!(
                "object {key} (segment offset {at}): extent {} of {} stored bytes runs past the \
                 end of the object",
                h.id, h.stored_len
            ));
            return w;
        }
        let why = if h.raw_len > extent_size || h.raw_len == 0 {
            Some(format!(
                "raw length {} outside 1..={extent_size} (the largest extent size)",
                h.raw_len
            ))
        } else {
            let rec = ExtentRec::from_header(id, at, &h);
            if h.dict != 0 {
                // Compressed with a store dictionary, which lives in the metadata: without
                // it the stored bytes can be checked, not decoded.
                let crc = crc32c::crc32c(&data[pos + EXT_HEADER_LEN..end]);
                (crc != h.crc).then(|| {
                    format!(
                        "checksum mismatch: stored bytes have crc32c {crc:08x}, expected {:08x}",
                        h.crc
                    )
                })
            } else {
                crate::read::verify_extent(h.id, &rec, &data[pos..end], Ok(None)).err()
            }
        };
        match why {
            Some(why) => w.problems.push(format!(
                "object {key} (segment offset {at}): extent {} (inode {} offset {}): {why}",
                h.id, h.ino, h.file_offset
            )),
            None => w.extents += 1,
        }
        pos = end;
    }
    w
}

/// Chunks of one segment that overlap (a chunk is never rewritten, so two chunks covering
/// the same bytes mean a damaged bucket): (earlier key, later key) pairs.
pub fn overlaps(id: u64, chunks: &BTreeMap<u64, u64>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut prev: Option<(u64, u64)> = None;
    for (&s, &l) in chunks {
        if let Some((ps, pl)) = prev {
            if s < ps + pl {
                out.push((chunk_key(id, ps, pl), chunk_key(id, s, l)));
            }
        }
        if prev.is_none_or(|(ps, pl)| s + l > ps + pl) {
            prev = Some((s, l));
        }
    }
    out
}

fn problem(kind: ProblemKind, message: String) -> FsckProblem {
    FsckProblem {
        kind,
        ino: None,
        message,
        repaired: false,
    }
}

/// Checks the store in the bucket of `url` (not mounted for writing anywhere, or its latest
/// commits are not seen): the metadata snapshot is downloaded to a scratch directory beside
/// the cache directory (removed afterwards) and checked as a local store's metadata, reading
/// extents by ranged GETs; with `full`, every chunk object is walked too ([`walk_chunk`]).
/// Nothing in the bucket is changed.
pub fn fsck_bucket(
    url: &S3Url,
    o: &ObjectOptions,
    full: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<BucketReport> {
    let remote = Arc::new(Remote::connect(url, &o.remote)?);
    let sb_bytes = remote
        .get(SUPERBLOCK_KEY)?
        .ok_or_else(|| Error::NotAStore {
            path: PathBuf::from(url.to_string()),
            reason: "the bucket has no compfs superblock there".into(),
        })?;
    let scratch = scratch_beside(&o.cache_dir_for(url), "fsck")?;
    let _ = std::fs::remove_dir_all(&scratch);
    let r = check_in(&remote, &sb_bytes, &scratch, full, progress);
    let _ = std::fs::remove_dir_all(&scratch);
    r
}

fn check_in(
    remote: &Arc<Remote>,
    sb_bytes: &[u8],
    scratch: &Path,
    full: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<BucketReport> {
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().mode(0o700).create(scratch)?;
    }
    std::fs::write(scratch.join(SUPERBLOCK_FILE), sb_bytes)?;
    let sb = read_superblock(scratch)?;
    let mut out = BucketReport::default();
    let mut problems = Vec::new();
    if full {
        walk_bucket(
            remote,
            &sb.uuid,
            compfs_codec::MAX_EXTENT as u32,
            &mut out,
            &mut problems,
        )?;
    }
    // The metadata checks. A snapshot that cannot be had is an error of the check, unless the
    // walk (which needs no metadata) ran: then it is one more problem found.
    let meta = (|| -> Result<FsckReport> {
        let m = fetch_manifest(remote)?.ok_or_else(|| Error::NotAStore {
            path: PathBuf::from(remote.url.to_string()),
            reason: "the bucket has no metadata manifest".into(),
        })?;
        if m.uuid != sb.uuid {
            return Err(Error::NotAStore {
                path: PathBuf::from(remote.url.to_string()),
                reason: "the metadata manifest belongs to another store (UUID mismatch)".into(),
            });
        }
        download(remote, &m, scratch)?;
        let seg_dir = scratch.join(SEGMENT_DIR);
        std::fs::create_dir_all(&seg_dir)?;
        let backend =
            ObjectBackend::open(remote.clone(), &seg_dir, None, DEFAULT_DIRTY_LIMIT, None)?;
        fsck_with(scratch, false, Arc::new(backend), progress)
    })();
    match meta {
        Ok(r) => out.report = r,
        Err(e) if full => problems.push(problem(
            ProblemKind::BadRecord,
            format!("metadata not checked: {e}"),
        )),
        Err(e) => return Err(e),
    }
    out.report.problems.extend(problems);
    Ok(out)
}

/// The walk of every chunk object.
fn walk_bucket(
    remote: &Remote,
    uuid: &[u8; 16],
    extent_size: u32,
    out: &mut BucketReport,
    problems: &mut Vec<FsckProblem>,
) -> Result<()> {
    let mut segs: BTreeMap<u64, BTreeMap<u64, u64>> = BTreeMap::new();
    for (key, size) in remote.list(SEGS_FOLDER)? {
        let Some((id, start, len)) = parse_chunk_key(&key) else {
            problems.push(problem(
                ProblemKind::LeftoverSegment,
                format!("object {key} is not a segment chunk (ignored by mounts)"),
            ));
            continue;
        };
        if size != len {
            problems.push(problem(
                ProblemKind::BadSegment,
                format!("object {key} has {size} bytes, its name says {len}"),
            ));
            continue;
        }
        segs.entry(id).or_default().insert(start, len);
    }
    for (&id, chunks) in &segs {
        for (a, b) in overlaps(id, chunks) {
            problems.push(problem(
                ProblemKind::BadSegment,
                format!("objects {a} and {b} overlap"),
            ));
        }
        for (&start, &len) in chunks {
            let key = chunk_key(id, start, len);
            let data = match remote.get(&key)? {
                Some(d) => d,
                None => {
                    problems.push(problem(
                        ProblemKind::MissingExtent,
                        format!("object {key} disappeared during the check"),
                    ));
                    continue;
                }
            };
            out.objects += 1;
            out.object_bytes += data.len() as u64;
            if data.len() as u64 != len {
                problems.push(problem(
                    ProblemKind::BadSegment,
                    format!(
                        "object {key} read back {} bytes, its name says {len}",
                        data.len()
                    ),
                ));
                continue;
            }
            let w = walk_chunk(&key, id, start, &data, uuid, extent_size);
            out.walked_extents += w.extents;
            for m in w.problems {
                problems.push(problem(ProblemKind::CorruptExtent, m));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn extent(id: u64, payload: &[u8]) -> Vec<u8> {
        let h = ExtentHeader {
            codec: 0,
            level: 0,
            raw_len: payload.len() as u32,
            stored_len: payload.len() as u32,
            id,
            ino: 5,
            file_offset: id * 100,
            crc: crc32c::crc32c(payload),
            dict: 0,
        };
        let mut v = h.encode().to_vec();
        v.extend_from_slice(payload);
        v
    }

    fn segment(uuid: [u8; 16], id: u64) -> Vec<u8> {
        let mut v = SegmentHeader {
            version: crate::records::FORMAT_VERSION,
            uuid,
            id,
        }
        .encode()
        .to_vec();
        v.extend(extent(1, b"hello world"));
        v.extend(extent(2, &[7u8; 100]));
        v
    }

    #[test]
    fn a_sound_chunk_walks_clean_and_damage_is_found_never_a_panic() {
        let uuid = [3u8; 16];
        let seg = segment(uuid, 9);
        let w = walk_chunk("k", 9, 0, &seg, &uuid, 4096);
        assert_eq!(
            w,
            ChunkWalk {
                extents: 2,
                problems: vec![]
            }
        );
        // A chunk that does not start the segment starts at an extent.
        let tail = &seg[SEG_HEADER_LEN as usize..];
        assert_eq!(
            walk_chunk("k", 9, SEG_HEADER_LEN, tail, &uuid, 4096).extents,
            2
        );
        // Another store's segment.
        let w = walk_chunk("k", 9, 0, &seg, &[4u8; 16], 4096);
        assert_eq!(w.problems.len(), 1, "{w:?}");
        // Every flipped byte is found (or lands in reserved header bytes the decoders
        // refuse), every truncation too; nothing panics.
        for i in 0..seg.len() {
            let mut d = seg.clone();
            d[i] ^= 0x40;
            let w = walk_chunk("k", 9, 0, &d, &uuid, 4096);
            assert!(!w.problems.is_empty(), "flip at {i} not found");
        }
        // A cut at an extent boundary cannot be told without the metadata; any other can.
        let ends = [
            SEG_HEADER_LEN as usize,
            SEG_HEADER_LEN as usize + EXT_HEADER_LEN + 11,
        ];
        for n in 0..seg.len() {
            let w = walk_chunk("k", 9, 0, &seg[..n], &uuid, 4096);
            assert!(ends.contains(&n) || !w.problems.is_empty(), "cut at {n}");
        }
        // A raw length past the extent size is refused before anything is allocated.
        let w = walk_chunk("k", 9, SEG_HEADER_LEN, tail, &uuid, 8);
        assert!(w.problems[0].contains("extent size"), "{w:?}");
    }

    #[test]
    fn overlapping_chunks_are_found() {
        let m: BTreeMap<u64, u64> = [(0, 100), (100, 50), (120, 10), (200, 5)].into();
        let o = overlaps(1, &m);
        assert_eq!(o, vec![(chunk_key(1, 100, 50), chunk_key(1, 120, 10))]);
        let clean: BTreeMap<u64, u64> = [(0, 100), (100, 50)].into();
        assert!(overlaps(1, &clean).is_empty());
    }
}
