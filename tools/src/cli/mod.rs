//! appliance-cli: arguments, connecting and logging in, name resolution, and the
//! create/produce/consume commands (README.md).

pub mod bench;
pub mod consume;
pub mod derive;
pub mod probe;
pub mod produce;
pub mod status;
pub mod topic;

use std::net::SocketAddr;
use std::time::Duration;

use appliance::client::{resolve, Client, ClientError, ClientOptions, ClientTls, RetryPolicy};
use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};

/// Environment variable read when --password is not given.
pub const PASSWORD_ENV: &str = "APPLIANCE_PASSWORD";

#[derive(Parser, Debug)]
#[command(
    name = "appliance-cli",
    version,
    about = "Create streams and topics, produce and consume messages"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Args, Debug)]
pub struct Global {
    /// Any node's client address HOST:PORT (repeat or comma-separate for more); requests
    /// follow redirects to each group's primary.
    #[arg(
        long = "server",
        global = true,
        value_delimiter = ',',
        default_value = "127.0.0.1:8090"
    )]
    pub servers: Vec<String>,
    /// User to log in as.
    #[arg(long, global = true, default_value = "root")]
    pub user: String,
    /// Password (default: the APPLIANCE_PASSWORD environment variable).
    #[arg(long, global = true)]
    pub password: Option<String>,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    pub json: bool,
    /// Per-attempt reply timeout, milliseconds.
    #[arg(long, global = true, default_value_t = 10_000)]
    pub request_timeout_ms: u64,
    /// Attempts per request (redirects included) before giving up.
    #[arg(long, global = true, default_value_t = 300)]
    pub attempts: u32,
    /// Total time per request across its attempts, milliseconds.
    #[arg(long, global = true, default_value_t = 30_000)]
    pub retry_timeout_ms: u64,
    /// Connect with TLS 1.3 (the cluster's tcp.tls is enabled).
    #[arg(long, global = true)]
    pub tls: bool,
    /// PEM CA bundle the nodes' certificates chain to (default: the system's roots).
    /// Implies --tls.
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Name the nodes' certificates carry (default: the address's IP). Implies --tls.
    #[arg(long, global = true, value_name = "NAME")]
    pub tls_domain: Option<String>,
}

/// The TLS settings --tls, --tls-ca and --tls-domain give (None: plaintext).
pub fn client_tls(global: &Global) -> Result<Option<ClientTls>, CliError> {
    if !global.tls && global.tls_ca.is_none() && global.tls_domain.is_none() {
        return Ok(None);
    }
    ClientTls::new(global.tls_ca.as_deref(), global.tls_domain.clone())
        .map(Some)
        .map_err(|e| CliError::Usage(e.to_string()))
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Streams.
    Stream {
        #[command(subcommand)]
        action: StreamCmd,
    },
    /// Topics.
    Topic {
        #[command(subcommand)]
        action: topic::TopicCmd,
    },
    /// Send generated messages derived from --seed; report what was acknowledged.
    Produce(produce::ProduceArgs),
    /// Read messages back by offset; verify checksums and (with --verify) content.
    Consume(consume::ConsumeArgs),
    /// The cluster at a glance from any node's stats endpoint (--http).
    Status(status::StatusArgs),
    /// Benchmarks: latency histograms and throughput, results checked.
    Bench {
        #[command(subcommand)]
        action: bench::BenchCmd,
    },
}

#[derive(Subcommand, Debug)]
pub enum StreamCmd {
    /// Create a stream.
    Create { name: String },
}

/// Why a command failed: bad usage (exit 2) or a runtime failure (exit 1).
#[derive(Debug)]
pub enum CliError {
    Usage(String),
    /// A failure; `report` is printed (text or JSON) before the one-line error.
    Runtime {
        message: String,
        report: Option<Report>,
    },
}

impl CliError {
    pub fn runtime(message: impl Into<String>) -> CliError {
        CliError::Runtime {
            message: message.into(),
            report: None,
        }
    }

    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Runtime { .. } => 1,
        }
    }
}

impl From<ClientError> for CliError {
    fn from(error: ClientError) -> CliError {
        match error {
            ClientError::InvalidArgument { what, rule } => {
                CliError::Usage(format!("{what}: {rule}"))
            }
            other => CliError::runtime(other.to_string()),
        }
    }
}

/// What a command prints: text lines and the JSON object for --json.
#[derive(Debug)]
pub struct Report {
    pub text: String,
    pub json: Value,
}

impl Report {
    pub fn print(&self, json_output: bool) {
        if json_output {
            println!("{}", self.json);
        } else {
            println!("{}", self.text);
        }
    }
}

fn servers(global: &Global) -> Result<Vec<SocketAddr>, CliError> {
    let mut out = Vec::new();
    for spec in &global.servers {
        let addrs = resolve(spec).map_err(|e| match e {
            ClientError::InvalidArgument { rule, .. } => {
                CliError::Usage(format!("--server {rule}"))
            }
            other => CliError::Usage(format!("--server: {other}")),
        })?;
        out.extend(addrs);
    }
    if out.is_empty() {
        return Err(CliError::Usage("--server: no address given".into()));
    }
    Ok(out)
}

fn password(global: &Global) -> Result<String, CliError> {
    match &global.password {
        Some(p) => Ok(p.clone()),
        None => std::env::var(PASSWORD_ENV).map_err(|_| {
            CliError::Usage(format!(
                "no password: give --password or set {PASSWORD_ENV}"
            ))
        }),
    }
}

/// Connects to any of the servers and logs in.
pub fn connect(global: &Global) -> Result<Client, CliError> {
    connect_with(global, |retry| retry)
}

/// `connect` with the retry policy the global options give, adjusted by `retry`.
pub fn connect_with(
    global: &Global,
    retry: impl FnOnce(RetryPolicy) -> RetryPolicy,
) -> Result<Client, CliError> {
    let servers = servers(global)?;
    let password = password(global)?;
    if global.attempts == 0 {
        return Err(CliError::Usage("--attempts must be at least 1".into()));
    }
    let options = ClientOptions {
        request_timeout: Duration::from_millis(global.request_timeout_ms.max(1)),
        retry: retry(RetryPolicy {
            attempts_max: global.attempts,
            total_timeout: Duration::from_millis(global.retry_timeout_ms),
            ..RetryPolicy::default()
        }),
        tls: client_tls(global)?,
        ..ClientOptions::default()
    };
    let mut client = Client::connect(&servers, options)?;
    client.login(&global.user, password.as_bytes())?;
    // No Register here: the client registers a session before its first write, so a
    // read-only consume leaves no session behind.
    Ok(client)
}

/// How long a stream or topic lookup that misses is retried. Metadata reads are served
/// by the node the client is connected to, from what it has applied, and a backup may
/// lag the commit that created the stream or topic (by up to a commit broadcast).
pub const LOOKUP_PATIENCE: std::time::Duration = std::time::Duration::from_secs(3);

/// `find` until it finds something or `patience` has passed (then None); errors end it.
pub fn lookup<T>(
    patience: std::time::Duration,
    mut find: impl FnMut() -> Result<Option<T>, CliError>,
) -> Result<Option<T>, CliError> {
    let deadline = std::time::Instant::now() + patience;
    loop {
        if let Some(found) = find()? {
            return Ok(Some(found));
        }
        if std::time::Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The id of the stream named `name`, as the connected node knows it now.
pub fn find_stream(client: &mut Client, name: &str) -> Result<Option<u32>, CliError> {
    Ok(client
        .list_streams()?
        .streams
        .into_iter()
        .find(|s| s.name == name)
        .map(|s| s.stream_id))
}

/// A stream given by id (digits) or by name.
pub fn stream_id(client: &mut Client, stream: &str) -> Result<u32, CliError> {
    if let Ok(id) = stream.parse::<u32>() {
        return Ok(id);
    }
    lookup(LOOKUP_PATIENCE, || find_stream(client, stream))?
        .ok_or_else(|| CliError::runtime(format!("no stream named {stream:?}")))
}

/// A topic of `stream_id` given by id or name, with its partition count.
pub fn topic(client: &mut Client, stream_id: u32, topic: &str) -> Result<(u32, u32), CliError> {
    lookup(LOOKUP_PATIENCE, || find_topic(client, stream_id, topic))?
        .ok_or_else(|| CliError::runtime(format!("no topic {topic:?} in stream {stream_id}")))
}

/// The id and partition count of `topic` (id or name) of `stream_id`, as the connected
/// node knows it now.
pub fn find_topic(
    client: &mut Client,
    stream_id: u32,
    topic: &str,
) -> Result<Option<(u32, u32)>, CliError> {
    let topics = client.list_topics(stream_id)?.topics;
    let found = match topic.parse::<u32>() {
        Ok(id) => topics.into_iter().find(|t| t.topic_id == id),
        Err(_) => topics.into_iter().find(|t| t.name == topic),
    };
    Ok(found.map(|t| (t.topic_id, t.partitions)))
}

/// Runs a parsed command.
pub fn run(cli: &Cli) -> Result<Report, CliError> {
    match &cli.command {
        Cmd::Stream {
            action: StreamCmd::Create { name },
        } => {
            let mut client = connect(&cli.global)?;
            let id = client.create_stream(name)?;
            Ok(Report {
                text: format!("stream {name:?} created with id {id}"),
                json: json!({"stream_id": id, "name": name}),
            })
        }
        Cmd::Topic { action } => topic::run(&cli.global, action),
        Cmd::Produce(args) => produce::run(&cli.global, args),
        Cmd::Consume(args) => consume::run(&cli.global, args),
        Cmd::Status(args) => status::run(&cli.global, args),
        Cmd::Bench { action } => bench::run(&cli.global, action),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn a_lookup_that_misses_is_retried_until_found_or_out_of_patience() {
        let mut calls = 0;
        let found = lookup(Duration::from_secs(5), || {
            calls += 1;
            Ok((calls == 3).then_some(42))
        })
        .unwrap();
        assert_eq!((found, calls), (Some(42), 3));

        let started = Instant::now();
        let mut calls = 0;
        let found: Option<u32> = lookup(Duration::from_millis(250), || {
            calls += 1;
            Ok(None)
        })
        .unwrap();
        assert_eq!(found, None);
        assert!(calls >= 2 && started.elapsed() >= Duration::from_millis(250));

        let mut calls = 0;
        let failed: Result<Option<u32>, CliError> = lookup(Duration::from_secs(5), || {
            calls += 1;
            Err(CliError::runtime("connection lost".to_string()))
        });
        assert!(failed.is_err() && calls == 1, "an error is not retried");
    }
}
