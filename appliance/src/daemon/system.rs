//! Process plumbing: logging (and the replica executor's slow steps), the shutdown
//! signal flag, systemd readiness, and the locked-memory limit glommio needs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

static SHUTDOWN: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Async-signal-safe: one atomic store.
    SHUTDOWN.store(true, Ordering::SeqCst);
}

static RELOAD: AtomicBool = AtomicBool::new(false);

extern "C" fn on_reload_signal(_: libc::c_int) {
    // Async-signal-safe: one atomic store.
    RELOAD.store(true, Ordering::SeqCst);
}

/// Installs SIGTERM and SIGINT handlers that only raise the shutdown flag, and a SIGHUP
/// handler that only raises the reload flag (the client port's certificate).
pub fn install_signal_handlers() {
    // SIGHUP restarts interrupted system calls: the daemon goes on after it.
    let handlers: [(libc::c_int, extern "C" fn(libc::c_int), libc::c_int); 3] = [
        (libc::SIGTERM, on_signal, 0),
        (libc::SIGINT, on_signal, 0),
        (libc::SIGHUP, on_reload_signal, libc::SA_RESTART),
    ];
    for (signal, handler, flags) in handlers {
        // SAFETY: the handlers only store to an atomic; the sigaction struct is ours.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = handler as *const () as usize;
            libc::sigemptyset(&mut action.sa_mask);
            action.sa_flags = flags;
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// Whether SIGHUP arrived since the last call (clears the flag).
pub fn take_reload_request() -> bool {
    RELOAD.swap(false, Ordering::SeqCst)
}

/// Whether SIGTERM or SIGINT arrived.
pub fn shutdown_requested() -> bool {
    SHUTDOWN.load(Ordering::SeqCst)
}

/// Logs to stderr, human-readable. RUST_LOG wins over the config's `log.level`.
pub fn init_logging(level: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

/// Sends `state` (e.g. "READY=1") to systemd when NOTIFY_SOCKET is set. Errors are
/// logged, never fatal: readiness is a courtesy to the supervisor.
pub fn sd_notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let socket = match std::os::unix::net::UnixDatagram::unbound() {
        Ok(socket) => socket,
        Err(error) => {
            tracing::warn!(%error, "sd_notify: cannot create a socket");
            return;
        }
    };
    let bytes = path.as_encoded_bytes();
    let result = if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name)
            .and_then(|addr| socket.send_to_addr(state.as_bytes(), &addr))
    } else {
        socket.send_to(state.as_bytes(), &path)
    };
    if let Err(error) = result {
        tracing::warn!(%error, state, "sd_notify failed");
    }
}

/// Allocations below this come from the heap, not from fresh mmap'ed pages.
const MMAP_THRESHOLD_BYTES: libc::c_int = 32 << 20;
/// Free heap memory kept for reuse before any is returned to the kernel.
const TRIM_THRESHOLD_BYTES: libc::c_int = 128 << 20;

/// Keeps freed frame-sized buffers (1 MiB batches, their prepares and DMA copies) in the
/// heap for the next frame. glibc otherwise returns them to the kernel (an mmap'ed chunk
/// on free, a trimmed heap top), and every frame then faults in and zeroes fresh pages:
/// measured as 15-40% of the daemon's CPU under produce load. The memory kept is bounded
/// by the largest load's working set plus TRIM_THRESHOLD_BYTES.
pub fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only adjusts the allocator's parameters, under its own lock.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES);
    }
}

/// The open files limit (soft and hard), if it can be read.
fn nofile() -> Option<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes a plain struct we own.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0).then_some(limit)
}

/// Raises the soft limit of open files to the hard one (each partition holds two files
/// open, and every client and peer connection one) and returns it; 0 if unknown.
pub fn raise_open_files_limit() -> u64 {
    let Some(limit) = nofile() else {
        return 0;
    };
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads a plain struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return raised.rlim_cur;
        }
    }
    limit.rlim_cur
}

/// The soft limit of open files (0 if unknown).
pub fn open_files_limit() -> u64 {
    nofile().map_or(0, |limit| limit.rlim_cur)
}

/// Raises RLIMIT_MEMLOCK for glommio's io memory when allowed; returns the io memory to
/// configure: the configured amount if the limit allows it, else the journal crate's
/// small default that fits the usual 8 MiB limit.
pub fn io_memory_bytes(configured: u64) -> usize {
    // The replica executor locks `configured`; stats and statexfer lock the default
    // pool each.
    let want = configured.saturating_add(2 * journal::runtime::IO_MEMORY_BYTES as u64) + (1 << 20);
    journal::runtime::raise_memlock(want);
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes a plain struct we own.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } == 0;
    if ok && limit.rlim_cur >= want {
        configured as usize
    } else {
        journal::runtime::IO_MEMORY_BYTES
    }
}

/// A step of the replica executor longer than this is logged at debug (what held up
/// commits, when an operator looks for it).
pub(super) const SLOW_STEP: Duration = Duration::from_millis(15);

/// Logs `step` at debug if it took SLOW_STEP or longer since `started`.
pub(super) fn slow_step(step: &'static str, started: Instant) {
    let took = started.elapsed();
    if took >= SLOW_STEP {
        tracing::debug!(step, ms = took.as_secs_f64() * 1e3, "slow step");
    }
}
