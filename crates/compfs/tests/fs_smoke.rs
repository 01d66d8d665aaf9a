#![allow(clippy::unwrap_used, clippy::expect_used)]
mod fs_common;
use compfs_store::Mode;
use fs_common::*;

#[test]
fn mount_write_remount_read() {
    require_fuse!();
    let t = TempDir::new("smoke");
    let store = t.path().join("store");
    let mnt = t.path().join("mnt");
    mkstore(&store, "zstd:3", Mode::Heuristic, 128 << 10);
    let data = text_bytes(3 << 20, 7);
    {
        let m = Mount::new(&store, &mnt, "compress=zstd:3");
        std::fs::write(m.path("a.txt"), &data).unwrap();
        std::fs::create_dir(m.path("d")).unwrap();
        assert!(m.unmount().success());
    }
    let m = Mount::new(&store, &mnt, "");
    assert_eq!(std::fs::read(m.path("a.txt")).unwrap(), data);
    assert!(m.path("d").is_dir());
}

/// `compfs umount` returns only once the daemon has written everything back and closed the
/// store: the store opens at once (no "in use"), with the data, without a remount.
#[test]
fn compfs_umount_waits_for_the_daemon() {
    require_fuse!();
    let t = TempDir::new("umount");
    let store = t.path().join("store");
    let mnt = t.path().join("mnt");
    mkstore(&store, "zstd:3", Mode::Force, 128 << 10);
    let data = text_bytes(20 << 20, 11);
    let mut m = Mount::new(&store, &mnt, "compress-force=zstd:3");
    // Buffered in the daemon (no fsync): the final flush happens after the kernel lets go.
    std::fs::write(m.path("big.txt"), &data).unwrap();
    std::fs::write(m.path("small.txt"), b"tail").unwrap();
    let (ok, _, err) = compfs(&["umount", mnt.to_str().unwrap()]);
    assert!(ok, "compfs umount failed: {err}");
    assert!(!is_mounted(&mnt));
    let s = compfs_store::Store::open(&store, &compfs_store::OpenOptions::default())
        .expect("store still in use after compfs umount returned");
    let a = s.lookup(compfs_store::ROOT_INO, b"big.txt").unwrap();
    let mut buf = vec![0u8; data.len()];
    assert_eq!(s.read(a.ino, 0, &mut buf).unwrap(), data.len());
    assert!(buf == data, "big.txt differs after compfs umount");
    drop(s);
    m.child.take().map(|mut c| c.wait().unwrap());
    // Not a compfs mount any more: one clear error.
    let (ok, _, err) = compfs(&["umount", mnt.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("is not a compfs mount point"), "{err}");
}
