//! appliance-workload: the workload driver and checker `tools/cluster-vm` runs against a
//! cluster under faults.
//!
//! - `produce`: one producer per partition at a steady rate; every batch's outcome to
//!   the acks file (check::BatchRecord, one JSON line each).
//! - `check`: reads every partition from every node (each node alone: replicas serve
//!   reads from their committed log), waits for the replicas to converge, and runs the
//!   rules of `check` against the acks and the fault events; prints the JSON report,
//!   exit 1 on any violation.
//! - `wait-healthy`: until every node's `/health` answers 200.
//! - `primary`: the replica that is primary of the most partition groups, by the
//!   majority of the nodes' `/stats`.

pub mod check;
pub mod produce;

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use appliance::client::{resolve, Client, ClientError, ClientOptions, RetryPolicy};
use appliance::protocol::reply::split_poll_body;
use appliance::protocol::{Consumer, PollStrategy};
use clap::{Args, Parser, Subcommand};
use replication::wire::{batch, PartitionKey};
use serde_json::{json, Value};

use check::{BatchRecord, CheckParams, Event, ReplicaLogs, Stored};

/// The stream and topic the workload writes to.
pub const STREAM: &str = "cluster-vm";
pub const TOPIC: &str = "workload";

/// Messages asked for per poll when reading a replica.
const READ_BATCH: u32 = 5_000;

#[derive(Parser, Debug)]
#[command(
    name = "appliance-workload",
    version,
    about = "Workload driver and checker for cluster fault tests (tools/cluster-vm)"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Args, Debug, Clone)]
pub struct ConnectArgs {
    /// Client addresses HOST:PORT of the nodes, in replica order (comma-separated).
    #[arg(long, value_delimiter = ',', required = true)]
    pub servers: Vec<String>,
    #[arg(long, default_value = "root")]
    pub user: String,
    /// Password (default: $APPLIANCE_PASSWORD).
    #[arg(long, env = "APPLIANCE_PASSWORD", hide_env_values = true)]
    pub password: String,
    /// Per-attempt reply timeout, milliseconds: how long a silent node (isolated, or its
    /// host stalled) is waited for before the request goes to another node, so about
    /// the cluster's heartbeat timeout. A slower answer is retried under the same request
    /// number, which the cluster answers once.
    #[arg(long, default_value_t = 1_000)]
    pub request_timeout_ms: u64,
    /// Time per request across its retries, milliseconds.
    #[arg(long, default_value_t = 20_000)]
    pub retry_timeout_ms: u64,
}

/// What the producer and the checker must agree on.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    #[arg(long, default_value_t = 4)]
    pub partitions: u32,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 128)]
    pub size: usize,
    /// Seed of the message ids and payloads.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The acks file: one JSON line per batch sent (check::BatchRecord).
    #[arg(long)]
    pub acks: PathBuf,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Produce to every partition at a steady rate until --stop-file exists.
    Produce {
        #[command(flatten)]
        conn: ConnectArgs,
        #[command(flatten)]
        run: RunArgs,
        /// Messages per second per partition.
        #[arg(long, default_value_t = 200)]
        rate: u32,
        #[arg(long, default_value_t = 10)]
        batch: u32,
        /// Stop once this file exists.
        #[arg(long)]
        stop_file: PathBuf,
        /// Stop after this many seconds whatever happens.
        #[arg(long, default_value_t = 1_800)]
        max_seconds: u64,
    },
    /// Read every replica and check the run; print the JSON report.
    Check {
        #[command(flatten)]
        conn: ConnectArgs,
        #[command(flatten)]
        run: RunArgs,
        /// The fault events (JSON lines: t_ms, kind, node, expect_writes).
        #[arg(long)]
        events: Option<PathBuf>,
        /// How long replicas may take to converge before a shorter one is a violation.
        #[arg(long, default_value_t = 30_000)]
        settle_ms: u64,
        /// Bound on the time to an acknowledged write after a fault that leaves a quorum.
        #[arg(long, default_value_t = 30_000)]
        recovery_bound_ms: u64,
        /// Tighter bound for a failover (kill, stop, isolation): heartbeat_timeout +
        /// 500 ms. 0: only --recovery-bound-ms applies.
        #[arg(long, default_value_t = 0)]
        failover_bound_ms: u64,
        /// Bound on the p99 ack latency of batches sent while a node is slowed.
        #[arg(long, default_value_t = 150)]
        slow_latency_bound_ms: u64,
        /// A JSON object merged into the report (scenario name, seed, mode...).
        #[arg(long)]
        meta: Option<String>,
        /// Also write the report here.
        #[arg(long)]
        report: Option<PathBuf>,
    },
    /// Wait until every node's /health answers 200.
    WaitHealthy {
        /// Stats addresses HOST:PORT (comma-separated).
        #[arg(long, value_delimiter = ',', required = true)]
        http: Vec<String>,
        #[arg(long, default_value_t = 60_000)]
        timeout_ms: u64,
    },
    /// Print the replica id that is primary of the most partition groups.
    Primary {
        /// Stats addresses HOST:PORT in replica order (comma-separated).
        #[arg(long, value_delimiter = ',', required = true)]
        http: Vec<String>,
    },
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn addrs(specs: &[String]) -> Result<Vec<SocketAddr>, String> {
    let mut out = Vec::new();
    for spec in specs {
        out.extend(resolve(spec).map_err(|e| format!("{spec}: {e}"))?);
    }
    Ok(out)
}

fn options(conn: &ConnectArgs) -> ClientOptions {
    ClientOptions {
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_millis(conn.request_timeout_ms.max(1)),
        retry: RetryPolicy {
            total_timeout: Duration::from_millis(conn.retry_timeout_ms),
            ..RetryPolicy::default()
        },
        // A failover then needs no new connection and password check at the new
        // primary, which every producer thread reaches at once.
        standby_logins: true,
        ..ClientOptions::default()
    }
}

fn connect_to(addrs: &[SocketAddr], conn: &ConnectArgs) -> Result<Client, ClientError> {
    let mut client = Client::connect(addrs, options(conn))?;
    client.login(&conn.user, conn.password.as_bytes())?;
    Ok(client)
}

/// A client that knows every node and logs in.
pub fn connect_all(conn: &ConnectArgs) -> Result<Client, String> {
    let all = addrs(&conn.servers)?;
    connect_to(&all, conn).map_err(|e| e.to_string())
}

/// Everything one node serves of every partition, read from that node alone.
fn read_replica(
    addr: SocketAddr,
    conn: &ConnectArgs,
    key: impl Fn(u32) -> PartitionKey,
    partitions: u32,
    seed: u64,
    size: usize,
) -> ReplicaLogs {
    let mut client = connect_to(&[addr], conn).map_err(|e| e.to_string())?;
    let mut logs = BTreeMap::new();
    for p in 0..partitions {
        let mut log: Vec<Stored> = Vec::new();
        loop {
            let next = log.len() as u64;
            let body = client
                .poll_messages(
                    key(p),
                    Consumer::Single(0),
                    PollStrategy::Offset(next),
                    READ_BATCH,
                )
                .map_err(|e| format!("partition {p} at offset {next}: {e}"))?;
            let batches = split_poll_body(&body).map_err(|e| format!("partition {p}: {e}"))?;
            let before = log.len();
            for (bytes, _) in &batches {
                for m in batch::messages(bytes) {
                    if m.offset < next {
                        continue;
                    }
                    let (_, index) = crate::cli::derive::split_id(m.id);
                    let payload_ok = m.payload.len() == size
                        && crate::cli::derive::payload(seed, index, size) == m.payload;
                    log.push(Stored {
                        offset: m.offset,
                        id: m.id,
                        payload_hash: xxhash_rust::xxh3::xxh3_64(m.payload),
                        payload_ok,
                    });
                }
            }
            if log.len() == before {
                break;
            }
            // A replica with a gap would loop on it: the checker reports the gap.
            if log.last().is_some_and(|s| s.offset + 1 != log.len() as u64) {
                break;
            }
        }
        logs.insert(p, log);
    }
    Ok(logs)
}

/// The workload topic's (stream, topic) ids, from the first node that can tell (each
/// node serves these reads from its own metadata, so one slow node does not matter).
fn topic_ids(nodes: &[SocketAddr], conn: &ConnectArgs) -> Result<(u32, u32), String> {
    let mut errors = Vec::new();
    for node in nodes {
        let found = connect_to(&[*node], conn).and_then(|mut c| {
            let stream = c
                .list_streams()?
                .streams
                .into_iter()
                .find(|s| s.name == STREAM);
            let Some(stream) = stream else {
                return Ok(None);
            };
            let topic = c
                .list_topics(stream.stream_id)?
                .topics
                .into_iter()
                .find(|t| t.name == TOPIC);
            Ok(topic.map(|t| (stream.stream_id, t.topic_id)))
        });
        match found {
            Ok(Some(ids)) => return Ok(ids),
            Ok(None) => errors.push(format!("{node}: no topic {STREAM}/{TOPIC}")),
            Err(e) => errors.push(format!("{node}: {e}")),
        }
    }
    Err(format!(
        "no node names the workload topic: {}",
        errors.join("; ")
    ))
}

fn lengths(r: &ReplicaLogs) -> Option<Vec<usize>> {
    r.as_ref().ok().map(|l| l.values().map(Vec::len).collect())
}

/// Reads every node until they all serve logs of the same lengths, or the settle time
/// passes (then the last reading is checked as it is).
fn read_replicas(
    conn: &ConnectArgs,
    partitions: u32,
    seed: u64,
    size: usize,
    settle: Duration,
) -> Result<Vec<ReplicaLogs>, String> {
    let nodes = addrs(&conn.servers)?;
    let (stream, topic) = topic_ids(&nodes, conn)?;
    let key = |partition| PartitionKey {
        stream,
        topic,
        partition,
    };
    let deadline = Instant::now() + settle;
    loop {
        let replicas: Vec<ReplicaLogs> = nodes
            .iter()
            .map(|a| read_replica(*a, conn, key, partitions, seed, size))
            .collect();
        let all: Vec<Option<Vec<usize>>> = replicas.iter().map(lengths).collect();
        let converged = all.iter().all(|l| l.is_some() && *l == all[0]);
        if converged || Instant::now() >= deadline {
            return Ok(replicas);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn read_lines<T: serde::de::DeserializeOwned>(path: &PathBuf) -> Result<Vec<T>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    // A producer killed mid-line leaves a torn last line: skip only that one.
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(v) => out.push(v),
            Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => {}
            Err(e) => return Err(format!("{} line {}: {e}", path.display(), i + 1)),
        }
    }
    Ok(out)
}

/// GET path on addr: (status code, body).
fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let sock = resolve(addr).ok()?.into_iter().next()?;
    let mut s = TcpStream::connect_timeout(&sock, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}

fn wait_healthy(http: &[String], timeout: Duration) -> Result<Value, String> {
    let started = Instant::now();
    loop {
        let unhealthy: Vec<&String> = http
            .iter()
            .filter(|a| http_get(a, "/health").is_none_or(|(code, _)| code != 200))
            .collect();
        if unhealthy.is_empty() {
            return Ok(json!({"healthy_after_ms": started.elapsed().as_millis() as u64}));
        }
        if started.elapsed() >= timeout {
            return Err(format!(
                "not healthy within {} ms: {unhealthy:?}",
                timeout.as_millis()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The primary of the most partition groups (metadata group if there are none), each
/// group's primary taken from the majority of the nodes that answered.
fn primary(http: &[String]) -> Result<u32, String> {
    let mut votes: HashMap<String, HashMap<u64, usize>> = HashMap::new();
    for addr in http {
        let Some((200, body)) = http_get(addr, "/stats?groups=all") else {
            continue;
        };
        let Ok(stats) = serde_json::from_str::<Value>(&body) else {
            continue;
        };
        for g in stats["groups"].as_array().into_iter().flatten() {
            if let (Some(group), Some(p)) = (g["group"].as_str(), g["primary"].as_u64()) {
                *votes
                    .entry(group.to_owned())
                    .or_default()
                    .entry(p)
                    .or_default() += 1;
            }
        }
    }
    let metadata = replication::wire::METADATA_GROUP.to_string();
    let mut count: BTreeMap<u64, usize> = BTreeMap::new();
    let partition_groups = votes.keys().filter(|g| **g != metadata).count();
    for (group, v) in &votes {
        if partition_groups > 0 && *group == metadata {
            continue;
        }
        if let Some((p, _)) = v.iter().max_by_key(|(p, n)| (**n, std::cmp::Reverse(**p))) {
            *count.entry(*p).or_default() += 1;
        }
    }
    count
        .iter()
        .max_by_key(|(p, n)| (**n, std::cmp::Reverse(**p)))
        .map(|(p, _)| *p as u32)
        .ok_or_else(|| "no node answered /stats".to_string())
}

/// Runs a command: the JSON to print and whether it passed.
pub fn run(cli: &Cli) -> Result<(Value, bool), String> {
    match &cli.command {
        Cmd::Produce {
            conn,
            run: args,
            rate,
            batch,
            stop_file,
            max_seconds,
        } => {
            let RunArgs {
                partitions,
                size,
                seed,
                acks,
            } = args;
            if *batch == 0 || *partitions == 0 {
                return Err("--batch and --partitions must be at least 1".into());
            }
            let params = produce::ProduceParams {
                partitions: *partitions,
                rate: *rate,
                batch: *batch,
                size: *size,
                seed: *seed,
                stop_file: stop_file.clone(),
                max_duration: Duration::from_secs(*max_seconds),
            };
            let (acked, failed) = produce::run(conn, &params, acks)?;
            Ok((json!({"acked": acked, "failed": failed}), true))
        }
        Cmd::Check {
            conn,
            run: args,
            events,
            settle_ms,
            recovery_bound_ms,
            failover_bound_ms,
            slow_latency_bound_ms,
            meta,
            report,
        } => {
            let records: Vec<BatchRecord> = read_lines(&args.acks)?;
            let (partitions, size, seed) = (&args.partitions, &args.size, &args.seed);
            let events: Vec<Event> = match events {
                Some(path) => read_lines(path)?,
                None => Vec::new(),
            };
            let replicas = read_replicas(
                conn,
                *partitions,
                *seed,
                *size,
                Duration::from_millis(*settle_ms),
            )?;
            let params = CheckParams {
                seed: *seed,
                partitions: *partitions,
                recovery_bound_ms: *recovery_bound_ms,
                failover_bound_ms: *failover_bound_ms,
                slow_latency_bound_ms: *slow_latency_bound_ms,
            };
            let mut out = check::analyze(params, &records, &events, &replicas);
            if let Some(meta) = meta {
                let meta: Value = serde_json::from_str(meta).map_err(|e| format!("--meta: {e}"))?;
                for (k, v) in meta.as_object().into_iter().flatten() {
                    out[k] = v.clone();
                }
            }
            if let Some(path) = report {
                std::fs::write(path, format!("{out}\n"))
                    .map_err(|e| format!("{}: {e}", path.display()))?;
            }
            let ok = out["ok"] == true;
            Ok((out, ok))
        }
        Cmd::WaitHealthy { http, timeout_ms } => {
            wait_healthy(http, Duration::from_millis(*timeout_ms)).map(|v| (v, true))
        }
        Cmd::Primary { http } => primary(http).map(|p| (json!(p), true)),
    }
}
