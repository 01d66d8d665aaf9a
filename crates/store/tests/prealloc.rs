//! Preallocation (`Store::allocate`): reserved ranges count in `st_blocks`, are held on the
//! host by the reserve file (so the host's free space shrinks), survive a reopen, end when
//! written (what compression saves is free again), punched, truncated or unlinked; a range that
//! does not fit fails with ENOSPC; and a write into a reserved range succeeds on a full host.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use common::*;
use compfs_store::*;

const RESERVE: &str = "prealloc.reserve";

fn reserve_file_bytes(dir: &Path) -> u64 {
    std::fs::metadata(dir.join(RESERVE)).map_or(0, |m| m.len())
}

fn blocks(s: &Store, ino: Ino) -> u64 {
    s.getattr(ino).unwrap().blocks
}

fn clean(dir: &Path) {
    let r = fsck(dir, false, &mut |_, _| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
}

/// A new store in a temporary directory (at `t.path()/s`) with one empty regular file, `f`.
fn store_with_file() -> (tempfile::TempDir, Store, Ino) {
    let t = tempfile::tempdir().unwrap();
    let s = create(&t.path().join("s"), 131072, tuning());
    let f = s
        .mknod(ROOT_INO, b"f", FileKind::File, 0o644, 0, 0, 0)
        .unwrap()
        .ino;
    (t, s, f)
}

#[test]
fn reservations_count_persist_and_end() {
    let (t, s, f) = store_with_file();
    let p = t.path().join("s");
    // 1 MiB + 1 byte: widened to whole pages as ext4 does.
    s.allocate(f, 0, (1 << 20) + 1, false).unwrap();
    let want = (1 << 20) + 4096;
    assert_eq!(s.reserved_bytes(f).unwrap(), want);
    assert_eq!(blocks(&s, f), want / 512);
    assert_eq!(s.getattr(f).unwrap().size, (1 << 20) + 1);
    let held = reserve_file_bytes(&p);
    assert!(held >= want, "reserve file {held} < {want}");
    let alloc = std::fs::metadata(p.join(RESERVE)).unwrap().blocks() * 512;
    assert!(alloc >= want, "reserve file allocates {alloc} < {want}");
    // Allocating again reserves nothing more; KEEP_SIZE past the end adds its pages.
    s.allocate(f, 0, 1 << 20, false).unwrap();
    assert_eq!(s.reserved_bytes(f).unwrap(), want);
    s.allocate(f, 2 << 20, 8192, true).unwrap();
    assert_eq!(s.reserved_bytes(f).unwrap(), want + 8192);
    assert_eq!(s.getattr(f).unwrap().size, (1 << 20) + 1);
    s.close().unwrap();
    clean(&p);
    // The table is the record: a reserve file lost (or left too large) is resized at open.
    std::fs::write(p.join(RESERVE), b"").unwrap();

    let s = open(&p, tuning());
    assert_eq!(s.reserved_bytes(f).unwrap(), want + 8192);
    assert_eq!(reserve_file_bytes(&p), host_bytes(want + 8192));
    s.close().unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(p.join(RESERVE))
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let s = open(&p, tuning());
    assert_eq!(reserve_file_bytes(&p), host_bytes(want + 8192));
    // Writing compressible data over the first 512 KiB: its reservation ends, and the file's
    // blocks are the compressed bytes plus what stays reserved.
    s.write(f, 0, &pattern(512 << 10, 1)).unwrap();
    s.fsync(f, false).unwrap();
    let left = want + 8192 - (512 << 10);
    assert_eq!(s.reserved_bytes(f).unwrap(), left);
    let b = blocks(&s, f);
    assert!(
        b * 512 < left + (256 << 10),
        "blocks {b} after a compressible write"
    );
    assert!(b * 512 >= left);
    assert!(reserve_file_bytes(&p) < host_bytes(left + 4096));
    // A small write in the middle takes only its bytes.
    s.write(f, 600 << 10, &[7u8; 100]).unwrap();
    s.fsync(f, false).unwrap();
    assert_eq!(s.reserved_bytes(f).unwrap(), left - 100);
    // Punch: whole pages inside the hole go.
    s.punch_hole(f, (700 << 10) + 1, 3 * 4096).unwrap();
    assert_eq!(s.reserved_bytes(f).unwrap(), left - 100 - 2 * 4096);
    // Truncate to the same size drops what lies past the end (the KEEP_SIZE pages).
    let size = s.getattr(f).unwrap().size;
    s.setattr(
        f,
        &SetAttr {
            size: Some(size),
            ..SetAttr::default()
        },
    )
    .unwrap();
    assert_eq!(s.reserved_bytes(f).unwrap(), left - 100 - 2 * 4096 - 8192);
    // Truncate down.
    s.setattr(
        f,
        &SetAttr {
            size: Some(800 << 10),
            ..SetAttr::default()
        },
    )
    .unwrap();
    let r = s.reserved_bytes(f).unwrap();
    assert_eq!(r, (800 << 10) - (512 << 10) - 100 - 2 * 4096);
    let data = read_all(&s, f).unwrap();
    assert_eq!(&data[..512 << 10], &pattern(512 << 10, 1)[..]);
    assert_eq!(&data[600 << 10..(600 << 10) + 100], &[7u8; 100][..]);
    s.sync().unwrap();
    assert_eq!(reserve_file_bytes(&p), host_bytes(r));
    // Unlink: everything goes.
    s.unlink(ROOT_INO, b"f").unwrap();
    s.sync().unwrap();
    assert_eq!(reserve_file_bytes(&p), 0);
    s.close().unwrap();
    clean(&p);
}

/// What the store holds on the host for `r` reserved bytes: one extent header per page, and
/// a 4 MiB pool for metadata while anything is reserved.
fn host_bytes(r: u64) -> u64 {
    if r == 0 {
        return 0;
    }
    r + r.div_ceil(4096) * 48 + (4 << 20)
}

#[test]
fn a_range_larger_than_the_host_fails_with_enospc() {
    let (t, s, f) = store_with_file();
    let p = t.path().join("s");
    let fs = s.statfs().unwrap();
    let huge = (fs.blocks * u64::from(fs.bsize)).next_power_of_two() * 2;
    assert!(matches!(s.allocate(f, 0, huge, false), Err(Error::NoSpace)));
    assert_eq!(s.getattr(f).unwrap().size, 0);
    assert_eq!(s.reserved_bytes(f).unwrap(), 0);
    assert_eq!(reserve_file_bytes(&p), 0);
    // The store stays writable.
    s.write(f, 0, b"still writable").unwrap();
    s.close().unwrap();
    clean(&p);
}

/// A small tmpfs (root only), unmounted on drop.
struct Tmpfs(std::path::PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn writes_into_a_reservation_succeed_on_a_full_host() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: mounting a tmpfs needs root");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let mnt = t.path().join("m");
    std::fs::create_dir(&mnt).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=24m", "tmpfs"])
        .arg(&mnt)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mount -t tmpfs failed");
    let _m = Tmpfs(mnt.clone());
    let p = mnt.join("s");
    let s = create(&p, 131072, tuning());
    let f = s
        .mknod(ROOT_INO, b"f", FileKind::File, 0o644, 0, 0, 0)
        .unwrap()
        .ino;
    let n = 4 << 20;
    s.allocate(f, 0, n, false).unwrap();
    // Fill the host to the last byte.
    {
        use std::io::Write;
        let mut fill = std::fs::File::create(mnt.join("fill")).unwrap();
        let chunk = vec![0x55u8; 64 << 10];
        loop {
            match fill.write(&chunk) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let mut one = [0u8; 1];
        while fill.write(&one).is_ok_and(|w| w == 1) {
            one[0] ^= 1;
        }
    }
    // Without the reservation this could not be stored: incompressible data, 4 MiB.
    let data = random(n as usize, 9);
    s.write(f, 0, &data).unwrap();
    s.fsync(f, false).unwrap();
    assert_eq!(s.reserved_bytes(f).unwrap(), 0);
    assert_eq!(read_all(&s, f).unwrap(), data);
    // A write outside any reservation finds the host full.
    let g = s
        .mknod(ROOT_INO, b"g", FileKind::File, 0o644, 0, 0, 0)
        .map(|a| a.ino);
    let outside = g.and_then(|g| {
        // More than the pool given back once nothing is reserved.
        s.write(g, 0, &random(6 << 20, 3))?;
        s.fsync(g, false)
    });
    assert!(
        outside.is_err(),
        "a write past the reservation fit a full host"
    );
    drop(s);
    std::fs::remove_file(mnt.join("fill")).unwrap();
    let s = open(&p, tuning());
    assert_eq!(read_all(&s, f).unwrap(), data);
    s.close().unwrap();
}

#[test]
fn fsck_finds_and_repairs_bad_reservations() {
    use redb::TableDefinition;
    const PREALLOC: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("prealloc");
    let (t, s, f) = store_with_file();
    let p = t.path().join("s");
    s.write(f, 0, &pattern(256 << 10, 2)).unwrap();
    s.allocate(f, 256 << 10, 64 << 10, false).unwrap();
    let d = s.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    s.close().unwrap();
    clean(&p);
    {
        let db = redb::Database::open(p.join(format::META_FILE)).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut tb = txn.open_table(PREALLOC).unwrap();
            let rec = |len: u64| format::PreallocRec { len }.encode();
            // Over written data, on a directory, of a missing inode, and malformed.
            tb.insert((f, 4096), rec(4096).as_slice()).unwrap();
            tb.insert((d, 0), rec(4096).as_slice()).unwrap();
            tb.insert((999, 0), rec(4096).as_slice()).unwrap();
            tb.insert((f, 1 << 30), &[1u8, 2, 3][..]).unwrap();
        }
        txn.commit().unwrap();
    }
    let r = fsck(&p, false, &mut |_, _| {}).unwrap();
    let msgs: Vec<&str> = r.problems.iter().map(|p| p.message.as_str()).collect();
    assert_eq!(r.errors(), 4, "{msgs:?}");
    assert!(
        msgs.iter().any(|m| m.contains("overlaps written data")),
        "{msgs:?}"
    );
    assert!(msgs.iter().any(|m| m.contains("non-file")), "{msgs:?}");
    assert!(msgs.iter().any(|m| m.contains("missing inode")), "{msgs:?}");
    assert!(msgs.iter().any(|m| m.contains("malformed")), "{msgs:?}");
    let r = fsck(&p, true, &mut |_, _| {}).unwrap();
    assert_eq!(r.unrepaired(), 0, "{:?}", r.problems);
    clean(&p);
    // The good reservation is still there; the file reads as before.
    let s = open(&p, tuning());
    assert_eq!(s.reserved_bytes(f).unwrap(), 64 << 10);
    assert_eq!(
        &read_all(&s, f).unwrap()[..256 << 10],
        &pattern(256 << 10, 2)[..]
    );
    s.close().unwrap();
}

#[test]
fn concurrent_reservations_stay_in_step_with_the_reserve_file() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("s");
    let s = std::sync::Arc::new(create(&p, 65536, tuning()));
    let mut hs = Vec::new();
    for k in 0..4u64 {
        let s = s.clone();
        hs.push(std::thread::spawn(move || {
            let name = format!("f{k}");
            let f = s
                .mknod(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, 0, 0, 0)
                .unwrap()
                .ino;
            for round in 0..20u64 {
                let off = round * (256 << 10);
                s.allocate(f, off, 256 << 10, round % 2 == 0).unwrap();
                s.write(f, off + 4096, &pattern(100 << 10, k * 100 + round))
                    .unwrap();
                if round % 3 == 0 {
                    s.fsync(f, false).unwrap();
                    s.punch_hole(f, off, 64 << 10).unwrap();
                }
            }
            if k == 0 {
                s.unlink(ROOT_INO, name.as_bytes()).unwrap();
            }
        }));
    }
    for h in hs {
        h.join().unwrap();
    }
    s.sync().unwrap();
    let mut total = 0;
    for k in 1..4u64 {
        let a = s.lookup(ROOT_INO, format!("f{k}").as_bytes()).unwrap();
        total += s.reserved_bytes(a.ino).unwrap();
    }
    assert!(total > 0);
    assert_eq!(reserve_file_bytes(&p), host_bytes(total));
    std::sync::Arc::try_unwrap(s).ok().unwrap().close().unwrap();
    clean(&p);
}
