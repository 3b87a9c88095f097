//! glommio executor setup for the journal: a small locked IO-memory pool, and a raised
//! RLIMIT_MEMLOCK when the process may raise it.

use std::future::Future;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use glommio::LocalExecutorBuilder;

/// IO memory each executor locks for registered buffers; buffers beyond it come from the
/// heap (still 4 KiB aligned), so a small pool is enough.
pub const IO_MEMORY_BYTES: usize = 2 * 1024 * 1024;
/// io_uring submission-queue depth.
pub const RING_DEPTH: usize = 128;

/// Raises RLIMIT_MEMLOCK to at least `bytes` if allowed; failures are ignored because the
/// executor works within the default 8 MiB with `IO_MEMORY_BYTES`.
pub fn raise_memlock(bytes: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write a plain struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) != 0 {
            return;
        }
        if limit.rlim_cur >= bytes {
            return;
        }
        limit.rlim_cur = bytes;
        limit.rlim_max = limit.rlim_max.max(bytes);
        libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit);
    }
}

/// A single-threaded glommio executor configured for this crate's IO.
pub fn executor_builder() -> LocalExecutorBuilder {
    executor_builder_on(glommio::Placement::Unbound)
}

/// As `executor_builder`, placed as `placement` says (e.g. pinned to one CPU).
pub fn executor_builder_on(placement: glommio::Placement) -> LocalExecutorBuilder {
    LocalExecutorBuilder::new(placement)
        .io_memory(IO_MEMORY_BYTES)
        .ring_depth(RING_DEPTH)
}

/// Runs `future` to completion on a fresh executor on this thread (tests, tools, bins).
pub fn block_on<T>(future: impl Future<Output = T>) -> std::io::Result<T> {
    let executor = executor_builder()
        .make()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(executor.run(future))
}

/// How an executor learns that its O_DIRECT reads and writes completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskCompletions {
    /// The device raises an interrupt; the executor sleeps while disk IO is in flight.
    Interrupts,
    /// The device has io_uring poll queues: completions are polled for.
    Polled,
}

impl DiskCompletions {
    pub fn name(self) -> &'static str {
        match self {
            DiskCompletions::Interrupts => "interrupts",
            DiskCompletions::Polled => "polled",
        }
    }
}

/// Whether the block device holding `dir` has io_uring poll queues (sysfs
/// `queue/io_poll` of the device, or of the disk a partition is on). `None` when sysfs
/// does not say (no block device behind the file system, or no sysfs).
pub fn device_polls(dir: &Path) -> Option<bool> {
    let dev = std::fs::metadata(dir).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let base = format!("/sys/dev/block/{major}:{minor}");
    ["queue/io_poll", "../queue/io_poll"]
        .iter()
        .find_map(|rel| std::fs::read_to_string(format!("{base}/{rel}")).ok())
        .map(|text| text.trim() == "1")
}

/// Chooses, for the executor running on this thread, how it learns of completed disk IO
/// on the file system holding `dir`; call it before the executor opens any O_DIRECT file
/// there.
///
/// glommio sends a `DmaFile`'s reads and writes to its polled (IOPOLL) ring whenever the
/// kernel accepts IOPOLL for the file, and ext4 and xfs accept it even when the device
/// has no poll queues. Then completions are only found by polling: while any disk IO is in
/// flight the executor cannot sleep and spins on `io_uring_enter` (measured here: 275,000
/// calls a second and half the daemon's CPU during a produce, stolen from the other
/// processes on the host). Unless the device really has poll queues, this makes the
/// executor use its interrupt-driven ring instead. glommio decides once per device and
/// thread, by a read through the first `DmaFile` opened there; a first file opened
/// write-only fails that read, so the device is recorded as not pollable. The choice is
/// then checked with a real write.
pub async fn choose_disk_completions(dir: &Path) -> io::Result<DiskCompletions> {
    if device_polls(dir) == Some(true) {
        return Ok(DiskCompletions::Polled);
    }
    let probe = dir.join(".disk-completions-probe");
    let result = async {
        let write_only = glommio::io::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .dma_open(&probe)
            .await?;
        write_only.close().await?;
        let file = glommio::io::OpenOptions::new()
            .read(true)
            .write(true)
            .dma_open(&probe)
            .await?;
        let before = glommio::executor().io_stats().poll_ring.file_writes().0;
        let mut buf = file.alloc_dma_buffer(file.alignment() as usize);
        buf.as_bytes_mut().fill(0);
        file.write_at(buf, 0).await?;
        let polled = glommio::executor().io_stats().poll_ring.file_writes().0 != before;
        file.close().await?;
        Ok::<_, glommio::GlommioError<()>>(polled)
    }
    .await;
    let _ = std::fs::remove_file(&probe);
    match result {
        Ok(false) => Ok(DiskCompletions::Interrupts),
        Ok(true) => Ok(DiskCompletions::Polled),
        Err(error) => Err(io::Error::other(format!(
            "{}: choosing disk completions: {error}",
            dir.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes through a fresh `DmaFile` in `dir` and says which rings took the writes:
    /// (polled ring, interrupt-driven ring).
    async fn rings_taking_writes(dir: &Path) -> (u64, u64) {
        let before = glommio::executor().io_stats();
        // Read-write, as the journal opens its files (`DmaFile::create` opens write-only).
        let file = glommio::io::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .dma_open(dir.join("data"))
            .await
            .unwrap();
        for i in 0..4u64 {
            let mut buf = file.alloc_dma_buffer(4096);
            buf.as_bytes_mut().fill(i as u8);
            file.write_at(buf, i * 4096).await.unwrap();
        }
        file.fdatasync().await.unwrap();
        file.close().await.unwrap();
        let after = glommio::executor().io_stats();
        (
            after.poll_ring.file_writes().0 - before.poll_ring.file_writes().0,
            after.main_ring.file_writes().0 - before.main_ring.file_writes().0,
        )
    }

    #[test]
    fn without_poll_queues_disk_writes_complete_by_interrupt_after_the_choice() {
        let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        let path = dir.path().to_path_buf();
        let polls = device_polls(&path);
        // Another thread, without the choice: what glommio does on its own here.
        let unchosen = {
            let path = path.join("unchosen");
            std::fs::create_dir(&path).unwrap();
            std::thread::spawn(move || block_on(rings_taking_writes(&path)).unwrap())
                .join()
                .unwrap()
        };
        let (chosen, rings) = block_on(async {
            let chosen = choose_disk_completions(&path).await.unwrap();
            (chosen, rings_taking_writes(&path).await)
        })
        .unwrap();
        eprintln!("device polls: {polls:?}; without the choice (polled, interrupt) writes = {unchosen:?}; chose {chosen:?}: {rings:?}");
        if polls != Some(true) {
            assert_eq!(chosen, DiskCompletions::Interrupts);
            assert_eq!(rings.0, 0, "no write may go to the polled ring");
            assert!(rings.1 >= 4, "the writes went to the interrupt-driven ring");
        } else {
            assert_eq!(chosen, DiskCompletions::Polled);
        }
        assert!(
            !path.join(".disk-completions-probe").exists(),
            "the probe file is removed"
        );
    }
}
