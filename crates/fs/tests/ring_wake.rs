//! `compfs_fs::ring::ring_wake_here`: a ring thread's replies wake requesters on its own CPU
//! only while the mount's store has no written data buffered or being compressed (and never
//! when there is no store), see `compfs_fs::ring`. Its own test binary: the store it asks is
//! process-wide.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use compfs_fs::ring::{ring_wake_here, set_ring_store};
use compfs_store::{CreateOptions, FileKind, Store, ROOT_INO};

#[test]
fn wakes_here_only_while_no_write_is_pending() {
    assert!(!ring_wake_here(), "no store yet");
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(Store::create(&dir.path().join("s"), &CreateOptions::default()).unwrap());
    set_ring_store(&s);
    assert!(ring_wake_here(), "an idle store");
    let a = s
        .mknod(ROOT_INO, b"f", FileKind::File, 0o644, 0, 0, 0)
        .unwrap();
    s.open_file(a.ino).unwrap();
    s.write(a.ino, 0, &vec![7u8; 300_000]).unwrap();
    assert!(!ring_wake_here(), "written data is buffered");
    s.fsync(a.ino, false).unwrap();
    assert!(ring_wake_here(), "everything written is in the store");
    s.release(a.ino).unwrap();
    drop(s);
    assert!(!ring_wake_here(), "the store is gone");
}
