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
