//! glommio executor setup for the journal: a small locked IO-memory pool, and a raised
//! RLIMIT_MEMLOCK when the process may raise it.

use std::future::Future;

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
