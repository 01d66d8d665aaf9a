//! Differential test against ext4 (issue 12 section 3, issue 13): the same syscall sequences run
//! on a kernel ext4 loop mount and on a compfs mount (`-o allow_other`), as root and as
//! unprivileged users with supplementary groups, and every result is compared: each call's
//! return value or errno (and what `fstat` on a descriptor says), and after every step the
//! `lstat` of every path the case names: type and mode, uid, gid, nlink, size (not for
//! directories, whose size is a layout detail on every filesystem) and which of
//! atime/mtime/ctime changed. `st_blocks` is compared where a case asks for it (the prealloc
//! case: preallocated ranges, never written data, which compfs stores compressed).
//!
//! Each step runs in a forked child that sets its groups, gid and uid (no sudo) and runs its
//! calls with descriptors that live for the step; results come back through a pipe. A
//! difference fails the test unless [`ALLOWED`] names it with the kernel reason it cannot be
//! fixed in the daemon, and an [`ALLOWED`] entry that matches nothing fails it too.
//!
//! POSIX ACLs are compared through their xattrs (setfacl and getfacl make the same calls):
//! `acl_access` and `acl_default` set them and compare a hash of what getxattr returns; the
//! `noacl` mount option is compared with btrfs, as ext4 on this kernel refuses it.
//!
//! `COMPFS_DIFF_SHOW=CASE` prints what both filesystems did in that case;
//! `COMPFS_DIFF_KERNEL_FS=btrfs` compares with btrfs instead of ext4 (by hand: the allow-list is
//! ext4's).
//!
//! Needs root and a loop device (CI runs as root); skipped with a printed reason otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod fs_common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use compfs_store::Mode;
use fs_common::*;

/// Who runs a step: uid, gid, supplementary groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    Root,
    /// uid 2001, gid 2001, groups 2001 and 2100.
    A,
    /// uid 2002, gid 2002, groups 2002 and 2100.
    B,
    /// uid 2003, gid 2003, no other group.
    C,
}

const UA: u32 = 2001;
const UB: u32 = 2002;
const UC: u32 = 2003;
/// A group A and B are in; C is not.
const GS: u32 = 2100;
/// A group nobody is in.
const GX: u32 = 2200;
/// chown's "leave unchanged".
const KEEP: u32 = u32::MAX;

impl Who {
    fn creds(self) -> (u32, u32, &'static [u32]) {
        match self {
            Who::Root => (0, 0, &[]),
            Who::A => (UA, UA, &[UA, GS]),
            Who::B => (UB, UB, &[UB, GS]),
            Who::C => (UC, UC, &[UC]),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Ts {
    Now,
    Omit,
    At(i64),
}

/// One system call. Paths are relative to the case's directory; `usize` is a descriptor slot.
#[derive(Clone, Debug)]
enum Op {
    Open(CString, i32, u32, usize),
    Close(usize),
    Write(usize, usize),
    Pwrite(usize, i64, usize),
    Read(usize, usize),
    Ftruncate(usize, i64),
    Truncate(CString, i64),
    Fallocate(usize, i32, i64, i64),
    Fstat(usize),
    /// Returns `st_blocks` (fstat): compared only where no data is written (compressed data
    /// takes fewer blocks on compfs by design).
    Blocks(usize),
    Getdents(usize),
    Chmod(CString, u32),
    Fchmod(usize, u32),
    Chown(CString, u32, u32),
    Lchown(CString, u32, u32),
    Fchown(usize, u32, u32),
    Link(CString, CString),
    Symlink(CString, CString),
    Mkdir(CString, u32),
    Mkfifo(CString, u32),
    Mknod(CString, u32, u64),
    Rmdir(CString),
    Unlink(CString),
    Rename(CString, CString, u32),
    Utimens(CString, Option<[Ts; 2]>, i32),
    Setxattr(CString, CString, Vec<u8>),
    /// Returns the value's size.
    Getxattr(CString, CString),
    /// Returns the mount flags statvfs reports (read-only, nosuid, nodev, noexec, atime).
    Statvfs(CString),
    Removexattr(CString, CString),
    /// Returns a hash of the value (FNV-1a, 62 bits), to compare contents.
    GetxattrHash(CString, CString),
    /// Sets the umask for the rest of the step (steps start with 022).
    Umask(u32),
}

impl Op {
    /// Paths this call names (watched after every step of its case).
    fn paths(&self) -> Vec<String> {
        let s = |c: &CString| c.to_str().unwrap().to_string();
        match self {
            Op::Open(p, ..)
            | Op::Truncate(p, _)
            | Op::Chmod(p, _)
            | Op::Chown(p, ..)
            | Op::Lchown(p, ..)
            | Op::Mkdir(p, _)
            | Op::Mkfifo(p, _)
            | Op::Mknod(p, ..)
            | Op::Rmdir(p)
            | Op::Unlink(p)
            | Op::Utimens(p, ..)
            | Op::Setxattr(p, ..)
            | Op::Removexattr(p, _)
            | Op::GetxattrHash(p, _)
            | Op::Getxattr(p, _) => vec![s(p)],
            Op::Link(a, b) | Op::Rename(a, b, _) => vec![s(a), s(b)],
            Op::Symlink(_, p) => vec![s(p)],
            _ => vec![],
        }
    }

    fn name(&self) -> String {
        let short = |c: &CString| {
            let s = c.to_str().unwrap();
            if s.len() > 24 {
                format!("{}..({} bytes)", &s[..12], s.len())
            } else {
                s.to_string()
            }
        };
        match self {
            Op::Open(p, f, m, s) => format!("open({}, {f:#o}, {m:#o})->fd{s}", short(p)),
            Op::Close(s) => format!("close(fd{s})"),
            Op::Write(s, n) => format!("write(fd{s}, {n})"),
            Op::Pwrite(s, o, n) => format!("pwrite(fd{s}, {o}, {n})"),
            Op::Read(s, n) => format!("read(fd{s}, {n})"),
            Op::Ftruncate(s, n) => format!("ftruncate(fd{s}, {n})"),
            Op::Truncate(p, n) => format!("truncate({}, {n})", short(p)),
            Op::Fallocate(s, m, o, n) => format!("fallocate(fd{s}, {m:#x}, {o}, {n})"),
            Op::Fstat(s) => format!("fstat(fd{s})"),
            Op::Blocks(s) => format!("fstat(fd{s}).st_blocks"),
            Op::Getdents(s) => format!("getdents(fd{s})"),
            Op::Chmod(p, m) => format!("chmod({}, {m:#o})", short(p)),
            Op::Fchmod(s, m) => format!("fchmod(fd{s}, {m:#o})"),
            Op::Chown(p, u, g) => format!("chown({}, {}, {})", short(p), *u as i32, *g as i32),
            Op::Lchown(p, u, g) => format!("lchown({}, {}, {})", short(p), *u as i32, *g as i32),
            Op::Fchown(s, u, g) => format!("fchown(fd{s}, {}, {})", *u as i32, *g as i32),
            Op::Link(a, b) => format!("link({}, {})", short(a), short(b)),
            Op::Symlink(t, p) => format!("symlink({}, {})", short(t), short(p)),
            Op::Mkdir(p, m) => format!("mkdir({}, {m:#o})", short(p)),
            Op::Mkfifo(p, m) => format!("mkfifo({}, {m:#o})", short(p)),
            Op::Mknod(p, m, d) => format!("mknod({}, {m:#o}, {d:#x})", short(p)),
            Op::Rmdir(p) => format!("rmdir({})", short(p)),
            Op::Unlink(p) => format!("unlink({})", short(p)),
            Op::Rename(a, b, f) => format!("renameat2({}, {}, {f})", short(a), short(b)),
            Op::Utimens(p, t, f) => format!("utimensat({}, {t:?}, {f:#x})", short(p)),
            Op::Setxattr(p, n, v) => format!("lsetxattr({}, {n:?}, {} bytes)", short(p), v.len()),
            Op::Getxattr(p, n) => format!("lgetxattr({}, {n:?})", short(p)),
            Op::Statvfs(p) => format!("statvfs({}).f_flag", short(p)),
            Op::Removexattr(p, n) => format!("lremovexattr({}, {n:?})", short(p)),
            Op::GetxattrHash(p, n) => format!("lgetxattr({}, {n:?}) value hash", short(p)),
            Op::Umask(m) => format!("umask({m:#o})"),
        }
    }
}

/// What a child reports per call: return value (or -errno), then for fstat mode, uid, gid,
/// nlink and size (-1 for directories).
type Rec = [i64; 6];

struct Step {
    who: Who,
    ops: Vec<Op>,
}

struct Case {
    name: &'static str,
    steps: Vec<Step>,
}

// ---- builders -------------------------------------------------------------------------------

fn c(s: impl AsRef<str>) -> CString {
    CString::new(s.as_ref()).unwrap()
}
fn st(who: Who, ops: Vec<Op>) -> Step {
    Step { who, ops }
}
fn open(p: impl AsRef<str>, flags: i32, mode: u32, slot: usize) -> Op {
    Op::Open(c(p), flags, mode, slot)
}
/// Creates `p` with `mode` (open O_CREAT|O_WRONLY, close) in slot 7.
fn creat(p: impl AsRef<str>, mode: u32) -> Vec<Op> {
    vec![
        open(p, libc::O_CREAT | libc::O_WRONLY, mode, 7),
        Op::Close(7),
    ]
}
fn chmod(p: impl AsRef<str>, m: u32) -> Op {
    Op::Chmod(c(p), m)
}
fn chown(p: impl AsRef<str>, u: u32, g: u32) -> Op {
    Op::Chown(c(p), u, g)
}
fn mkdir(p: impl AsRef<str>, m: u32) -> Op {
    Op::Mkdir(c(p), m)
}
fn unlink(p: impl AsRef<str>) -> Op {
    Op::Unlink(c(p))
}
fn rmdir(p: impl AsRef<str>) -> Op {
    Op::Rmdir(c(p))
}
fn rename(a: impl AsRef<str>, b: impl AsRef<str>) -> Op {
    Op::Rename(c(a), c(b), 0)
}
fn link(a: impl AsRef<str>, b: impl AsRef<str>) -> Op {
    Op::Link(c(a), c(b))
}
fn symlink(t: impl AsRef<str>, p: impl AsRef<str>) -> Op {
    Op::Symlink(c(t), c(p))
}
fn utimens(p: impl AsRef<str>, t: Option<[Ts; 2]>, flags: i32) -> Op {
    Op::Utimens(c(p), t, flags)
}
/// Root creates `p` with `mode`, owned by `uid:gid`, with `len` bytes.
fn setup_file(p: &str, mode: u32, uid: u32, gid: u32, len: usize) -> Vec<Op> {
    vec![
        open(p, libc::O_CREAT | libc::O_WRONLY, 0o644, 7),
        Op::Write(7, len),
        Op::Close(7),
        chown(p, uid, gid),
        chmod(p, mode),
    ]
}
fn cat(parts: Vec<Vec<Op>>) -> Vec<Op> {
    parts.into_iter().flatten().collect()
}

const RW: i32 = libc::O_RDWR;
const WR: i32 = libc::O_WRONLY;
const RD: i32 = libc::O_RDONLY;
const DIR: i32 = libc::O_RDONLY | libc::O_DIRECTORY;
const CREAT: i32 = libc::O_CREAT | libc::O_WRONLY;
const KEEP_SIZE: i32 = libc::FALLOC_FL_KEEP_SIZE;
const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;

// ---- the cases ------------------------------------------------------------------------------

fn cases() -> Vec<Case> {
    use Who::*;
    let mut v = Vec::new();

    v.push(Case {
        name: "chmod",
        steps: vec![
            st(
                Root,
                cat(vec![
                    setup_file("f", 0o644, UA, UA, 10),
                    vec![mkdir("d", 0o755), chown("d", UA, GX)],
                ]),
            ),
            st(
                A,
                vec![
                    chmod("f", 0o600),
                    chmod("f", 0o4755),
                    chmod("f", 0o2755),
                    chmod("f", 0o7777),
                    chmod("nothere", 0o644),
                ],
            ),
            st(B, vec![chmod("f", 0o777)]),
            st(Root, vec![chown("f", UA, GS)]),
            st(A, vec![chmod("f", 0o2755)]),
            // The owner is not in the file's group: S_ISGID is dropped (setattr_prepare).
            st(Root, vec![chown("f", UA, GX)]),
            st(A, vec![chmod("f", 0o2755)]),
            st(
                A,
                vec![open("f", RD, 0, 0), Op::Fchmod(0, 0o2750), Op::Close(0)],
            ),
            st(A, vec![chmod("d", 0o2755)]),
            st(Root, vec![chmod("f", 0o2755), chmod("d", 0o3777)]),
        ],
    });

    v.push(Case {
        name: "chown",
        steps: vec![
            st(
                Root,
                cat(vec![
                    setup_file("f", 0o644, UA, UA, 0),
                    vec![symlink("f", "l"), Op::Lchown(c("l"), UA, UA)],
                ]),
            ),
            st(
                A,
                vec![
                    chown("f", KEEP, GS),
                    chown("f", KEEP, GX),
                    chown("f", UB, KEEP),
                    chown("f", KEEP, KEEP),
                    chown("f", UA, KEEP),
                    chown("f", UA, UA),
                ],
            ),
            st(B, vec![chown("f", KEEP, GS), chown("f", KEEP, KEEP)]),
            st(Root, vec![chown("f", UB, UB)]),
            st(Root, vec![Op::Lchown(c("l"), UC, UC), chown("l", UA, KEEP)]),
            st(C, vec![Op::Lchown(c("l"), KEEP, GS)]),
            st(
                A,
                vec![open("f", RD, 0, 0), Op::Fchown(0, KEEP, GS), Op::Close(0)],
            ),
        ],
    });

    // Privilege bits on chown/chgrp (issue 12 section 3, issue 13).
    v.push(Case {
        name: "suid_chown",
        steps: vec![
            st(
                Root,
                cat(vec![
                    setup_file("f1", 0o6755, UA, UA, 4),
                    setup_file("f2", 0o2745, UA, UA, 4),
                    setup_file("f3", 0o2745, UA, GX, 4),
                    setup_file("f4", 0o4755, UA, UA, 4),
                    setup_file("f5", 0o6755, UA, UA, 4),
                    setup_file("f6", 0o6755, UA, UA, 4),
                    setup_file("f7", 0o6755, UA, UA, 4),
                    vec![
                        Op::Mkfifo(c("p"), 0o644),
                        chown("p", UA, UA),
                        chmod("p", 0o6775),
                        mkdir("d", 0o755),
                        chown("d", UA, UA),
                        chmod("d", 0o6755),
                    ],
                ]),
            ),
            // Owner changes the group: S_ISUID goes, S_ISGID goes when group-executable.
            st(A, vec![chown("f1", KEEP, GS)]),
            // S_ISGID without group-execute stays when the owner is in the old group...
            st(A, vec![chown("f2", KEEP, GS)]),
            // ...and goes when not.
            st(A, vec![chown("f3", KEEP, UA)]),
            // chown(-1, -1) still kills S_ISUID on Linux.
            st(A, vec![chown("f4", KEEP, KEEP)]),
            // Root changing the owner kills both too.
            st(Root, vec![chown("f5", UB, KEEP)]),
            st(Root, vec![chown("f6", KEEP, KEEP)]),
            st(
                A,
                vec![open("f7", RD, 0, 0), Op::Fchown(0, KEEP, GS), Op::Close(0)],
            ),
            st(A, vec![chown("p", KEEP, GS), chown("d", KEEP, GS)]),
            st(Root, vec![chmod("p", 0o6775), chmod("d", 0o6775)]),
            st(A, vec![chown("p", KEEP, KEEP), chown("d", KEEP, KEEP)]),
        ],
    });

    // Privilege bits on write, truncate, fallocate and direct I/O (issue 13).
    {
        let files: &[(&str, u32)] = &[
            ("w1", 0o6777),
            ("w2", 0o2676),
            ("w3", 0o2666),
            ("w4", 0o6777),
            ("w5", 0o6777),
            ("t1", 0o6777),
            ("t2", 0o6777),
            ("t3", 0o6777),
            ("t4", 0o6777),
            ("a1", 0o6777),
            ("a2", 0o6777),
            ("a3", 0o2676),
            ("a4", 0o6777),
            ("a5", 0o6777),
            ("a6", 0o6777),
            ("a7", 0o6777),
            ("o1", 0o6777),
            ("o2", 0o6777),
        ];
        let mut setup = Vec::new();
        for (f, m) in files {
            setup.extend(setup_file(f, *m, UA, UA, 8192));
        }
        let w = |f: &str, ops: Vec<Op>| {
            let mut v = vec![open(f, RW, 0, 0)];
            v.extend(ops);
            v.push(Op::Close(0));
            v
        };
        v.push(Case {
            name: "suid_write",
            steps: vec![
                st(Root, setup),
                st(B, w("w1", vec![Op::Write(0, 100)])),
                st(B, w("w2", vec![Op::Write(0, 100)])),
                // S_ISGID without group-execute: B is not in the group, so it goes.
                st(B, w("w3", vec![Op::Write(0, 100)])),
                // The owner (in the group) keeps S_ISGID without group-execute.
                st(A, w("w4", vec![Op::Pwrite(0, 9000, 10)])),
                st(Root, w("w5", vec![Op::Write(0, 100)])),
                st(B, w("t1", vec![Op::Ftruncate(0, 100)])),
                st(B, vec![Op::Truncate(c("t2"), 20000)]),
                st(Root, vec![Op::Truncate(c("t3"), 10)]),
                st(B, vec![open("t4", WR | libc::O_TRUNC, 0, 0), Op::Close(0)]),
                st(B, w("a1", vec![Op::Fallocate(0, 0, 0, 65536)])),
                st(B, w("a2", vec![Op::Fallocate(0, KEEP_SIZE, 0, 65536)])),
                st(B, w("a3", vec![Op::Fallocate(0, 0, 0, 65536)])),
                st(B, w("a4", vec![Op::Fallocate(0, PUNCH, 0, 4096)])),
                st(B, w("a5", vec![Op::Fallocate(0, ZERO, 0, 4096)])),
                st(B, w("a6", vec![Op::Fallocate(0, ZERO, 4096, 65536)])),
                st(Root, w("a7", vec![Op::Fallocate(0, PUNCH, 0, 4096)])),
                st(
                    B,
                    vec![
                        open("o1", RW | libc::O_DIRECT, 0, 0),
                        Op::Pwrite(0, 0, 4096),
                        Op::Close(0),
                    ],
                ),
                st(
                    B,
                    vec![
                        open("o2", WR | libc::O_APPEND, 0, 0),
                        Op::Write(0, 5),
                        Op::Fstat(0),
                        Op::Close(0),
                    ],
                ),
            ],
        });
    }

    // File capabilities go with the setuid bit (the kernel's ATTR_KILL_PRIV).
    {
        // struct vfs_cap_data, revision 2, effective, CAP_NET_BIND_SERVICE permitted.
        let cap: Vec<u8> = [0x0200_0001u32, 1 << 10, 0, 0, 0]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let name = "security.capability";
        let mut setup = Vec::new();
        for f in ["c1", "c2", "c3", "c4", "c5"] {
            setup.extend(setup_file(f, 0o777, UA, UA, 100));
            setup.push(Op::Setxattr(c(f), c(name), cap.clone()));
        }
        let get = |f: &str| Op::Getxattr(c(f), c(name));
        v.push(Case {
            name: "capability",
            steps: vec![
                st(Root, setup),
                st(
                    B,
                    vec![open("c1", WR, 0, 0), Op::Write(0, 10), Op::Close(0)],
                ),
                st(A, vec![chown("c2", KEEP, GS)]),
                st(B, vec![Op::Truncate(c("c3"), 10)]),
                st(
                    Root,
                    vec![open("c4", WR, 0, 0), Op::Write(0, 10), Op::Close(0)],
                ),
                st(Root, vec![chmod("c5", 0o755)]),
                st(
                    Root,
                    vec![get("c1"), get("c2"), get("c3"), get("c4"), get("c5")],
                ),
            ],
        });
    }

    v.push(Case {
        name: "link",
        steps: vec![
            st(
                Root,
                cat(vec![
                    setup_file("f", 0o644, UA, UA, 3),
                    setup_file("rootonly", 0o600, 0, 0, 3),
                    vec![mkdir("d", 0o755), mkdir("ro", 0o755)],
                ]),
            ),
            st(A, vec![link("f", "g"), link("f", "d/h"), link("f", "g")]),
            st(
                A,
                vec![
                    link("d", "d2"),
                    link("missing", "x"),
                    link("f", "ro/x"),
                    // fs.protected_hardlinks: no link to a file A cannot read and write.
                    link("rootonly", "r2"),
                ],
            ),
            st(Root, vec![unlink("f")]),
            st(A, vec![unlink("g")]),
        ],
    });

    v.push(Case {
        name: "mkdir",
        steps: vec![
            st(Root, vec![mkdir("ro", 0o755)]),
            st(
                A,
                vec![
                    mkdir("d", 0o755),
                    mkdir("d", 0o755),
                    mkdir("d/e", 0o7777),
                    mkdir("ro/x", 0o755),
                    mkdir("missing/x", 0o755),
                ],
            ),
            st(A, vec![mkdir("d/e/f", 0o700)]),
        ],
    });

    v.push(Case {
        name: "mknod",
        steps: vec![
            st(
                Root,
                vec![
                    Op::Mkfifo(c("p"), 0o644),
                    Op::Mknod(c("chr"), libc::S_IFCHR | 0o600, libc::makedev(1, 3)),
                    Op::Mknod(c("blk"), libc::S_IFBLK | 0o600, libc::makedev(7, 0)),
                    Op::Mknod(c("sock"), libc::S_IFSOCK | 0o755, 0),
                    Op::Mkfifo(c("p"), 0o644),
                ],
            ),
            st(
                A,
                vec![
                    Op::Mknod(c("chr2"), libc::S_IFCHR | 0o600, libc::makedev(1, 3)),
                    Op::Mknod(c("reg"), libc::S_IFREG | 0o4755, 0),
                    Op::Mknod(c("p2"), libc::S_IFIFO | 0o2777, 0),
                    Op::Mkfifo(c("p3"), 0o7777),
                ],
            ),
            // A device node works as its device (unless the mount is nodev).
            st(
                Root,
                vec![
                    Op::Statvfs(c(".")),
                    open("chr", WR, 0, 0),
                    Op::Write(0, 10),
                    Op::Close(0),
                ],
            ),
        ],
    });

    v.push(Case {
        name: "open",
        steps: vec![
            st(
                Root,
                cat(vec![
                    setup_file("f", 0o644, UA, UA, 100),
                    setup_file("e", 0o644, UA, UA, 0),
                    setup_file("private", 0o600, 0, 0, 10),
                    vec![mkdir("ro", 0o755), mkdir("d", 0o777), symlink("f", "l")],
                ]),
            ),
            st(
                A,
                vec![
                    open("new", CREAT, 0o666, 0),
                    Op::Close(0),
                    open("new", CREAT | libc::O_EXCL, 0o666, 0),
                    open("l", CREAT | libc::O_EXCL, 0o666, 0),
                    open("f", RD | libc::O_DIRECTORY, 0, 0),
                    open("d", WR, 0, 0),
                    open("private", RD, 0, 0),
                    open("ro/x", CREAT, 0o644, 0),
                    open("d/x", CREAT | libc::O_EXCL, 0o4777, 0),
                    Op::Close(0),
                ],
            ),
            st(A, vec![open("f", WR | libc::O_TRUNC, 0, 0), Op::Close(0)]),
            st(A, vec![open("e", WR | libc::O_TRUNC, 0, 0), Op::Close(0)]),
            st(
                A,
                vec![
                    open("f", WR | libc::O_APPEND, 0, 0),
                    Op::Write(0, 10),
                    Op::Pwrite(0, 0, 10),
                    Op::Fstat(0),
                    Op::Close(0),
                ],
            ),
            st(A, vec![open("l", RW, 0, 0), Op::Write(0, 3), Op::Close(0)]),
            // relatime: a read after a change updates atime.
            st(A, vec![open("f", RD, 0, 0), Op::Read(0, 5), Op::Close(0)]),
            st(A, vec![open("d", DIR, 0, 0), Op::Getdents(0), Op::Close(0)]),
        ],
    });

    v.push(Case {
        name: "rename",
        steps: vec![
            st(
                Root,
                cat(vec![
                    vec![mkdir("src", 0o777), mkdir("dst", 0o777)],
                    setup_file("src/a", 0o644, UA, UA, 1),
                    setup_file("src/b", 0o644, UA, UA, 2),
                    setup_file("src/c", 0o644, UA, UA, 3),
                    vec![
                        link("src/c", "src/c2"),
                        mkdir("src/e1", 0o755),
                        mkdir("src/e2", 0o755),
                        mkdir("src/full", 0o755),
                        mkdir("src/full/x", 0o755),
                        chown("src/e1", UA, UA),
                        chown("src/e2", UA, UA),
                        chown("src/full", UA, UA),
                    ],
                ]),
            ),
            // over a file
            st(A, vec![rename("src/a", "src/b")]),
            // onto itself, and onto another link of the same inode: nothing happens
            st(A, vec![rename("src/b", "src/b"), rename("src/c", "src/c2")]),
            // file over dir, dir over file, dir over non-empty dir, dir into itself
            st(
                A,
                vec![
                    rename("src/b", "src/e1"),
                    rename("src/e1", "src/b"),
                    rename("src/e1", "src/full"),
                    rename("src/e1", "src/e1/sub"),
                    rename("src/missing", "src/z"),
                ],
            ),
            // dir over empty dir
            st(A, vec![rename("src/e1", "src/e2")]),
            // across directories (dir and file)
            st(A, vec![rename("src/e2", "dst/e"), rename("src/b", "dst/b")]),
            st(
                A,
                vec![
                    Op::Rename(c("dst/b"), c("src/c"), libc::RENAME_NOREPLACE),
                    Op::Rename(c("dst/b"), c("src/c"), libc::RENAME_EXCHANGE),
                    Op::Rename(c("dst/e"), c("src/c"), libc::RENAME_EXCHANGE),
                ],
            ),
            // C may not move A's directory (it must rewrite its "..")
            st(Root, vec![chmod("src/full", 0o777)]),
            st(C, vec![rename("src/full/x", "dst/x")]),
        ],
    });

    v.push(Case {
        name: "rmdir",
        steps: vec![
            st(
                Root,
                cat(vec![
                    vec![
                        mkdir("d", 0o755),
                        mkdir("full", 0o755),
                        mkdir("full/x", 0o755),
                    ],
                    setup_file("f", 0o644, 0, 0, 0),
                ]),
            ),
            st(
                Root,
                vec![
                    rmdir("full"),
                    rmdir("f"),
                    rmdir("d/."),
                    rmdir("d/.."),
                    rmdir("missing"),
                ],
            ),
            st(A, vec![rmdir("full/x")]),
            st(Root, vec![rmdir("d"), rmdir("full/x"), rmdir("full")]),
        ],
    });

    let long_target = "t".repeat(4095);
    let too_long_target = "t".repeat(4096);
    v.push(Case {
        name: "symlink",
        steps: vec![
            st(Root, vec![mkdir("ro", 0o755)]),
            st(
                A,
                vec![
                    symlink("target", "l"),
                    symlink("target", "l"),
                    symlink(&long_target, "long"),
                    symlink(&too_long_target, "toolong"),
                    symlink("x", "ro/l"),
                ],
            ),
            st(Root, vec![Op::Lchown(c("l"), UB, GS)]),
        ],
    });

    v.push(Case {
        name: "truncate",
        steps: vec![
            st(
                Root,
                cat(vec![
                    setup_file("f", 0o644, UA, UA, 1000),
                    setup_file("ro", 0o444, UA, UA, 10),
                    vec![mkdir("d", 0o777)],
                ]),
            ),
            st(A, vec![Op::Truncate(c("f"), 100)]),
            st(A, vec![Op::Truncate(c("f"), 100_000)]),
            // same size: times change anyway
            st(A, vec![Op::Truncate(c("f"), 100_000)]),
            st(
                A,
                vec![
                    Op::Truncate(c("d"), 0),
                    Op::Truncate(c("ro"), 0),
                    Op::Truncate(c("f"), -1),
                    Op::Truncate(c("missing"), 0),
                ],
            ),
            st(
                A,
                vec![
                    open("f", RD, 0, 0),
                    Op::Ftruncate(0, 0),
                    Op::Close(0),
                    open("f", RW, 0, 0),
                    Op::Ftruncate(0, 7),
                    Op::Fstat(0),
                    Op::Close(0),
                ],
            ),
            st(B, vec![Op::Truncate(c("f"), 0)]),
        ],
    });

    v.push(Case {
        name: "unlink",
        steps: vec![
            st(
                Root,
                cat(vec![
                    setup_file("f", 0o644, UA, UA, 100),
                    setup_file("g", 0o644, UA, UA, 100),
                    vec![link("g", "g2"), mkdir("d", 0o755), mkdir("ro", 0o755)],
                    setup_file("ro/x", 0o666, UA, UA, 1),
                ]),
            ),
            st(A, vec![unlink("g")]),
            // unlink of an open file: the descriptor keeps working
            st(
                A,
                vec![
                    open("f", RW, 0, 0),
                    unlink("f"),
                    Op::Fstat(0),
                    Op::Write(0, 50),
                    Op::Fstat(0),
                    Op::Ftruncate(0, 10),
                    Op::Fstat(0),
                    Op::Fchmod(0, 0o600),
                    Op::Fstat(0),
                    Op::Close(0),
                ],
            ),
            st(
                A,
                vec![
                    unlink("d"),
                    unlink("missing"),
                    unlink("ro/x"),
                    unlink("ro/x/y"),
                ],
            ),
        ],
    });

    v.push(Case {
        name: "utimensat",
        steps: vec![
            st(
                Root,
                cat(vec![
                    setup_file("f", 0o644, UA, UA, 10),
                    setup_file("shared", 0o666, UA, UA, 10),
                    vec![symlink("f", "l"), Op::Lchown(c("l"), UA, UA)],
                ]),
            ),
            st(A, vec![utimens("f", Some([Ts::At(1000), Ts::At(2000)]), 0)]),
            st(A, vec![utimens("f", Some([Ts::Now, Ts::Now]), 0)]),
            st(A, vec![utimens("f", Some([Ts::Omit, Ts::Omit]), 0)]),
            st(A, vec![utimens("f", Some([Ts::Omit, Ts::At(5000)]), 0)]),
            st(A, vec![utimens("f", Some([Ts::Now, Ts::Omit]), 0)]),
            st(A, vec![utimens("f", None, 0)]),
            st(
                A,
                vec![utimens(
                    "l",
                    Some([Ts::At(3000), Ts::At(3000)]),
                    libc::AT_SYMLINK_NOFOLLOW,
                )],
            ),
            // not the owner, may write: only "now" is allowed
            st(B, vec![utimens("shared", None, 0)]),
            st(B, vec![utimens("shared", Some([Ts::Now, Ts::Now]), 0)]),
            st(B, vec![utimens("shared", Some([Ts::At(1), Ts::At(1)]), 0)]),
            st(B, vec![utimens("shared", Some([Ts::Now, Ts::Omit]), 0)]),
            // not the owner, may not write
            st(
                B,
                vec![
                    utimens("f", None, 0),
                    utimens("f", Some([Ts::At(1), Ts::At(1)]), 0),
                    utimens("f", Some([Ts::Omit, Ts::Omit]), 0),
                ],
            ),
            st(Root, vec![utimens("f", Some([Ts::At(7), Ts::At(8)]), 0)]),
        ],
    });

    v.push(Case {
        name: "setgid_dir",
        steps: vec![
            st(
                Root,
                vec![mkdir("sg", 0o755), chown("sg", 0, GS), chmod("sg", 0o2777)],
            ),
            st(
                A,
                vec![
                    open("sg/f", CREAT, 0o2775, 0),
                    Op::Close(0),
                    mkdir("sg/d", 0o755),
                    Op::Mkfifo(c("sg/p"), 0o644),
                    symlink("x", "sg/l"),
                ],
            ),
            st(A, vec![mkdir("sg/d/e", 0o700)]),
            // C is not in the directory's group: a group-executable S_ISGID is dropped.
            st(
                C,
                vec![
                    open("sg/g", CREAT, 0o2775, 0),
                    Op::Close(0),
                    open("sg/h", CREAT, 0o2764, 0),
                    Op::Close(0),
                    mkdir("sg/cd", 0o2755),
                    Op::Mknod(c("sg/n"), libc::S_IFREG | 0o2755, 0),
                ],
            ),
            st(Root, vec![open("sg/r", CREAT, 0o2755, 0), Op::Close(0)]),
            // A moves a file in: it keeps its group
            st(
                A,
                cat(vec![creat("own", 0o644), vec![rename("own", "sg/own")]]),
            ),
        ],
    });

    v.push(Case {
        name: "sticky_dir",
        steps: vec![
            st(
                Root,
                vec![mkdir("t", 0o755), chown("t", UC, UC), chmod("t", 0o1777)],
            ),
            st(
                A,
                cat(vec![creat("t/fa", 0o666), vec![mkdir("t/da", 0o777)]]),
            ),
            st(B, creat("t/fb", 0o666)),
            st(
                B,
                vec![
                    unlink("t/fa"),
                    rename("t/fa", "t/fa2"),
                    rename("t/fb", "t/fa"),
                    rmdir("t/da"),
                    // fs.protected_regular
                    open("t/fa", CREAT, 0o666, 0),
                ],
            ),
            st(A, vec![rename("t/fa", "t/fa3")]),
            st(C, vec![unlink("t/fb")]),
            st(Root, vec![rmdir("t/da")]),
        ],
    });

    let n255 = "n".repeat(255);
    let n256 = "n".repeat(256);
    v.push(Case {
        name: "name_max",
        steps: vec![
            st(
                A,
                cat(vec![
                    creat(&n255, 0o644),
                    vec![
                        mkdir(format!("d{}", &n255[1..]), 0o755),
                        open(&n256, CREAT, 0o644, 0),
                        mkdir(&n256, 0o755),
                        symlink("x", &n256),
                        symlink(&n256, "l"),
                        link(&n255, &n256),
                        rename(&n255, &n256),
                        Op::Chmod(c(&n256), 0o600),
                        Op::Mkfifo(c(&n256), 0o644),
                    ],
                ]),
            ),
            st(A, vec![rename(&n255, "short"), rename("short", &n255)]),
            st(A, vec![unlink(&n255), unlink(&n256)]),
        ],
    });

    // Paths near PATH_MAX (4096 with its NUL): 15 directories of 255 bytes, then names that
    // make the relative path 4095 bytes (allowed) and 4096 (ENAMETOOLONG).
    {
        let mut dirs = Vec::new();
        let mut p = String::new();
        for i in 0..15 {
            if !p.is_empty() {
                p.push('/');
            }
            p.push_str(&format!("{i:x}").repeat(255)[..255]);
            dirs.push(mkdir(&p, 0o755));
        }
        let room = 4095 - p.len() - 1;
        let ok = format!("{p}/{}", "f".repeat(room));
        let over = format!("{p}/{}", "g".repeat(room + 1));
        assert_eq!(ok.len(), 4095);
        v.push(Case {
            name: "path_max",
            steps: vec![
                st(A, dirs),
                st(
                    A,
                    vec![
                        open(&ok, CREAT, 0o644, 0),
                        Op::Close(0),
                        open(&over, CREAT, 0o644, 0),
                        mkdir(&over, 0o755),
                        unlink(&ok),
                    ],
                ),
            ],
        });
    }

    // Less common calls: O_TMPFILE, RENAME_WHITEOUT, user xattrs on files, symlinks and
    // fifos (the kernel refuses user.* on symlinks and special files), xattr limits.
    v.push(Case {
        name: "misc",
        steps: vec![
            st(
                Root,
                cat(vec![
                    setup_file("f", 0o644, UA, UA, 10),
                    vec![
                        symlink("f", "l"),
                        Op::Lchown(c("l"), UA, UA),
                        Op::Mkfifo(c("p"), 0o666),
                        chown("p", UA, UA),
                        mkdir("d", 0o777),
                    ],
                ]),
            ),
            st(
                Root,
                vec![
                    open("d", libc::O_TMPFILE | RW, 0o600, 0),
                    Op::Write(0, 10),
                    Op::Close(0),
                ],
            ),
            st(
                A,
                vec![
                    Op::Setxattr(c("f"), c("user.k"), b"v".to_vec()),
                    Op::Getxattr(c("f"), c("user.k")),
                    Op::Setxattr(c("l"), c("user.k"), b"v".to_vec()),
                    Op::Setxattr(c("p"), c("user.k"), b"v".to_vec()),
                    Op::Setxattr(c("f"), c("trusted.k"), b"v".to_vec()),
                    Op::Setxattr(c("f"), c(format!("user.{}", "k".repeat(251))), vec![1]),
                    Op::Setxattr(c("f"), c("user.big"), vec![7; 70000]),
                ],
            ),
            st(
                Root,
                vec![Op::Rename(c("f"), c("g"), libc::RENAME_WHITEOUT)],
            ),
        ],
    });

    // A directory open while another is renamed over it, or removed (issue 13).
    v.push(Case {
        name: "dir_replaced_while_open",
        steps: vec![
            st(
                Root,
                vec![mkdir("a", 0o755), mkdir("b", 0o755), mkdir("c", 0o755)],
            ),
            st(
                Root,
                vec![
                    open("b", DIR, 0, 0),
                    rename("a", "b"),
                    Op::Fstat(0),
                    Op::Getdents(0),
                    Op::Close(0),
                    open("c", DIR, 0, 1),
                    rmdir("c"),
                    Op::Fstat(1),
                    Op::Getdents(1),
                    Op::Close(1),
                ],
            ),
        ],
    });

    // Preallocation (issue 13): blocks counted, released by punch and truncate as ext4 does,
    // ENOSPC when the range does not fit (nothing changes). Files owned by A, written by A.
    let f = |p: &str, ops: Vec<Op>| {
        let mut v = vec![open(p, RW | libc::O_CREAT, 0o644, 0)];
        v.extend(ops);
        v.push(Op::Blocks(0));
        v.push(Op::Fstat(0));
        v.push(Op::Close(0));
        v
    };
    let fa = |o: i64, n: i64| Op::Fallocate(0, 0, o, n);
    v.push(Case {
        name: "prealloc",
        steps: vec![
            // 1 MiB + 1 byte: whole pages (2056 blocks), size 1 MiB + 1.
            st(A, f("p", vec![fa(0, (1 << 20) + 1)])),
            // Again: nothing more; KEEP_SIZE past the end: two pages more, size unchanged.
            st(A, f("p", vec![fa(0, 1 << 20)])),
            st(A, f("p", vec![Op::Fallocate(0, KEEP_SIZE, 2 << 20, 8192)])),
            // Punch: the two whole pages inside go, the partial ones stay.
            st(A, f("p", vec![Op::Fallocate(0, PUNCH, 4097, 3 * 4096)])),
            // Truncate to the same size: the KEEP_SIZE pages past the end go.
            st(A, f("p", vec![Op::Ftruncate(0, (1 << 20) + 1)])),
            // Truncate down: from the page after the new end on.
            st(A, f("p", vec![Op::Ftruncate(0, 100_000)])),
            // Truncate up: nothing reserved.
            st(A, f("p", vec![Op::Ftruncate(0, 200_000)])),
            // Zero range allocates (size extended); with KEEP_SIZE, past the end too.
            st(A, f("z", vec![Op::Fallocate(0, ZERO, 0, 10_000)])),
            st(
                A,
                f("z", vec![Op::Fallocate(0, ZERO | KEEP_SIZE, 5000, 20_000)]),
            ),
            // KEEP_SIZE from 0 on an empty file, then a punch at or past the end of file: ext4
            // frees nothing there (offset >= i_size).
            st(
                A,
                f(
                    "k",
                    vec![
                        Op::Fallocate(0, KEEP_SIZE, 0, 65536),
                        Op::Fallocate(0, PUNCH, 0, 65536),
                    ],
                ),
            ),
            // 8 TiB: more than either disk holds (below ext4's 16 TiB file limit).
            st(A, f("p", vec![fa(0, 8 << 40)])),
            st(A, f("e", vec![Op::Fallocate(0, KEEP_SIZE, 0, 8 << 40)])),
            // Unlink and recreate: a new file has nothing reserved.
            st(A, vec![unlink("p")]),
            st(A, f("p", vec![])),
        ],
    });

    v.extend(acl_cases());
    v
}

// ---- POSIX ACLs -----------------------------------------------------------------------------

const ACL_ACCESS: &str = "system.posix_acl_access";
const ACL_DEFAULT: &str = "system.posix_acl_default";
// Tags of the kernel's ACL xattr format.
const UO: u16 = 0x01;
const NU: u16 = 0x02;
const GO: u16 = 0x04;
const NG: u16 = 0x08;
const MK: u16 = 0x10;
const OT: u16 = 0x20;

/// An ACL xattr value (what setfacl passes): entries of (tag, rwx, id; unnamed ones -1).
fn acl_value(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        let id = if tag == NU || tag == NG { id } else { u32::MAX };
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}
fn set_acl(p: &str, name: &str, entries: &[(u16, u16, u32)]) -> Op {
    Op::Setxattr(c(p), c(name), acl_value(entries))
}
fn get_acl(p: &str, name: &str) -> Op {
    Op::GetxattrHash(c(p), c(name))
}

/// setfacl/getfacl as system calls: access ACLs (mode kept in step both ways, enforcement,
/// S_ISGID on setfacl), default ACLs (inheritance by files, directories and nodes under
/// several umasks, setgid directories), malformed values.
fn acl_cases() -> Vec<Case> {
    use Who::*;
    let mut v = Vec::new();
    // user::rw- user:B:rw- group::r-- mask::rw- other::---
    let named_b = [(UO, 6, 0), (NU, 6, UB), (GO, 4, 0), (MK, 6, 0), (OT, 0, 0)];
    v.push(Case {
        name: "acl_access",
        steps: vec![
            st(
                Root,
                cat(vec![
                    setup_file("f", 0o644, UA, GS, 10),
                    setup_file("g", 0o2755, UA, GX, 0),
                    setup_file("h", 0o2755, UA, GS, 0),
                    vec![mkdir("d", 0o755), chown("d", UA, GS), symlink("f", "l")],
                ]),
            ),
            st(
                A,
                vec![
                    get_acl("f", ACL_ACCESS),
                    set_acl("f", ACL_ACCESS, &named_b),
                    get_acl("f", ACL_ACCESS),
                ],
            ),
            st(B, vec![open("f", RW, 0, 0), Op::Write(0, 5), Op::Close(0)]),
            st(C, vec![open("f", RD, 0, 0), Op::Close(0)]),
            // chmod narrows the mask: B loses write
            st(A, vec![chmod("f", 0o640), get_acl("f", ACL_ACCESS)]),
            st(
                B,
                vec![open("f", WR, 0, 0), open("f", RD, 0, 1), Op::Close(1)],
            ),
            st(A, vec![chmod("f", 0o670), get_acl("f", ACL_ACCESS)]),
            st(B, vec![open("f", WR, 0, 0), Op::Close(0)]),
            // not the owner
            st(C, vec![set_acl("f", ACL_ACCESS, &named_b)]),
            st(B, vec![set_acl("f", ACL_ACCESS, &named_b)]),
            // an ACL the mode says all of is not kept; the mode takes its bits
            st(
                A,
                vec![
                    set_acl("f", ACL_ACCESS, &[(UO, 7, 0), (GO, 5, 0), (OT, 4, 0)]),
                    get_acl("f", ACL_ACCESS),
                    Op::Removexattr(c("f"), c(ACL_ACCESS)),
                ],
            ),
            st(
                A,
                vec![
                    set_acl("f", ACL_ACCESS, &named_b),
                    Op::Removexattr(c("f"), c(ACL_ACCESS)),
                    get_acl("f", ACL_ACCESS),
                    chmod("f", 0o600),
                ],
            ),
            // malformed values, a default ACL on a file, on a symlink
            st(
                A,
                vec![
                    Op::Setxattr(c("f"), c(ACL_ACCESS), vec![1, 0, 0, 0, 1, 0, 6, 0]),
                    Op::Setxattr(c("f"), c(ACL_ACCESS), vec![2, 0, 0, 0, 1, 0]),
                    set_acl("f", ACL_ACCESS, &[(UO, 6, 0), (OT, 0, 0)]),
                    set_acl(
                        "f",
                        ACL_ACCESS,
                        &[(UO, 6, 0), (NU, 6, UB), (GO, 4, 0), (OT, 0, 0)],
                    ),
                    set_acl("f", ACL_ACCESS, &[(UO, 8, 0), (GO, 4, 0), (OT, 0, 0)]),
                    set_acl("f", ACL_ACCESS, &[(GO, 4, 0), (UO, 6, 0), (OT, 0, 0)]),
                    set_acl("f", ACL_DEFAULT, &named_b),
                    get_acl("f", ACL_DEFAULT),
                    get_acl("d", ACL_DEFAULT),
                ],
            ),
            // setfacl by an owner outside the file's group drops S_ISGID; inside it keeps it
            st(
                A,
                vec![
                    set_acl("g", ACL_ACCESS, &named_b),
                    set_acl("h", ACL_ACCESS, &named_b),
                ],
            ),
            st(
                Root,
                vec![
                    chmod("g", 0o2755),
                    set_acl(
                        "g",
                        ACL_ACCESS,
                        &[(UO, 7, 0), (GO, 5, 0), (NG, 7, GS), (MK, 7, 0), (OT, 5, 0)],
                    ),
                    get_acl("g", ACL_ACCESS),
                ],
            ),
            // root's chmod without a mask entry: the group entry follows
            st(
                Root,
                vec![
                    chmod("h", 0o751),
                    set_acl("h", ACL_ACCESS, &[(UO, 7, 0), (GO, 5, 0), (OT, 1, 0)]),
                    get_acl("h", ACL_ACCESS),
                ],
            ),
        ],
    });

    // user::rwx user:B:rwx group::r-x group:GS:rwx mask::rwx other::r-x
    let dflt = [
        (UO, 7, 0),
        (NU, 7, UB),
        (GO, 5, 0),
        (NG, 7, GS),
        (MK, 7, 0),
        (OT, 5, 0),
    ];
    let made = |d: &str| {
        vec![
            get_acl(&format!("{d}/f"), ACL_ACCESS),
            get_acl(&format!("{d}/s"), ACL_ACCESS),
            get_acl(&format!("{d}/s"), ACL_DEFAULT),
            get_acl(&format!("{d}/p"), ACL_ACCESS),
            get_acl(&format!("{d}/l"), ACL_ACCESS),
        ]
    };
    let make = |d: &str, umask: u32| {
        vec![
            Op::Umask(umask),
            open(format!("{d}/f"), CREAT, 0o666, 0),
            Op::Close(0),
            mkdir(format!("{d}/s"), 0o777),
            Op::Mkfifo(c(format!("{d}/p")), 0o640),
            symlink("x", format!("{d}/l")),
            open(format!("{d}/x"), CREAT, 0o751, 1),
            Op::Close(1),
            mkdir(format!("{d}/s/t"), 0o700),
            open(format!("{d}/s/f"), CREAT, 0o666, 2),
            Op::Close(2),
        ]
    };
    v.push(Case {
        name: "acl_default",
        steps: vec![
            st(
                Root,
                vec![
                    mkdir("d", 0o777),
                    chown("d", UA, GS),
                    mkdir("e", 0o777),
                    chown("e", UA, GS),
                    mkdir("m", 0o777),
                    chown("m", UA, GS),
                    mkdir("n", 0o777),
                    chown("n", UA, GS),
                    mkdir("g", 0o2777),
                    chown("g", UA, GX),
                ],
            ),
            st(
                A,
                vec![
                    set_acl("d", ACL_DEFAULT, &dflt),
                    set_acl("e", ACL_DEFAULT, &dflt),
                    set_acl("m", ACL_DEFAULT, &[(UO, 7, 0), (GO, 5, 0), (OT, 0, 0)]),
                    set_acl("g", ACL_DEFAULT, &dflt),
                    get_acl("d", ACL_DEFAULT),
                    get_acl("d", ACL_ACCESS),
                ],
            ),
            st(A, make("d", 0o022)),
            st(A, made("d")),
            // the umask is ignored under a default ACL
            st(A, make("e", 0o077)),
            st(A, made("e")),
            // a minimal default ACL: the mode only, no access ACL
            st(A, make("m", 0o000)),
            st(A, made("m")),
            // no default ACL: the umask
            st(A, make("n", 0o027)),
            st(A, made("n")),
            // setgid directory with a default ACL
            st(C, make("g", 0o002)),
            st(C, made("g")),
            // the inherited ACLs are enforced: B is named, C is other
            st(
                B,
                vec![
                    open("d/f", RW, 0, 0),
                    Op::Close(0),
                    open("d/s/f", RW, 0, 1),
                    Op::Close(1),
                ],
            ),
            st(C, vec![open("d/f", WR, 0, 0), open("e/f", RD, 0, 1)]),
            // chmod of an inheriting directory and its removal of the default ACL
            st(
                A,
                vec![
                    chmod("d/s", 0o750),
                    get_acl("d/s", ACL_ACCESS),
                    get_acl("d/s", ACL_DEFAULT),
                    Op::Removexattr(c("d/s"), c(ACL_DEFAULT)),
                    get_acl("d/s", ACL_DEFAULT),
                    open("d/s/z", CREAT, 0o666, 0),
                    Op::Close(0),
                ],
            ),
        ],
    });
    v
}

// ---- running --------------------------------------------------------------------------------

/// What `lstat` says of one path (times raw; the comparison says which changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Snap {
    ino: u64,
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u64,
    size: Option<i64>,
    atime: (i64, i64),
    mtime: (i64, i64),
    ctime: (i64, i64),
}

fn lstat_at(dirfd: i32, rel: &CString) -> Option<Snap> {
    // SAFETY: stat is plain data; fstatat writes it.
    let mut s: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor, C string and out pointer.
    let r = unsafe { libc::fstatat(dirfd, rel.as_ptr(), &mut s, libc::AT_SYMLINK_NOFOLLOW) };
    if r != 0 {
        return None;
    }
    let dir = s.st_mode & libc::S_IFMT == libc::S_IFDIR;
    Some(Snap {
        ino: s.st_ino,
        mode: s.st_mode,
        uid: s.st_uid,
        gid: s.st_gid,
        nlink: s.st_nlink,
        size: if dir { None } else { Some(s.st_size) },
        atime: (s.st_atime, s.st_atime_nsec),
        mtime: (s.st_mtime, s.st_mtime_nsec),
        ctime: (s.st_ctime, s.st_ctime_nsec),
    })
}

/// Runs one step in a forked child with the step's credentials; returns one record per call.
fn run_step(casedir: &CString, step: &Step, buf: &mut [u8]) -> Vec<Rec> {
    let mut recs: Vec<Rec> = vec![[0; 6]; step.ops.len()];
    let (uid, gid, groups) = step.who.creds();
    let mut fds = [0i32; 2];
    // SAFETY: fds has room for two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only makes system calls on memory prepared before the fork (no
    // allocation, no locks) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: see above.
        unsafe {
            libc::close(fds[0]);
            let ok = libc::setgroups(groups.len(), groups.as_ptr()) == 0
                && libc::setgid(gid) == 0
                && libc::setuid(uid) == 0
                && libc::chdir(casedir.as_ptr()) == 0;
            if !ok {
                libc::_exit(2);
            }
            libc::umask(0o022);
            child_ops(&step.ops, &mut recs, buf);
            let bytes = std::slice::from_raw_parts(
                recs.as_ptr().cast::<u8>(),
                std::mem::size_of_val(recs.as_slice()),
            );
            let mut off = 0;
            while off < bytes.len() {
                let n = libc::write(fds[1], bytes[off..].as_ptr().cast(), bytes.len() - off);
                if n <= 0 {
                    libc::_exit(3);
                }
                off += n as usize;
            }
            libc::_exit(0);
        }
    }
    // SAFETY: our descriptors.
    unsafe { libc::close(fds[1]) };
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        // SAFETY: valid buffer.
        let n = unsafe { libc::read(fds[0], chunk.as_mut_ptr().cast(), chunk.len()) };
        if n <= 0 {
            break;
        }
        out.extend_from_slice(&chunk[..n as usize]);
    }
    // SAFETY: ours.
    unsafe { libc::close(fds[0]) };
    let mut status = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "step child failed: status {status:#x}"
    );
    assert_eq!(out.len(), std::mem::size_of_val(recs.as_slice()));
    for (i, r) in recs.iter_mut().enumerate() {
        for (k, v) in r.iter_mut().enumerate() {
            let o = (i * 6 + k) * 8;
            *v = i64::from_ne_bytes(out[o..o + 8].try_into().unwrap());
        }
    }
    recs
}

/// The child's interpreter: system calls only.
///
/// # Safety
/// Runs in a forked child of a multithreaded process: it must not allocate or take locks.
unsafe fn child_ops(ops: &[Op], recs: &mut [Rec], buf: &mut [u8]) {
    let mut fd = [-1i32; 8];
    let ret = |r: i64| -> i64 {
        if r < 0 {
            -i64::from(*libc::__errno_location())
        } else {
            r
        }
    };
    let ts = |t: Ts| match t {
        Ts::Now => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Ts::Omit => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Ts::At(s) => libc::timespec {
            tv_sec: s,
            tv_nsec: 0,
        },
    };
    for (op, rec) in ops.iter().zip(recs.iter_mut()) {
        let r: i64 = match op {
            Op::Open(p, f, m, s) => {
                let r = libc::open(p.as_ptr(), *f, *m);
                if r >= 0 {
                    fd[*s] = r;
                    0
                } else {
                    ret(-1)
                }
            }
            Op::Close(s) => {
                let r = libc::close(fd[*s]);
                fd[*s] = -1;
                ret(r.into())
            }
            Op::Write(s, n) => ret(libc::write(fd[*s], buf.as_ptr().cast(), *n) as i64),
            Op::Pwrite(s, o, n) => ret(libc::pwrite(fd[*s], buf.as_ptr().cast(), *n, *o) as i64),
            Op::Read(s, n) => ret(libc::read(fd[*s], buf.as_mut_ptr().cast(), *n) as i64),
            Op::Ftruncate(s, n) => ret(libc::ftruncate(fd[*s], *n).into()),
            Op::Truncate(p, n) => ret(libc::truncate(p.as_ptr(), *n).into()),
            Op::Fallocate(s, m, o, n) => ret(libc::fallocate(fd[*s], *m, *o, *n).into()),
            Op::Blocks(s) => {
                let mut sb: libc::stat = std::mem::zeroed();
                let r = ret(libc::fstat(fd[*s], &mut sb).into());
                if r == 0 {
                    sb.st_blocks
                } else {
                    r
                }
            }
            Op::Fstat(s) => {
                let mut sb: libc::stat = std::mem::zeroed();
                let r = ret(libc::fstat(fd[*s], &mut sb).into());
                if r == 0 {
                    rec[1] = sb.st_mode.into();
                    rec[2] = sb.st_uid.into();
                    rec[3] = sb.st_gid.into();
                    rec[4] = sb.st_nlink as i64;
                    rec[5] = if sb.st_mode & libc::S_IFMT == libc::S_IFDIR {
                        -1
                    } else {
                        sb.st_size
                    };
                }
                r
            }
            Op::Getdents(s) => {
                // Counts entries until the end.
                let mut count = 0i64;
                loop {
                    let n = libc::syscall(
                        libc::SYS_getdents64,
                        fd[*s],
                        buf.as_mut_ptr(),
                        buf.len().min(65536),
                    );
                    if n < 0 {
                        count = ret(-1);
                        break;
                    }
                    if n == 0 {
                        break;
                    }
                    let mut off = 0usize;
                    while off < n as usize {
                        let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]);
                        count += 1;
                        off += usize::from(reclen);
                    }
                }
                count
            }
            Op::Chmod(p, m) => ret(libc::chmod(p.as_ptr(), *m).into()),
            Op::Fchmod(s, m) => ret(libc::fchmod(fd[*s], *m).into()),
            Op::Chown(p, u, g) => ret(libc::chown(p.as_ptr(), *u, *g).into()),
            Op::Lchown(p, u, g) => ret(libc::lchown(p.as_ptr(), *u, *g).into()),
            Op::Fchown(s, u, g) => ret(libc::fchown(fd[*s], *u, *g).into()),
            Op::Link(a, b) => ret(libc::link(a.as_ptr(), b.as_ptr()).into()),
            Op::Symlink(t, p) => ret(libc::symlink(t.as_ptr(), p.as_ptr()).into()),
            Op::Mkdir(p, m) => ret(libc::mkdir(p.as_ptr(), *m).into()),
            Op::Mkfifo(p, m) => ret(libc::mkfifo(p.as_ptr(), *m).into()),
            Op::Mknod(p, m, d) => ret(libc::mknod(p.as_ptr(), *m, *d).into()),
            Op::Rmdir(p) => ret(libc::rmdir(p.as_ptr()).into()),
            Op::Unlink(p) => ret(libc::unlink(p.as_ptr()).into()),
            Op::Rename(a, b, f) => {
                ret(
                    libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), *f)
                        .into(),
                )
            }
            Op::Utimens(p, t, f) => {
                let times = t.map(|[a, m]| [ts(a), ts(m)]);
                let ptr = match &times {
                    Some(t) => t.as_ptr(),
                    None => std::ptr::null(),
                };
                ret(libc::utimensat(libc::AT_FDCWD, p.as_ptr(), ptr, *f).into())
            }
            Op::Setxattr(p, n, v) => {
                ret(libc::lsetxattr(p.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0).into())
            }
            Op::Statvfs(p) => {
                let mut sv: libc::statvfs = std::mem::zeroed();
                let r = ret(libc::statvfs(p.as_ptr(), &mut sv).into());
                let mask = libc::ST_RDONLY
                    | libc::ST_NOSUID
                    | libc::ST_NODEV
                    | libc::ST_NOEXEC
                    | libc::ST_NOATIME
                    | libc::ST_NODIRATIME
                    | libc::ST_RELATIME;
                if r == 0 {
                    (sv.f_flag & mask) as i64
                } else {
                    r
                }
            }
            Op::Getxattr(p, n) => ret(libc::lgetxattr(
                p.as_ptr(),
                n.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len().min(65536),
            ) as i64),
            Op::Removexattr(p, n) => ret(libc::lremovexattr(p.as_ptr(), n.as_ptr()).into()),
            Op::GetxattrHash(p, n) => {
                let r = ret(libc::lgetxattr(
                    p.as_ptr(),
                    n.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len().min(65536),
                ) as i64);
                if r >= 0 {
                    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                    for &b in &buf[..r as usize] {
                        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
                    }
                    (h >> 2) as i64
                } else {
                    r
                }
            }
            Op::Umask(m) => {
                libc::umask(*m);
                0
            }
        };
        rec[0] = r;
    }
    for f in fd {
        if f >= 0 {
            libc::close(f);
        }
    }
}

fn errno_name(e: i64) -> String {
    let e = -e as i32;
    let n = match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EACCES => "EACCES",
        libc::EEXIST => "EEXIST",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::EXDEV => "EXDEV",
        libc::EBADF => "EBADF",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ENOSPC => "ENOSPC",
        libc::EFBIG => "EFBIG",
        libc::EIO => "EIO",
        libc::ELOOP => "ELOOP",
        libc::EMLINK => "EMLINK",
        libc::EROFS => "EROFS",
        libc::ENOSYS => "ENOSYS",
        libc::EBUSY => "EBUSY",
        libc::ENODATA => "ENODATA",
        _ => return format!("errno {e}"),
    };
    n.to_string()
}

fn fmt_rec(op: &Op, r: &Rec) -> String {
    if r[0] < 0 {
        return errno_name(r[0]);
    }
    match op {
        Op::Fstat(_) => format!(
            "ok mode={:o} uid={} gid={} nlink={} size={}",
            r[1], r[2], r[3], r[4], r[5]
        ),
        _ => format!("ok {}", r[0]),
    }
}

/// Everything observed on one filesystem: key -> value, in order.
type Trace = BTreeMap<String, String>;

/// Runs every case under `root` (a directory of the filesystem under test).
fn run_all(root: &Path, cases: &[Case]) -> Trace {
    let mut trace = Trace::new();
    let mut buf = vec![b'x'; (1 << 20) + 4096];
    let off = buf.as_ptr().align_offset(4096);
    let buf = &mut buf[off..off + (1 << 20)];
    for case in cases {
        let dir = root.join(case.name);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let cdir = cstr(&dir);
        let dirf = std::fs::File::open(&dir).unwrap();
        let dirfd = std::os::fd::AsRawFd::as_raw_fd(&dirf);
        let mut watched: Vec<String> = vec![".".into()];
        for s in &case.steps {
            for o in &s.ops {
                for p in o.paths() {
                    if !watched.contains(&p) {
                        watched.push(p);
                    }
                }
            }
        }
        let wc: Vec<CString> = watched.iter().map(c).collect();
        let mut prev: Vec<Option<Snap>> = wc.iter().map(|p| lstat_at(dirfd, p)).collect();
        for (i, step) in case.steps.iter().enumerate() {
            // A step's time stamps must differ from the last step's: wait out the coarse
            // clock's tick (4 ms at HZ=250).
            std::thread::sleep(Duration::from_millis(12));
            let recs = run_step(&cdir, step, buf);
            for (j, (op, r)) in step.ops.iter().zip(&recs).enumerate() {
                let mut val = fmt_rec(op, r);
                if let Op::Write(..) | Op::Pwrite(..) | Op::Read(..) | Op::Getdents(_) = op {
                    if r[0] >= 0 {
                        val = format!("ok {}", r[0]);
                    }
                }
                trace.insert(
                    format!("{}/{i:02} {:?} op{j:02} {}", case.name, step.who, op.name()),
                    val,
                );
            }
            for (k, p) in wc.iter().enumerate() {
                let now = lstat_at(dirfd, p);
                let key = |f: &str| {
                    let shown = if watched[k].len() > 24 {
                        format!("{}..({} bytes)", &watched[k][..12], watched[k].len())
                    } else {
                        watched[k].clone()
                    };
                    format!("{}/{i:02} {:?} | {shown} {f}", case.name, step.who)
                };
                match (&prev[k], &now) {
                    (_, None) => {
                        trace.insert(key("exists"), "no".into());
                    }
                    (before, Some(s)) => {
                        trace.insert(key("exists"), "yes".into());
                        trace.insert(key("mode"), format!("{:o}", s.mode));
                        trace.insert(key("uid"), s.uid.to_string());
                        trace.insert(key("gid"), s.gid.to_string());
                        trace.insert(key("nlink"), s.nlink.to_string());
                        if let Some(sz) = s.size {
                            trace.insert(key("size"), sz.to_string());
                        }
                        if before.is_some_and(|b| b.ino != s.ino) {
                            trace.insert(key("inode"), "replaced".into());
                        }
                        // Time stamps of the same inode (a replaced one has its own).
                        if let Some(b) = before.filter(|b| b.ino == s.ino) {
                            for (f, x, y) in [
                                ("atime", b.atime, s.atime),
                                ("mtime", b.mtime, s.mtime),
                                ("ctime", b.ctime, s.ctime),
                            ] {
                                let v = if x == y { "same" } else { "changed" };
                                trace.insert(key(f), v.into());
                            }
                        }
                    }
                }
                prev[k] = now;
            }
        }
    }
    trace
}

/// A difference compfs cannot remove, with the kernel's reason. `case` and `key` are matched
/// as substrings of the difference's key.
struct Allowed {
    case: &'static str,
    key: &'static str,
    reason: &'static str,
}

const ALLOWED: &[Allowed] = &[
    Allowed {
        case: "truncate/03",
        key: "| f ",
        reason: "truncate to the same size: with the writeback cache the kernel owns a regular \
                 file's mtime/ctime (fuse_get_cache_mask) and fuse_do_setattr only stamps them \
                 when the size changes (POSIX requires no more; btrfs does the same); a time \
                 set by the daemon is ignored while the inode is cached",
    },
    Allowed {
        case: "mknod/02",
        key: "",
        reason: "compfs mounts nodev,nosuid unless given -o dev,suid (root only), the default of \
                 every libfuse filesystem: a FUSE daemon would otherwise hand out device access \
                 and setuid binaries; mount_options_match_ext4 checks dev,suid",
    },
    Allowed {
        case: "misc/01 Root op0",
        key: "",
        reason: "O_TMPFILE: not done; fuser 0.18 does not dispatch FUSE_TMPFILE, so the kernel \
                 gets ENOSYS and returns EOPNOTSUPP (as on filesystems without tmpfile)",
    },
    Allowed {
        case: "misc/03",
        key: "",
        reason: "RENAME_WHITEOUT: not done (EINVAL); a whiteout must be created atomically with \
                 the rename, which the store cannot yet; only overlayfs upper layers use it",
    },
    Allowed {
        case: "prealloc/10 A op0",
        key: "fstat(fd0)",
        reason: "fallocate larger than the free space: ext4 returns ENOSPC but keeps the blocks \
                 it allocated before running out, and the size up to them \
                 (ext4_alloc_file_blocks); compfs, as btrfs (btrfs_fallocate reserves the whole \
                 range first), fails with nothing changed",
    },
    Allowed {
        case: "prealloc/10 A | p size",
        key: "",
        reason: "the size ext4 keeps after a failed fallocate (see prealloc/10 fstat)",
    },
    Allowed {
        case: "open/06",
        key: "| f atime",
        reason: "read(2) from the page cache: FUSE inodes are S_NOATIME (fuse_iget), reads \
                 served from cached pages (writeback cache, FOPEN_KEEP_CACHE) never reach the \
                 daemon, so it cannot apply relatime (reads that reach it do: see atime_cases)",
    },
];

// ---- the filesystems ------------------------------------------------------------------------

/// A kernel filesystem (ext4) on a sparse loop image; unmounted (and its loop device freed)
/// on drop.
struct KernelFs {
    mnt: PathBuf,
    fstype: String,
}

impl KernelFs {
    fn new(dir: &Path, fstype: &str, opts: &str) -> Result<KernelFs, String> {
        // One loop-device setup at a time: the tests of this file run in parallel, and
        // concurrent `mount -o loop` calls can race for the same free loop device.
        static LOOP_SETUP: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _g = LOOP_SETUP.lock().unwrap_or_else(|p| p.into_inner());
        let fstype = fstype.to_string();
        let img = dir.join(format!("{fstype}.img"));
        let f = std::fs::File::create(&img).map_err(|e| e.to_string())?;
        f.set_len(256 << 20).map_err(|e| e.to_string())?;
        drop(f);
        let mkfs = format!("mkfs.{fstype}");
        let mut cmd = Command::new(&mkfs);
        match fstype.as_str() {
            // 256-byte inodes: nanosecond time stamps (a small image would get 128-byte ones).
            "ext4" => cmd.args(["-q", "-F", "-b", "4096", "-I", "256"]),
            _ => cmd.args(["-q", "-f"]),
        };
        let o = cmd.arg(&img).output().map_err(|e| format!("{mkfs}: {e}"))?;
        if !o.status.success() {
            return Err(format!("{mkfs}: {}", String::from_utf8_lossy(&o.stderr)));
        }
        let mnt = dir.join("kernelfs");
        std::fs::create_dir_all(&mnt).map_err(|e| e.to_string())?;
        let o = Command::new("mount")
            .args(["-t", &fstype, "-o", &format!("loop{opts}")])
            .arg(&img)
            .arg(&mnt)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !o.status.success() {
            return Err(format!(
                "mount -o loop: {}",
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        Ok(KernelFs { mnt, fstype })
    }
}

impl Drop for KernelFs {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while is_mounted(&self.mnt) {
            // The loop device was set up with autoclear and goes with the last unmount.
            let ok = Command::new("umount")
                .arg(&self.mnt)
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok || Instant::now() > deadline {
                if !ok {
                    let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn syscalls_match_ext4() {
    differential("diff", &cases(), "", ALLOWED);
}

/// The atime mount options on both filesystems.
#[test]
fn atime_options_match_ext4() {
    let cached = &[Allowed {
        case: "atime/01",
        key: "| f atime",
        reason: "read(2) from the page cache never reaches the daemon (see ALLOWED)",
    }];
    differential("atime-relatime", &atime_cases(), "relatime", cached);
    differential("atime-strict", &atime_cases(), "strictatime", cached);
    differential("atime-noatime", &atime_cases(), "noatime", &[]);
    differential("atime-nodiratime", &atime_cases(), "nodiratime", cached);
}

/// Kernel mount flags given to both: devices open on `dev`, not on `nodev`.
#[test]
fn mount_options_match_ext4() {
    let cases = || {
        vec![Case {
            name: "flags",
            steps: vec![
                st(
                    Who::Root,
                    vec![Op::Mknod(
                        c("null"),
                        libc::S_IFCHR | 0o666,
                        libc::makedev(1, 3),
                    )],
                ),
                st(
                    Who::A,
                    vec![
                        Op::Statvfs(c(".")),
                        open("null", WR, 0, 0),
                        Op::Write(0, 10),
                        Op::Close(0),
                    ],
                ),
            ],
        }]
    };
    differential("opts-dev", &cases(), "dev,suid", &[]);
    differential("opts-nodev", &cases(), "nodev,nosuid,noexec", &[]);
}

/// `noacl` on compfs and btrfs: the ACL xattrs are refused (EOPNOTSUPP), the umask applies.
#[test]
fn noacl_matches_btrfs() {
    let cases = vec![Case {
        name: "noacl",
        steps: vec![
            st(Who::Root, vec![mkdir("d", 0o777), chown("d", UA, GS)]),
            st(
                Who::A,
                vec![
                    set_acl("d", ACL_DEFAULT, &[(UO, 7, 0), (GO, 5, 0), (OT, 0, 0)]),
                    set_acl(
                        "d",
                        ACL_ACCESS,
                        &[(UO, 7, 0), (NU, 7, UB), (GO, 5, 0), (MK, 7, 0), (OT, 0, 0)],
                    ),
                    get_acl("d", ACL_ACCESS),
                    Op::Removexattr(c("d"), c(ACL_ACCESS)),
                    Op::Umask(0o027),
                    open("d/f", CREAT, 0o666, 0),
                    Op::Close(0),
                    mkdir("d/s", 0o777),
                    chmod("d", 0o750),
                ],
            ),
        ],
    }];
    // ext4 on Linux 6.18 no longer accepts `noacl` ("Unknown parameter"): btrfs does.
    let nlink = &[Allowed {
        case: "noacl/",
        key: " nlink",
        reason: "btrfs reports nlink 1 for directories (compfs, as ext4, 2 + subdirectories)",
    }];
    differential_on("btrfs", "noacl", &cases, "noacl", nlink);
}

fn atime_cases() -> Vec<Case> {
    use Who::*;
    let read =
        |f: &str, flags: i32| vec![open(f, RD | flags, 0, 0), Op::Read(0, 4096), Op::Close(0)];
    let list = |d: &str| vec![open(d, DIR, 0, 0), Op::Getdents(0), Op::Close(0)];
    vec![Case {
        name: "atime",
        steps: vec![
            st(
                Root,
                cat(vec![
                    setup_file("f", 0o644, UA, UA, 8192),
                    setup_file("g", 0o644, UA, UA, 8192),
                    vec![mkdir("d", 0o755), symlink("g", "l")],
                ]),
            ),
            st(A, read("f", 0)),
            // O_DIRECT reads reach the daemon every time
            st(A, read("g", libc::O_DIRECT)),
            st(A, read("g", libc::O_DIRECT)),
            st(A, list("d")),
            st(A, list("d")),
            st(Root, vec![chmod("g", 0o640), chmod("d", 0o750)]),
            st(A, cat(vec![read("g", libc::O_DIRECT), list("d")])),
            st(Root, cat(vec![read("l", libc::O_DIRECT), list("d")])),
        ],
    }]
}

/// Runs `cases` on ext4 and compfs, both mounted with the extra options `opts`, and fails on
/// any difference `allowed` does not explain (or an `allowed` entry that explains nothing).
fn differential(tag: &str, cases: &[Case], opts: &str, allowed: &[Allowed]) {
    // COMPFS_DIFF_KERNEL_FS=btrfs compares with btrfs instead (not in CI: the allow-list is
    // ext4's), e.g. to check what docs/kernel-features.md says of btrfs.
    let fstype = std::env::var("COMPFS_DIFF_KERNEL_FS").unwrap_or_else(|_| "ext4".into());
    differential_on(&fstype, tag, cases, opts, allowed)
}

/// [`differential`] against the kernel filesystem `fstype`.
fn differential_on(fstype: &str, tag: &str, cases: &[Case], opts: &str, allowed: &[Allowed]) {
    // Only a non-root run skips: as root (CI), missing tools fail the test rather than hide it.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: not root (the ext4 loop mount and setuid children need root)");
        return;
    }
    if let Some(r) = fs_common::skip_reason() {
        panic!("cannot run as root: {r}");
    }
    assert!(
        Command::new("mkfs.ext4").arg("-V").output().is_ok(),
        "mkfs.ext4 missing (scripts/deps.sh installs e2fsprogs)"
    );
    let start = Instant::now();
    let t = TempDir::new(tag);
    // Other users must reach the mounts.
    std::fs::set_permissions(
        t.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    // ",OPT" for each option, after ext4's "loop".
    let ext4_opts: String = opts
        .split(',')
        .filter(|o| !o.is_empty())
        .map(|o| format!(",{o}"))
        .collect();
    let mut ext4 = KernelFs::new(t.path(), fstype, &ext4_opts)
        .unwrap_or_else(|e| panic!("kernel filesystem loop mount: {e}"));
    let store = t.path().join("store");
    mkstore(&store, "zstd:1", Mode::Heuristic, 128 << 10);
    let m = Mount::new(
        &store,
        &t.path().join("cfs"),
        &format!("allow_other,{opts}"),
    );

    let want = run_all(&ext4.mnt, cases);
    let got = run_all(&m.mnt, cases);

    // COMPFS_DIFF_SHOW=PREFIX prints both traces of the cases whose keys start with PREFIX.
    if let Ok(prefix) = std::env::var("COMPFS_DIFF_SHOW") {
        for (k, v) in want.iter().filter(|(k, _)| k.starts_with(&prefix)) {
            eprintln!(
                "{k}: {} {v} compfs {}",
                ext4.fstype,
                got.get(k).map_or("-", |s| s)
            );
        }
    }
    let mut used = vec![false; allowed.len()];
    let mut unexplained = Vec::new();
    let mut explained = 0;
    let keys: std::collections::BTreeSet<&String> = want.keys().chain(got.keys()).collect();
    // A path's field that differs the same way as at the step before is reported once.
    let mut last: BTreeMap<String, (Option<&String>, Option<&String>)> = BTreeMap::new();
    for k in keys {
        let (a, b) = (want.get(k), got.get(k));
        let series = match (k.split_once('/'), k.split_once(" | ")) {
            (Some((case, _)), Some((_, field))) => Some(format!("{case} {field}")),
            _ => None,
        };
        if a == b {
            if let Some(s) = series {
                last.remove(&s);
            }
            continue;
        }
        if let Some(s) = series {
            if last.insert(s, (a, b)) == Some((a, b)) {
                continue;
            }
        }
        let line = format!(
            "{k}: {} {} compfs {}",
            ext4.fstype,
            a.map_or("-", |s| s),
            b.map_or("-", |s| s)
        );
        match allowed
            .iter()
            .position(|al| k.starts_with(al.case) && k.contains(al.key))
        {
            Some(i) => {
                used[i] = true;
                explained += 1;
                eprintln!("allowed: {line} ({})", allowed[i].reason);
            }
            None => unexplained.push(line),
        }
    }
    let stale: Vec<_> = allowed
        .iter()
        .zip(&used)
        .filter(|(_, u)| !**u)
        .map(|(a, _)| format!("{} / {}", a.case, a.key))
        .collect();
    drop(m);
    let fstype = std::mem::take(&mut ext4.fstype);
    drop(ext4);
    eprintln!(
        "fs_diff {tag}: {} observations, {} allowed differences, {} unexplained, {:.1} s",
        want.len(),
        explained,
        unexplained.len(),
        start.elapsed().as_secs_f64()
    );
    assert!(
        unexplained.is_empty(),
        "{} differences from {fstype}:\n{}",
        unexplained.len(),
        unexplained.join("\n")
    );
    assert!(
        stale.is_empty(),
        "allow-list entries that match nothing: {stale:?}"
    );
}
