//! Rounds of side-file writes made durable together: many partition groups' VSR
//! superblocks written on the blocking pool, covered by one sync of their file system.

use std::fs::File;
use std::path::Path;

use replication::vsr::Superblock as VsrSuperblock;

use super::{io, write_vsr_superblock, write_vsr_superblock_unsynced, FileError};

/// One sync of a file system shared by a round of writes (syncfs: one journal commit
/// and one device flush for all of them).
pub struct SharedSync {
    handle: File,
    device: u64,
    path: String,
}

impl SharedSync {
    /// A sync of `dir`'s file system, opened before the writes it is to cover: the
    /// kernel reports a write-back error to a sync through a handle opened before the
    /// error, so one that struck a write before the sync is not missed.
    pub fn open(dir: &Path) -> Result<SharedSync, FileError> {
        let handle = File::open(dir).map_err(io(dir))?;
        let device = handle.metadata().map_err(io(dir))?;
        Ok(SharedSync {
            handle,
            device: std::os::unix::fs::MetadataExt::dev(&device),
            path: dir.display().to_string(),
        })
    }

    /// The file system's device: a directory on it is covered by the sync
    /// (`write_round`).
    pub fn device(&self) -> u64 {
        self.device
    }

    /// Forces every write so far on the file system to stable storage; fails when a
    /// write-back failed since the sync was opened.
    pub fn sync(&self) -> Result<(), FileError> {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid open descriptor; syncfs takes no pointers.
        if unsafe { libc::syncfs(self.handle.as_raw_fd()) } != 0 {
            return Err(FileError::Io {
                path: self.path.clone(),
                error: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }
}

/// Whether `dir` is on `device` (a directory on another file system syncs its own).
fn on_device(dir: &Path, device: u64) -> bool {
    std::fs::metadata(dir).is_ok_and(|m| std::os::unix::fs::MetadataExt::dev(&m) == device)
}

/// One file write of a round (`write_round`).
pub trait RoundWrite: Send + 'static {
    /// The directory the file is in.
    fn dir(&self) -> &Path;
    /// Writes the file: `covered`, to be made durable by the round's shared sync;
    /// otherwise durable on its own.
    fn write(&self, covered: bool) -> Result<(), FileError>;
}

/// A partition group's VSR superblock: written in place unsynced when covered.
impl RoundWrite for (u64, std::path::PathBuf, VsrSuperblock) {
    fn dir(&self) -> &Path {
        &self.1
    }

    fn write(&self, covered: bool) -> Result<(), FileError> {
        if covered {
            write_vsr_superblock_unsynced(&self.1, &self.2)
        } else {
            write_vsr_superblock(&self.1, &self.2)
        }
    }
}

/// Does the writes of a round on the blocking pool, every one in flight before the
/// first is awaited. A write whose directory is on `shared`'s file system is covered:
/// the caller makes it durable with that sync. Returns each write in order, whether it
/// is covered, and its outcome. Under a shared sync the writes only reach the page
/// cache, so they go `SHARED_CHUNK` to a blocking task (a task per write cost more in
/// hand-offs than the writes themselves); each write that syncs itself gets its own.
pub async fn write_round<W: RoundWrite>(
    writes: Vec<W>,
    shared: Option<&SharedSync>,
) -> Vec<(W, bool, Result<(), FileError>)> {
    let device = shared.map(SharedSync::device);
    let chunk = if shared.is_some() { SHARED_CHUNK } else { 1 };
    let mut chunks: Vec<Vec<W>> = Vec::new();
    for w in writes {
        match chunks.last_mut() {
            Some(last) if last.len() < chunk => last.push(w),
            _ => chunks.push(vec![w]),
        }
    }
    let tasks: Vec<_> = chunks
        .into_iter()
        .map(|chunk| {
            glommio::spawn_local(glommio::executor().spawn_blocking(move || {
                chunk
                    .into_iter()
                    .map(|w| {
                        let covered = device.is_some_and(|device| on_device(w.dir(), device));
                        let written = w.write(covered);
                        (w, covered, written)
                    })
                    .collect::<Vec<_>>()
            }))
        })
        .collect();
    let mut done = Vec::new();
    for task in tasks {
        done.extend(task.await);
    }
    done
}

/// Writes a blocking task does in a round under a shared sync (`write_round`).
const SHARED_CHUNK: usize = 128;
