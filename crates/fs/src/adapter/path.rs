//! A path of an inode, for log lines.

use std::collections::VecDeque;

use compfs_store::{FileKind, Ino, Store, ROOT_INO};

use super::READDIR_BATCH;

/// log line, so its cost does not matter). Gives up after visiting 1,000,000 entries.
pub fn path_of(store: &Store, target: Ino) -> Option<Vec<u8>> {
    if target == ROOT_INO {
        return Some(b"/".to_vec());
    }
    let mut queue: VecDeque<(Ino, Vec<u8>)> = VecDeque::from([(ROOT_INO, Vec::new())]);
    let mut budget = 1_000_000usize;
    while let Some((dir, path)) = queue.pop_front() {
        let mut offset = 0;
        loop {
            let entries = store.readdir(dir, offset, READDIR_BATCH).ok()?;
            if entries.is_empty() {
                break;
            }
            for e in entries {
                offset = e.offset;
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                budget = budget.checked_sub(1)?;
                let mut p = path.clone();
                p.push(b'/');
                p.extend_from_slice(&e.name);
                if e.ino == target {
                    return Some(p);
                }
                if e.kind == FileKind::Dir {
                    queue.push_back((e.ino, p));
                }
            }
        }
    }
    None
}
