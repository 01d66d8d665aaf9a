//! `compfs mkfs/mount/usage/gc s3://BUCKET/PREFIX` against a real local S3 server (s3s-fs,
//! started by `scripts/s3-local.sh` on a free port, stopped when the test ends even when it
//! fails): files written and fsynced over FUSE read back after a remount from an empty cache
//! directory; a kill -9 of the daemon loses nothing fsynced; a second read-write mount is
//! refused (the lease); `compfs sync --remote` puts what was not fsynced in the bucket; the
//! credentials file must be private.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod fs_common;
use fs_common::*;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Server {
    dir: TempDir,
    env: Vec<(String, String)>,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/s3-local.sh")
}

impl Server {
    fn start() -> Server {
        let dir = TempDir::new("s3srv");
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(dir.path())
            .output()
            .unwrap();
        let s = Server {
            env: String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.strip_prefix("export "))
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            dir,
        };
        assert!(
            out.status.success() && !s.env.is_empty(),
            "scripts/s3-local.sh start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        s
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(self.dir.path())
            .status();
    }
}

fn compfs_env(srv: &Server, args: &[&str]) -> (bool, String, String) {
    let o = Command::new(BIN)
        .args(args)
        .envs(srv.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn s3_store_mount_write_fsync_remount_from_empty_cache() {
    require_fuse!();
    let srv = Server::start();
    // The mount daemons inherit the server's variables from this process (this file holds one
    // test, so nothing else reads the environment meanwhile).
    for (k, v) in &srv.env {
        std::env::set_var(k, v);
    }
    let t = TempDir::new("s3fs");
    let url = "s3://compfs/fuse/one";
    let (ok, out, err) = compfs_env(&srv, &["mkfs", url, "--extent-size", "64K"]);
    assert!(ok, "mkfs: {err}");
    assert!(
        out.contains("created compfs store s3://compfs/fuse/one"),
        "{out}"
    );
    let (ok, _, err) = compfs_env(&srv, &["mkfs", url]);
    assert!(!ok && err.contains("already holds"), "second mkfs: {err}");

    let mnt = t.path().join("mnt");
    let c1 = t.path().join("cache1");
    let text = text_bytes(6 << 20, 5);
    let rand = random_bytes(3 << 20, 6);
    {
        let opts = format!("compress=zstd:3,cache_dir={},cache_size=8M", c1.display());
        let m = Mount::new(Path::new(url), &mnt, &opts);
        let mut f = std::fs::File::create(m.path("text")).unwrap();
        f.write_all(&text).unwrap();
        f.sync_all().unwrap();
        drop(f);
        std::fs::create_dir(m.path("dir")).unwrap();
        std::fs::write(m.path("dir/rand"), &rand).unwrap();
        assert_eq!(std::fs::read(m.path("text")).unwrap(), text);
        assert!(m.unmount().success());
    }
    // A second machine: an empty cache directory.
    let c2 = t.path().join("cache2");
    {
        let opts = format!("cache_dir={},cache_size=2M", c2.display());
        let m = Mount::new(Path::new(url), &mnt, &opts);
        assert!(std::fs::read(m.path("text")).unwrap() == text);
        assert!(std::fs::read(m.path("dir/rand")).unwrap() == rand);
        let cached: u64 = std::fs::read_dir(c2.join("cache"))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert!(
            cached <= 2 << 20,
            "cache holds {cached} bytes over its 2M bound"
        );
        // kill -9 in the middle of writing: what was fsynced before is there afterwards.
        let more = text_bytes(2 << 20, 8);
        let mut f = std::fs::File::create(m.path("more")).unwrap();
        f.write_all(&more).unwrap();
        f.sync_all().unwrap();
        drop(f);
        std::fs::write(m.path("unsynced"), text_bytes(1 << 20, 9)).unwrap();
        m.kill9();
        // (The lease of the killed daemon, a dead process of this machine, is taken over.)
        // From here on `-o writeback`: fsyncs upload nothing, `sync --remote` still uploads
        // the queue and the snapshot before it returns.
        let m = Mount::new(
            Path::new(url),
            &mnt,
            &format!("cache_dir={},writeback,upload_limit=64M", c2.display()),
        );
        assert!(std::fs::read(m.path("more")).unwrap() == more);
        // One writer: a second read-write mount of the store is refused, naming the holder.
        let mnt2 = t.path().join("mnt2");
        std::fs::create_dir_all(&mnt2).unwrap();
        let c3 = t.path().join("cache3");
        let (ok, _, err) = compfs_env(
            &srv,
            &[
                "mount",
                url,
                mnt2.to_str().unwrap(),
                "-o",
                &format!("cache_dir={}", c3.display()),
                "--force",
            ],
        );
        assert!(
            !ok && err.contains("is mounted read-write by") && err.contains("unmount it there"),
            "second mount: {err}"
        );
        assert!(!is_mounted(&mnt2));
        // sync --remote: a change nobody fsynced is in the bucket once it returns.
        let late = text_bytes(300_000, 10);
        std::fs::write(m.path("late"), &late).unwrap();
        let (ok, out, err) = compfs_env(&srv, &["sync", "--remote", mnt.to_str().unwrap()]);
        assert!(ok, "sync --remote: {err}");
        assert!(
            out.contains("s3://compfs/fuse/one: metadata snapshot generation")
                && out.contains("no changes pending")
                && out.contains("upload queue: 0 chunks, 0 bytes (upload_limit 67108864 bytes)"),
            "{out}"
        );
        // `compfs stats` shows the same line.
        let (ok, out, err) = compfs_env(&srv, &["stats", mnt.to_str().unwrap()]);
        assert!(
            ok && out.contains("remote: s3://compfs/fuse/one: metadata snapshot generation")
                && out.contains("upload queue: 0 chunks, 0 bytes (upload_limit 67108864 bytes)"),
            "stats: {out}{err}"
        );
        // The machine is lost: another one mounts from an empty cache directory.
        m.kill9();
        let c4 = t.path().join("cache4");
        let m = Mount::new(Path::new(url), &mnt, &format!("cache_dir={}", c4.display()));
        assert!(std::fs::read(m.path("late")).unwrap() == late);
        assert!(m.unmount().success());
    }
    let (ok, out, err) = compfs_env(&srv, &["usage", url]);
    assert!(ok, "usage: {err}");
    assert!(out.contains("TOTAL") || out.contains("Total"), "{out}");
    let (ok, out, err) = compfs_env(&srv, &["gc", url]);
    assert!(ok && out.starts_with("gc:"), "gc: {out} {err}");
    // fsck --full of the bucket, and defrag of the unmounted store in it.
    let (ok, out, err) = compfs_env(&srv, &["fsck", url, "--full"]);
    assert!(ok, "fsck --full: {out} {err}");
    assert!(
        out.contains("objects")
            && out.contains("without the metadata")
            && out.contains(" 0 errors"),
        "{out}"
    );
    let (ok, out, err) = compfs_env(&srv, &["defrag", "-r", "-c", "zstd:9", url]);
    assert!(ok, "defrag: {out} {err}");
    let rewritten: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("extents rewritten"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(rewritten > 0, "{out}");
    let (ok, out, err) = compfs_env(&srv, &["fsck", url]);
    assert!(
        ok && out.contains(" 0 errors"),
        "fsck after defrag: {out} {err}"
    );
    {
        let c3 = t.path().join("cache3");
        let m = Mount::new(Path::new(url), &mnt, &format!("cache_dir={}", c3.display()));
        assert!(std::fs::read(m.path("text")).unwrap() == text);
        assert!(std::fs::read(m.path("dir/rand")).unwrap() == rand);
        assert!(m.unmount().success());
    }

    // A credentials file readable by others is refused.
    let cred = t.path().join("cred");
    std::fs::write(&cred, "aws_region=us-east-1\n").unwrap();
    std::fs::set_permissions(&cred, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (ok, _, err) = compfs_env(
        &srv,
        &[
            "mount",
            url,
            mnt.to_str().unwrap(),
            "-o",
            &format!("credentials={}", cred.display()),
        ],
    );
    assert!(!ok && err.contains("private"), "{err}");
}
