//! compfs blk: a compressed RAM block device in the manner of Linux zram, served over the
//! Network Block Device protocol.
//!
//! - [`pool`]: zsmalloc-like size-class pool that holds compressed pages.
//! - [`store`]: the page table, same-page and huge-page handling, recompression, writeback and
//!   zram's statistics.
//! - [`nbd`]: the NBD protocol (fixed newstyle handshake, simple and structured replies).
//! - [`meta`]: metadata context negotiation (`base:allocation`).
//! - [`extents`]: block status descriptors from page states.
//! - [`server`]: listeners, one thread per connection, and the control channel.
//! - [`statfmt`]: the `stat` reply of the control channel as `compfs blk stat` prints it.

pub mod conn;
pub mod error;
pub mod extents;
pub mod meta;
pub mod nbd;
pub mod nbd_consts;
pub mod pool;
pub mod server;
pub mod statfmt;
pub mod store;

pub use error::BlkError;
pub use nbd::Export;
pub use pool::{HUGE_THRESHOLD, PAGE};
pub use store::{Config, PageKind, PageState, PageStore, Stats};
