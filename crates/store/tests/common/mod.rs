//! Helpers shared by the integration tests.
#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use compfs_store::*;

/// Text-like data that compresses, and incompressible data (the shared generators).
pub use compfs_testdata::{random, text as pattern};

pub fn read_all(s: &Store, ino: Ino) -> Result<Vec<u8>> {
    let size = s.getattr(ino)?.size as usize;
    let mut buf = vec![0u8; size];
    let mut pos = 0;
    while pos < size {
        let n = s.read(ino, pos as u64, &mut buf[pos..])?;
        assert!(n > 0, "short read at {pos} of {size}");
        pos += n;
    }
    Ok(buf)
}

/// Copies the directory tree `from` to `to` (a store directory, a fixture).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

/// Every file's bytes under `dir` (to prove that nothing changed).
pub fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut m = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                m.insert(p.clone(), std::fs::read(&p).unwrap());
            }
        }
    }
    m
}

/// A test-friendly tuning: no background flusher, small segments.
pub fn tuning() -> Tuning {
    Tuning {
        segment_size: 256 << 10,
        flush_interval: None,
        ..Tuning::default()
    }
}

pub fn create(dir: &Path, ext: u32, t: Tuning) -> Store {
    let opts = CreateOptions {
        extent_size: ext,
        ..CreateOptions::default()
    };
    Store::create_tuned(dir, &opts, t).unwrap()
}

pub fn open(dir: &Path, t: Tuning) -> Store {
    Store::open_tuned(dir, &OpenOptions::default(), t).unwrap()
}

/// Segment files of a store and the extent headers found walking them: (path, offset, header).
pub fn walk_segments(store: &Path) -> Vec<(PathBuf, u64, format::ExtentHeader)> {
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(store.join(format::SEGMENT_DIR))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for p in files {
        let data = std::fs::read(&p).unwrap();
        let mut pos = format::SEG_HEADER_LEN as usize;
        while pos + format::EXT_HEADER_LEN <= data.len() {
            let Ok(h) = format::ExtentHeader::decode(&data[pos..pos + format::EXT_HEADER_LEN])
            else {
                break;
            };
            out.push((p.clone(), pos as u64, h));
            pos += format::EXT_HEADER_LEN + h.stored_len as usize;
        }
    }
    out
}

pub fn fsck_report(dir: &Path, repair: bool) -> FsckReport {
    fsck(dir, repair, &mut |_, _| {}).unwrap()
}

pub fn assert_clean(dir: &Path) {
    let r = fsck_report(dir, false);
    assert!(r.is_clean(), "fsck found problems: {:#?}", r.problems);
}

/// Creates a regular file `name` in `parent` (mode 0644, root-owned).
pub fn mkfile(s: &Store, parent: Ino, name: &str) -> Ino {
    s.mknod(parent, name.as_bytes(), FileKind::File, 0o644, 0, 0, 0)
        .unwrap()
        .ino
}
