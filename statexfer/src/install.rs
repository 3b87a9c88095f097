//! Staging and atomic install of a transferred state. Artifacts are written into a
//! staging directory beside the live one; install fsyncs them, then swaps the two
//! directories in one `renameat2(RENAME_EXCHANGE)`. A crash at any point leaves the live
//! directory holding the old state or the new one, never a mix; `recover` clears what
//! a crash left in the staging directory.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::artifact::ArtifactSink;
use crate::manifest::Manifest;

/// The file in an installed directory that names what it holds.
pub const MANIFEST_FILE: &str = "MANIFEST.ism1";

/// The file name of artifact `index` in a staged or installed directory.
pub fn artifact_file(index: u32) -> String {
    format!("artifact-{index:05}")
}

/// Writes artifacts into a staging directory.
#[derive(Debug)]
pub struct FileSink {
    dir: PathBuf,
    /// Artifacts being written (several at once: the fetcher interleaves their chunks),
    /// least recently written first.
    open: Vec<OpenArtifact>,
    write_back_every: Option<u64>,
}

#[derive(Debug)]
struct OpenArtifact {
    index: u32,
    file: File,
    /// Bytes of the file (appends go to its end).
    len: u64,
    /// With `write_back_every`: where the bytes not yet written back start.
    written_back: u64,
    /// Bytes appended since the file was last synced (made durable).
    unsynced: u64,
}

impl OpenArtifact {
    /// Writes the bytes appended since the last write-back to the disk (`write_back`).
    fn write_back(&mut self) -> std::io::Result<()> {
        write_back(&self.file, self.written_back, self.len - self.written_back)?;
        self.written_back = self.len;
        Ok(())
    }
}

/// Writes `len` bytes of `file` from `offset` to the disk and waits for them, without
/// a data sync: no filesystem journal commit, no disk cache flush (which the other
/// writers' fsyncs on the same disk would queue behind). A later `sync_data` then has
/// only the metadata left to commit.
pub fn write_back(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    let (Ok(offset), Ok(len)) = (
        libc::off64_t::try_from(offset),
        libc::off64_t::try_from(len),
    ) else {
        return Err(std::io::Error::other("range beyond off64_t"));
    };
    // SAFETY: sync_file_range on an open file descriptor the caller owns; no pointers.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, flags) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Artifact files kept open at once (more than a fetcher has in flight).
const OPEN_MAX: usize = 16;

impl FileSink {
    /// A sink writing into `dir`, emptied first (a staging area holds one transfer).
    pub fn create(dir: &Path) -> std::io::Result<FileSink> {
        if dir.exists() {
            fs::remove_dir_all(dir)?;
        }
        fs::create_dir_all(dir)?;
        Ok(FileSink {
            dir: dir.to_path_buf(),
            open: Vec::new(),
            write_back_every: None,
        })
    }

    /// Writes each artifact back to the disk every `bytes` of it while it is written
    /// (without a sync) and syncs its data once it is complete, so the staged state
    /// reaches the disk as a steady stream rather than one large writeback at install
    /// (which would stall other writers' fsyncs on the same disk).
    pub fn write_back_every(mut self, bytes: u64) -> FileSink {
        self.write_back_every = Some(bytes.max(1));
        self
    }

    /// Closes artifact `index` if it is open, syncing what was written since its last
    /// sync (with `write_back_every`).
    fn close(&mut self, index: u32) -> std::io::Result<()> {
        let Some(at) = self.open.iter().position(|o| o.index == index) else {
            return Ok(());
        };
        let open = self.open.remove(at);
        if self.write_back_every.is_some() && open.unsynced > 0 {
            open.file.sync_data()?;
        }
        Ok(())
    }

    /// The open artifact `index` (opened for appending if it is not), most recent last.
    fn open_for_append(&mut self, index: u32) -> std::io::Result<&mut OpenArtifact> {
        match self.open.iter().position(|o| o.index == index) {
            Some(at) => {
                let open = self.open.remove(at);
                self.open.push(open);
            }
            None => {
                if self.open.len() >= OPEN_MAX {
                    let oldest = self.open[0].index;
                    self.close(oldest)?;
                }
                let file = OpenOptions::new()
                    .append(true)
                    .open(self.dir.join(artifact_file(index)))?;
                // Reopened after an eviction, which synced it: everything is durable.
                let len = file.metadata()?.len();
                self.open.push(OpenArtifact {
                    index,
                    file,
                    len,
                    written_back: len,
                    unsynced: 0,
                });
            }
        }
        self.open
            .last_mut()
            .ok_or_else(|| std::io::Error::other("no open artifact"))
    }
}

impl ArtifactSink for FileSink {
    fn begin(&mut self, index: u32) -> std::io::Result<()> {
        // Whatever an earlier attempt wrote is discarded unsynced.
        if let Some(at) = self.open.iter().position(|o| o.index == index) {
            self.open.remove(at);
        }
        File::create(self.dir.join(artifact_file(index))).map(|_| ())
    }

    fn append(&mut self, index: u32, bytes: &[u8]) -> std::io::Result<()> {
        let write_back_every = self.write_back_every;
        let open = self.open_for_append(index)?;
        open.file.write_all(bytes)?;
        open.len += bytes.len() as u64;
        open.unsynced += bytes.len() as u64;
        if let Some(every) = write_back_every {
            if open.len - open.written_back >= every {
                open.write_back()?;
            }
        }
        Ok(())
    }

    fn finish(&mut self, index: u32, _manifest: &Manifest) -> std::io::Result<()> {
        self.close(index)
    }
}

/// fsyncs a directory (its entries are then durable).
pub fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Swaps two directory entries atomically (both must exist).
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    let a = CString::new(a.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let b = CString::new(b.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: both paths are valid NUL-terminated C strings that outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Where an install stops, for crash tests: the steps run in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum InstallStep {
    /// Staged files and the manifest are durable.
    Synced,
    /// Live and staging are swapped (the new state is live).
    Swapped,
    /// The old state is gone.
    Cleaned,
}

/// Installs the verified artifacts in `staging` as `live`, atomically. `stop_after`
/// ends early (tests simulate a crash there).
pub fn install(
    staging: &Path,
    live: &Path,
    manifest: &Manifest,
    stop_after: Option<InstallStep>,
) -> std::io::Result<()> {
    for index in 0..manifest.entries.len() as u32 {
        let path = staging.join(artifact_file(index));
        if !path.exists() {
            File::create(&path)?;
        }
        File::open(&path)?.sync_all()?;
    }
    let mut file = File::create(staging.join(MANIFEST_FILE))?;
    file.write_all(&manifest.encode())?;
    file.sync_all()?;
    fsync_dir(staging)?;
    if stop_after == Some(InstallStep::Synced) {
        return Ok(());
    }
    swap(staging, live, stop_after == Some(InstallStep::Swapped))
}

/// Makes the durable directory `staging` live at `live` in one atomic step (an exchange
/// when `live` exists, a rename otherwise), then removes the old state now at `staging`
/// unless `keep_old`. Everything in `staging` must already be synced.
pub fn swap(staging: &Path, live: &Path, keep_old: bool) -> std::io::Result<()> {
    let parent = live.parent().unwrap_or(Path::new("."));
    if live.exists() {
        exchange(staging, live)?;
    } else {
        fs::rename(staging, live)?;
    }
    fsync_dir(parent)?;
    if keep_old {
        return Ok(());
    }
    if staging.exists() {
        fs::remove_dir_all(staging)?;
        fsync_dir(parent)?;
    }
    Ok(())
}

/// Clears what a crash left in `staging`: an unfinished transfer before the swap, or the
/// old state after it. The live directory is whole either way.
pub fn recover(staging: &Path) -> std::io::Result<()> {
    if staging.exists() {
        fs::remove_dir_all(staging)?;
        if let Some(parent) = staging.parent() {
            fsync_dir(parent)?;
        }
    }
    Ok(())
}

/// Reads the manifest of an installed directory and checks every artifact against it.
pub fn verify_installed(live: &Path) -> Result<Manifest, String> {
    let bytes =
        fs::read(live.join(MANIFEST_FILE)).map_err(|e| format!("reading {MANIFEST_FILE}: {e}"))?;
    let manifest = Manifest::decode(&bytes).map_err(|e| e.to_string())?;
    for (index, entry) in manifest.entries.iter().enumerate() {
        let artifact = fs::read(live.join(artifact_file(index as u32)))
            .map_err(|e| format!("artifact {index}: {e}"))?;
        if !entry.matches(&artifact) {
            return Err(format!(
                "artifact {index} does not match its manifest entry"
            ));
        }
    }
    Ok(manifest)
}
