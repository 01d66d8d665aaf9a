//! The file systems a benchmark runs on, mounted and torn down again: a compfs mount (its own
//! daemon), a `bindfs` passthrough (the FUSE floor) and kernel file systems on loop images, with
//! the tools every benchmark needs around them: full sync, dropping caches, reading a tree,
//! and each file system's ratio.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use compfs_fs::UsageReport;

use crate::error::{bail, failed, Context, Result};

pub(crate) fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

pub(crate) fn run_tool(cmd: &mut Command) -> Result<()> {
    let o = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !o.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(())
}

/// Flushes the page cache to the file system, and the file system to disk: `sync`, then an
/// fsync of the mount's root directory (compfs: syncs the whole store; FUSE has no syncfs).
pub(crate) fn full_sync(mnt: &Path) -> Result<()> {
    rustix::fs::sync();
    std::fs::File::open(mnt)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("fsync {}", mnt.display()))
}

pub(crate) fn drop_caches() -> bool {
    rustix::fs::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

/// Cold read of everything under `mnt` the way the seed did it.
pub(crate) fn read_all(mnt: &Path) -> Result<f64> {
    let t = Instant::now();
    // Through cat: GNU tar writing to /dev/null itself would skip reading the files.
    let mut tar = Command::new("tar")
        .args(["cf", "-", "."])
        .current_dir(mnt)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot run tar")?;
    let out = tar.stdout.take().ok_or_else(|| failed!("no tar stdout"))?;
    let cat = Command::new("cat")
        .stdin(out)
        .stdout(Stdio::null())
        .status()
        .context("cannot run cat");
    let st = tar.wait().context("waiting for tar")?;
    if !st.success() || !cat?.success() {
        bail!("reading {} with tar cf - . | cat failed", mnt.display());
    }
    Ok(t.elapsed().as_secs_f64())
}

/// A compfs daemon for one measurement; unmounts on drop.
pub(crate) struct CompfsMount {
    child: Option<Child>,
    mnt: PathBuf,
}

impl CompfsMount {
    pub(crate) fn new(store: &Path, mnt: &Path, opts: &str) -> Result<CompfsMount> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .arg("mount")
            .arg(store)
            .arg(mnt)
            .args(["--foreground", "--notify-ready", "-o", opts])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start the compfs daemon")?;
        let out = child
            .stdout
            .take()
            .ok_or_else(|| failed!("no daemon stdout"))?;
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line)?;
        let m = CompfsMount {
            child: Some(child),
            mnt: mnt.to_path_buf(),
        };
        if line.trim() != "ready" {
            bail!("compfs mount -o {opts} did not come up");
        }
        Ok(m)
    }

    /// The daemon's process id while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Peak RSS of the daemon so far, MiB.
    pub(crate) fn peak_rss_mib(&self) -> f64 {
        let Some(c) = &self.child else { return 0.0 };
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", c.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    }

    pub(crate) fn unmount(mut self) -> Result<()> {
        self.unmount_inner()
    }

    pub(crate) fn unmount_inner(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let ok = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.mnt)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(&self.mnt)
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(st) = child.try_wait()? {
                if !st.success() {
                    bail!("compfs daemon exited with {st}");
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("compfs daemon did not exit after unmount");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for CompfsMount {
    fn drop(&mut self) {
        let _ = self.unmount_inner();
    }
}

/// A `bindfs` passthrough of a directory; unmounted on drop.
pub(crate) struct BindfsMount {
    mnt: PathBuf,
    mounted: bool,
}

impl BindfsMount {
    pub(crate) fn new(src: &Path, mnt: &Path) -> Result<BindfsMount> {
        // bindfs returns once the mount is up and serves it from a detached process.
        run_tool(Command::new("bindfs").arg(src).arg(mnt))
            .context("bindfs (scripts/deps.sh installs it)")?;
        Ok(BindfsMount {
            mnt: mnt.to_path_buf(),
            mounted: true,
        })
    }

    pub(crate) fn unmount(mut self) -> Result<()> {
        self.mounted = false;
        run_tool(Command::new("fusermount3").arg("-u").arg(&self.mnt))
    }
}

impl Drop for BindfsMount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&self.mnt)
                .status();
        }
    }
}

/// A kernel file system (btrfs, ext4, xfs) on a loop image; unmounted on drop.
pub(crate) struct KernelMount {
    mnt: PathBuf,
    mounted: bool,
}

impl KernelMount {
    pub(crate) fn new(fstype: &str, img: &Path, mnt: &Path, opts: &str) -> Result<KernelMount> {
        let mut o = String::from("loop");
        if !opts.is_empty() {
            o.push(',');
            o.push_str(opts);
        }
        run_tool(
            Command::new("mount")
                .arg("-t")
                .arg(fstype)
                .arg("-o")
                .arg(&o)
                .arg(img)
                .arg(mnt),
        )?;
        Ok(KernelMount {
            mnt: mnt.to_path_buf(),
            mounted: true,
        })
    }

    pub(crate) fn unmount(mut self) -> Result<()> {
        self.mounted = false;
        run_tool(Command::new("umount").arg(&self.mnt))
    }
}

impl Drop for KernelMount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

pub(crate) fn mkfs_btrfs(img: &Path, size: u64) -> Result<()> {
    mkfs_image("btrfs", img, size)
}

/// A fresh sparse image file of `size` bytes holding an empty file system of type `fstype`
/// (btrfs, ext4 or xfs).
pub(crate) fn mkfs_image(fstype: &str, img: &Path, size: u64) -> Result<()> {
    let _ = std::fs::remove_file(img);
    let f = std::fs::File::create(img)?;
    f.set_len(size)?;
    drop(f);
    let force = if fstype == "ext4" { "-F" } else { "-f" };
    run_tool(
        Command::new(format!("mkfs.{fstype}"))
            .args([force, "-q"])
            .arg(img),
    )
}

/// btrfs ratio: compsize when installed, else df.
pub(crate) fn btrfs_ratio(mnt: &Path, bytes: u64, df_before: u64) -> (f64, u64, String) {
    if let Ok(o) = Command::new("compsize").arg("-b").arg(mnt).output() {
        if o.status.success() {
            let text = String::from_utf8_lossy(&o.stdout);
            if let Some(l) = text.lines().find(|l| l.starts_with("TOTAL")) {
                let f: Vec<&str> = l.split_whitespace().collect();
                if let (Some(Ok(disk)), Some(Ok(unc))) = (
                    f.get(2).map(|s| s.parse::<u64>()),
                    f.get(3).map(|s| s.parse::<u64>()),
                ) {
                    if disk > 0 {
                        return (unc as f64 / disk as f64, disk, "compsize".into());
                    }
                }
            }
        }
    }
    let used = df_used(mnt).saturating_sub(df_before).max(1);
    (bytes as f64 / used as f64, used, "df".into())
}

pub(crate) fn df_used(p: &Path) -> u64 {
    rustix::fs::statvfs(p).map_or(0, |s| (s.f_blocks - s.f_bfree) * s.f_frsize)
}

pub(crate) fn compfs_ratio(mnt: &Path) -> Result<(f64, u64)> {
    let mut total = UsageReport::default();
    compfs_fs::add_tree_usage(mnt, &mut HashSet::new(), &mut total)?;
    let t = total.total();
    Ok((t.uncompressed as f64 / t.disk.max(1) as f64, t.disk))
}
