//! Staging and atomic install of a transferred state. Artifacts are written into a
//! staging directory beside the live one; install fsyncs them, then swaps the two
//! directories in one `renameat2(RENAME_EXCHANGE)`. A crash at any point leaves the live
//! directory holding the old state or the new one, never a mix; `recover` clears what
//! a crash left in the staging directory.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
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
    open: Option<(u32, File)>,
    /// With `sync_every`: bytes appended since the open file was last synced.
    unsynced: u64,
    sync_every: Option<u64>,
}

impl FileSink {
    /// A sink writing into `dir`, emptied first (a staging area holds one transfer).
    pub fn create(dir: &Path) -> std::io::Result<FileSink> {
        if dir.exists() {
            fs::remove_dir_all(dir)?;
        }
        fs::create_dir_all(dir)?;
        Ok(FileSink {
            dir: dir.to_path_buf(),
            open: None,
            unsynced: 0,
            sync_every: None,
        })
    }

    /// Syncs each artifact's data every `bytes` while it is written, so the staged state
    /// reaches the disk as a steady stream rather than one large writeback at install
    /// (which would stall other writers' fsyncs on the same disk).
    pub fn sync_every(mut self, bytes: u64) -> FileSink {
        self.sync_every = Some(bytes.max(1));
        self
    }

    fn file(&mut self, index: u32, truncate: bool) -> std::io::Result<&mut File> {
        if truncate || self.open.as_ref().map(|(i, _)| *i) != Some(index) {
            let file = OpenOptions::new()
                .create(true)
                .append(!truncate)
                .write(true)
                .truncate(truncate)
                .open(self.dir.join(artifact_file(index)))?;
            self.open = Some((index, file));
        }
        match &mut self.open {
            Some((_, file)) => Ok(file),
            None => Err(std::io::Error::other("no open artifact")),
        }
    }
}

impl ArtifactSink for FileSink {
    fn begin(&mut self, index: u32) -> std::io::Result<()> {
        self.file(index, true).map(|_| ())
    }

    fn append(&mut self, index: u32, bytes: &[u8]) -> std::io::Result<()> {
        let sync_every = self.sync_every;
        let file = self.file(index, false)?;
        file.write_all(bytes)?;
        if let Some(every) = sync_every {
            self.unsynced += bytes.len() as u64;
            if self.unsynced >= every {
                self.unsynced = 0;
                if let Some((_, file)) = &self.open {
                    file.sync_data()?;
                }
            }
        }
        Ok(())
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
