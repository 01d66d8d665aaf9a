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

/// Without `CAP_SYS_NICE` and with `RLIMIT_NICE` at 0 (an ordinary user), a thread can enter
/// `SCHED_IDLE` but not leave it: the ring threads must then never switch. The probe runs on a
/// thread of its own, so the caller keeps its policy either way. Checked in a child process
/// (this test binary again, copied where any user can run it) running as `nobody`.
#[test]
fn an_unprivileged_daemon_never_switches_its_ring_threads() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;

    const CHILD: &str = "COMPFS_RING_PROBE_CHILD";
    if std::env::var_os(CHILD).is_some() {
        // SAFETY: no preconditions.
        assert_ne!(unsafe { libc::geteuid() }, 0);
        assert!(
            !fuser::sched_idle_reversible(),
            "an unprivileged thread came back"
        );
        // SAFETY: 0 is the calling thread.
        assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_OTHER);
        return;
    }
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: not root (CI runs these tests as root)");
        return;
    }
    assert!(fuser::sched_idle_reversible(), "root can leave SCHED_IDLE");
    let exe = std::env::temp_dir().join(format!("compfs-ring-probe-{}", std::process::id()));
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cmd = std::process::Command::new(&exe);
    cmd.args([
        "--exact",
        "an_unprivileged_daemon_never_switches_its_ring_threads",
        "--test-threads=1",
    ])
    .env(CHILD, "1")
    .current_dir("/")
    .uid(65534)
    .gid(65534);
    // SAFETY: setrlimit is async-signal-safe; no allocation in the closure.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::setrlimit(libc::RLIMIT_NICE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output();
    let _ = std::fs::remove_file(&exe);
    let out = out.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "child as nobody: {:?}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
