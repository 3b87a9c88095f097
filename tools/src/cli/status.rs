//! `status`: the cluster at a glance from any node. Reads that node's `GET /stats`, finds
//! the other members in its `nodes` list, reads theirs and `GET /health` of each, and
//! prints per node its role in every group, view, op/commit lag, links, drops and p99
//! latencies. A node that does not answer is shown as down; `--watch` refreshes.

use std::io::{IsTerminal, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Map, Value};

use super::{CliError, Global, Report};

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Stats endpoint (the `http` port) of any node, HOST:PORT.
    #[arg(long = "http", default_value = "127.0.0.1:3000")]
    pub http: String,
    /// Refresh until interrupted (or --count refreshes).
    #[arg(long)]
    pub watch: bool,
    /// Time between refreshes with --watch ("1s", "500ms").
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// With --watch, stop after this many refreshes (0: never).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
    /// Per-request HTTP timeout, milliseconds.
    #[arg(long, default_value_t = 1_000)]
    pub timeout_ms: u64,
    /// List every group of every node, not only the metadata group and those that need
    /// attention up to the node's `limits.stats_groups_max`.
    #[arg(long)]
    pub all_groups: bool,
}

/// "1s", "500ms" (the config's duration syntax), 50ms to 1h.
fn parse_interval(text: &str) -> Result<Duration, String> {
    let interval = appliance::config::units::parse_duration(text.trim())?;
    if !(Duration::from_millis(50)..=Duration::from_secs(3600)).contains(&interval) {
        return Err("must be between 50ms and 1h".into());
    }
    Ok(interval)
}

/// A blocking HTTP/1.1 GET with connect and read timeouts: status code and body.
pub fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<(u16, String), String> {
    let deadline = Instant::now() + timeout;
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    stream
        .set_read_timeout(Some(left))
        .and_then(|()| stream.set_write_timeout(Some(left)))
        .map_err(|e| e.to_string())?;
    // One write: the whole head in one segment.
    let head = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(head.as_bytes())
        .map_err(|e| e.to_string())?;
    // Bounded: a stats reply is a few KiB (some MiB for every group of a node with
    // thousands); a hostile or broken server cannot grow this past 32 MiB.
    let mut raw = Vec::new();
    stream
        .take(32 << 20)
        .read_to_end(&mut raw)
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| "malformed HTTP reply".to_string())?;
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| "malformed HTTP status line".to_string())?;
    Ok((code, body.to_string()))
}

/// Resolves HOST:PORT (usage error when it does not).
fn resolve_http(spec: &str) -> Result<SocketAddr, CliError> {
    spec.to_socket_addrs()
        .map_err(|e| CliError::Usage(format!("--http {spec:?}: {e}")))?
        .next()
        .ok_or_else(|| CliError::Usage(format!("--http {spec:?}: no address")))
}

/// One node as seen this refresh.
struct NodeView {
    replica: Option<u64>,
    name: String,
    http: SocketAddr,
    stats: Result<Value, String>,
    health: Option<(u16, String)>,
}

impl NodeView {
    fn read(http: SocketAddr, timeout: Duration, all_groups: bool) -> NodeView {
        let path = if all_groups {
            "/stats?groups=all"
        } else {
            "/stats"
        };
        let stats = http_get(http, path, timeout).and_then(|(code, body)| {
            if code != 200 {
                return Err(format!("/stats answered {code}"));
            }
            serde_json::from_str::<Value>(&body).map_err(|e| format!("/stats is not JSON: {e}"))
        });
        let health = stats
            .is_ok()
            .then(|| http_get(http, "/health", timeout).ok())
            .flatten();
        NodeView {
            replica: stats.as_ref().ok().and_then(|s| s["replica_id"].as_u64()),
            name: String::new(),
            http,
            stats,
            health,
        }
    }
}

/// The member list the seed node reports: (replica, name, http address). A member
/// bound to an unspecified address (0.0.0.0) is reached at the seed's host.
fn members(seed: &Value, seed_addr: SocketAddr) -> Vec<(u64, String, SocketAddr)> {
    let Some(nodes) = seed["nodes"].as_array() else {
        return Vec::new();
    };
    nodes
        .iter()
        .filter_map(|n| {
            let replica = n["replica"].as_u64()?;
            let mut http: SocketAddr = n["http"].as_str()?.parse().ok()?;
            if http.ip().is_unspecified() {
                http.set_ip(seed_addr.ip());
            }
            Some((replica, n["name"].as_str().unwrap_or("").to_string(), http))
        })
        .collect()
}

/// Reads every node the seed knows about (the seed alone when it lists none).
fn survey(seed_addr: SocketAddr, timeout: Duration, all_groups: bool) -> Vec<NodeView> {
    let seed = NodeView::read(seed_addr, timeout, all_groups);
    let list = seed
        .stats
        .as_ref()
        .map(|s| members(s, seed_addr))
        .unwrap_or_default();
    if list.is_empty() {
        return vec![seed];
    }
    let seed_replica = seed.replica;
    let mut seed = Some(seed);
    let mut views = Vec::new();
    for (replica, name, http) in list {
        let mut view = if Some(replica) == seed_replica {
            seed.take().expect("one seed")
        } else {
            NodeView::read(http, timeout, all_groups)
        };
        view.replica = Some(replica);
        view.name = name;
        views.push(view);
    }
    views
}

fn u(value: &Value) -> u64 {
    value.as_u64().unwrap_or(0)
}

/// The report of one refresh: per node its groups, links and latencies, with op lag
/// measured against the highest op any reachable node reports for the group.
fn report(seed: SocketAddr, views: &[NodeView]) -> Report {
    let highest_op = highest_ops(views);
    let cluster = views
        .iter()
        .find_map(|v| v.stats.as_ref().ok())
        .and_then(|s| s["cluster"].as_str())
        .unwrap_or("?")
        .to_string();
    let up = views.iter().filter(|v| v.stats.is_ok()).count();
    let mut text = format!(
        "cluster {cluster}: {up} of {} nodes up (via {seed})\n",
        views.len()
    );
    let nodes: Vec<Value> = views
        .iter()
        .map(|view| node_report(view, &highest_op, &mut text))
        .collect();
    Report {
        text: text.trim_end().to_string(),
        json: json!({
            "cluster": cluster,
            "via": seed.to_string(),
            "nodes_up": up,
            "nodes": nodes,
        }),
    }
}

/// The highest op any node reports, per group: what each node's op lag is against.
fn highest_ops(views: &[NodeView]) -> Map<String, Value> {
    let mut highest_op: Map<String, Value> = Map::new();
    for stats in views.iter().filter_map(|v| v.stats.as_ref().ok()) {
        for g in stats["groups"].as_array().into_iter().flatten() {
            let key = g["group"].as_str().unwrap_or("").to_string();
            let op = u(&g["op"]).max(highest_op.get(&key).map_or(0, u));
            highest_op.insert(key, json!(op));
        }
    }
    highest_op
}

/// One node's part of the report: its lines appended to `text`, its JSON returned.
fn node_report(view: &NodeView, highest_op: &Map<String, Value>, text: &mut String) -> Value {
    let replica = view.replica.map_or("?".to_string(), |r| r.to_string());
    let label = [replica.as_str(), view.name.as_str()]
        .iter()
        .filter(|s| !s.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(" ");
    let stats = match &view.stats {
        Ok(stats) => stats,
        Err(error) => {
            text.push_str(&format!("\nnode {label} {}: DOWN ({error})\n", view.http));
            return json!({
                "replica": view.replica, "name": view.name, "http": view.http.to_string(),
                "up": false, "error": error,
            });
        }
    };
    let (healthy, health_reason) = match &view.health {
        Some((200, _)) => (true, "healthy".to_string()),
        Some((code, body)) => (false, format!("unhealthy ({code}): {}", body.trim())),
        None => (false, "health unknown".to_string()),
    };
    let client_tls = &stats["client_tls"];
    text.push_str(&format!(
        "\nnode {label} {}: up {}s, {health_reason}, client port {}\n",
        view.http,
        u(&stats["uptime_s"]),
        client_port(client_tls),
    ));
    let summary = &stats["group_summary"];
    let listed = stats["groups"].as_array().map_or(0, Vec::len) as u64;
    let total = summary["total"].as_u64().unwrap_or(listed);
    if total > 0 {
        text.push_str(&format!("  groups: {total} ({})\n", group_counts(summary)));
    }
    let groups = group_lines(stats, highest_op, text);
    if listed < total {
        text.push_str(&format!(
            "  ... {} more groups not listed (--all-groups lists them)\n",
            total - listed
        ));
    }
    let dropped_total = links_line(stats, text);
    let latency = &stats["latency_us"];
    let p99 = |figure: &str| u(&latency[figure]["p99"]);
    text.push_str(&format!(
        "  p99 us: request {}, prepare->commit {}, journal fsync {}\n",
        p99("request"),
        p99("prepare_commit"),
        p99("journal_fsync")
    ));
    json!({
        "replica": view.replica,
        "name": view.name,
        "http": view.http.to_string(),
        "up": true,
        "healthy": healthy,
        "health": health_reason,
        "uptime_s": u(&stats["uptime_s"]),
        "client_tls": client_tls.clone(),
        "group_summary": summary.clone(),
        "groups": groups,
        "peers": stats["peers"].clone(),
        "dropped": dropped_total,
        "p99_us": {
            "request": p99("request"),
            "prepare_commit": p99("prepare_commit"),
            "journal_fsync": p99("journal_fsync"),
        },
    })
}

/// How the node's client port is served: plaintext or TLS (with failed reloads).
fn client_port(client_tls: &Value) -> String {
    let tls_enabled = client_tls["enabled"].as_bool().unwrap_or(false);
    match (tls_enabled, u(&client_tls["reload_failures"])) {
        (false, _) => "plaintext".to_string(),
        (true, 0) => "TLS".to_string(),
        (true, failures) => format!(
            "TLS ({failures} certificate reloads failed: {})",
            client_tls["last_error"]
                .as_str()
                .unwrap_or("the last one succeeded")
        ),
    }
}

/// The group summary's counts: by status, then without quorum, needing attention and
/// led here.
fn group_counts(summary: &Value) -> String {
    let mut counts: Vec<String> = ["normal", "view_change", "recovering", "state_transfer"]
        .iter()
        .filter(|status| u(&summary[**status]) > 0)
        .map(|status| format!("{} {status}", u(&summary[*status])))
        .collect();
    for (key, what) in [
        ("without_quorum", "without quorum"),
        ("needing_attention", "needing attention"),
        ("primary", "led here"),
    ] {
        counts.push(format!("{} {what}", u(&summary[key])));
    }
    counts.join(", ")
}

/// A line per listed group (role, view, op, commit and their lags) appended to `text`;
/// the groups' JSON returned.
fn group_lines(stats: &Value, highest_op: &Map<String, Value>, text: &mut String) -> Vec<Value> {
    let mut groups = Vec::new();
    for g in stats["groups"].as_array().into_iter().flatten() {
        let key = g["group"].as_str().unwrap_or("");
        let status = g["status"].as_str().unwrap_or("?");
        let role = if status != "normal" {
            status
        } else if g["is_primary"].as_bool().unwrap_or(false) {
            "primary"
        } else {
            "backup"
        };
        let (op, commit) = (u(&g["op"]), u(&g["commit"]));
        let op_lag = highest_op.get(key).map_or(0, u).saturating_sub(op);
        let commit_lag = op.saturating_sub(commit);
        let name = g["name"].as_str().unwrap_or(key);
        text.push_str(&format!(
            "  {name:<16} {role:<8} view {:<4} op {op:<8} commit {commit:<8} lag op {op_lag} commit {commit_lag}\n",
            u(&g["view"]),
        ));
        groups.push(json!({
            "group": key, "name": name, "role": role, "status": status,
            "view": u(&g["view"]), "primary": u(&g["primary"]),
            "op": op, "commit": commit, "op_lag": op_lag, "commit_lag": commit_lag,
        }));
    }
    groups
}

/// The node's links to its peers, one line appended to `text`; returns the frames
/// dropped on all of them.
fn links_line(stats: &Value, text: &mut String) -> u64 {
    let mut links = Vec::new();
    let mut dropped_total = 0;
    for p in stats["peers"].as_array().into_iter().flatten() {
        let connected = p["connected"].as_bool().unwrap_or(false);
        dropped_total += u(&p["dropped"]);
        links.push(format!(
            "{} {} (queue {}, dropped {})",
            u(&p["replica"]),
            if connected { "up" } else { "DOWN" },
            u(&p["queue_depth"]),
            u(&p["dropped"])
        ));
    }
    if !links.is_empty() {
        text.push_str(&format!("  links: {}\n", links.join(", ")));
    }
    dropped_total
}

/// One refresh: the report, or a failure (with the report) when no node answered.
fn once(seed: SocketAddr, timeout: Duration, all_groups: bool) -> Result<Report, CliError> {
    let views = survey(seed, timeout, all_groups);
    let report = report(seed, &views);
    if views.iter().all(|v| v.stats.is_err()) {
        let error = views
            .first()
            .and_then(|v| v.stats.as_ref().err())
            .cloned()
            .unwrap_or_default();
        return Err(CliError::Runtime {
            message: format!("no stats from {seed}: {error}"),
            report: Some(report),
        });
    }
    Ok(report)
}

pub fn run(global: &Global, args: &StatusArgs) -> Result<Report, CliError> {
    let seed = resolve_http(&args.http)?;
    let timeout = Duration::from_millis(args.timeout_ms.max(1));
    if !args.watch {
        return once(seed, timeout, args.all_groups);
    }
    let clear = !global.json && std::io::stdout().is_terminal();
    let mut refreshes = 0u64;
    loop {
        let started = Instant::now();
        let report = match once(seed, timeout, args.all_groups) {
            Ok(report) => report,
            Err(CliError::Runtime {
                report: Some(report),
                ..
            }) => report,
            Err(other) => return Err(other),
        };
        refreshes += 1;
        if args.count != 0 && refreshes >= args.count {
            // The last refresh is printed by the caller, like a plain status.
            return Ok(report);
        }
        if clear {
            print!("\x1b[2J\x1b[H");
        }
        report.print(global.json);
        if !global.json {
            println!();
        }
        let _ = std::io::stdout().flush();
        std::thread::sleep(args.interval.saturating_sub(started.elapsed()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_parse_with_units_and_bounds() {
        assert_eq!(parse_interval("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_interval("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_interval("2").is_err(), "a unit is required");
        assert!(parse_interval("2h").is_err());
        assert!(parse_interval("0s").is_err());
        assert!(parse_interval("soon").is_err());
    }

    #[test]
    fn an_unreachable_node_is_down_and_the_report_says_so() {
        // A port that was free a moment ago: nothing listens there.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let views = survey(addr, Duration::from_millis(300), false);
        assert_eq!(views.len(), 1);
        let report = report(addr, &views);
        assert_eq!(report.json["nodes_up"], 0);
        assert_eq!(report.json["nodes"][0]["up"], false);
        assert!(report.text.contains("DOWN"), "{}", report.text);
        assert!(once(addr, Duration::from_millis(300), true).is_err());
    }

    #[test]
    fn members_bound_to_any_address_are_reached_at_the_seed_host() {
        let seed: SocketAddr = "127.0.0.7:3000".parse().unwrap();
        let stats = json!({"nodes": [
            {"replica": 0, "name": "a", "http": "0.0.0.0:3000"},
            {"replica": 1, "name": "b", "http": "127.0.0.2:3001"},
            {"replica": 2, "name": "c", "http": "not an address"},
        ]});
        let list = members(&stats, seed);
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].2, "127.0.0.7:3000".parse().unwrap());
        assert_eq!(list[1].2, "127.0.0.2:3001".parse().unwrap());
    }

    #[test]
    fn a_node_listing_some_of_its_groups_shows_the_counts_and_what_is_left_out() {
        let view = NodeView {
            replica: Some(0),
            name: "n0".into(),
            http: "127.0.0.1:3000".parse().unwrap(),
            stats: Ok(json!({
                "cluster": "c", "uptime_s": 5,
                "group_summary": {"total": 10001, "listed": 2, "normal": 10000,
                    "state_transfer": 1, "without_quorum": 0, "needing_attention": 1,
                    "primary": 3334},
                "groups": [
                    {"group": "9", "name": "metadata", "status": "normal", "op": 5, "commit": 5},
                    {"group": "7", "name": "1/1/6", "status": "state_transfer", "op": 1, "commit": 1},
                ],
            })),
            health: Some((503, "group 1/1/6 is state_transfer".into())),
        };
        let report = report("127.0.0.1:3000".parse().unwrap(), &[view]);
        assert!(
            report.text.contains(
                "groups: 10001 (10000 normal, 1 state_transfer, 0 without quorum, \
                 1 needing attention, 3334 led here)"
            ),
            "{}",
            report.text
        );
        assert!(
            report.text.contains("9999 more groups not listed"),
            "{}",
            report.text
        );
        assert!(report.text.contains("1/1/6"), "{}", report.text);
        assert_eq!(report.json["nodes"][0]["group_summary"]["total"], 10001);
        assert_eq!(
            report.json["nodes"][0]["groups"].as_array().unwrap().len(),
            2
        );
    }

    #[test]
    fn lag_is_measured_against_the_highest_op_of_the_group() {
        let node = |replica: u64, op: u64, commit: u64, primary: bool| NodeView {
            replica: Some(replica),
            name: format!("n{replica}"),
            http: format!("127.0.0.1:{}", 3000 + replica).parse().unwrap(),
            stats: Ok(json!({
                "cluster": "c", "uptime_s": 5,
                "groups": [{"group": "9", "name": "metadata", "status": "normal",
                    "is_primary": primary, "view": 2, "primary": 0, "op": op, "commit": commit}],
                "peers": [{"replica": 1, "connected": !primary, "queue_depth": 0, "dropped": 4}],
                "latency_us": {"request": {"p99": 77}},
            })),
            health: Some((200, "ok".into())),
        };
        let views = vec![node(0, 10, 9, true), node(1, 7, 7, false)];
        let report = report("127.0.0.1:3000".parse().unwrap(), &views);
        let nodes = &report.json["nodes"];
        assert_eq!(nodes[0]["groups"][0]["role"], "primary");
        assert_eq!(nodes[0]["groups"][0]["op_lag"], 0);
        assert_eq!(nodes[0]["groups"][0]["commit_lag"], 1);
        assert_eq!(nodes[1]["groups"][0]["role"], "backup");
        assert_eq!(nodes[1]["groups"][0]["op_lag"], 3);
        assert_eq!(nodes[1]["dropped"], 4);
        assert_eq!(nodes[1]["p99_us"]["request"], 77);
        assert!(report.text.contains("1 DOWN"), "{}", report.text);
    }

    #[test]
    fn the_client_port_shows_plaintext_tls_and_failed_certificate_reloads() {
        let node = |replica: u64, client_tls: Value| NodeView {
            replica: Some(replica),
            name: format!("n{replica}"),
            http: format!("127.0.0.1:{}", 3000 + replica).parse().unwrap(),
            stats: Ok(json!({"cluster": "c", "uptime_s": 5, "client_tls": client_tls})),
            health: Some((200, "ok".into())),
        };
        let views = vec![
            node(0, json!({"enabled": false})),
            node(
                1,
                json!({"enabled": true, "reloads": 1, "reload_failures": 0}),
            ),
            node(
                2,
                json!({"enabled": true, "reload_failures": 2,
                    "last_error": "tcp.tls.cert_file = /x: no CERTIFICATE in the file"}),
            ),
        ];
        let report = report("127.0.0.1:3000".parse().unwrap(), &views);
        let lines: Vec<&str> = report
            .text
            .lines()
            .filter(|l| l.starts_with("node "))
            .collect();
        assert!(
            lines[0].ends_with("client port plaintext"),
            "{}",
            report.text
        );
        assert!(lines[1].ends_with("client port TLS"), "{}", report.text);
        assert!(
            lines[2].contains("TLS (2 certificate reloads failed: tcp.tls.cert_file"),
            "{}",
            report.text
        );
        assert_eq!(report.json["nodes"][1]["client_tls"]["reloads"], 1);
    }
}
