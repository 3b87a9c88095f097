//! Typed errors with the context an operator or caller can act on.
//!
//! Faults found on disk (a bad checksum, a torn write) are expected conditions and come
//! back as values; violated invariants of this crate are bugs and assert.

use std::path::PathBuf;

/// Everything the journal, superblock, snapshot and segment code can fail with.
#[derive(Debug)]
pub enum JournalError {
    /// A configuration value is out of bounds.
    Config {
        key: &'static str,
        value: u64,
        rule: &'static str,
    },
    /// An operating-system IO call failed.
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not what this crate wrote (bad magic, version or both meta copies bad).
    Format { path: PathBuf, reason: &'static str },
    /// The file is shorter than its recorded geometry.
    FileTruncated {
        path: PathBuf,
        size: u64,
        expected: u64,
    },
    /// The entry for `op` failed its checksum (header identity or body seal) when read.
    SlotChecksum { slot: u64, op: u64 },
    /// The journal holds no valid entry for `op` (never written, faulty, or wrapped out).
    EntryMissing { op: u64 },
    /// A prepare handed to the journal is malformed.
    PrepareInvalid { reason: &'static str },
    /// A prepare does not fit a slot.
    PrepareTooLarge { size: u64, slot_size: u64 },
    /// Appends must be contiguous: `op` must be `expected`.
    OpOutOfOrder { op: u64, expected: u64 },
    /// Writing `op` would overwrite an op the last checkpoint does not cover yet.
    WrapBeyondCheckpoint {
        op: u64,
        op_checkpoint: u64,
        slot_count: u64,
    },
    /// A repair write for an op that is not faulty (or outside the journal window).
    RepairUnexpected { op: u64 },
    /// Truncation below the checkpoint is not allowed.
    TruncateBelowCheckpoint { op: u64, op_checkpoint: u64 },
    /// No copy of the superblock is valid.
    SuperblockLost { path: PathBuf },
    /// A checkpoint that goes backwards or past the journal head.
    CheckpointInvalid { op: u64, reason: &'static str },
    /// A snapshot file failed verification.
    SnapshotInvalid { path: PathBuf, reason: &'static str },
    /// A batch handed to a segment log failed verification or does not follow the log.
    BatchRejected { base_offset: u64, reason: String },
    /// A segment holds a damaged record before its end (not a torn tail).
    SegmentCorrupt { path: PathBuf, position: u64 },
    /// An offset below the log's start (deleted) or at/after its end.
    OffsetOutOfRange { offset: u64, start: u64, end: u64 },
}

impl JournalError {
    /// Wraps an IO error with the operation and path it came from.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: impl IntoIoError) -> Self {
        JournalError::Io {
            op,
            path: path.into(),
            source: source.into_io_error(),
        }
    }
}

/// An IO call's error as the `std::io::Error` it carries, with the operating system's
/// code (ENOSPC, EMFILE) still readable by `raw_os_error`: callers decide on it (a full
/// disk stops a partition group, not the node). glommio's own conversion of a file
/// operation's error keeps only its kind and text, so its errors are unwrapped here.
pub trait IntoIoError {
    fn into_io_error(self) -> std::io::Error;
}

impl IntoIoError for std::io::Error {
    fn into_io_error(self) -> std::io::Error {
        self
    }
}

impl<T> IntoIoError for glommio::GlommioError<T> {
    fn into_io_error(self) -> std::io::Error {
        match self {
            glommio::GlommioError::IoError(source)
            | glommio::GlommioError::EnhancedIoError { source, .. } => source,
            other => other.into(),
        }
    }
}

impl std::fmt::Display for JournalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use JournalError::*;
        match self {
            Config { key, value, rule } => write!(f, "config {key} = {value}: {rule}"),
            Io { op, path, source } => write!(f, "{op} {}: {source}", path.display()),
            Format { path, reason } => write!(f, "{}: {reason}", path.display()),
            FileTruncated {
                path,
                size,
                expected,
            } => write!(
                f,
                "{}: {size} bytes, expected at least {expected}",
                path.display()
            ),
            SlotChecksum { slot, op } => {
                write!(f, "journal slot {slot} (op {op}) fails its checksum")
            }
            EntryMissing { op } => write!(f, "journal holds no valid entry for op {op}"),
            PrepareInvalid { reason } => write!(f, "prepare rejected: {reason}"),
            PrepareTooLarge { size, slot_size } => {
                write!(
                    f,
                    "prepare of {size} bytes exceeds the {slot_size}-byte slot"
                )
            }
            OpOutOfOrder { op, expected } => write!(f, "append of op {op}, expected op {expected}"),
            WrapBeyondCheckpoint {
                op,
                op_checkpoint,
                slot_count,
            } => write!(
                f,
                "op {op} would overwrite op {} but the checkpoint is at op {op_checkpoint} \
                 ({slot_count} slots); checkpoint first",
                op - slot_count
            ),
            RepairUnexpected { op } => write!(f, "repair of op {op}, which is not faulty"),
            TruncateBelowCheckpoint { op, op_checkpoint } => {
                write!(
                    f,
                    "truncate to op {op} below the checkpoint at op {op_checkpoint}"
                )
            }
            SuperblockLost { path } => write!(f, "{}: no superblock copy is valid", path.display()),
            CheckpointInvalid { op, reason } => write!(f, "checkpoint at op {op}: {reason}"),
            SnapshotInvalid { path, reason } => write!(f, "snapshot {}: {reason}", path.display()),
            BatchRejected {
                base_offset,
                reason,
            } => write!(f, "batch at offset {base_offset} rejected: {reason}"),
            SegmentCorrupt { path, position } => write!(
                f,
                "segment {} is damaged at byte {position}, before its end",
                path.display()
            ),
            OffsetOutOfRange { offset, start, end } => {
                write!(f, "offset {offset} outside the log [{start}, {end})")
            }
        }
    }
}

impl std::error::Error for JournalError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            JournalError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Shorthand used across the crate.
pub type Result<T, E = JournalError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// A DMA write that meets a full disk fails as glommio reports it: its file
    /// operation's error, with the operation, path and descriptor.
    fn dma_write_error(code: i32) -> glommio::GlommioError<()> {
        glommio::GlommioError::EnhancedIoError {
            source: std::io::Error::from_raw_os_error(code),
            op: "Writing",
            path: Some(PathBuf::from(
                "/data/partitions/1-1-0/00000000000000000000.log",
            )),
            fd: Some(7),
        }
    }

    #[test]
    fn a_glommio_file_error_keeps_its_os_code() {
        let error = JournalError::io("write", "/data/x.log", dma_write_error(libc::ENOSPC));
        let JournalError::Io { source, .. } = &error else {
            panic!("not an IO error: {error}");
        };
        assert_eq!(source.raw_os_error(), Some(libc::ENOSPC));
        let source = std::error::Error::source(&error).expect("a source");
        let source = source
            .downcast_ref::<std::io::Error>()
            .expect("an io::Error");
        assert_eq!(source.raw_os_error(), Some(libc::ENOSPC));
        assert!(
            error.to_string().starts_with("write /data/x.log: "),
            "{error}"
        );
        // glommio's plain IO errors, and std's, pass as they are.
        let plain =
            glommio::GlommioError::<()>::IoError(std::io::Error::from_raw_os_error(libc::EMFILE));
        assert_eq!(plain.into_io_error().raw_os_error(), Some(libc::EMFILE));
        let std = std::io::Error::from_raw_os_error(libc::EIO);
        assert_eq!(std.into_io_error().raw_os_error(), Some(libc::EIO));
        // What glommio's own conversion would have kept: the kind, not the code.
        let converted: std::io::Error = dma_write_error(libc::ENOSPC).into();
        assert_eq!(converted.raw_os_error(), None);
    }
}
