//! What compfs tells the FUSE-over-io_uring transport: which requests a ring thread hands to
//! the helper threads ([`fuser::HandOff`], [`ring_hand_off`]) and when its replies should wake
//! requesters on its own CPU ([`fuser::WakeHere`], [`ring_wake_here`]).
//!
//! Hand-off: a ring thread serves its CPU's requests one after the other, so one long request
//! holds up every other request from that CPU (a `ls` behind a defrag of a large file, a
//! reader's progress poll behind the defrag it polls). Handing a request off costs a wake-up of
//! another thread, the very cost the ring saves, so only the requests that can take long go:
//! those of [`fuser::default_hand_off`] (READ, FSYNC, FSYNCDIR), every SETXATTR (the
//! `compfs.defrag` rewrite and the `compfs.remote` upload among them; others are rare), and the
//! GETXATTRs of the virtual records that walk a tree or the store (`compfs.usage`,
//! `compfs.stats`, `compfs.remote`). Creates, lookups, attribute changes and WRITEs (which only
//! buffer) stay on the ring thread.
//!
//! Waking here: worth it while the store's writeback and compression threads are idle (a
//! `stat` of a tree, creates and deletes of empty files: the round trip of an unpinned
//! requester goes from 52–74 to 18–22 µs); not while they have work, when the ring thread,
//! briefly `SCHED_IDLE`, would wait behind them (an untar was 0.84x as fast with it always on).

use std::sync::{Arc, RwLock, Weak};

use compfs_store::Store;

use crate::report;

/// `FUSE_SETXATTR` and `FUSE_GETXATTR` (include/uapi/linux/fuse.h).
const FUSE_SETXATTR: u32 = 21;
const FUSE_GETXATTR: u32 = 22;

/// Bytes of `struct fuse_getxattr_in` (size, padding) before the attribute's name.
const GETXATTR_IN: usize = 8;

/// The store of this process's mount, for [`ring_wake_here`] (a daemon serves one mount).
static STORE: RwLock<Weak<Store>> = RwLock::new(Weak::new());

/// Makes `store` the one [`ring_wake_here`] asks.
pub fn set_ring_store(store: &Arc<Store>) {
    match STORE.write() {
        Ok(mut g) => *g = Arc::downgrade(store),
        Err(p) => *p.into_inner() = Arc::downgrade(store),
    }
}

/// compfs's [`fuser::WakeHere`]: while the store has no written data buffered or being
/// compressed.
pub fn ring_wake_here() -> bool {
    let store = match STORE.read() {
        Ok(g) => g.upgrade(),
        Err(_) => None,
    };
    store.is_some_and(|s| !s.writes_pending())
}

/// compfs's [`fuser::HandOff`]: `args` are the request's bytes after `fuse_in_header`.
pub fn ring_hand_off(opcode: u32, args: &[u8]) -> bool {
    match opcode {
        FUSE_SETXATTR => true,
        FUSE_GETXATTR => args
            .get(GETXATTR_IN..)
            .map(|rest| rest.split(|&b| b == 0).next().unwrap_or(rest))
            .is_some_and(report::is_virtual),
        _ => fuser::default_hand_off(opcode, args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn getxattr(name: &str) -> Vec<u8> {
        let mut v = vec![0u8; GETXATTR_IN];
        v[..4].copy_from_slice(&4096u32.to_ne_bytes());
        v.extend_from_slice(name.as_bytes());
        v.push(0);
        v
    }

    #[test]
    fn long_requests_are_handed_off() {
        assert!(ring_hand_off(fuser::FUSE_READ, &[0; 40]));
        assert!(ring_hand_off(fuser::FUSE_FSYNC, &[0; 16]));
        assert!(ring_hand_off(fuser::FUSE_FSYNCDIR, &[0; 16]));
        assert!(ring_hand_off(
            FUSE_SETXATTR,
            b"\0\0\0\0\0\0\0\0compfs.defrag\0"
        ));
        assert!(ring_hand_off(FUSE_GETXATTR, &getxattr(report::USAGE_XATTR)));
        assert!(ring_hand_off(FUSE_GETXATTR, &getxattr(report::STATS_XATTR)));
        assert!(ring_hand_off(
            FUSE_GETXATTR,
            &getxattr(report::REMOTE_XATTR)
        ));
    }

    #[test]
    fn short_requests_stay_on_the_ring_thread() {
        // The ACL lookups of an untar, the defrag progress poll, and names that only start
        // like a virtual record.
        assert!(!ring_hand_off(
            FUSE_GETXATTR,
            &getxattr("system.posix_acl_access")
        ));
        assert!(!ring_hand_off(FUSE_GETXATTR, &getxattr("compfs.defrag")));
        assert!(!ring_hand_off(FUSE_GETXATTR, &getxattr("compfs.usagex")));
        // Opcodes of LOOKUP (1), SETATTR (4), WRITE (16), RELEASE (18), CREATE (35).
        for op in [1, 4, 16, 18, 35] {
            assert!(!ring_hand_off(op, &[0; 64]), "opcode {op}");
        }
    }

    #[test]
    fn malformed_arguments_are_not_handed_off() {
        assert!(!ring_hand_off(FUSE_GETXATTR, &[]));
        assert!(!ring_hand_off(FUSE_GETXATTR, &[0; 3]));
        // No terminating NUL: the whole rest is the name.
        let mut v = vec![0u8; GETXATTR_IN];
        v.extend_from_slice(report::USAGE_XATTR.as_bytes());
        assert!(ring_hand_off(FUSE_GETXATTR, &v));
    }
}
