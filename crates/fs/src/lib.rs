//! compfs's FUSE filesystem: a thin translation from kernel requests to `compfs_store` calls.
//! All filesystem semantics live in the store; this crate maps requests to store calls, store
//! errors to errno values, and adds the mount options and the usage/stats reporting interface
//! (virtual xattrs) on top.

pub mod acl;
pub mod adapter;
pub mod atime;
pub mod daemon;
pub mod defrag;
pub mod defrag_run;
pub mod error;
pub mod helper;
pub mod mount;
pub mod nullfs;
pub mod options;
pub mod privilege;
pub mod procstatus;
pub mod property;
pub mod report;
pub mod ring;
pub mod usage;
pub mod walk;

pub use adapter::CompFs;
pub use error::{OptionError, RecordError};
pub use mount::{serve, MountError};
pub use options::MountOptions;
pub use usage::{Figures, UsageReport};
pub use walk::{add_tree_usage, UsageError};
