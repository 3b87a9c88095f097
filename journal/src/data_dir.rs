//! A replica's data directory: formatting it, and opening the superblock, checkpoint
//! snapshot and journal in the order recovery needs (the superblock names the checkpoint
//! op the journal scan starts from and the snapshot that covers everything below it).

use std::path::{Path, PathBuf};

use crate::error::{JournalError, Result};
use crate::journal::{Journal, JOURNAL_FILE};
use crate::layout::JournalLayout;
use crate::recovery::Recovery;
use crate::snapshot::{load_checkpoint, SnapshotInfo};
use crate::superblock::{Superblock, SuperblockFile, SUPERBLOCK_FILE};

/// Folder of checkpoint snapshots inside a data directory.
pub const SNAPSHOTS_DIR: &str = "snapshots";
/// Folder of partition logs inside a data directory (one sub-folder per group).
pub const PARTITIONS_DIR: &str = "partitions";

/// An opened data directory.
pub struct DataDir {
    pub path: PathBuf,
    pub superblock: SuperblockFile,
    pub journal: Journal,
    /// What the journal scan found (faulty ops to repair, torn tail truncated).
    pub recovery: Recovery,
    /// The snapshot at the superblock's checkpoint and its payload, if any.
    pub checkpoint: Option<(SnapshotInfo, Vec<u8>)>,
}

/// Whether `dir` holds a formatted data directory (its superblock is written last).
pub fn is_formatted(dir: &Path) -> bool {
    dir.join(SUPERBLOCK_FILE).exists()
}

/// Formats `dir`: the journal first, the superblock last, so an interrupted format
/// leaves no superblock and can simply be run again. Refuses a formatted directory.
pub async fn format(dir: &Path, layout: JournalLayout, identity: Superblock) -> Result<()> {
    if is_formatted(dir) {
        return Err(JournalError::Format {
            path: dir.into(),
            reason: "already formatted (a superblock exists)",
        });
    }
    std::fs::create_dir_all(dir.join(SNAPSHOTS_DIR))
        .map_err(|e| JournalError::io("create directory", dir, e))?;
    std::fs::create_dir_all(dir.join(PARTITIONS_DIR))
        .map_err(|e| JournalError::io("create directory", dir, e))?;
    let journal_path = dir.join(JOURNAL_FILE);
    match std::fs::remove_file(&journal_path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(JournalError::io("remove", &journal_path, e)),
    }
    Journal::create(&journal_path, layout)
        .await?
        .close()
        .await?;
    let initial = Superblock {
        view: 0,
        log_view: 0,
        commit: 0,
        op_checkpoint: 0,
        snapshot_checksum: 0,
        snapshot_len: 0,
        ..identity
    };
    SuperblockFile::create(&dir.join(SUPERBLOCK_FILE), initial)
        .await?
        .close()
        .await
}

/// Opens a formatted data directory: superblock, then the checkpoint snapshot it names
/// (verified by length and checksum), then the journal from that checkpoint.
pub async fn open(dir: &Path) -> Result<DataDir> {
    let superblock = SuperblockFile::open(&dir.join(SUPERBLOCK_FILE)).await?;
    let current = *superblock.current();
    let checkpoint = load_checkpoint(&dir.join(SNAPSHOTS_DIR), &current)?;
    let (journal, recovery) = Journal::open(&dir.join(JOURNAL_FILE), current.op_checkpoint).await?;
    Ok(DataDir {
        path: dir.into(),
        superblock,
        journal,
        recovery,
        checkpoint,
    })
}

impl DataDir {
    /// Takes a checkpoint at commit op `op` with the state machine's serialized state.
    pub async fn checkpoint(&mut self, op: u64, state: &[u8]) -> Result<SnapshotInfo> {
        crate::snapshot::checkpoint(
            &self.path.join(SNAPSHOTS_DIR),
            &mut self.superblock,
            &mut self.journal,
            op,
            state,
        )
        .await
    }

    /// Installs a metadata snapshot received by state transfer at commit op `op`.
    pub async fn install_checkpoint(&mut self, op: u64, state: &[u8]) -> Result<SnapshotInfo> {
        crate::snapshot::install(
            &self.path.join(SNAPSHOTS_DIR),
            &mut self.superblock,
            &mut self.journal,
            op,
            state,
        )
        .await
    }

    /// Closes the journal and superblock files.
    pub async fn close(self) -> Result<()> {
        self.journal.close().await?;
        self.superblock.close().await
    }
}
