//! Durable storage for the appliance: the metadata journal (direct-IO writes, mmap reads),
//! the redundant superblock, checkpoint snapshots and the partition segment logs.
//!
//! The promise kept here: an entry the journal reports durable is on stable storage, and
//! recovery never trusts bytes that fail their checksum. The crate knows nothing of
//! consensus; it stores 256-byte-header prepares by op and message batches by offset.
//!
//! Verification and recovery decisions are sans-IO (`slot`, `recovery`,
//! `superblock::decode`, `segment::scan`), so tests drive them with arbitrary bytes; the
//! glommio IO shells (`journal`, `superblock`, `segment`) are thin around them.

mod buffers;
pub mod data_dir;
pub mod durability;
pub mod error;
pub mod format;
pub mod inspect;
pub mod journal;
pub mod layout;
pub mod recovery;
pub mod runtime;
pub mod segment;
pub mod slot;
pub mod snapshot;
pub mod superblock;

pub use durability::Durability;
pub use error::{IntoIoError, JournalError, Result};
pub use journal::{join_all, Durable, Journal, JournalIo, PrepareBuffer, RepairServe};
pub use layout::JournalLayout;
pub use recovery::{FaultReason, Recovery, SlotStatus};
pub use superblock::{Superblock, SuperblockFile};
