//! Every filesystem operation issue 5 lists, through a real FUSE mount.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod fs_common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::process::Command;

use compfs_store::Mode;
use fs_common::*;

fn setup(tag: &str, opts: &str) -> (TempDir, Mount) {
    let t = TempDir::new(tag);
    let store = t.path().join("store");
    mkstore(&store, "zstd:3", Mode::Heuristic, 128 << 10);
    let m = Mount::new(&store, &t.path().join("mnt"), opts);
    (t, m)
}

fn renameat2(from: &std::path::Path, to: &std::path::Path, flags: u32) -> Result<(), i32> {
    let (a, b) = (cstr(from), cstr(to));
    // SAFETY: valid C strings; AT_FDCWD with absolute paths.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

#[test]
fn namespace_operations() {
    require_fuse!();
    let (_t, m) = setup("ns", "");
    fs::create_dir_all(m.path("a/b/c")).unwrap();
    for n in ["x", "y", "z"] {
        fs::write(m.path(&format!("a/{n}")), n).unwrap();
    }
    let mut names: Vec<String> = fs::read_dir(m.path("a"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["b", "x", "y", "z"]);

    // Many entries: readdir continues across batches with stable cookies.
    fs::create_dir(m.path("many")).unwrap();
    for i in 0..700 {
        File::create(m.path(&format!("many/f{i:04}"))).unwrap();
    }
    assert_eq!(fs::read_dir(m.path("many")).unwrap().count(), 700);

    // symlink / readlink
    std::os::unix::fs::symlink("a/x", m.path("sl")).unwrap();
    assert_eq!(fs::read_link(m.path("sl")).unwrap().to_str(), Some("a/x"));
    assert_eq!(fs::read_to_string(m.path("sl")).unwrap(), "x");
    assert!(fs::symlink_metadata(m.path("sl"))
        .unwrap()
        .file_type()
        .is_symlink());

    // hard links share the inode
    fs::hard_link(m.path("a/x"), m.path("a/x2")).unwrap();
    let (m1, m2) = (
        fs::metadata(m.path("a/x")).unwrap(),
        fs::metadata(m.path("a/x2")).unwrap(),
    );
    assert_eq!(m1.ino(), m2.ino());
    assert_eq!(m2.nlink(), 2);
    fs::write(m.path("a/x2"), "changed").unwrap();
    assert_eq!(fs::read_to_string(m.path("a/x")).unwrap(), "changed");

    // rename over an existing target
    fs::rename(m.path("a/y"), m.path("a/z")).unwrap();
    assert_eq!(fs::read_to_string(m.path("a/z")).unwrap(), "y");
    assert!(!m.path("a/y").exists());
    // rename a directory across parents
    fs::rename(m.path("a/b"), m.path("b2")).unwrap();
    assert!(m.path("b2/c").is_dir());
    // RENAME_NOREPLACE refuses an existing target
    fs::write(m.path("n1"), "1").unwrap();
    fs::write(m.path("n2"), "2").unwrap();
    assert_eq!(
        renameat2(&m.path("n1"), &m.path("n2"), libc::RENAME_NOREPLACE),
        Err(libc::EEXIST)
    );
    renameat2(&m.path("n1"), &m.path("n3"), libc::RENAME_NOREPLACE).unwrap();
    // RENAME_EXCHANGE swaps
    renameat2(&m.path("n2"), &m.path("n3"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read_to_string(m.path("n2")).unwrap(), "1");
    assert_eq!(fs::read_to_string(m.path("n3")).unwrap(), "2");

    // unlink / rmdir
    assert_eq!(
        fs::remove_dir(m.path("b2")).unwrap_err().raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
    fs::remove_dir(m.path("b2/c")).unwrap();
    fs::remove_dir(m.path("b2")).unwrap();
    fs::remove_file(m.path("a/x2")).unwrap();
    assert_eq!(fs::metadata(m.path("a/x")).unwrap().nlink(), 1);
    assert_eq!(
        fs::metadata(m.path("nope")).unwrap_err().raw_os_error(),
        Some(libc::ENOENT)
    );
    let long = "l".repeat(256);
    assert_eq!(
        File::create(m.path(&long)).unwrap_err().raw_os_error(),
        Some(libc::ENAMETOOLONG)
    );
    File::create(m.path(&"l".repeat(255))).unwrap();

    // special files
    let fifo = cstr(&m.path("fifo"));
    // SAFETY: valid path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(
        &fs::symlink_metadata(m.path("fifo")).unwrap().file_type()
    ));
    let dev = cstr(&m.path("null"));
    // SAFETY: valid path; root may create device nodes.
    let r = unsafe { libc::mknod(dev.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    assert_eq!(r, 0);
    assert_eq!(
        fs::symlink_metadata(m.path("null")).unwrap().rdev(),
        libc::makedev(1, 3)
    );

    // survives a remount
    let (store, mnt) = (m.store.clone(), m.mnt.clone());
    assert!(m.unmount().success());
    let m = Mount::new(&store, &mnt, "");
    assert_eq!(fs::read_to_string(m.path("a/x")).unwrap(), "changed");
    assert_eq!(fs::read_dir(m.path("many")).unwrap().count(), 700);
    assert_eq!(fs::read_link(m.path("sl")).unwrap().to_str(), Some("a/x"));
}

#[test]
fn attributes_and_permissions() {
    require_fuse!();
    let (_t, m) = setup("attr", "allow_other");
    let f = m.path("f");
    fs::write(&f, "secret").unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o640);
    std::os::unix::fs::chown(&f, Some(1234), Some(5678)).unwrap();
    let md = fs::metadata(&f).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 5678));
    // nanosecond utimens
    let c = cstr(&f);
    let ts = [
        libc::timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 123_456_789,
        },
        libc::timespec {
            tv_sec: 1_500_000_000,
            tv_nsec: 987_654_321,
        },
    ];
    // SAFETY: valid path and two timespecs.
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) },
        0
    );
    let md = fs::metadata(&f).unwrap();
    assert_eq!((md.atime(), md.atime_nsec()), (1_000_000_000, 123_456_789));
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_500_000_000, 987_654_321));

    // default_permissions: the kernel checks modes for other users (mount has allow_other).
    fs::write(m.path("public"), "hello").unwrap();
    fs::set_permissions(m.path("public"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(m.path("private"), "no").unwrap();
    fs::set_permissions(m.path("private"), fs::Permissions::from_mode(0o600)).unwrap();
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(args)
            .output()
            .unwrap()
    };
    let o = as_nobody(&["cat", m.path("public").to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(o.stdout, b"hello");
    assert!(!as_nobody(&["cat", m.path("private").to_str().unwrap()])
        .status
        .success());
    assert!(!as_nobody(&["touch", m.path("newfile").to_str().unwrap()])
        .status
        .success());

    // chown kills setuid/setgid (setgid only with group exec), as on Linux
    fs::write(m.path("suid"), "#!/bin/sh\n").unwrap();
    fs::set_permissions(m.path("suid"), fs::Permissions::from_mode(0o6755)).unwrap();
    assert_eq!(
        fs::metadata(m.path("suid")).unwrap().mode() & 0o7777,
        0o6755
    );
    std::os::unix::fs::chown(m.path("suid"), Some(1), None).unwrap();
    assert_eq!(fs::metadata(m.path("suid")).unwrap().mode() & 0o7777, 0o755);
    fs::set_permissions(m.path("suid"), fs::Permissions::from_mode(0o2745)).unwrap();
    std::os::unix::fs::chown(m.path("suid"), Some(2), None).unwrap();
    assert_eq!(
        fs::metadata(m.path("suid")).unwrap().mode() & 0o7777,
        0o2745
    );
    // a write by an unprivileged user kills setuid
    fs::write(m.path("suidw"), "x").unwrap();
    fs::set_permissions(m.path("suidw"), fs::Permissions::from_mode(0o4777)).unwrap();
    let o = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
        ])
        .arg(format!("echo more >> '{}'", m.path("suidw").display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    assert_eq!(fs::read_to_string(m.path("suidw")).unwrap(), "xmore\n");
    assert_eq!(
        fs::metadata(m.path("suidw")).unwrap().mode() & 0o7777,
        0o777
    );

    // setgid directories pass their group on
    fs::create_dir(m.path("sg")).unwrap();
    std::os::unix::fs::chown(m.path("sg"), None, Some(4242)).unwrap();
    fs::set_permissions(m.path("sg"), fs::Permissions::from_mode(0o2775)).unwrap();
    fs::write(m.path("sg/f"), "").unwrap();
    fs::create_dir(m.path("sg/d")).unwrap();
    assert_eq!(fs::metadata(m.path("sg/f")).unwrap().gid(), 4242);
    let d = fs::metadata(m.path("sg/d")).unwrap();
    assert_eq!(d.gid(), 4242);
    assert_ne!(d.mode() & 0o2000, 0);
}

#[test]
fn private_mount_without_allow_other() {
    require_fuse!();
    let (_t, m) = setup("priv", "");
    fs::write(m.path("f"), "x").unwrap();
    fs::set_permissions(m.path("f"), fs::Permissions::from_mode(0o644)).unwrap();
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "stat"])
        .arg(m.path("f"))
        .output()
        .unwrap();
    assert!(
        !o.status.success(),
        "other users must not see a private mount"
    );
}

/// fallocate reserves space on a mount (issue 13): the range counts in st_blocks, the free
/// space statfs reports shrinks by it, a compressible write into it leaves fewer blocks, and
/// an unlink gives the space back.
#[test]
fn fallocate_reserves_space() {
    require_fuse!();
    let (_t, m) = setup("prealloc", "compress=zstd:1");
    let p = m.path("r");
    let free = || {
        let c = cstr(p.parent().unwrap());
        // SAFETY: zeroed statvfs is valid output storage; valid path.
        let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut sv) }, 0);
        (sv.f_bavail * sv.f_frsize) as i64
    };
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    let fd = f.as_raw_fd();
    let gib: i64 = 1 << 30;
    let before = free();
    // SAFETY: valid fd.
    assert_eq!(unsafe { libc::fallocate(fd, 0, 0, gib) }, 0);
    let after = free();
    // Other processes share the disk: a margin of 256 MiB for what they write meanwhile.
    assert!(
        before - after > gib - (256 << 20),
        "free space {before} -> {after} after reserving 1 GiB"
    );
    assert_eq!(f.metadata().unwrap().blocks(), (gib / 512) as u64);
    // 64 MiB of text written into the range: compressed, fewer blocks than reserved.
    let data = text_bytes(64 << 20, 5);
    f.write_all_at(&data, 0).unwrap();
    f.sync_all().unwrap();
    let blocks = f.metadata().unwrap().blocks();
    assert!(
        blocks < ((gib - (32 << 20)) / 512) as u64,
        "{blocks} blocks after a compressible write into the reservation"
    );
    drop(f);
    fs::remove_file(&p).unwrap();
    let end = free();
    assert!(
        end - after > gib - (256 << 20),
        "free space {after} -> {end} after the unlink"
    );
}

#[test]
fn data_operations() {
    require_fuse!();
    let (_t, m) = setup("data", "compress=zstd:1");
    let p = m.path("f");
    let data = text_bytes(1 << 20, 3);
    fs::write(&p, &data).unwrap();
    // truncate down and up: the tail reads as zeros
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(1000).unwrap();
    f.set_len(300_000).unwrap();
    drop(f);
    let back = fs::read(&p).unwrap();
    assert_eq!(back.len(), 300_000);
    assert_eq!(&back[..1000], &data[..1000]);
    assert!(back[1000..].iter().all(|&b| b == 0));

    // O_APPEND
    let mut a = OpenOptions::new().append(true).open(&p).unwrap();
    a.write_all(b"tail").unwrap();
    drop(a);
    assert_eq!(fs::metadata(&p).unwrap().len(), 300_004);
    assert_eq!(&fs::read(&p).unwrap()[300_000..], b"tail");

    // sparse file beyond 4 GiB, SEEK_DATA / SEEK_HOLE
    let s = m.path("sparse");
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&s)
        .unwrap();
    let off = 5u64 << 30;
    let chunk = random_bytes(1 << 20, 9);
    f.write_all_at(&chunk, off).unwrap();
    f.sync_all().unwrap();
    assert_eq!(f.metadata().unwrap().len(), off + (1 << 20));
    let mut got = vec![0u8; 1 << 20];
    f.read_exact_at(&mut got, off).unwrap();
    assert_eq!(got, chunk);
    let mut z = vec![1u8; 4096];
    f.read_exact_at(&mut z, 1 << 30).unwrap();
    assert!(z.iter().all(|&b| b == 0));
    let fd = f.as_raw_fd();
    // SAFETY: valid fd.
    let data_at = unsafe { libc::lseek(fd, 0, libc::SEEK_DATA) };
    assert_eq!(data_at as u64, off);
    // SAFETY: valid fd.
    let hole_at = unsafe { libc::lseek(fd, 0, libc::SEEK_HOLE) };
    assert_eq!(hole_at, 0);
    // SAFETY: valid fd.
    let hole_after = unsafe { libc::lseek(fd, off as i64, libc::SEEK_HOLE) };
    assert_eq!(hole_after as u64, off + (1 << 20));
    // SAFETY: valid fd.
    let past = unsafe { libc::lseek(fd, (off + (2 << 20)) as i64, libc::SEEK_DATA) };
    assert_eq!((past, errno()), (-1, libc::ENXIO));
    drop(f);

    // fallocate: default mode extends, punch hole zeroes, other modes are refused
    let fa = m.path("falloc");
    fs::write(&fa, text_bytes(512 << 10, 4)).unwrap();
    let f = OpenOptions::new().read(true).write(true).open(&fa).unwrap();
    let fd = f.as_raw_fd();
    // SAFETY: valid fd.
    assert_eq!(unsafe { libc::fallocate(fd, 0, 0, 1 << 20) }, 0);
    assert_eq!(f.metadata().unwrap().len(), 1 << 20);
    // SAFETY: valid fd.
    let r = unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            128 << 10,
            128 << 10,
        )
    };
    assert_eq!(r, 0);
    let mut hole = vec![1u8; 128 << 10];
    f.read_exact_at(&mut hole, 128 << 10).unwrap();
    assert!(hole.iter().all(|&b| b == 0));
    assert_eq!(f.metadata().unwrap().len(), 1 << 20);
    // SAFETY: valid fd.
    let r = unsafe { libc::fallocate(fd, libc::FALLOC_FL_COLLAPSE_RANGE, 0, 128 << 10) };
    assert_eq!((r, errno()), (-1, libc::EOPNOTSUPP));
    // Preallocating more than the free space fails with ENOSPC (as ext4) and changes nothing;
    // the data already there needs no room.
    let c = cstr(&fa);
    // SAFETY: zeroed statvfs is valid output storage; valid path.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut sv) }, 0);
    let free = sv.f_bavail * sv.f_frsize;
    for mode in [0, libc::FALLOC_FL_KEEP_SIZE] {
        // SAFETY: valid fd.
        let r = unsafe { libc::fallocate(fd, mode, 1 << 20, (free + (1 << 30)) as i64) };
        assert_eq!((r, errno()), (-1, libc::ENOSPC), "mode {mode:#x}");
        assert_eq!(f.metadata().unwrap().len(), 1 << 20);
    }
    // SAFETY: valid fd.
    assert_eq!(unsafe { libc::fallocate(fd, 0, 0, 128 << 10) }, 0);
    drop(f);

    // mmap writes and reads
    let mp = m.path("mmap");
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&mp)
        .unwrap();
    f.set_len(64 << 10).unwrap();
    // SAFETY: mapping a 64 KiB file we own, MAP_SHARED, unmapped below.
    unsafe {
        let ptr = libc::mmap(
            std::ptr::null_mut(),
            64 << 10,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(ptr, libc::MAP_FAILED);
        let s = std::slice::from_raw_parts_mut(ptr.cast::<u8>(), 64 << 10);
        s[..5].copy_from_slice(b"mmap!");
        s[60_000] = 7;
        assert_eq!(libc::msync(ptr, 64 << 10, libc::MS_SYNC), 0);
        libc::munmap(ptr, 64 << 10);
    }
    f.sync_data().unwrap();
    drop(f);

    // unlink of an open file: data lives until close
    let u = m.path("unlinked");
    let body = random_bytes(300 << 10, 5);
    fs::write(&u, &body).unwrap();
    let mut open = File::open(&u).unwrap();
    fs::remove_file(&u).unwrap();
    assert!(!u.exists());
    let mut got = Vec::new();
    open.read_to_end(&mut got).unwrap();
    assert_eq!(got, body);
    open.seek(SeekFrom::Start(1000)).unwrap();
    drop(open);

    // statfs reports the store's file system
    let sv = nix_statvfs(&m.mnt);
    let st = nix_statvfs(&m.store);
    assert_eq!(
        sv.0 * sv.1,
        st.0 * st.1,
        "total bytes differ: {sv:?} vs {st:?}"
    );

    // everything is there after a remount
    let (store, mnt) = (m.store.clone(), m.mnt.clone());
    assert!(m.unmount().success());
    let m = Mount::new(&store, &mnt, "");
    let mm = fs::read(m.path("mmap")).unwrap();
    assert_eq!(&mm[..5], b"mmap!");
    assert_eq!(mm[60_000], 7);
    let back = fs::read(m.path("f")).unwrap();
    assert_eq!(&back[..1000], &data[..1000]);
    assert_eq!(&back[300_000..], b"tail");
    assert_eq!(
        fs::metadata(m.path("sparse")).unwrap().len(),
        (5u64 << 30) + (1 << 20)
    );
    // The sparse file uses about the data it holds, not 5 GiB.
    assert!(fs::metadata(m.path("sparse")).unwrap().blocks() * 512 < 8 << 20);
    let f = File::open(m.path("sparse")).unwrap();
    let mut got = vec![0u8; 1 << 20];
    f.read_exact_at(&mut got, 5u64 << 30).unwrap();
    assert_eq!(got, chunk);
}

/// (f_blocks, f_frsize) of a path.
fn nix_statvfs(p: &std::path::Path) -> (u64, u64) {
    let c = cstr(p);
    // SAFETY: zeroed statvfs is valid output storage.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and output pointer.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
    (s.f_blocks, s.f_frsize)
}

#[test]
fn xattrs_and_compression_property() {
    require_fuse!();
    let (_t, m) = setup("xattr", "");
    let f = m.path("f");
    fs::write(&f, "x").unwrap();
    setxattr(&f, "user.color", b"blue", 0).unwrap();
    setxattr(&f, "trusted.t", b"1", 0).unwrap();
    assert_eq!(getxattr(&f, "user.color").unwrap(), b"blue");
    assert_eq!(getxattr(&f, "trusted.t").unwrap(), b"1");
    assert_eq!(
        setxattr(&f, "user.color", b"red", libc::XATTR_CREATE),
        Err(libc::EEXIST)
    );
    assert_eq!(
        setxattr(&f, "user.none", b"x", libc::XATTR_REPLACE),
        Err(libc::ENODATA)
    );
    assert_eq!(getxattr(&f, "user.none"), Err(libc::ENODATA));
    let c = cstr(&f);
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid path and buffer.
    let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n > 0);
    let names: Vec<&[u8]> = buf[..n as usize]
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .collect();
    assert!(names.contains(&&b"user.color"[..]) && names.contains(&&b"trusted.t"[..]));
    let cn = std::ffi::CString::new("user.color").unwrap();
    // SAFETY: valid strings.
    assert_eq!(unsafe { libc::lremovexattr(c.as_ptr(), cn.as_ptr()) }, 0);
    assert_eq!(getxattr(&f, "user.color"), Err(libc::ENODATA));

    // the compression property: validated, inherited by new files and directories
    assert_eq!(
        setxattr(&f, "compfs.compression", b"brotli:3", 0),
        Err(libc::EINVAL)
    );
    assert_eq!(setxattr(&f, "compfs.usage", b"x", 0), Err(libc::EPERM));
    fs::create_dir(m.path("z9")).unwrap();
    let (ok, _, err) = compfs(&[
        "property",
        "set",
        m.path("z9").to_str().unwrap(),
        "compression",
        "zlib:9",
    ]);
    assert!(ok, "{err}");
    let (ok, out, _) = compfs(&[
        "property",
        "get",
        m.path("z9").to_str().unwrap(),
        "compression",
    ]);
    assert!(ok);
    assert_eq!(out.trim(), "compression=zlib:9");
    let (ok, _, err) = compfs(&[
        "property",
        "set",
        m.path("z9").to_str().unwrap(),
        "compression",
        "zstd:99x",
    ]);
    assert!(!ok && err.contains("invalid compression"), "{err}");
    fs::create_dir(m.path("z9/sub")).unwrap();
    fs::write(m.path("z9/sub/t.txt"), text_bytes(512 << 10, 1)).unwrap();
    assert_eq!(
        getxattr(&m.path("z9/sub"), "compfs.compression").unwrap(),
        b"zlib:9"
    );
    assert_eq!(
        getxattr(&m.path("z9/sub/t.txt"), "compfs.compression").unwrap(),
        b"zlib:9"
    );
    let (ok, out, err) = compfs(&["usage", "-b", m.path("z9").to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.lines().any(|l| l.starts_with("zlib ")), "{out}");
    assert!(!out.lines().any(|l| l.starts_with("zstd ")), "{out}");
    // a file's property applies to its future writes
    fs::write(m.path("lz"), "").unwrap();
    setxattr(&m.path("lz"), "compfs.compression", b"lzo", 0).unwrap();
    fs::write(m.path("lz"), text_bytes(256 << 10, 2)).unwrap();
    let (ok, out, _) = compfs(&["usage", "-b", m.path("lz").to_str().unwrap()]);
    assert!(ok && out.lines().any(|l| l.starts_with("lzo ")), "{out}");
    // clearing
    let (ok, _, _) = compfs(&[
        "property",
        "set",
        m.path("lz").to_str().unwrap(),
        "compression",
        "",
    ]);
    assert!(ok);
    let (_, out, _) = compfs(&["property", "get", m.path("lz").to_str().unwrap()]);
    assert_eq!(out, "");
    // stats on the root
    let (ok, out, err) = compfs(&["stats", m.mnt.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("user bytes written"), "{out}");
    let (ok, _, err) = compfs(&["stats", m.path("z9").to_str().unwrap()]);
    assert!(!ok && err.contains("not the root"), "{err}");
}

/// Issue 13: a directory read while its entries are renamed returns no entry twice and ends
/// (a renamed entry gets a new cookie at the end; a reader that follows it never finishes).
#[test]
fn readdir_during_renames_terminates_without_duplicates() {
    use std::collections::HashSet;
    use std::os::unix::fs::DirEntryExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    require_fuse!();
    let (_t, m) = setup("readdir-renames", "");
    let dir = m.path("d");
    fs::create_dir(&dir).unwrap();
    const N: usize = 2000;
    for i in 0..N {
        File::create(dir.join(format!("a{i}"))).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let renamer = {
        let (stop, dir) = (stop.clone(), dir.clone());
        std::thread::spawn(move || {
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let (from, to) = if round % 2 == 0 {
                    ("a", "b")
                } else {
                    ("b", "a")
                };
                for i in 0..N {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    fs::rename(dir.join(format!("{from}{i}")), dir.join(format!("{to}{i}")))
                        .unwrap();
                }
                round += 1;
            }
        })
    };
    let result = std::panic::catch_unwind(|| {
        for pass in 0..15 {
            let mut seen = HashSet::new();
            for (k, e) in fs::read_dir(&dir).unwrap().enumerate() {
                let e = e.unwrap();
                assert!(k < 2 * N, "pass {pass}: readdir does not end");
                assert!(
                    seen.insert(e.ino()),
                    "pass {pass}: {:?} (inode {}) returned twice",
                    e.file_name(),
                    e.ino()
                );
            }
            assert!(seen.len() <= N, "pass {pass}: {} entries", seen.len());
        }
    });
    stop.store(true, Ordering::Relaxed);
    renamer.join().unwrap();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
    assert_eq!(fs::read_dir(&dir).unwrap().count(), N);
}

/// `name_to_handle_at` / `open_by_handle_at` (NFS export): handles of a file and of a nested
/// directory still open after an unmount and a remount, when the kernel has nothing cached.
#[test]
fn file_handles_survive_a_remount() {
    require_fuse!();
    let (_t, m) = setup("handles", "");
    fs::create_dir_all(m.path("a/b/c")).unwrap();
    fs::write(m.path("a/b/c/f"), "handled").unwrap();
    fs::write(m.path("top"), "top").unwrap();
    // struct file_handle: handle_bytes u32, handle_type i32, then the handle (up to 128 bytes).
    let handle = |p: &std::path::Path| -> Vec<u8> {
        let mut buf = vec![0u8; 8 + 128];
        buf[..4].copy_from_slice(&128u32.to_ne_bytes());
        let mut mount_id: i32 = 0;
        let cp = cstr(p);
        // SAFETY: valid path, buffer of handle_bytes + 8, out pointer.
        let r = unsafe {
            libc::syscall(
                libc::SYS_name_to_handle_at,
                libc::AT_FDCWD,
                cp.as_ptr(),
                buf.as_mut_ptr(),
                &mut mount_id,
                0,
            )
        };
        assert_eq!(r, 0, "name_to_handle_at {}: errno {}", p.display(), errno());
        buf
    };
    let hf = handle(&m.path("a/b/c/f"));
    let hd = handle(&m.path("a/b/c"));
    let ht = handle(&m.path("top"));
    let store = m.store.clone();
    let mnt = m.mnt.clone();
    assert!(m.unmount().success());
    let m = Mount::new(&store, &mnt, "");
    let root = File::open(&m.mnt).unwrap();
    let open = |h: &[u8], flags: i32| -> Result<File, i32> {
        // SAFETY: a handle filled by name_to_handle_at; the root directory's descriptor.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_open_by_handle_at,
                root.as_raw_fd(),
                h.as_ptr(),
                flags,
            )
        };
        if fd < 0 {
            Err(errno())
        } else {
            // SAFETY: a descriptor we own.
            Ok(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) })
        }
    };
    // The directory first, while nothing below the root is cached: its path is rebuilt
    // through "..".
    let d = open(&hd, libc::O_RDONLY | libc::O_DIRECTORY).expect("directory handle");
    let mut names: Vec<String> = fs::read_dir(format!("/proc/self/fd/{}", d.as_raw_fd()))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["f"]);
    let mut s = String::new();
    open(&hf, libc::O_RDONLY)
        .expect("file handle")
        .read_to_string(&mut s)
        .unwrap();
    assert_eq!(s, "handled");
    // A removed file's handle is stale.
    fs::remove_file(m.path("top")).unwrap();
    assert_eq!(open(&ht, libc::O_RDONLY).err(), Some(libc::ESTALE));
}
