//! The detached mount daemon: started in a new session, it tells its parent "ready" on
//! stdout once the mount is up, then points stdout and stderr away from the parent's pipe
//! and terminal (to `/dev/null` and its log file).

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

/// The line a daemon prints on stdout once its mount is ready.
pub const READY: &str = "ready";

/// Starting a daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot start the compfs daemon")]
    Start(#[source] std::io::Error),
    #[error("daemon stdout was not captured")]
    NoStdout,
    #[error("waiting for the compfs daemon")]
    Wait(#[source] std::io::Error),
}

/// Runs `cmd` in a new session (detached from the terminal), stdin on `/dev/null`, stdout a
/// pipe, `NO_COLOR=1` in its environment (its stderr becomes a log file), and waits until it
/// prints [`READY`] (`Ok(None)`: it runs on) or exits without (`Ok(Some(status))`).
pub fn start_detached(mut cmd: Command) -> Result<Option<ExitStatus>, DaemonError> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    cmd.env("NO_COLOR", "1");
    // SAFETY: setsid is async-signal-safe and allocates nothing; it detaches the daemon from
    // the terminal's session.
    unsafe {
        cmd.pre_exec(|| {
            let _ = rustix::process::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(DaemonError::Start)?;
    let Some(stdout) = child.stdout.take() else {
        return Err(DaemonError::NoStdout);
    };
    let mut line = String::new();
    let _ = BufReader::new(stdout).read_line(&mut line);
    if line.trim() == READY {
        return Ok(None);
    }
    child.wait().map(Some).map_err(DaemonError::Wait)
}

/// Which standard descriptor [`redirect`] replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Std {
    Out,
    Err,
}

/// Points stdout or stderr at `path` (opened for appending, created if needed); keeps it on
/// failure.
pub fn redirect(which: Std, path: &Path) {
    if let Ok(f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = match which {
            Std::Out => rustix::stdio::dup2_stdout(&f),
            Std::Err => rustix::stdio::dup2_stderr(&f),
        };
    }
}

/// The detached daemon's default log: `/var/log/compfs.log` for root, nowhere
/// (`/dev/null`) for other users.
pub fn default_log() -> PathBuf {
    if rustix::process::geteuid().is_root() {
        PathBuf::from("/var/log/compfs.log")
    } else {
        PathBuf::from("/dev/null")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_daemon_that_prints_ready_runs_on() {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg("echo ready; exec sleep 0");
        assert!(start_detached(cmd).unwrap().is_none());
    }

    #[test]
    fn a_daemon_that_exits_without_ready_gives_its_status() {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg("echo not yet; exit 3");
        let status = start_detached(cmd).unwrap().unwrap();
        assert_eq!(status.code(), Some(3));
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg("test \"$NO_COLOR\" = 1 && exit 4");
        assert_eq!(start_detached(cmd).unwrap().unwrap().code(), Some(4));
    }

    #[test]
    fn a_missing_program_is_a_start_error() {
        let e = start_detached(Command::new("/nonexistent/compfs-daemon")).unwrap_err();
        assert!(matches!(e, DaemonError::Start(_)), "{e}");
    }
}
