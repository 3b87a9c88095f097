//! The daemon's errors: where each happened (the consensus group, the op, the step) and
//! the failure it wraps, typed, so a full disk or an exhausted descriptor table is read
//! from the operating system's code.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use journal::{IntoIoError, JournalError};
use replication::bus::BusError;
use replication::wire::batch::BatchError;
use replication::wire::GroupKind;

use super::{files, prepares};

/// Why the daemon stopped with an error, each with the exit code it maps to; or, for
/// `NoSpace`, why one partition group stops while the node goes on.
///
/// The runtime variants say where it happened (the consensus group, the op where one
/// is known, the step) and carry the failure they wrap as a typed source, so a full
/// disk or an exhausted descriptor table is read from the operating system's code
/// (`is_no_space`, `is_out_of_open_files`), not from a message.
#[derive(Debug)]
pub enum DaemonError {
    /// Bad usage or configuration, as text for the operator: exit 2.
    Config(String),
    /// The data directory is not one this command may use as it is.
    DataDir { path: PathBuf, reason: &'static str },
    /// An executor or thread of the daemon could not start.
    Start {
        what: &'static str,
        source: std::io::Error,
    },
    /// A listener of the daemon's own (the stats endpoint) could not bind.
    Listen {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// The message bus could not start.
    Bus(BusError),
    /// A file-system call of the daemon's own (not the journal crate's) failed.
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The journal crate failed: the metadata journal, superblock and snapshots, or a
    /// partition's segment log and consumer offsets.
    Journal {
        group: u64,
        op: Option<u64>,
        what: &'static str,
        source: JournalError,
    },
    /// A side file failed: genesis, VSR superblock, checkpoint (files.rs).
    File {
        group: u64,
        what: &'static str,
        source: files::FileError,
    },
    /// A partition group's prepare log failed (prepares.rs).
    PrepareLog {
        group: u64,
        op: Option<u64>,
        source: prepares::PrepareLogError,
    },
    /// A batch read back, committed or transferred fails verification.
    Batch {
        group: u64,
        op: u64,
        what: &'static str,
        source: BatchError,
    },
    /// Other data read back, committed or transferred fails validation.
    Corrupt {
        group: u64,
        op: Option<u64>,
        detail: String,
    },
    /// The node's own bookkeeping broke: a bug, not input.
    Internal {
        group: u64,
        op: Option<u64>,
        detail: &'static str,
    },
    /// A partition group's write met a full disk: the group stops (as a crashed
    /// replica) until space returns; the node goes on (storage.rs). `source` is the
    /// write's error; None when the group's journal lane failed on it before.
    NoSpace {
        group: u64,
        source: Option<Box<DaemonError>>,
    },
}

impl DaemonError {
    pub fn exit_code(&self) -> u8 {
        match self {
            DaemonError::Config(_) => 2,
            _ => 1,
        }
    }

    /// A failure of the journal crate in `group` (at `op` when known) during `what`.
    pub(crate) fn journal(
        group: u64,
        op: Option<u64>,
        what: &'static str,
    ) -> impl Fn(JournalError) -> DaemonError + Copy {
        move |source| DaemonError::Journal {
            group,
            op,
            what,
            source,
        }
    }

    /// A side file's failure in `group` during `what`.
    pub(crate) fn file(
        group: u64,
        what: &'static str,
    ) -> impl Fn(files::FileError) -> DaemonError + Copy {
        move |source| DaemonError::File {
            group,
            what,
            source,
        }
    }

    /// A prepare log's failure in `group` (at `op` when known).
    pub(crate) fn prepare_log(
        group: u64,
        op: Option<u64>,
    ) -> impl Fn(prepares::PrepareLogError) -> DaemonError + Copy {
        move |source| DaemonError::PrepareLog { group, op, source }
    }

    /// A file-system call's failure on `path` during `what`.
    pub(crate) fn io<'a>(
        what: &'static str,
        path: &'a Path,
    ) -> impl Fn(std::io::Error) -> DaemonError + Copy + 'a {
        move |source| DaemonError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    }

    /// An executor or thread that could not start (`what`); glommio's errors keep
    /// their OS code.
    pub(crate) fn start<E: IntoIoError>(what: &'static str) -> impl FnOnce(E) -> DaemonError {
        move |source| DaemonError::Start {
            what,
            source: source.into_io_error(),
        }
    }

    /// The operating system's code of the IO error this one comes from, if any: the
    /// first io::Error down the `source` chain that carries one.
    pub fn os_error(&self) -> Option<i32> {
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(error) = next {
            if let Some(code) = error
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::raw_os_error)
            {
                return Some(code);
            }
            next = error.source();
        }
        None
    }

    /// Whether a write met a full disk or quota (ENOSPC, EDQUOT), or a group stopped
    /// for it.
    pub fn is_no_space(&self) -> bool {
        matches!(self, DaemonError::NoSpace { .. })
            || matches!(self.os_error(), Some(libc::ENOSPC | libc::EDQUOT))
    }

    /// Whether the process or the system ran out of file descriptors (EMFILE, ENFILE).
    pub fn is_out_of_open_files(&self) -> bool {
        matches!(self.os_error(), Some(libc::EMFILE | libc::ENFILE))
    }

    /// The consensus group the error happened in, if it happened in one.
    pub fn group(&self) -> Option<u64> {
        match self {
            DaemonError::Journal { group, .. }
            | DaemonError::File { group, .. }
            | DaemonError::PrepareLog { group, .. }
            | DaemonError::Batch { group, .. }
            | DaemonError::Corrupt { group, .. }
            | DaemonError::Internal { group, .. }
            | DaemonError::NoSpace { group, .. } => Some(*group),
            _ => None,
        }
    }

    /// The op the error happened at, if it is known.
    pub fn op(&self) -> Option<u64> {
        match self {
            DaemonError::Journal { op, .. }
            | DaemonError::PrepareLog { op, .. }
            | DaemonError::Corrupt { op, .. }
            | DaemonError::Internal { op, .. } => *op,
            DaemonError::Batch { op, .. } => Some(*op),
            DaemonError::NoSpace {
                source: Some(source),
                ..
            } => source.op(),
            _ => None,
        }
    }

    /// What went wrong, without the group and op (`Display` puts them first).
    fn fmt_detail(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DaemonError::Config(text) => f.write_str(text),
            DaemonError::DataDir { path, reason } => write!(f, "{} {reason}", path.display()),
            DaemonError::Start { what, source } => write!(f, "{what}: {source}"),
            DaemonError::Listen { what, addr, source } => {
                write!(f, "cannot listen on {addr} ({what}): {source}")
            }
            DaemonError::Bus(source) => write!(f, "message bus: {source}"),
            DaemonError::Io { what, path, source } => {
                write!(f, "{}: {what}: {source}", path.display())
            }
            DaemonError::Journal { what, source, .. } => write!(f, "{what}: {source}"),
            DaemonError::File { what, source, .. } => write!(f, "{what}: {source}"),
            DaemonError::PrepareLog { source, .. } => write!(f, "{source}"),
            DaemonError::Batch { what, source, .. } => write!(f, "{what}: {source}"),
            DaemonError::Corrupt { detail, .. } => f.write_str(detail),
            DaemonError::Internal { detail, .. } => f.write_str(detail),
            DaemonError::NoSpace { source, .. } => {
                f.write_str("the disk is full: ")?;
                match source {
                    Some(source) => source.fmt_detail(f),
                    None => f.write_str("a journal write met it"),
                }
            }
        }
    }
}

/// Where an error happened: a consensus group and the op, when known.
struct Place {
    group: u64,
    op: Option<u64>,
}

impl core::fmt::Display for Place {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match replication::wire::group_kind(self.group) {
            Ok(GroupKind::Metadata) => f.write_str("metadata group")?,
            Ok(GroupKind::Partition(key)) => write!(
                f,
                "partition group {} ({}/{}/{})",
                self.group, key.stream, key.topic, key.partition
            )?,
            Err(_) => write!(f, "group {}", self.group)?,
        }
        match self.op {
            Some(op) => write!(f, " op {op}"),
            None => Ok(()),
        }
    }
}

impl core::fmt::Display for DaemonError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if let Some(group) = self.group() {
            let op = self.op();
            write!(f, "{}: ", Place { group, op })?;
        }
        self.fmt_detail(f)
    }
}

impl std::error::Error for DaemonError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DaemonError::Start { source, .. }
            | DaemonError::Listen { source, .. }
            | DaemonError::Io { source, .. } => Some(source),
            DaemonError::Bus(source) => Some(source),
            DaemonError::Journal { source, .. } => Some(source),
            DaemonError::File { source, .. } => Some(source),
            DaemonError::PrepareLog { source, .. } => Some(source),
            DaemonError::Batch { source, .. } => Some(source),
            DaemonError::NoSpace {
                source: Some(source),
                ..
            } => Some(source.as_ref()),
            DaemonError::Config(_)
            | DaemonError::DataDir { .. }
            | DaemonError::Corrupt { .. }
            | DaemonError::Internal { .. }
            | DaemonError::NoSpace { source: None, .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use replication::wire::{PartitionKey, METADATA_GROUP};

    fn partition_group() -> u64 {
        PartitionKey {
            stream: 1,
            topic: 2,
            partition: 3,
        }
        .pack()
        .unwrap()
    }

    fn write_error(group: u64, code: i32) -> DaemonError {
        DaemonError::journal(group, Some(9), "partition sync")(JournalError::io(
            "fdatasync",
            "/data/partitions/1-2-3/00000000000000000000.log",
            std::io::Error::from_raw_os_error(code),
        ))
    }

    #[test]
    fn messages_say_where_first_and_keep_the_source_text() {
        let group = partition_group();
        let error = write_error(group, libc::EIO);
        assert_eq!(
            error.to_string(),
            format!(
                "partition group {group} (1/2/3) op 9: partition sync: fdatasync \
                 /data/partitions/1-2-3/00000000000000000000.log: {}",
                std::io::Error::from_raw_os_error(libc::EIO)
            )
        );
        let stopped = DaemonError::NoSpace {
            group,
            source: Some(Box::new(write_error(group, libc::ENOSPC))),
        };
        let text = stopped.to_string();
        assert!(
            text.starts_with(&format!(
                "partition group {group} (1/2/3) op 9: the disk is full: partition sync: "
            )),
            "{text}"
        );
        let metadata = DaemonError::Internal {
            group: METADATA_GROUP,
            op: None,
            detail: "journal completions closed",
        };
        assert_eq!(
            metadata.to_string(),
            "metadata group: journal completions closed"
        );
        let refused = DaemonError::DataDir {
            path: PathBuf::from("/data"),
            reason: "is not empty; refusing to format it",
        };
        assert_eq!(
            refused.to_string(),
            "/data is not empty; refusing to format it"
        );
    }

    #[test]
    fn the_source_chain_reaches_the_io_error_and_only_config_exits_2() {
        let error = DaemonError::NoSpace {
            group: partition_group(),
            source: Some(Box::new(write_error(partition_group(), libc::ENOSPC))),
        };
        let mut chain = Vec::new();
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(&error);
        while let Some(error) = next {
            chain.push(error.to_string());
            next = error.source();
        }
        assert_eq!(chain.len(), 4, "{chain:#?}");
        let io = std::error::Error::source(&error)
            .and_then(std::error::Error::source)
            .and_then(std::error::Error::source)
            .and_then(|e| e.downcast_ref::<std::io::Error>())
            .expect("the io::Error at the end of the chain");
        assert_eq!(io.raw_os_error(), Some(libc::ENOSPC));
        assert_eq!(error.exit_code(), 1);
        assert_eq!(DaemonError::Config("bad".into()).exit_code(), 2);
    }

    fn os(code: i32) -> std::io::Error {
        std::io::Error::from_raw_os_error(code)
    }

    /// A partition group's IO failing with `code` through each layer that meets the
    /// disk or the descriptor table.
    fn layered_errors(code: i32) -> Vec<DaemonError> {
        let group = partition_group();
        // As glommio reports a DMA file's failure (the segment log's writes and opens).
        let dma = glommio::GlommioError::<()>::EnhancedIoError {
            source: os(code),
            op: "Writing",
            path: Some(PathBuf::from("/d/00000000000000318000.log")),
            fd: Some(7),
        };
        vec![
            DaemonError::journal(group, Some(3), "journal write")(JournalError::io(
                "write",
                "/d/00000000000000318000.log",
                dma,
            )),
            DaemonError::journal(group, None, "consumer offsets sync")(JournalError::io(
                "write",
                "/d/consumer-offsets.tmp",
                os(code),
            )),
            DaemonError::file(group, "partition checkpoint")(files::FileError::Io {
                path: "/d/vsr-checkpoint".into(),
                error: os(code),
            }),
            // One failed shared sync fails each write it was to cover.
            DaemonError::file(group, "partition VSR superblock")(
                files::FileError::Io {
                    path: "/d".into(),
                    error: os(code),
                }
                .duplicate(),
            ),
            DaemonError::prepare_log(group, None)(prepares::PrepareLogError::Io {
                op: "open",
                path: "/d/vsr-prepares".into(),
                source: os(code),
            }),
            DaemonError::Io {
                what: "sync",
                path: "/d".into(),
                source: os(code),
            },
        ]
    }

    #[test]
    fn a_full_disk_and_running_out_of_descriptors_are_read_from_the_os_code() {
        // (code, a full disk, out of descriptors)
        let cases = [
            (libc::ENOSPC, true, false),
            (libc::EDQUOT, true, false),
            (libc::EMFILE, false, true),
            (libc::ENFILE, false, true),
            (libc::EIO, false, false),
        ];
        for (code, full, out_of_files) in cases {
            for error in layered_errors(code) {
                assert_eq!(error.os_error(), Some(code), "{error}");
                assert_eq!(error.is_no_space(), full, "{error}");
                assert_eq!(error.is_out_of_open_files(), out_of_files, "{error}");
            }
        }
        let text = DaemonError::Corrupt {
            group: partition_group(),
            op: None,
            detail: "No space left on device (os error 28)".into(),
        };
        assert!(!text.is_no_space(), "a message is not an OS code");
        let lane = DaemonError::NoSpace {
            group: partition_group(),
            source: None,
        };
        assert!(lane.is_no_space() && !lane.is_out_of_open_files());
    }

    #[test]
    fn a_full_disk_stops_the_group_and_any_other_error_passes() {
        for error in layered_errors(libc::ENOSPC) {
            let text = error.to_string();
            match error.stops_group_when_full() {
                DaemonError::NoSpace {
                    group,
                    source: Some(source),
                } => {
                    assert_eq!(group, partition_group());
                    assert_eq!(source.to_string(), text);
                }
                // Not a group's: nothing to stop.
                DaemonError::Io { .. } => {}
                other => panic!("not a group's stop: {other}"),
            }
        }
        for error in layered_errors(libc::EIO) {
            let passed = error.stops_group_when_full();
            assert!(!matches!(passed, DaemonError::NoSpace { .. }), "{passed}");
        }
    }
}
