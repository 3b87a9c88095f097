//! Snapshots.
