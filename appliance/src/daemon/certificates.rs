//! TLS material: the client port's (`[tcp.tls]`) and the replica plane's
//! (`[cluster.tls]`), loaded at start (a missing, unreadable or mismatched certificate and
//! key stop the start with the key's name), and reloaded from the same files on SIGHUP so
//! an operator can rotate certificates without a restart. New connections get the new
//! material; open ones keep their sessions. A reload that fails keeps the material in
//! use, logs why and is counted.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use replication::bus::{tls, Bus, TlsContext};

use super::{system, DaemonError};
use crate::config::ClientTlsConfig;
use crate::stats::TlsStats;

/// How often the reload task looks at the SIGHUP flag.
const RELOAD_POLL: Duration = Duration::from_millis(200);

/// The client port's certificate and key files, when TLS is on.
#[derive(Clone, Debug)]
pub struct ClientTlsFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl ClientTlsFiles {
    /// The files `[tcp.tls]` names, None when client TLS is off.
    pub fn of(config: &ClientTlsConfig) -> Option<ClientTlsFiles> {
        if !config.enabled {
            return None;
        }
        Some(ClientTlsFiles {
            cert_file: config.cert_file.clone().unwrap_or_default(),
            key_file: config.key_file.clone().unwrap_or_default(),
        })
    }

    /// Reads and checks the certificate and key.
    pub fn load(&self) -> Result<Arc<rustls::ServerConfig>, tls::TlsSetupError> {
        tls::client_port_config(&self.cert_file, &self.key_file)
    }
}

/// The client port's acceptor config for the start, or the error that stops it.
pub fn load_at_start(
    files: Option<&ClientTlsFiles>,
) -> Result<Option<Arc<rustls::ServerConfig>>, DaemonError> {
    files
        .map(|files| {
            files
                .load()
                .map_err(|e| DaemonError::Config(format!("client port TLS: {e}")))
        })
        .transpose()
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What /stats shows of one port's TLS, as of the start.
pub fn initial_status(enabled: bool) -> Rc<RefCell<TlsStats>> {
    Rc::new(RefCell::new(TlsStats {
        enabled,
        loaded_unix_ms: if enabled { now_unix_ms() } else { 0 },
        ..TlsStats::default()
    }))
}

/// What SIGHUP reloads, and where each reload's outcome is shown.
pub struct Reloads {
    pub client: Option<ClientTlsFiles>,
    pub client_status: Rc<RefCell<TlsStats>>,
    /// `[cluster.tls]` when enabled.
    pub replica: Option<replication::bus::TlsConfig>,
    pub replica_status: Rc<RefCell<TlsStats>>,
}

/// Notes one reload's outcome in `status` and the log.
fn record<T>(
    status: &RefCell<TlsStats>,
    what: &str,
    outcome: Result<T, tls::TlsSetupError>,
) -> Option<T> {
    let mut status = status.borrow_mut();
    match outcome {
        Ok(material) => {
            status.reloads += 1;
            status.loaded_unix_ms = now_unix_ms();
            status.last_error = None;
            tracing::info!(
                reloads = status.reloads,
                "{what} certificate reloaded: new connections use it"
            );
            Some(material)
        }
        Err(error) => {
            status.reload_failures += 1;
            status.last_error = Some(error.to_string());
            tracing::error!(%error, "{what} certificate reload failed; the previous certificate stays in use");
            None
        }
    }
}

/// Runs on the replica executor until cancelled: on each SIGHUP, reads the files on the
/// blocking pool (the executor never waits on the disk for them) and swaps the bus's
/// material.
pub async fn reload_on_sighup(bus: Bus, reloads: Reloads) {
    loop {
        glommio::timer::sleep(RELOAD_POLL).await;
        if !system::take_reload_request() {
            continue;
        }
        if reloads.client.is_none() && reloads.replica.is_none() {
            tracing::info!("SIGHUP: neither tcp.tls nor cluster.tls is enabled, nothing to reload");
            continue;
        }
        if let Some(files) = reloads.client.clone() {
            let loaded = glommio::executor()
                .spawn_blocking(move || files.load())
                .await;
            if let Some(config) = record(&reloads.client_status, "client port", loaded) {
                bus.set_client_tls(Some(config));
            }
        }
        if let Some(config) = reloads.replica.clone() {
            let loaded = glommio::executor()
                .spawn_blocking(move || TlsContext::load(&config))
                .await;
            if let Some(context) = record(&reloads.replica_status, "replica plane", loaded) {
                bus.set_replica_tls(context);
            }
        }
    }
}
