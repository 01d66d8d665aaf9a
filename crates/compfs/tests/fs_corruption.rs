//! Corruption surfaces as EIO on the affected range plus one log line naming the file and
//! offset; the mount stays up.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod fs_common;

use std::fs;
use std::io::Read;
use std::os::unix::fs::FileExt;

use compfs_store::format::{EXT_HEADER_LEN, SEGMENT_DIR, SEG_HEADER_LEN};
use compfs_store::Mode;
use fs_common::*;

#[test]
fn corrupt_extent_gives_eio_and_one_log_line() {
    require_fuse!();
    let t = TempDir::new("corrupt");
    let store = t.path().join("store");
    let mnt = t.path().join("mnt");
    mkstore(&store, "zstd:3", Mode::Heuristic, 128 << 10);
    let victim = text_bytes(256 << 10, 77);
    {
        let m = Mount::new(&store, &mnt, "compress-force=zstd:3");
        fs::create_dir(m.path("dir")).unwrap();
        fs::write(m.path("dir/victim"), &victim).unwrap();
        fs::write(m.path("small"), b"inline and unaffected").unwrap();
        assert!(m.unmount().success());
    }
    // Flip a byte in the body of the first extent record of the first segment (one of the
    // victim's two extents).
    let mut segs: Vec<_> = fs::read_dir(store.join(SEGMENT_DIR))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    segs.sort();
    let seg = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&segs[0])
        .unwrap();
    let at = SEG_HEADER_LEN + EXT_HEADER_LEN as u64 + 100;
    let mut b = [0u8; 1];
    seg.read_exact_at(&mut b, at).unwrap();
    seg.write_all_at(&[b[0] ^ 0xff], at).unwrap();
    seg.sync_all().unwrap();
    drop(seg);

    let log = t.path().join("daemon.log");
    let m = Mount::with_args(&store, &mnt, "", &["--log", log.to_str().unwrap()]);
    let f = fs::File::open(m.path("dir/victim")).unwrap();
    let mut buf = Vec::new();
    let err = (&f).read_to_end(&mut buf).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    // Which of the two extents is first in the segment depends on which compression worker
    // finished first: exactly one 128 KiB range fails, the other reads back intact.
    let mut bad = Vec::new();
    for off in [0u64, 128 << 10] {
        let mut chunk = vec![0u8; 128 << 10];
        match f.read_exact_at(&mut chunk, off) {
            Ok(()) => assert_eq!(chunk, victim[off as usize..off as usize + (128 << 10)]),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EIO));
                bad.push(off);
            }
        }
    }
    assert_eq!(bad.len(), 1, "{bad:?}");
    // Reading the damaged range again gives EIO again, without a second log line.
    let mut one = [0u8; 4096];
    assert_eq!(
        f.read_at(&mut one, bad[0]).unwrap_err().raw_os_error(),
        Some(libc::EIO)
    );
    // The mount is still up and other files are fine.
    assert_eq!(fs::read(m.path("small")).unwrap(), b"inline and unaffected");
    fs::write(m.path("new"), b"still writable").unwrap();
    assert!(is_mounted(&mnt));
    let text = fs::read_to_string(&log).unwrap();
    // Exactly one line names the file (the store itself also logs each failed read by inode).
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("/dir/victim")).collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(lines[0].contains("corrupt"), "{}", lines[0]);
    assert!(
        lines[0].contains(&format!("at offset {}:", bad[0])),
        "{}",
        lines[0]
    );
}
