//! The alert rules (systemd/prometheus/appliance-rules.yml) and the Grafana dashboard
//! (systemd/grafana/appliance-dashboard.json) against real nodes: every metric name they
//! use is served by `GET /metrics`, and Debian's Prometheus server, scraping a 3-node
//! cluster with the shipped rules (their `for:` shortened), fires AppliancePeerLinkDown
//! when a replica link is cut, ApplianceNodeDown, AppliancePeerLinkDown and
//! ApplianceGroupNoQuorum when a node is killed as well, and resolves them all once the
//! link is restored and the node restarted.
//!
//! The Prometheus test skips (with a message) when /usr/bin/prometheus is missing, unless
//! REQUIRE_PROMETHEUS is set (CI sets it), where that is a failure.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const NODES: usize = 3;
const PROMETHEUS: &str = "/usr/bin/prometheus";
/// Set (CI does) to fail rather than skip when Prometheus is missing (not APPLIANCE_*:
/// the daemons inherit the environment and read that prefix as config).
const REQUIRE_ENV: &str = "REQUIRE_PROMETHEUS";
/// The `for:` every alert gets in the copy of the rules the test loads.
const SHORT_FOR: &str = "2s";

/// The tests of this file each run a cluster; one at a time keeps them within the
/// heartbeat timeouts on a small host.
static ONE_CLUSTER: Mutex<()> = Mutex::new(());

fn one_cluster() -> std::sync::MutexGuard<'static, ()> {
    ONE_CLUSTER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn rules_text() -> String {
    read(&repo_file("systemd/prometheus/appliance-rules.yml"))
}

fn dashboard() -> Value {
    let path = repo_file("systemd/grafana/appliance-dashboard.json");
    serde_json::from_str(&read(&path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The `appliance_...` metric names a text mentions (recording rules are named
/// `appliance:...` and are not matched).
fn metric_names(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let mut names = BTreeSet::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("appliance_").map(|i| from + i) {
        let starts_a_word = at == 0 || {
            let c = bytes[at - 1];
            !(c.is_ascii_alphanumeric() || c == b'_' || c == b':')
        };
        let end = text[at..]
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .map_or(text.len(), |i| at + i);
        if starts_a_word {
            names.insert(text[at..end].to_string());
        }
        from = end;
    }
    names
}

/// The names `/metrics` text declares (`# TYPE`) or has samples of.
fn served_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|line| match line.strip_prefix("# TYPE ") {
            Some(rest) => rest.split(' ').next(),
            None if line.starts_with('#') => None,
            None => line.split(['{', ' ']).next(),
        })
        .filter(|name| !name.is_empty())
        .map(str::to_string)
        .collect()
}

/// Every PromQL expression of the dashboard's panels.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels[]") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or("?").to_string();
            let expr = target["expr"].as_str().expect("targets[].expr").to_string();
            queries.push((title, expr));
        }
    }
    queries
}

/// Starts the cluster and waits until every node is healthy with every link up.
fn start_cluster(files: &ClusterFiles) -> Vec<Daemon> {
    let mut daemons: Vec<Daemon> = (0..NODES).map(|r| Daemon::start(files, r)).collect();
    for daemon in &mut daemons {
        wait_healthy(files, daemon, Duration::from_secs(60));
    }
    for replica in 0..NODES {
        wait_links(files, replica, Duration::from_secs(30));
    }
    daemons
}

/// Waits until every peer link of `replica` is up.
fn wait_links(files: &ClusterFiles, replica: usize, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let s = stats(files, replica);
        let peers = s["peers"].as_array().cloned().unwrap_or_default();
        if peers.len() == NODES - 1 && peers.iter().all(|p| p["connected"] == true) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "links of node {replica} not up within {within:?}: {s}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn every_metric_of_the_rules_and_the_dashboard_is_served() {
    let rules = rules_text();
    let dashboard = dashboard();
    let mut wanted = metric_names(&rules);
    let from_rules = wanted.len();
    for (_, expr) in dashboard_queries(&dashboard) {
        wanted.extend(metric_names(&expr));
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        wanted.extend(metric_names(&variable["definition"].to_string()));
    }
    // The scan finds what it should: a gauge, a counter, a summary's count, a family
    // named in a runbook.
    for name in [
        "appliance_group_quorum",
        "appliance_peer_dropped_frames_total",
        "appliance_request_latency_seconds_count",
        "appliance_state_transfer_bytes_done",
        "appliance_info",
    ] {
        assert!(wanted.contains(name), "{name} not found in {wanted:?}");
    }
    assert!(
        from_rules >= 15,
        "{from_rules} names in the rules: {wanted:?}"
    );

    let _cluster = one_cluster();
    let files = ClusterFiles::new(NODES);
    let _daemons = start_cluster(&files);
    for replica in 0..NODES {
        let (code, text) = http_get(files.http_addr(replica), "/metrics").expect("/metrics");
        assert_eq!(code, 200, "{text}");
        let served = served_names(&text);
        let missing: Vec<&String> = wanted.iter().filter(|n| !served.contains(*n)).collect();
        assert!(
            missing.is_empty(),
            "node {replica} serves no {missing:?}; it serves {served:?}"
        );
        // The per-peer and per-group families have samples, not only declarations.
        for family in ["appliance_peer_connected", "appliance_group_quorum"] {
            assert!(
                text.lines().any(|l| l.starts_with(&format!("{family}{{"))),
                "no {family} samples on node {replica}"
            );
        }
    }
    eprintln!(
        "{} metric names of the rules and the dashboard, all served by the 3 nodes",
        wanted.len()
    );
}

/// A TCP proxy on 127.0.0.1 in front of `target` that can cut every connection it
/// carries and refuse new ones (accepted and closed at once) until healed.
struct CutProxy {
    port: u16,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl CutProxy {
    fn start(target: u16) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy port");
        let port = listener.local_addr().expect("bound").port();
        let cut = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::new()));
        let (cut_flag, streams) = (cut.clone(), open.clone());
        std::thread::spawn(move || {
            for inbound in listener.incoming().flatten() {
                if cut_flag.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                if let Ok(mut open) = streams.lock() {
                    open.extend(
                        [&inbound, &outbound]
                            .iter()
                            .filter_map(|s| s.try_clone().ok()),
                    );
                }
                for (from, to) in [(&inbound, &outbound), (&outbound, &inbound)] {
                    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
                        continue;
                    };
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 64 * 1024];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 || to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        CutProxy { port, cut, open }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        if let Ok(mut open) = self.open.lock() {
            for stream in open.drain(..) {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }

    fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

/// Debian's Prometheus server on 127.0.0.1, killed by PID when dropped (its log printed
/// when the test is failing).
struct Prometheus {
    child: Option<Child>,
    addr: SocketAddr,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Scrapes `targets` every second as job "appliance", evaluating `rules` every second.
    fn start(rules: &str, targets: &[SocketAddr]) -> Prometheus {
        let dir = tempfile::tempdir().expect("tempdir");
        let rules_path = dir.path().join("appliance-rules.yml");
        std::fs::write(&rules_path, rules).expect("write rules");
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: appliance\n    static_configs:\n      - targets: [{}]\n",
            rules_path.display(),
            targets.join(", ")
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write prometheus.yml");
        let port = common::Ports::pick(1)[0].http;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let log = dir.path().join("prometheus.log");
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).expect("log file")))
            .spawn()
            .expect("spawn prometheus");
        let mut server = Prometheus {
            child: Some(child),
            addr,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(Ok(Some(status))) = server.child.as_mut().map(|c| c.try_wait()) {
                panic!("prometheus exited ({status}):\n{}", log_of(&server.log));
            }
            if get(addr, "/-/ready").is_some_and(|(code, _)| code == 200) {
                return server;
            }
            assert!(Instant::now() < deadline, "prometheus not ready in 60 s");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A GET of the HTTP API, parsed; fails unless it answers `"status": "success"`.
    fn api(&self, path: &str) -> Value {
        let (code, body) = get(self.addr, path).unwrap_or_else(|| panic!("GET {path}"));
        let value: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
        assert!(
            code == 200 && value["status"] == "success",
            "{path}: {code} {body}"
        );
        value
    }

    /// An instant query's result vector.
    fn query(&self, expr: &str) -> Vec<Value> {
        let value = self.api(&format!("/api/v1/query?query={}", encode(expr)));
        value["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The active alerts (pending or firing).
    fn alerts(&self) -> Vec<Value> {
        let value = self.api("/api/v1/alerts");
        value["data"]["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- prometheus log ---\n{}", log_of(&self.log));
        }
    }
}

/// An HTTP/1.0 GET (no chunked replies): status code and body.
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let code = text.split(' ').nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Some((code, body))
}

/// Percent-encodes a query parameter.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The rules as shipped with every `for:` set to SHORT_FOR.
fn rules_with_short_for(rules: &str) -> String {
    let alerts = rules
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert:"))
        .count();
    let mut shortened = 0;
    let text: Vec<String> = rules
        .lines()
        .map(|line| {
            let trimmed = line.trim_start();
            if trimmed.starts_with("for:") {
                shortened += 1;
                let indent = &line[..line.len() - trimmed.len()];
                format!("{indent}for: {SHORT_FOR}")
            } else {
                line.to_string()
            }
        })
        .collect();
    assert!(alerts >= 10, "{alerts} alerts in the rules");
    assert_eq!(shortened, alerts, "one `for:` per alert");
    text.join("\n") + "\n"
}

/// An alert as the API reports it: name, labels and state.
fn describe(alerts: &[Value]) -> String {
    alerts
        .iter()
        .map(|a| {
            format!(
                "{} {} {}",
                a["labels"]["alertname"], a["labels"], a["state"]
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `alerts` has `name` in `state` (None: pending or firing) with `labels`.
fn has(alerts: &[Value], name: &str, labels: &[(&str, &str)], state: Option<&str>) -> bool {
    alerts.iter().any(|a| {
        a["labels"]["alertname"] == name
            && labels.iter().all(|(k, v)| a["labels"][*k] == *v)
            && match state {
                Some(state) => a["state"] == state,
                None => true,
            }
    })
}

/// Polls the active alerts until `check` holds.
fn wait_alerts(
    prometheus: &Prometheus,
    what: &str,
    within: Duration,
    check: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let started = Instant::now();
    loop {
        let alerts = prometheus.alerts();
        if check(&alerts) {
            eprintln!(
                "{what}: after {:.1} s\n{}",
                started.elapsed().as_secs_f64(),
                describe(&alerts)
            );
            return alerts;
        }
        assert!(
            started.elapsed() < within,
            "not {what} within {within:?}; active alerts:\n{}",
            describe(&alerts)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The alerts this test raises and expects to resolve.
const RAISED: [&str; 3] = [
    "ApplianceNodeDown",
    "AppliancePeerLinkDown",
    "ApplianceGroupNoQuorum",
];

#[test]
fn prometheus_fires_the_alerts_of_a_killed_node_and_a_cut_link_then_resolves_them() {
    if !Path::new(PROMETHEUS).exists() {
        let message = format!("{PROMETHEUS} is missing (apt-get install prometheus)");
        assert!(
            std::env::var_os(REQUIRE_ENV).is_none(),
            "{message}, and {REQUIRE_ENV} is set"
        );
        eprintln!("\n!!!!! SKIPPED the Prometheus alerting test: {message} !!!!!\n");
        return;
    }
    let started = Instant::now();
    let rules = rules_with_short_for(&rules_text());
    let _cluster = one_cluster();
    let files = ClusterFiles::new(NODES);
    // Node 0 dials node 1 (the lower id dials): through the proxy, which cuts that link.
    let proxy = CutProxy::start(files.ports[1].tcp_replica);
    files.route_replica_plane(0, 1, proxy.port);
    let mut daemons = start_cluster(&files);
    let instance: Vec<String> = (0..NODES).map(|r| files.http_addr(r).to_string()).collect();
    let targets: Vec<SocketAddr> = (0..NODES).map(|r| files.http_addr(r)).collect();
    let prometheus = Prometheus::start(&rules, &targets);

    // Every node scraped, the rules loaded, and nothing of what follows raised yet.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let up = prometheus.query("up{job=\"appliance\"} == 1");
        let rules = prometheus.api("/api/v1/rules");
        let loaded = rules["data"]["groups"]
            .as_array()
            .and_then(|g| g.first())
            .and_then(|g| g["rules"].as_array())
            .map_or(0, Vec::len);
        if up.len() == NODES && loaded >= 10 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "targets up {up:?}, {loaded} rules loaded"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // A healthy cluster stays silent for twice the `for:` and more.
    let quiet = Instant::now() + Duration::from_secs(6);
    while Instant::now() < quiet {
        let alerts = prometheus.alerts();
        assert!(
            RAISED.iter().all(|name| !has(&alerts, name, &[], None)),
            "alerts on a healthy cluster:\n{}",
            describe(&alerts)
        );
        std::thread::sleep(Duration::from_millis(250));
    }

    // Every dashboard query is valid PromQL on the real series, and the recording rule
    // the commit-lag alert uses computes one lag per node and group.
    let mut with_data = 0;
    let queries = dashboard_queries(&dashboard());
    for (title, expr) in &queries {
        let expr = expr
            .replace("$__rate_interval", "10s")
            .replace("$instance", ".*")
            .replace("$job", "appliance");
        assert!(
            !expr.contains('$'),
            "{title}: unreplaced variable in {expr}"
        );
        if !prometheus.query(&expr).is_empty() {
            with_data += 1;
        }
    }
    eprintln!(
        "{} dashboard queries accepted, {with_data} with data",
        queries.len()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let lag = prometheus.query("appliance:group_commit_lag:ops");
        if lag.len() >= NODES {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "commit lag per node and group: {lag:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }

    // Cut the link between nodes 0 and 1: both ends see it down.
    proxy.cut();
    wait_alerts(
        &prometheus,
        "link 0-1 cut: AppliancePeerLinkDown firing on both ends",
        Duration::from_secs(60),
        |alerts| {
            has(
                alerts,
                "AppliancePeerLinkDown",
                &[("instance", &instance[0]), ("replica", "1")],
                Some("firing"),
            ) && has(
                alerts,
                "AppliancePeerLinkDown",
                &[("instance", &instance[1]), ("replica", "0")],
                Some("firing"),
            )
        },
    );
    let alerts = prometheus.alerts();
    assert!(
        !has(&alerts, "ApplianceNodeDown", &[], None),
        "every node is up: {}",
        describe(&alerts)
    );

    // Kill node 2 as well: it is down, the others lose their link to it, and nodes 0
    // and 1, each alone now, have no quorum.
    daemons[2].kill();
    wait_alerts(
        &prometheus,
        "node 2 killed: ApplianceNodeDown, AppliancePeerLinkDown and ApplianceGroupNoQuorum firing",
        Duration::from_secs(60),
        |alerts| {
            has(
                alerts,
                "ApplianceNodeDown",
                &[("instance", &instance[2])],
                Some("firing"),
            ) && [0, 1].iter().all(|r| {
                has(
                    alerts,
                    "AppliancePeerLinkDown",
                    &[("instance", &instance[*r]), ("replica", "2")],
                    Some("firing"),
                ) && has(
                    alerts,
                    "ApplianceGroupNoQuorum",
                    &[("instance", &instance[*r]), ("name", "metadata")],
                    Some("firing"),
                )
            })
        },
    );
    let firing = prometheus.query("ALERTS{alertstate=\"firing\"}");
    assert!(
        firing.len() >= 7,
        "ALERTS has the firing alerts: {firing:?}"
    );

    // Heal: the link restored and node 2 restarted. Every alert raised resolves.
    proxy.heal();
    daemons[2] = Daemon::start(&files, 2);
    for daemon in &mut daemons {
        wait_healthy(&files, daemon, Duration::from_secs(60));
    }
    wait_alerts(
        &prometheus,
        "healed: every alert raised resolved",
        Duration::from_secs(60),
        |alerts| RAISED.iter().all(|name| !has(alerts, name, &[], None)),
    );
    let rules = prometheus.api("/api/v1/rules?type=alert");
    for rule in rules["data"]["groups"][0]["rules"]
        .as_array()
        .expect("rules")
    {
        if RAISED.iter().any(|name| rule["name"] == *name) {
            assert_eq!(rule["state"], "inactive", "{rule}");
        }
    }
    eprintln!(
        "alerts raised and resolved in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
