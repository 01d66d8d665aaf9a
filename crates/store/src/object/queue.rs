//! The local upload queue of `-o writeback` (`cache_dir/upload/`): a durable commit writes the
//! pending runs of segment bytes as one file each and fsyncs them (and the directory) instead of
//! PUTting them; an uploader PUTs the files and deletes each once its PUT completed. See
//! docs/format.md, "The upload queue (`-o writeback`)".
//!
//! A queue file is named `SEGMENT-START-LENGTH` (16 hex digits each, the chunk it becomes) and
//! holds a [`HEADER_LEN`]-byte header then the chunk's bytes. The header encoding is pure and
//! tested alone.

use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::records::{u32_at, u64_at};

/// The queue's directory inside the cache directory.
pub const QUEUE_DIR: &str = "upload";

/// Bytes of a queue file's header.
pub const HEADER_LEN: u64 = 64;

const MAGIC: &[u8; 8] = b"CFSUPQ01";

/// A queued chunk: its store, segment, start and length, and the CRC-32C of its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub uuid: [u8; 16],
    pub seg: u64,
    pub start: u64,
    pub len: u64,
    pub crc: u32,
}

/// Why a queue file is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    #[error("no compfs upload-queue magic")]
    BadMagic,
    #[error("truncated to {0} bytes")]
    Truncated(u64),
    #[error("header checksum mismatch")]
    BadHeaderChecksum,
    #[error("data checksum mismatch")]
    BadDataChecksum,
    #[error("the header names chunk {0}, the file name another")]
    NameMismatch(String),
    #[error("invalid {0}")]
    BadField(&'static str),
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN as usize] {
        let mut h = [0u8; HEADER_LEN as usize];
        h[..8].copy_from_slice(MAGIC);
        h[8..24].copy_from_slice(&self.uuid);
        h[24..32].copy_from_slice(&self.seg.to_le_bytes());
        h[32..40].copy_from_slice(&self.start.to_le_bytes());
        h[40..48].copy_from_slice(&self.len.to_le_bytes());
        h[48..52].copy_from_slice(&self.crc.to_le_bytes());
        // 52..60 reserved, zero.
        let crc = crc32c::crc32c(&h[..60]);
        h[60..64].copy_from_slice(&crc.to_le_bytes());
        h
    }

    pub fn decode(b: &[u8]) -> Result<Header, QueueError> {
        if b.len() < 8 || &b[..8] != MAGIC {
            return Err(QueueError::BadMagic);
        }
        if b.len() < HEADER_LEN as usize {
            return Err(QueueError::Truncated(b.len() as u64));
        }
        if crc32c::crc32c(&b[..60]) != u32_at(b, 60) {
            return Err(QueueError::BadHeaderChecksum);
        }
        if b[52..60].iter().any(|&x| x != 0) {
            return Err(QueueError::BadField("reserved bytes"));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[8..24]);
        let h = Header {
            uuid,
            seg: u64_at(b, 24),
            start: u64_at(b, 32),
            len: u64_at(b, 40),
            crc: u32_at(b, 48),
        };
        if h.len == 0 || h.start.checked_add(h.len).is_none() {
            return Err(QueueError::BadField("chunk range"));
        }
        Ok(h)
    }

    /// The file name of this chunk in the queue.
    pub fn file_name(&self) -> String {
        file_name(self.seg, self.start, self.len)
    }
}

/// A queued chunk: (segment, start, length).
pub type Chunk = (u64, u64, u64);

/// `SEGMENT-START-LENGTH`, 16 hex digits each.
pub fn file_name(seg: u64, start: u64, len: u64) -> String {
    format!("{seg:016x}-{start:016x}-{len:016x}")
}

/// Parses a queue file name back to (segment, start, length).
pub fn parse_file_name(n: &str) -> Option<Chunk> {
    let mut it = n.split('-');
    let mut next = || {
        it.next()
            .filter(|s| s.len() == 16)
            .and_then(|s| u64::from_str_radix(s, 16).ok())
    };
    let (a, b, c) = (next()?, next()?, next()?);
    if it.next().is_some() || c == 0 || b.checked_add(c).is_none() {
        return None;
    }
    Some((a, b, c))
}

/// Checks a whole queue file's bytes (`name` its file name); returns its header and data.
pub fn verify(name: &str, file: &[u8]) -> Result<(Header, Vec<u8>), QueueError> {
    let h = Header::decode(file)?;
    if h.file_name() != name {
        return Err(QueueError::NameMismatch(h.file_name()));
    }
    let data = &file[HEADER_LEN as usize..];
    if data.len() as u64 != h.len {
        return Err(QueueError::Truncated(file.len() as u64));
    }
    if crc32c::crc32c(data) != h.crc {
        return Err(QueueError::BadDataChecksum);
    }
    Ok((h, data.to_vec()))
}

/// Writes chunk `h` with bytes `data` into the queue `dir` (through a temporary name, fsynced
/// before the rename); the caller fsyncs `dir` once its files are in place.
pub fn write(dir: &Path, h: &Header, data: &[u8]) -> io::Result<PathBuf> {
    let path = dir.join(h.file_name());
    let tmp = dir.join(format!("{}.tmp", h.file_name()));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&h.encode())?;
    f.write_all(data)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Whether `need` more bytes of chunk data fit in a queue holding `queued` bytes with bound
/// `limit`. An empty queue takes anything (a single sync's runs larger than the bound go alone:
/// else they could never be queued).
pub fn fits(queued: u64, need: u64, limit: u64) -> bool {
    queued == 0 || queued.saturating_add(need) <= limit
}

/// Fsyncs directory `dir`.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Reads `buf.len()` bytes at `off` of the chunk data in an open queue file.
pub fn read_at(f: &std::fs::File, buf: &mut [u8], off: u64) -> io::Result<()> {
    f.read_exact_at(buf, HEADER_LEN + off)
}

/// The queue files in `dir` (temporary files of a write cut short are removed): their names
/// and chunks, in name order. A missing directory is an empty queue.
pub fn list(dir: &Path) -> io::Result<Vec<(String, Chunk)>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for e in rd {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tmp") {
            // Never renamed into place: its commit did not complete, nothing references it.
            std::fs::remove_file(e.path())?;
            continue;
        }
        match parse_file_name(&name) {
            Some(k) => out.push((name, k)),
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{}: unexpected file {name} in the upload queue",
                        dir.display()
                    ),
                ))
            }
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn h() -> Header {
        Header {
            uuid: [7; 16],
            seg: 9,
            start: 4096,
            len: 5,
            crc: crc32c::crc32c(b"hello"),
        }
    }

    #[test]
    fn headers_round_trip_and_files_verify() {
        let e = h().encode();
        assert_eq!(Header::decode(&e), Ok(h()));
        let mut file = e.to_vec();
        file.extend_from_slice(b"hello");
        let name = h().file_name();
        assert_eq!(parse_file_name(&name), Some((9, 4096, 5)));
        assert_eq!(verify(&name, &file), Ok((h(), b"hello".to_vec())));
    }

    #[test]
    fn malformed_queue_files_are_typed_errors() {
        let name = h().file_name();
        let mut file = h().encode().to_vec();
        file.extend_from_slice(b"hello");
        assert_eq!(verify(&name, b""), Err(QueueError::BadMagic));
        assert_eq!(verify(&name, &file[..20]), Err(QueueError::Truncated(20)));
        for cut in [0usize, 1, 8, 30, 63, 64, 68] {
            assert!(verify(&name, &file[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = file.clone();
        bad[30] ^= 1;
        assert_eq!(verify(&name, &bad), Err(QueueError::BadHeaderChecksum));
        let mut bad = file.clone();
        bad[66] ^= 1;
        assert_eq!(verify(&name, &bad), Err(QueueError::BadDataChecksum));
        let mut long = file.clone();
        long.push(0);
        assert!(matches!(
            verify(&name, &long),
            Err(QueueError::Truncated(_))
        ));
        let other = file_name(9, 0, 5);
        assert!(matches!(
            verify(&other, &file),
            Err(QueueError::NameMismatch(_))
        ));
        let mut zero = h();
        zero.len = 0;
        assert_eq!(
            Header::decode(&zero.encode()),
            Err(QueueError::BadField("chunk range"))
        );
        for n in ["", "1-2-3", &format!("{name}-x"), &name[..40]] {
            assert_eq!(parse_file_name(n), None, "{n}");
        }
        assert_eq!(parse_file_name(&file_name(1, 2, 0)), None);
    }

    #[test]
    fn the_bound_takes_runs_up_to_the_limit_and_anything_when_empty() {
        assert!(fits(0, 10, 4));
        assert!(fits(0, 0, 0));
        assert!(fits(3, 1, 4));
        assert!(!fits(3, 2, 4));
        assert!(fits(4, 0, 4));
        assert!(!fits(5, 0, 4));
        assert!(!fits(u64::MAX, u64::MAX, u64::MAX - 1));
        assert!(fits(1, u64::MAX - 1, u64::MAX));
    }

    #[test]
    fn write_list_and_read_back() {
        let t = tempfile::tempdir().unwrap();
        let p = write(t.path(), &h(), b"hello").unwrap();
        std::fs::write(t.path().join("x.tmp"), b"cut").unwrap();
        sync_dir(t.path()).unwrap();
        let l = list(t.path()).unwrap();
        assert_eq!(l, vec![(h().file_name(), (9, 4096, 5))]);
        assert!(!t.path().join("x.tmp").exists());
        let mut b = [0u8; 3];
        read_at(&std::fs::File::open(&p).unwrap(), &mut b, 1).unwrap();
        assert_eq!(&b, b"ell");
        std::fs::write(t.path().join("junk"), b"x").unwrap();
        assert!(list(t.path()).is_err());
        assert!(list(&t.path().join("missing")).unwrap().is_empty());
    }
}
