//! `compfs blk serve` against real NBD clients: qemu-io, nbdinfo, nbdcopy, nbdfuse + ext4.
//! Tools come from scripts/deps.sh (qemu-utils, libnbd-bin, nbdfuse, e2fsprogs); a test whose
//! tool is missing says so and returns.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use compfs_codec::{CodecSpec, Compressor};

const BIN: &str = env!("CARGO_BIN_EXE_compfs");
const CORPUS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/corpus/silesia.tar.zst"
);
const PAGE: usize = 4096;

fn have(tool: &str) -> bool {
    let ok = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("SKIP: {tool} is not installed (run scripts/deps.sh)");
    }
    ok
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

static SEQ: AtomicU32 = AtomicU32::new(0);

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "compfs-blk-{tag}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A running `compfs blk serve`, killed and cleaned up on drop.
struct Server {
    child: Child,
    dir: PathBuf,
    sock: PathBuf,
}

impl Server {
    fn start(tag: &str, args: &[&str]) -> Server {
        let dir = temp_dir(tag);
        let sock = dir.join("nbd.sock");
        let child = Command::new(BIN)
            .args(["blk", "serve", "--socket"])
            .arg(&sock)
            .args(args)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let s = Server { child, dir, sock };
        let ctl = s.dir.join("nbd.sock.ctl");
        let start = Instant::now();
        // Ready once the control thread answers (it starts after both sockets are bound).
        while compfs_blk::server::control_request(&ctl, "stat").is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.sock.display())
    }

    fn blk(&self, args: &[&str]) -> Output {
        let (cmd, rest) = args.split_first().unwrap();
        Command::new(BIN)
            .args(["blk", cmd])
            .arg(&self.sock)
            .args(rest)
            .output()
            .unwrap()
    }

    /// mm_stat, io_stat, bd_stat fields from `compfs blk stat`.
    fn stat(&self) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
        let o = self.blk(&["stat"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let text = String::from_utf8(o.stdout).unwrap();
        let line = |k: &str| -> Vec<u64> {
            text.lines()
                .find_map(|l| l.strip_prefix(k))
                .unwrap_or_else(|| panic!("no {k} in {text}"))
                .split_whitespace()
                .map(|w| w.parse().unwrap())
                .collect()
        };
        (line("mm_stat "), line("io_stat "), line("bd_stat "))
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn run(cmd: &mut Command) -> Output {
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "{:?} failed: {}{}",
        cmd,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn qemu_io(uri: &str, cmds: &[&str]) -> Output {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for x in cmds {
        c.args(["-c", x]);
    }
    c.arg(uri);
    c.output().unwrap()
}

use compfs_testdata::{random as random_bytes, text as text_bytes};

fn sha(path: &Path) -> String {
    let o = run(Command::new("sha256sum").arg(path));
    String::from_utf8(o.stdout).unwrap()[..64].to_string()
}

#[test]
fn qemu_io_and_nbdinfo() {
    if !have("qemu-io") || !have("nbdinfo") {
        return;
    }
    let s = Server::start("qemu", &["--size", "16M", "--algo", "lz4"]);
    let info = run(Command::new("nbdinfo").args(["--json", &s.uri()]));
    let json = String::from_utf8(info.stdout).unwrap();
    for want in [
        "\"export-size\": 16777216",
        "\"can_multi_conn\": true",
        "\"can_trim\": true",
        "\"can_zero\": true",
        "\"can_fua\": true",
        "\"can_flush\": true",
        "\"block_size_preferred\": 4096",
        "\"block_size_maximum\": 33554432",
    ] {
        assert!(json.contains(want), "{want} missing in {json}");
    }
    let list = run(Command::new("nbdinfo").args(["--list", &s.uri()]));
    assert!(String::from_utf8_lossy(&list.stdout).contains("compfs"));
    let o = qemu_io(
        &s.uri(),
        &[
            "write -P 0xab 0 1M",
            "write -P 0x11 4000 200",
            "read -P 0xab 0 4000",
            "read -P 0x11 4000 200",
            "read -P 0xab 4200 1044376",
            "write -z 65536 65536",
            "read -P 0 65536 65536",
            "discard 131072 131072",
            "read -P 0 131072 131072",
            "read -P 0 1M 15M",
            "flush",
        ],
    );
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!String::from_utf8_lossy(&o.stdout).contains("failed"));
    // Reads past the end are refused by the client or the server, never served.
    let o = qemu_io(&s.uri(), &["read 16M 4096"]);
    assert!(!o.status.success() || String::from_utf8_lossy(&o.stdout).contains("failed"));
    let (mm, _, _) = s.stat();
    // 1 MiB of same-filled pages minus the 128 KiB trimmed; qemu-io's `write -z` sends
    // NO_HOLE, so those 16 pages stay allocated zero pages.
    assert_eq!(mm[0], (256 - 32) * PAGE as u64);
    // The two pages holding the 200-byte 0x11 write are mixed; the rest are same-filled.
    assert_eq!(mm[5], 256 - 32 - 2, "same_pages");
}

#[test]
fn crafted_pages_statistics_over_nbd() {
    if !have("qemu-io") {
        return;
    }
    let s = Server::start("stats", &["--size", "1M", "--algo", "lz4"]);
    let file = s.dir.join("pages.bin");
    let mut data = Vec::new();
    data.extend_from_slice(&[0u8; PAGE]); // zero page
    data.extend(
        0x0123_4567_89ab_cdefu64
            .to_ne_bytes()
            .iter()
            .cycle()
            .take(PAGE),
    ); // one word
    data.extend(random_bytes(2 * PAGE, 3)); // two huge pages
    let text = text_bytes(4 * PAGE, 5); // four compressible pages
    data.extend_from_slice(&text);
    std::fs::write(&file, &data).unwrap();
    let o = qemu_io(
        &s.uri(),
        &[&format!("write -s {} 0 {}", file.display(), data.len())],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut c = Compressor::new();
    let mut out = Vec::new();
    let spec = CodecSpec::parse("lz4").unwrap().spec;
    let mut compr = 2 * PAGE as u64;
    for p in text.chunks(PAGE) {
        compr += c.compress(spec, p, &mut out).unwrap() as u64;
    }
    let (mm, io, bd) = s.stat();
    assert_eq!(mm[0], 8 * PAGE as u64, "orig_data_size");
    assert_eq!(mm[1], compr, "compr_data_size");
    assert_eq!(mm[5], 2, "same_pages");
    assert_eq!(mm[7], 2, "huge_pages");
    assert_eq!(mm[8], 2, "huge_pages_since");
    assert!(mm[2] >= mm[1], "mem_used_total covers the data");
    assert_eq!(io, vec![0, 0, 0, 0]);
    assert_eq!(bd, vec![0, 0, 0]);
    let summary = String::from_utf8(s.blk(&["stat"]).stdout).unwrap();
    let ratio = format!("ratio {:.2}", (8 * PAGE) as f64 / compr as f64);
    assert!(summary.contains(&ratio), "{ratio} not in {summary}");
}

#[test]
fn control_commands_recompress_writeback_compact_reset() {
    if !have("qemu-io") {
        return;
    }
    let mut s = Server::start(
        "ctl",
        &["--size", "8M", "--algo", "lz4", "--recomp-algo", "zstd:9"],
    );
    // No backing file: writeback is refused with a clear error.
    let o = s.blk(&["writeback", "--type", "huge"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--backing"));
    drop(s);
    let dir = temp_dir("ctl3");
    let backing = dir.join("backing.img");
    s = Server::start(
        "ctl3s",
        &[
            "--size",
            "8M",
            "--algo",
            "lz4",
            "--recomp-algo",
            "zstd:9",
            "--backing",
            backing.to_str().unwrap(),
        ],
    );
    let file = s.dir.join("data.bin");
    let mut data = text_bytes(64 * PAGE, 11);
    data.extend(random_bytes(16 * PAGE, 12));
    std::fs::write(&file, &data).unwrap();
    let o = qemu_io(
        &s.uri(),
        &[&format!("write -s {} 0 {}", file.display(), data.len())],
    );
    assert!(o.status.success());
    let (before, _, _) = s.stat();
    assert_eq!(before[7], 16);
    let o = s.blk(&["mark-idle"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "marked 80");
    let o = s.blk(&["recompress", "--type", "idle", "--threshold", "1"]);
    assert!(o.status.success());
    let (after, _, _) = s.stat();
    assert!(after[1] < before[1], "zstd:9 shrinks text pages");
    let o = s.blk(&["writeback", "--type", "huge"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "written 16");
    let (mm, _, bd) = s.stat();
    assert_eq!(bd[0], 16);
    assert_eq!(mm[7], 0);
    // Everything reads back through the client, including written-back pages.
    let out = s.dir.join("out.bin");
    if have("nbdcopy") {
        run(Command::new("nbdcopy").args([&s.uri(), out.to_str().unwrap()]));
        let back = std::fs::read(&out).unwrap();
        assert_eq!(&back[..data.len()], &data[..]);
        let (_, _, bd) = s.stat();
        assert!(bd[1] >= 16, "bd_reads");
    }
    // Trim half the pages, compact, reset.
    let o = qemu_io(&s.uri(), &["discard 0 128k", "discard 256k 64k"]);
    assert!(o.status.success());
    assert!(s.blk(&["compact"]).status.success());
    assert!(s.blk(&["reset"]).status.success());
    let (mm, io, bd) = s.stat();
    assert_eq!((mm[0], mm[1], mm[5], mm[7]), (0, 0, 0, 0));
    assert_eq!(io[3], 0);
    assert_eq!(bd, vec![0, 0, 0]);
    assert!(s.alive());
    let _ = std::fs::remove_dir_all(&dir);
    // Bad control input gets a one-line error.
    let o = s.blk(&["recompress", "--type", "sideways"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("idle, huge or incompressible"));
}

#[test]
fn mem_limit_fails_writes_with_enospc_and_server_stays_healthy() {
    if !have("qemu-io") {
        return;
    }
    let mut s = Server::start(
        "limit",
        &["--size", "16M", "--algo", "lz4", "--mem-limit", "512K"],
    );
    let o = qemu_io(&s.uri(), &["write -P 0x33 0 64k"]);
    assert!(o.status.success());
    let file = s.dir.join("rand.bin");
    std::fs::write(&file, random_bytes(4 << 20, 1)).unwrap();
    let o = qemu_io(&s.uri(), &[&format!("write -s {} 1M 4M", file.display())]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(text.contains("No space left on device"), "{text}");
    assert!(s.alive());
    let o = qemu_io(&s.uri(), &["read -P 0x33 0 64k"]);
    assert!(o.status.success(), "stored data is intact");
    let (mm, io, _) = s.stat();
    assert!(
        mm[2] <= 512 * 1024,
        "mem_used_total {} within the limit",
        mm[2]
    );
    assert_eq!(mm[3], 512 * 1024);
    assert!(io[1] >= 1, "failed_writes");
}

/// Bytes the file really occupies on disk.
fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().blocks() * 512
}

/// `nbdinfo --map` lines as (offset, length, type).
fn nbdinfo_map(uri: &str) -> Vec<(u64, u64, u32)> {
    let o = run(Command::new("nbdinfo").args(["--map", uri]));
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect()
}

/// Block status through real clients: nbdinfo --map shows holes where nothing was written,
/// zeros where zeros were written, data elsewhere; nbdcopy and qemu-img convert copy a
/// mostly-empty device to sparse files with the right bytes.
#[test]
fn block_status_map_and_sparse_copies() {
    if !have("qemu-io") || !have("nbdinfo") || !have("nbdcopy") || !have("qemu-img") {
        return;
    }
    const M: u64 = 1 << 20;
    let mut s = Server::start("map", &["--size", "128M", "--algo", "lz4"]);
    let text = text_bytes(M as usize, 5);
    let file = s.dir.join("text.bin");
    std::fs::write(&file, &text).unwrap();
    let f = file.display();
    let o = qemu_io(
        &s.uri(),
        &[
            &format!("write -s {f} 0 1M"),
            "write -z 50M 1M", // WRITE_ZEROES with NO_HOLE: allocated zero pages
            "write -P 0 60M 128k", // zeros written as data: same-filled zero pages
            "write -P 0x5a 100M 64k", // same-filled, nonzero: data
            &format!("write -s {f} 120M 1M"),
            "discard 120M 512k", // trimmed back to holes
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let json =
        String::from_utf8(run(Command::new("nbdinfo").args(["--json", &s.uri()])).stdout).unwrap();
    for want in [
        "\"structured\": true",
        "\"base:allocation\"",
        "\"can_df\": true",
    ] {
        assert!(json.contains(want), "{want} missing in {json}");
    }
    let (data, zero, hole) = (0, 2, 3);
    assert_eq!(
        nbdinfo_map(&s.uri()),
        vec![
            (0, M, data),
            (M, 49 * M, hole),
            (50 * M, M, zero),
            (51 * M, 9 * M, hole),
            (60 * M, M / 8, zero),
            (60 * M + M / 8, 40 * M - M / 8, hole),
            (100 * M, M / 16, data),
            (100 * M + M / 16, 20 * M + M / 2 - M / 16, hole),
            (120 * M + M / 2, M / 2, data),
            (121 * M, 7 * M, hole),
        ]
    );
    let mut want = vec![0u8; 128 * M as usize];
    want[..M as usize].copy_from_slice(&text);
    want[100 * M as usize..(100 * M + M / 16) as usize].fill(0x5a);
    want[(120 * M + M / 2) as usize..121 * M as usize].copy_from_slice(&text[M as usize / 2..]);
    // 1.5625 MiB of data in a 128 MiB device: the copies must be sparse.
    let out = s.dir.join("nbdcopy.img");
    run(Command::new("nbdcopy").args([&s.uri(), out.to_str().unwrap()]));
    let out2 = s.dir.join("qemu-img.img");
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw", &s.uri()])
        .arg(&out2));
    for o in [&out, &out2] {
        let got = std::fs::read(o).unwrap();
        assert!(got == want, "{} differs from the device", o.display());
        let used = allocated(o);
        eprintln!("{}: {used} bytes allocated of {}", o.display(), got.len());
        assert!(used <= 4 * M, "{} is not sparse: {used} bytes", o.display());
    }
    assert!(s.alive());
}

#[test]
fn nbdcopy_in_and_out_byte_identical_and_tcp() {
    if !have("nbdcopy") || !have("zstd") {
        return;
    }
    let dir = temp_dir("copy");
    let src = dir.join("src.bin");
    let (size, from_corpus) = if Path::new(CORPUS).exists() {
        let f = std::fs::File::create(&src).unwrap();
        run(Command::new("zstd").args(["-dc", CORPUS]).stdout(f));
        (std::fs::metadata(&src).unwrap().len(), true)
    } else {
        eprintln!("corpus missing; using 48 MiB of generated data");
        let mut f = std::fs::File::create(&src).unwrap();
        for i in 0..12u64 {
            f.write_all(&text_bytes(2 << 20, i)).unwrap();
            f.write_all(&random_bytes(1 << 20, i)).unwrap();
            f.write_all(&vec![0u8; 1 << 20]).unwrap();
        }
        (48 << 20, false)
    };
    let dev = size.div_ceil(1 << 20) << 20;
    // Three threads whatever the machine: nbdcopy keeps requests in flight, so the helpers
    // answer some of them (out of order) and their path is checked byte for byte.
    let s = Server::start(
        "copy",
        &[
            "--size",
            &dev.to_string(),
            "--algo",
            "lz4",
            "--conn-threads",
            "3",
        ],
    );
    run(Command::new("nbdcopy").args([src.to_str().unwrap(), &s.uri()]));
    let out = dir.join("out.bin");
    run(Command::new("nbdcopy").args([&s.uri(), out.to_str().unwrap()]));
    run(Command::new("truncate")
        .args(["-s", &size.to_string()])
        .arg(&out));
    assert_eq!(sha(&src), sha(&out), "byte-identical round trip");
    let (mm, _, _) = s.stat();
    let ratio = mm[0] as f64 / mm[1] as f64;
    eprintln!(
        "nbdcopy: orig {} compr {} mem {} ratio {ratio:.3} (corpus: {from_corpus})",
        mm[0], mm[1], mm[2]
    );
    assert!(ratio > 1.3);
    assert!(mm[2] as f64 <= 1.05 * mm[1] as f64, "pool overhead");
    drop(s);
    // TCP on loopback, same data path.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let tdir = temp_dir("tcp");
    let ctl = tdir.join("blk.ctl");
    let mut child = Command::new(BIN)
        .args(["blk", "serve", "--size", "8M", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--control")
        .arg(&ctl)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !ctl.exists() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let small = dir.join("small.bin");
    std::fs::write(&small, text_bytes(8 << 20, 99)).unwrap();
    let uri = format!("nbd://127.0.0.1:{port}");
    let r1 = Command::new("nbdcopy")
        .args([small.to_str().unwrap(), &uri])
        .status();
    let back = dir.join("small.out");
    let r2 = Command::new("nbdcopy")
        .args([&uri, back.to_str().unwrap()])
        .status();
    let stat = Command::new(BIN)
        .args(["blk", "stat"])
        .arg(&ctl)
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(r1.unwrap().success() && r2.unwrap().success());
    assert_eq!(sha(&small), sha(&back));
    assert!(String::from_utf8_lossy(&stat.stdout).contains("mm_stat"));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&tdir);
}

/// nbdfuse, loop device, ext4: unmounted, detached and stopped in Drop even on failure.
struct Stack {
    fuse_dir: PathBuf,
    fuse: Option<Child>,
    loopdev: Option<String>,
    mnt: PathBuf,
    mounted: bool,
}

impl Drop for Stack {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.mnt).status();
        }
        if let Some(l) = self.loopdev.take() {
            let _ = Command::new("losetup").args(["-d", &l]).status();
        }
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.fuse_dir)
            .status();
        if let Some(mut c) = self.fuse.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn ext4_on_nbdfuse_loop_device_survives_remount() {
    if !is_root() {
        eprintln!("SKIP: the ext4 end-to-end test needs root (losetup, mount)");
        return;
    }
    for t in [
        "nbdfuse",
        "losetup",
        "mkfs.ext4",
        "fusermount3",
        "sha256sum",
    ] {
        if !have(t) {
            return;
        }
    }
    let s = Server::start("e2e", &["--size", "128M", "--algo", "zstd:1"]);
    let fuse_dir = s.dir.join("fuse");
    let mnt = s.dir.join("mnt");
    std::fs::create_dir_all(&fuse_dir).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    let fuse = Command::new("nbdfuse")
        .arg(fuse_dir.join("disk"))
        .args(["--unix"])
        .arg(&s.sock)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut st = Stack {
        fuse_dir: fuse_dir.clone(),
        fuse: Some(fuse),
        loopdev: None,
        mnt: mnt.clone(),
        mounted: false,
    };
    let disk = fuse_dir.join("disk");
    let start = Instant::now();
    while std::fs::metadata(&disk).map(|m| m.len()).unwrap_or(0) != 128 << 20 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "nbdfuse did not mount"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = run(Command::new("losetup").args(["-f", "--show"]).arg(&disk));
    let dev = String::from_utf8(o.stdout).unwrap().trim().to_string();
    st.loopdev = Some(dev.clone());
    run(Command::new("mkfs.ext4").args(["-q", "-F", &dev]));
    run(Command::new("mount").arg(&dev).arg(&mnt));
    st.mounted = true;
    // A tree: text files, random files, nested directories.
    let mut files = Vec::new();
    for d in 0..4u64 {
        let sub = mnt.join(format!("dir{d}/nested"));
        std::fs::create_dir_all(&sub).unwrap();
        for f in 0..5u64 {
            let p = sub.join(format!("f{f}.txt"));
            let data = if f % 2 == 0 {
                text_bytes(300_000 + (f * 7919) as usize, d * 10 + f)
            } else {
                random_bytes(100_000 + f as usize, d * 10 + f)
            };
            std::fs::write(&p, data).unwrap();
            files.push(p);
        }
    }
    let sums: Vec<String> = files.iter().map(|p| sha(p)).collect();
    run(Command::new("umount").arg(&mnt));
    st.mounted = false;
    run(Command::new("mount").arg(&dev).arg(&mnt));
    st.mounted = true;
    for (p, want) in files.iter().zip(&sums) {
        assert_eq!(&sha(p), want, "{}", p.display());
    }
    run(Command::new("umount").arg(&mnt));
    st.mounted = false;
    let fsck = Command::new("e2fsck").args(["-f", "-n", &dev]).output();
    if let Ok(o) = fsck {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    }
    drop(st);
    let (mm, io, _) = s.stat();
    assert!(
        mm[0] > 0 && mm[1] < mm[0],
        "ext4 metadata and text compress"
    );
    assert_eq!((io[0], io[1]), (0, 0), "no failed reads or writes");
}

#[test]
fn sigterm_removes_the_sockets() {
    let mut s = Server::start("sig", &["--size", "1M"]);
    // SAFETY: signals our own child process.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    let status = s.child.wait().unwrap();
    assert!(status.success());
    assert!(!s.sock.exists());
    assert!(!s.dir.join("nbd.sock.ctl").exists());
}

/// The `dict` line of the server's stat reply.
fn dict_status(s: &Server) -> Option<compfs_blk::store::DictStatus> {
    let lines = compfs_blk::server::control_request(&s.dir.join("nbd.sock.ctl"), "stat").unwrap();
    lines
        .iter()
        .find_map(|l| l.strip_prefix("dict "))
        .and_then(compfs_blk::store::DictStatus::parse)
}

/// `--dict auto` over a real client: nbdcopy writes text and binary pages, the server trains
/// and moves the pages written before onto its dictionary, and nbdcopy reads back identical
/// bytes; `--dict FILE` with a trained file does the same, and bad uses fail in one line.
#[test]
fn dict_auto_and_file_over_nbdcopy() {
    if !have("nbdcopy") || !have("zstd") {
        return;
    }
    // COMPFS_CORPUS points at the corpus from a worktree outside /work/main.
    let corpus = std::env::var("COMPFS_CORPUS").unwrap_or_else(|_| CORPUS.to_string());
    if !Path::new(&corpus).exists() {
        eprintln!(
            "SKIP: corpus {corpus} missing (generated data gains too little from a dictionary)"
        );
        return;
    }
    let dir = temp_dir("dict");
    let src = dir.join("src.bin");
    {
        // The first 24 MiB of the corpus (text, then binaries).
        let f = std::fs::File::create(&src).unwrap();
        run(Command::new("sh")
            .arg("-c")
            .arg(format!("zstd -dc {corpus} | head -c {}", 24 << 20))
            .stdout(f));
    }
    let size = std::fs::metadata(&src).unwrap().len();
    let out = dir.join("out.bin");
    let copy_back = |s: &Server| {
        run(Command::new("nbdcopy").args([&s.uri(), out.to_str().unwrap()]));
        run(Command::new("truncate")
            .args(["-s", &size.to_string()])
            .arg(&out));
        assert_eq!(sha(&src), sha(&out), "byte-identical round trip");
    };

    let s = Server::start(
        "dict",
        &["--size", "32M", "--algo", "zstd:1", "--dict", "auto"],
    );
    run(Command::new("nbdcopy").args([src.to_str().unwrap(), &s.uri()]));
    let start = Instant::now();
    let st = loop {
        let st = dict_status(&s).expect("dict line in stat");
        if st.trainings >= 1 && !st.busy {
            break st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no dictionary: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        st.version >= 1 && st.recompressed > 0 && st.pages > 0,
        "{st:?}"
    );
    let (mm, _, _) = s.stat();
    assert!(
        mm[2] >= mm[1] + st.bytes,
        "dictionary memory in mem_used_total"
    );
    copy_back(&s);
    let o = s.blk(&["stat"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("dict      version"));
    drop(s);

    // A dictionary file trained from the same kind of pages.
    let data = std::fs::read(&src).unwrap();
    let samples: Vec<&[u8]> = data.chunks(PAGE).step_by(8).collect();
    let dict = compfs_codec::Dictionary::train(&samples, 64 << 10, 1).unwrap();
    let dict_path = dir.join("pages.dict");
    std::fs::write(&dict_path, dict.raw()).unwrap();
    let s = Server::start(
        "dictf",
        &[
            "--size",
            "32M",
            "--algo",
            "zstd:1",
            "--dict",
            dict_path.to_str().unwrap(),
        ],
    );
    run(Command::new("nbdcopy").args([src.to_str().unwrap(), &s.uri()]));
    let st = dict_status(&s).unwrap();
    assert_eq!((st.version, st.trainings), (1, 0), "{st:?}");
    assert!(st.pages > 0);
    copy_back(&s);
    drop(s);

    // Refusals: not zstd, a damaged file; one line each, before serving.
    let bad = dir.join("bad.dict");
    std::fs::write(&bad, &dict.raw()[..64]).unwrap();
    for (algo, d, want) in [
        ("lz4", "auto", "--dict needs --algo zstd"),
        ("zstd:1", bad.to_str().unwrap(), "is damaged"),
        ("zstd:1", "/nonexistent/x.dict", "cannot read dictionary"),
    ] {
        // Under timeout(1): a server that wrongly starts must not hang the test.
        let o = Command::new("timeout")
            .args(["30", BIN, "blk", "serve", "--socket"])
            .arg(dir.join("never.sock"))
            .args(["--size", "1M", "--algo", algo, "--dict", d])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains(want),
            "{algo} {d}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The newer controls over the control socket and `--policy` with real clients: data copied in
/// with nbdcopy is recompressed and written back by the policy once idle, within the budget,
/// and copies back byte-identical (pages read again return to the primary codec).
#[test]
fn policy_and_newer_controls_over_nbdcopy() {
    if !have("nbdcopy") {
        return;
    }
    let dir = temp_dir("policy");
    let backing = dir.join("backing.img");
    let s = Server::start(
        "policy",
        &[
            "--size",
            "4M",
            "--algo",
            "lz4",
            "--recomp-algo",
            "zstd:9",
            "--backing",
            backing.to_str().unwrap(),
            "--policy",
            "--idle-age",
            "1",
            "--writeback-limit",
            "256K",
            "--writeback-period",
            "0",
        ],
    );
    let src = s.dir.join("src.bin");
    let mut data = text_bytes(512 * PAGE, 21);
    data.extend(random_bytes(64 * PAGE, 22));
    std::fs::write(&src, &data).unwrap();
    run(Command::new("nbdcopy").args([src.to_str().unwrap(), &s.uri()]));
    // Idle after 1 s, written back after 2 s; a step every second.
    let start = Instant::now();
    let policy = loop {
        let o = s.blk(&["stat"]);
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        let line = text
            .lines()
            .find(|l| l.starts_with("policy "))
            .expect("policy line")
            .to_string();
        if line.contains("written back") && !line.contains(" 0 written back") {
            break line;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "policy did nothing: {text}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(!policy.contains(" 0 recompressed"), "{policy}");
    // The budget (256 KiB = 64 pages, no refill) bounds the writeback.
    let (_, _, bd) = s.stat();
    assert_eq!(bd[0], 64, "{policy}");
    let o = s.blk(&["stat"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("writeback budget 256K per 0 s, 0B left"));
    // Byte-identical back; the pages read come back from the file to memory.
    let out = s.dir.join("out.bin");
    run(Command::new("nbdcopy").args([&s.uri(), out.to_str().unwrap()]));
    assert_eq!(&std::fs::read(&out).unwrap()[..data.len()], &data[..]);
    let (_, _, bd) = s.stat();
    assert_eq!(bd[0], 0, "read pages promoted back");
    // The newer controls.
    let o = s.blk(&["mark-idle", "--age", "100000"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "marked 0");
    let o = s.blk(&["writeback-limit", "1M", "--period", "60"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("writeback_limit 1048576 60 1048576 32"));
    let o = s.blk(&["writeback-batch-size", "0"]);
    assert!(!o.status.success());
    let o = s.blk(&["writeback-batch-size", "8"]);
    assert!(String::from_utf8_lossy(&o.stdout).trim().ends_with(" 8"));
    let o = s.blk(&["writeback", "--type", "incompressible", "--max-pages", "3"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = s.blk(&["recompress", "--type", "huge", "--max-pages", "2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}
