//! TLS on the client port (`[tcp.tls]`): the acceptor config loaded at start (a missing,
//! unreadable or mismatched certificate and key stop the start with the key's name), and
//! reloaded from the same files on SIGHUP so an operator can rotate certificates without
//! a restart. New connections get the new certificate; open ones keep their sessions. A
//! reload that fails keeps the certificate in use, logs why and is counted.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use replication::bus::{tls, Bus};

use super::{system, DaemonError};
use crate::config::ClientTlsConfig;
use crate::stats::ClientTlsStats;

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

/// The acceptor config for the start, or the error that stops it.
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

/// The status /stats shows, as of the start.
pub fn initial_status(files: Option<&ClientTlsFiles>) -> Rc<RefCell<ClientTlsStats>> {
    Rc::new(RefCell::new(ClientTlsStats {
        enabled: files.is_some(),
        loaded_unix_ms: if files.is_some() { now_unix_ms() } else { 0 },
        ..ClientTlsStats::default()
    }))
}

/// Runs on the replica executor until the bus closes: on each SIGHUP, reads the files on
/// the blocking pool (the executor never waits on the disk for them) and swaps the
/// bus's acceptor config.
pub async fn reload_on_sighup(
    bus: Bus,
    files: Option<ClientTlsFiles>,
    status: Rc<RefCell<ClientTlsStats>>,
) {
    loop {
        glommio::timer::sleep(RELOAD_POLL).await;
        if !system::take_reload_request() {
            continue;
        }
        let Some(files) = files.clone() else {
            tracing::info!("SIGHUP: tcp.tls is not enabled, no certificate to reload");
            continue;
        };
        let loaded = glommio::executor()
            .spawn_blocking(move || files.load())
            .await;
        let mut status = status.borrow_mut();
        match loaded {
            Ok(config) => {
                bus.set_client_tls(Some(config));
                status.reloads += 1;
                status.loaded_unix_ms = now_unix_ms();
                status.last_error = None;
                tracing::info!(
                    reloads = status.reloads,
                    "client port certificate reloaded: new connections use it"
                );
            }
            Err(error) => {
                status.reload_failures += 1;
                status.last_error = Some(error.to_string());
                tracing::error!(%error, "client port certificate reload failed; the previous certificate stays in use");
            }
        }
    }
}
