//! Disk space on one node (docs/operations.md, "Disk space"): the storage budget, the
//! reserve that keeps room for the consensus state, and the verdict that refuses new
//! writes.
//!
//! - The budget: `storage.min_free_bytes` of the file system stay free and the node's
//!   data stays below `storage.max_used_bytes`. Outside it the node refuses new writes
//!   (SendMessages, metadata creations) with StorageFull, and keeps serving reads and
//!   consensus.
//! - A write that meets a full disk anyway (another process filled it) is not
//!   acknowledged: the partition group it belonged to stops as a crashed replica would,
//!   the reserve file is given back to the file system, and writes are refused until
//!   the budget is met again; then the group restarts from its storage.
//! - The reserve, `storage-reserve` in the data directory, holds `storage.reserve_bytes`
//!   allocated while space allows. Given back on a full disk, it is the room superblock,
//!   checkpoint and view-change writes need (the metadata journal is preallocated).

use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::DaemonError;

/// The reserve file in the data directory.
pub const RESERVE_FILE: &str = "storage-reserve";

/// The configured budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    pub min_free_bytes: u64,
    /// 0: no limit.
    pub max_used_bytes: u64,
    pub reserve_bytes: u64,
}

/// Why the node refuses new writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    /// Free space is below `storage.min_free_bytes`.
    MinFree,
    /// The node's data reached `storage.max_used_bytes`.
    MaxUsed,
    /// A write met a full disk; cleared once the budget is met and the reserve refilled.
    NoSpace,
    /// The reserve is not allocated and the file system has no room for it.
    NoReserve,
}

impl Full {
    /// The reason as the StorageFull reply body, the logs and /stats say it.
    pub fn reason(self) -> &'static str {
        match self {
            Full::MinFree => "free space below storage.min_free_bytes",
            Full::MaxUsed => "data reached storage.max_used_bytes",
            Full::NoSpace => "a write met a full disk",
            Full::NoReserve => "no room for storage.reserve_bytes",
        }
    }
}

impl DaemonError {
    /// A partition group's IO error: the stop of that group when it met a full disk,
    /// else the error itself.
    pub(super) fn stops_group_when_full(self) -> DaemonError {
        match self.group() {
            Some(group) if self.is_no_space() => DaemonError::NoSpace {
                group,
                source: Some(Box::new(self)),
            },
            _ => self,
        }
    }
}

/// Free and total bytes of the file system holding `path` (for unprivileged users).
pub fn file_system_space(path: &Path) -> std::io::Result<(u64, u64)> {
    let dir = std::fs::File::open(path)?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `stat` is a valid statvfs buffer and the descriptor is open.
    if unsafe { libc::fstatvfs(dir.as_raw_fd(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let unit = stat.f_frsize as u64;
    Ok((
        (stat.f_bavail as u64).saturating_mul(unit),
        (stat.f_blocks as u64).saturating_mul(unit),
    ))
}

/// The node's view of its disk.
pub struct StorageState {
    dir: PathBuf,
    budget: Budget,
    pub free_bytes: u64,
    pub total_bytes: u64,
    pub used_bytes: u64,
    /// Bytes the reserve file holds now.
    pub reserve_held: u64,
    full: Option<Full>,
    /// A write met a full disk since the budget was last met.
    no_space: bool,
    /// Writes that met a full disk, and requests refused for storage.
    pub no_space_errors: u64,
    pub refused: u64,
    /// The free space could not be read at the last refresh (logged once per change).
    space_unreadable: bool,
}

impl StorageState {
    /// Reads what the reserve file holds (it is filled by `refresh` while space allows).
    pub fn open(dir: &Path, budget: Budget) -> StorageState {
        let reserve_held = std::fs::metadata(dir.join(RESERVE_FILE)).map_or(0, |m| m.len());
        StorageState {
            dir: dir.to_path_buf(),
            budget,
            free_bytes: 0,
            total_bytes: 0,
            used_bytes: 0,
            reserve_held,
            full: None,
            no_space: false,
            no_space_errors: 0,
            refused: 0,
            space_unreadable: false,
        }
    }

    /// Why new writes are refused, if they are.
    pub fn full(&self) -> Option<Full> {
        self.full
    }

    /// Re-reads the file system's free space with the node's data at `used_bytes`,
    /// refills the reserve when the budget allows, and decides whether writes are
    /// refused. Logs once per change.
    pub fn refresh(&mut self, used_bytes: u64) {
        self.used_bytes = used_bytes;
        match file_system_space(&self.dir) {
            Ok((free, total)) => {
                self.free_bytes = free;
                self.total_bytes = total;
                if std::mem::replace(&mut self.space_unreadable, false) {
                    tracing::info!(dir = %self.dir.display(), "free space readable again");
                }
            }
            Err(error) => {
                if !std::mem::replace(&mut self.space_unreadable, true) {
                    tracing::warn!(dir = %self.dir.display(), %error, "cannot read free space");
                }
            }
        }
        // Refilled only while as much again stays free besides the budget: a disk that
        // just gave the reserve back is not emptied by taking it again.
        let want = self.budget.reserve_bytes;
        let missing = want.saturating_sub(self.reserve_held);
        if missing > 0 && self.free_bytes >= self.budget.min_free_bytes + 2 * missing {
            self.fill_reserve();
        }
        let reserve_held = self.reserve_held >= want;
        let budget_met = self.free_bytes >= self.budget.min_free_bytes;
        if self.no_space && budget_met && reserve_held {
            self.no_space = false;
        }
        let full = if self.no_space {
            Some(Full::NoSpace)
        } else if !reserve_held {
            Some(Full::NoReserve)
        } else if !budget_met {
            Some(Full::MinFree)
        } else if self.budget.max_used_bytes != 0 && used_bytes >= self.budget.max_used_bytes {
            Some(Full::MaxUsed)
        } else {
            None
        };
        self.set_full(full);
    }

    fn set_full(&mut self, full: Option<Full>) {
        if full == self.full {
            return;
        }
        match full {
            Some(why) => tracing::warn!(
                free_bytes = self.free_bytes,
                used_bytes = self.used_bytes,
                "storage full: new writes are refused ({})",
                why.reason()
            ),
            None => tracing::info!(
                free_bytes = self.free_bytes,
                used_bytes = self.used_bytes,
                "storage within budget: writes accepted again"
            ),
        }
        self.full = full;
    }

    /// A write met a full disk (`what` says which): writes are refused and the reserve
    /// goes back to the file system, so consensus writes find room.
    pub fn on_no_space(&mut self, what: impl std::fmt::Display) {
        self.no_space_errors += 1;
        if !self.no_space {
            tracing::error!("{what}: the disk is full; writes refused until space returns");
        }
        self.no_space = true;
        self.release_reserve();
        self.set_full(Some(Full::NoSpace));
    }

    /// Gives the reserve back to the file system; true when it held anything.
    pub fn release_reserve(&mut self) -> bool {
        if self.reserve_held == 0 {
            return false;
        }
        let path = self.dir.join(RESERVE_FILE);
        match std::fs::remove_file(&path) {
            Ok(()) => {
                tracing::warn!(bytes = self.reserve_held, "storage reserve released");
                self.reserve_held = 0;
                true
            }
            Err(error) => {
                tracing::error!(path = %path.display(), %error, "cannot release the storage reserve");
                false
            }
        }
    }

    /// Allocates the reserve file to its configured size (blocks, not a sparse file).
    fn fill_reserve(&mut self) {
        let path = self.dir.join(RESERVE_FILE);
        let want = self.budget.reserve_bytes;
        let result = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .and_then(|file| {
                // SAFETY: the descriptor is open for writing; the range is within i64.
                let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, want as libc::off_t) };
                if rc != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                file.sync_all()
            });
        match result {
            Ok(()) => self.reserve_held = want,
            Err(error) => {
                // Whatever was allocated is given back: a half reserve is not counted.
                let _ = std::fs::remove_file(&path);
                self.reserve_held = 0;
                tracing::warn!(path = %path.display(), %error, "cannot allocate the storage reserve");
            }
        }
    }

    /// Counts a request refused for storage.
    pub fn refuse(&mut self) -> &'static str {
        self.refused += 1;
        self.full.map_or("storage full", Full::reason)
    }
}

/// Ticks between reads of the free space (with 10 ms ticks: 100 ms).
pub const REFRESH_TICKS: u64 = 10;

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(min_free: u64, max_used: u64, reserve: u64) -> Budget {
        Budget {
            min_free_bytes: min_free,
            max_used_bytes: max_used,
            reserve_bytes: reserve,
        }
    }

    #[test]
    fn the_budget_decides_and_a_full_disk_latches_until_the_reserve_is_back() {
        let dir = tempfile::tempdir().unwrap();
        let (free, _) = file_system_space(dir.path()).unwrap();
        // Within budget: the reserve is allocated, writes accepted.
        let mut state = StorageState::open(dir.path(), budget(0, 0, 1 << 20));
        state.refresh(0);
        assert_eq!(state.full(), None);
        assert_eq!(state.reserve_held, 1 << 20);
        let on_disk = std::fs::metadata(dir.path().join(RESERVE_FILE)).unwrap();
        assert_eq!(on_disk.len(), 1 << 20);
        // The data limit.
        let mut limited = StorageState::open(dir.path(), budget(0, 1000, 1 << 20));
        limited.refresh(1000);
        assert_eq!(limited.full(), Some(Full::MaxUsed));
        limited.refresh(999);
        assert_eq!(limited.full(), None);
        // More free space asked than the file system has.
        let mut short = StorageState::open(dir.path(), budget(free * 4 + (1 << 40), 0, 0));
        short.refresh(0);
        assert_eq!(short.full(), Some(Full::MinFree));
        assert_eq!(short.refuse(), Full::MinFree.reason());
        assert_eq!(short.refused, 1);
        // A write met a full disk: the reserve goes, writes stay refused until the next
        // refresh finds the budget met and refills it.
        state.on_no_space("partition 1/1/0");
        assert_eq!(state.full(), Some(Full::NoSpace));
        assert_eq!(state.reserve_held, 0);
        assert!(!dir.path().join(RESERVE_FILE).exists());
        state.refresh(0);
        assert_eq!(state.full(), None);
        assert_eq!(state.reserve_held, 1 << 20);
        assert_eq!(state.no_space_errors, 1);
    }
}
