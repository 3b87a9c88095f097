//! The node core: what a node decides, as plain values driven by events, with no IO of
//! its own. The daemon (`crate::daemon`) performs what these values ask for (writes,
//! syncs, sends) and feeds the completions back; the values never read a clock or touch
//! a file, so each is tested by driving it with events, exhaustive or random, and asserts
//! its own invariants: a transition that cannot happen is a bug and panics, it is never
//! reported as a runtime error.
//!
//! - `forward`: session forwarding's bookkeeping: what a backup owes the clients whose
//!   Register or Logout it forwarded, and which clients the primary prepared for one.
//! - `lane`: one partition group's journal work between the consensus asking for a
//!   JournalAppend and the prepare being reported durable (group commit).
//! - `pending`: what this node prepared and waits on: personal access tokens until their
//!   op commits, client requests until their op is applied here or discarded.
//! - `retention`: which sealed segments retention deletes, and the metadata primary's
//!   proposals in flight.

pub mod forward;
pub mod lane;
pub mod pending;
pub mod retention;

pub use lane::{Alone, Append, InFlight, Io, JournalAt, Lane, STAGED_OPS_MAX};
