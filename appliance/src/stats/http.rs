//! The stats endpoint's HTTP/1.1 server: `GET /stats`, `/health` and `/metrics`, one
//! request per connection. Bounded everywhere a hostile client could push: connections,
//! header bytes and time per request. It runs on its own executor and reads only the
//! latest published snapshot, so it cannot stall consensus.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_lite::{AsyncReadExt, AsyncWriteExt};

use super::{prometheus, Snapshot};

/// Bounds of the stats server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Connections served at once; more are closed on accept.
    pub connections_max: usize,
    /// Bytes of request head read before answering 431.
    pub head_max: usize,
    /// Time a client has to send its request head.
    pub request_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> HttpLimits {
        HttpLimits {
            connections_max: 64,
            head_max: 8192,
            request_timeout: Duration::from_secs(5),
        }
    }
}

/// Counters of the stats server itself.
#[derive(Debug, Default)]
pub struct HttpStats {
    pub served: AtomicU64,
    pub bad_requests: AtomicU64,
    pub refused_connections: AtomicU64,
    pub timeouts: AtomicU64,
}

/// An HTTP response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Response {
    fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into().into_bytes(),
        }
    }

    /// The bytes on the wire (Connection: close).
    pub fn to_bytes(&self) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            408 => "Request Timeout",
            431 => "Request Header Fields Too Large",
            503 => "Service Unavailable",
            _ => "Error",
        };
        let mut out = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.status,
            self.content_type,
            self.body.len()
        )
        .into_bytes();
        out.extend_from_slice(&self.body);
        out
    }
}

/// What a request head read so far amounts to.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// More bytes are needed.
    Partial,
    /// Answer with this.
    Done(Response),
}

/// Parses a request head (pure; tested without sockets) and answers it from `snapshot`.
pub fn handle(head: &[u8], snapshot: &Snapshot) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Partial) => Parsed::Partial,
        Err(e) => Parsed::Done(Response::text(400, format!("bad request: {e}\n"))),
        Ok(httparse::Status::Complete(_)) => {
            if request.method != Some("GET") {
                return Parsed::Done(Response::text(405, "only GET\n"));
            }
            let target = request.path.unwrap_or("/");
            let (path, query) = target.split_once('?').unwrap_or((target, ""));
            // `?groups=all` lists every group; otherwise up to limits.stats_groups_max.
            let all_groups = query.split('&').any(|pair| pair == "groups=all");
            Parsed::Done(match path {
                "/stats" => Response {
                    status: 200,
                    content_type: "application/json",
                    body: serde_json::to_vec(&snapshot.clone().bounded(all_groups))
                        .unwrap_or_default(),
                },
                "/health" => match snapshot.health() {
                    Ok(()) => Response::text(200, "ok\n"),
                    Err(reason) => Response::text(503, format!("{reason}\n")),
                },
                "/metrics" => Response {
                    status: 200,
                    content_type: "text/plain; version=0.0.4; charset=utf-8",
                    body: prometheus::render(&snapshot.clone().bounded(all_groups)).into_bytes(),
                },
                _ => Response::text(404, "try /stats, /health or /metrics\n"),
            })
        }
    }
}

/// The latest snapshot, published by the replica executor.
pub type SharedSnapshot = Arc<Mutex<Snapshot>>;

fn latest(shared: &SharedSnapshot) -> Snapshot {
    match shared.lock() {
        Ok(guard) => guard.clone(),
        // A publisher that panicked mid-update left a whole value behind: use it.
        Err(poisoned) => poisoned.into_inner().clone(),
    }
}

async fn serve_one(
    mut stream: glommio::net::TcpStream,
    shared: SharedSnapshot,
    limits: HttpLimits,
    stats: Arc<HttpStats>,
) {
    let _ = stream.set_read_timeout(Some(limits.request_timeout));
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let response = loop {
        match stream.read(&mut buf).await {
            Ok(0) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                stats.timeouts.fetch_add(1, Ordering::Relaxed);
                break Response::text(408, "request head not received in time\n");
            }
            Err(_) => return,
        }
        if head.len() > limits.head_max {
            stats.bad_requests.fetch_add(1, Ordering::Relaxed);
            break Response::text(431, "request head too large\n");
        }
        if let Parsed::Done(response) = handle(&head, &latest(&shared)) {
            if response.status == 400 {
                stats.bad_requests.fetch_add(1, Ordering::Relaxed);
            }
            break response;
        }
    };
    stats.served.fetch_add(1, Ordering::Relaxed);
    let _ = stream.write_all(&response.to_bytes()).await;
    let _ = stream.close().await;
}

/// Accepts and serves until the listener fails. Call on the stats executor.
pub async fn serve(
    listener: glommio::net::TcpListener,
    shared: SharedSnapshot,
    limits: HttpLimits,
    stats: Arc<HttpStats>,
) {
    let open = Rc::new(Cell::new(0usize));
    loop {
        let Ok(stream) = listener.accept().await else {
            continue;
        };
        if open.get() >= limits.connections_max {
            stats.refused_connections.fetch_add(1, Ordering::Relaxed);
            drop(stream);
            continue;
        }
        open.set(open.get() + 1);
        let open = open.clone();
        let (shared, stats) = (shared.clone(), stats.clone());
        glommio::spawn_local(async move {
            serve_one(stream, shared, limits, stats).await;
            open.set(open.get() - 1);
        })
        .detach();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::tests::sample;

    fn answer(head: &str) -> Response {
        match handle(head.as_bytes(), &sample()) {
            Parsed::Done(response) => response,
            Parsed::Partial => panic!("partial"),
        }
    }

    #[test]
    fn routes_stats_health_and_metrics() {
        let stats = answer("GET /stats HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(stats.status, 200);
        let json: serde_json::Value = serde_json::from_slice(&stats.body).unwrap();
        assert_eq!(json["replica_id"], 1);
        assert_eq!(answer("GET /health HTTP/1.1\r\n\r\n").status, 200);
        let metrics = answer("GET /metrics?x=1 HTTP/1.0\r\n\r\n");
        assert!(metrics.content_type.contains("version=0.0.4"));
        assert_eq!(answer("GET /nope HTTP/1.1\r\n\r\n").status, 404);
        assert_eq!(answer("POST /stats HTTP/1.1\r\n\r\n").status, 405);
        assert_eq!(answer("\x01\x02garbage\r\n\r\n").status, 400);
        assert_eq!(
            handle(b"GET /stats HTTP/1.1\r\nHost", &sample()),
            Parsed::Partial
        );
    }

    #[test]
    fn stats_and_metrics_list_groups_up_to_the_limit_unless_asked_for_all() {
        let mut snapshot = sample();
        snapshot.groups_max = 1;
        snapshot.groups[1].quorum = false;
        let get = |target: &str| {
            let head = format!("GET {target} HTTP/1.1\r\n\r\n");
            let Parsed::Done(response) = handle(head.as_bytes(), &snapshot) else {
                panic!("partial")
            };
            String::from_utf8(response.body).unwrap()
        };
        let bounded: serde_json::Value = serde_json::from_str(&get("/stats")).unwrap();
        assert_eq!(bounded["groups"].as_array().unwrap().len(), 1);
        assert_eq!(bounded["group_summary"]["listed"], 1);
        assert_eq!(bounded["group_summary"]["total"], 2);
        let all: serde_json::Value = serde_json::from_str(&get("/stats?x=1&groups=all")).unwrap();
        assert_eq!(all["groups"].as_array().unwrap().len(), 2);
        assert_eq!(all["group_summary"]["listed"], 2);

        let count = |text: &str| {
            text.lines()
                .filter(|l| l.starts_with("appliance_group_op{"))
                .count()
        };
        let metrics = get("/metrics");
        assert_eq!(count(&metrics), 1);
        assert!(metrics.contains("appliance_groups_listed 1"));
        assert!(metrics.contains("appliance_groups{status=\"normal\"} 2"));
        assert_eq!(count(&get("/metrics?groups=all")), 2);
        // Health judges every group, listed or not.
        assert!(get("/health").contains("1/1/0 has no replication quorum"));
    }

    #[test]
    fn health_is_503_with_the_reason() {
        let mut snapshot = sample();
        snapshot.groups[0].quorum = false;
        let Parsed::Done(response) = handle(b"GET /health HTTP/1.1\r\n\r\n", &snapshot) else {
            panic!()
        };
        assert_eq!(response.status, 503);
        assert!(String::from_utf8(response.body).unwrap().contains("quorum"));
    }
}
