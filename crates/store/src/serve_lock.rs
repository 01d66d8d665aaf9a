//! The serving lock: how a process that serves a store (the FUSE daemon) tells others when it
//! has made everything durable and let go of the store.
//!
//! The kernel does not wait for a FUSE daemon when unmounting (it sends no DESTROY to non-block
//! FUSE mounts), so `umount` returns while the daemon may still run its final flush and durable
//! commit. The daemon therefore holds an exclusive `flock(2)` on the store's superblock file
//! from before it serves until after the store is closed ([`ServeLock`]); the kernel drops it
//! if the process dies. [`wait_until_released`] takes a shared lock to learn that it is gone.
//! No other store code locks this file (the metadata database has its own lock, reported as
//! [`crate::Error::InUse`]).

use std::fs::File;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::fs::{flock, FlockOperation};

use crate::format::SUPERBLOCK_FILE;

/// The exclusive serving lock of one store, held until dropped.
#[derive(Debug)]
pub struct ServeLock {
    _file: File,
}

impl ServeLock {
    /// Takes the exclusive serving lock of the store in `store_dir`, waiting while another
    /// holder still has it.
    pub fn acquire(store_dir: &Path) -> io::Result<ServeLock> {
        let file = File::open(store_dir.join(SUPERBLOCK_FILE))?;
        flock(&file, FlockOperation::LockExclusive)?;
        Ok(ServeLock { _file: file })
    }
}

/// Waits until no process holds the serving lock of the store in `store_dir` (it released
/// the lock after its final durable commit, or died). False on timeout.
pub fn wait_until_released(store_dir: &Path, timeout: Duration) -> io::Result<bool> {
    let file = File::open(store_dir.join(SUPERBLOCK_FILE))?;
    let deadline = Instant::now() + timeout;
    loop {
        // The shared lock is released when `file` closes.
        match flock(&file, FlockOperation::NonBlockingLockShared) {
            Ok(()) => return Ok(true),
            Err(rustix::io::Errno::WOULDBLOCK) => {}
            Err(e) => return Err(e.into()),
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_ends_when_the_lock_is_released() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(SUPERBLOCK_FILE), b"sb").unwrap();
        assert!(wait_until_released(dir.path(), Duration::ZERO).unwrap());
        let lock = ServeLock::acquire(dir.path()).unwrap();
        assert!(!wait_until_released(dir.path(), Duration::from_millis(20)).unwrap());
        let waiter = {
            let d = dir.path().to_path_buf();
            std::thread::spawn(move || wait_until_released(&d, Duration::from_secs(10)))
        };
        std::thread::sleep(Duration::from_millis(30));
        drop(lock);
        assert!(waiter.join().unwrap().unwrap());
    }

    #[test]
    fn a_missing_store_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(ServeLock::acquire(dir.path()).is_err());
        assert!(wait_until_released(dir.path(), Duration::ZERO).is_err());
    }
}
