//! End-to-end harness: real `appliance` processes on 127.0.0.1 with distinct ports and
//! temporary data directories, killed by PID when the guard drops (even on failure), and
//! a small blocking client speaking docs/client-protocol.md over std::net.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use appliance::protocol::reply::strip_result_section;
pub use appliance::protocol::Status;
use replication::wire::{Frame, Header, Operation, ReplyHeader, RequestHeader};
use zerocopy::FromBytes;

pub const ROOT_PASSWORD: &str = "e2e-root-password";

/// Ports of one node.
#[derive(Clone, Copy, Debug)]
pub struct Ports {
    pub tcp: u16,
    pub http: u16,
    pub tcp_replica: u16,
    pub quic: u16,
    pub websocket: u16,
}

impl Ports {
    /// Ports for `nodes` nodes, all distinct, none handed out before by this process,
    /// and all below the kernel's ephemeral range: a port from that range can be taken
    /// as the local end of any outgoing connection between the moment it is chosen and
    /// the moment the node listens on it. Every listener is held until all are chosen.
    pub fn pick(nodes: usize) -> Vec<Ports> {
        static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
        let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
            .unwrap_or(32768);
        let floor: u16 = if low > 12_000 { 10_000 } else { 1024 };
        let span = u64::from(low.saturating_sub(floor).max(1));
        let mut seed = u64::from(std::process::id())
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        let mut listeners = Vec::with_capacity(nodes * 5);
        let mut ports = Vec::with_capacity(nodes * 5);
        let mut tries = 0u32;
        while ports.len() < nodes * 5 {
            tries += 1;
            assert!(tries < 100_000, "no free port below {low} on 127.0.0.1");
            // xorshift64*
            seed ^= seed >> 12;
            seed ^= seed << 25;
            seed ^= seed >> 27;
            let port =
                floor + (seed.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32).rem_euclid(span) as u16;
            if handed_out.contains(&port) {
                continue;
            }
            if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
                handed_out.insert(port);
                listeners.push(listener);
                ports.push(port);
            }
        }
        drop(listeners);
        ports
            .chunks_exact(5)
            .map(|p| Ports {
                tcp: p[0],
                http: p[1],
                tcp_replica: p[2],
                quic: p[3],
                websocket: p[4],
            })
            .collect()
    }
}

/// A cluster's configuration files and data directories.
pub struct ClusterFiles {
    pub dir: tempfile::TempDir,
    pub ports: Vec<Ports>,
}

impl ClusterFiles {
    pub fn new(nodes: usize) -> ClusterFiles {
        let dir = tempfile::tempdir().expect("tempdir");
        let ports = Ports::pick(nodes);
        let files = ClusterFiles { dir, ports };
        for replica in 0..nodes {
            let mut text = String::from(
                "[cluster]\nname = \"e2e\"\ncommit_broadcast_interval = \"50ms\"\n\
                 heartbeat_timeout = \"500ms\"\npipeline_max = 8\n\n",
            );
            for (id, p) in files.ports.iter().enumerate() {
                text.push_str(&format!(
                    "[[cluster.nodes]]\nname = \"n{id}\"\nip = \"127.0.0.1\"\nreplica_id = {id}\n\
                     ports = {{ tcp = {}, quic = {}, http = {}, websocket = {}, tcp_replica = {} }}\n\n",
                    p.tcp, p.quic, p.http, p.websocket, p.tcp_replica
                ));
            }
            text.push_str("[message_bus]\nmax_message_size = \"1 MiB\"\n\n[limits]\nrequest_body_max = \"512 KiB\"\n\n");
            text.push_str(&format!(
                "[storage]\ndata_dir = \"{}\"\njournal_size = \"16 MiB\"\nsegment_size = \"1 MiB\"\n\
                 reserve_bytes = \"4 MiB\"\nmin_free_bytes = \"256 MiB\"\n",
                files.data_dir(replica).display()
            ));
            std::fs::write(files.config(replica), text).expect("write config");
        }
        files
    }

    /// Applies text replacements to every node's config (e.g. a larger segment size);
    /// each `from` must occur in each config.
    pub fn edit_configs(&self, edits: &[(&str, &str)]) {
        for replica in 0..self.ports.len() {
            let path = self.config(replica);
            let mut text = std::fs::read_to_string(&path).expect("read config");
            for (from, to) in edits {
                assert!(text.contains(from), "{from} in {}", path.display());
                text = text.replace(from, to);
            }
            std::fs::write(&path, text).expect("write config");
        }
    }

    /// Makes node `replica` reach node `peer`'s replica plane at `port` instead (a proxy
    /// the test runs on 127.0.0.1).
    pub fn route_replica_plane(&self, replica: usize, peer: usize, port: u16) {
        let path = self.config(replica);
        let text = std::fs::read_to_string(&path).expect("read config");
        let real = format!("tcp_replica = {} }}", self.ports[peer].tcp_replica);
        assert!(
            text.contains(&real),
            "node {peer}'s entry in {}",
            path.display()
        );
        let text = text.replace(&real, &format!("tcp_replica = {port} }}"));
        std::fs::write(&path, text).expect("write config");
    }

    pub fn config(&self, replica: usize) -> PathBuf {
        self.dir.path().join(format!("node{replica}.toml"))
    }

    pub fn data_dir(&self, replica: usize) -> PathBuf {
        self.dir.path().join(format!("data{replica}"))
    }

    pub fn log(&self, replica: usize) -> PathBuf {
        self.dir.path().join(format!("node{replica}.log"))
    }

    pub fn client_addr(&self, replica: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports[replica].tcp))
    }

    pub fn http_addr(&self, replica: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports[replica].http))
    }
}

/// A running daemon; killed (SIGKILL) and reaped on drop, its log printed when the test
/// is failing.
pub struct Daemon {
    pub child: Option<Child>,
    pub replica: usize,
    pub log: PathBuf,
}

pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_appliance")
}

/// `appliance-cli`, built beside the daemon (cargo builds it for the workspace's tests;
/// when only this package's tests were built, build it now).
pub fn cli_binary() -> PathBuf {
    let path = PathBuf::from(binary()).with_file_name("appliance-cli");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build.args(["build", "-q", "-p", "tools", "--bin", "appliance-cli"]);
    if !cfg!(debug_assertions) {
        build.arg("--release");
    }
    let status = build
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("run cargo build");
    assert!(status.success(), "cargo build appliance-cli");
    assert!(path.exists(), "{} missing", path.display());
    path
}

impl Daemon {
    pub fn start(files: &ClusterFiles, replica: usize) -> Daemon {
        Daemon::start_with_env(files, replica, &[])
    }

    /// As `start`, with `APPLIANCE_*` overrides (e.g. ("APPLIANCE_LIMITS__SESSIONS_MAX", "2")).
    pub fn start_with_env(files: &ClusterFiles, replica: usize, env: &[(&str, &str)]) -> Daemon {
        Daemon::spawn(files, replica, env, Command::new(binary()))
    }

    /// As `start`, under an open files limit (soft and hard) of `limit`.
    #[allow(dead_code)]
    pub fn start_with_open_files(files: &ClusterFiles, replica: usize, limit: u64) -> Daemon {
        use std::os::unix::process::CommandExt;
        let mut command = Command::new(binary());
        // SAFETY: only setrlimit, async-signal-safe, runs between fork and exec.
        unsafe {
            command.pre_exec(move || {
                let rlimit = libc::rlimit {
                    rlim_cur: limit,
                    rlim_max: limit,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &rlimit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Daemon::spawn(files, replica, &[], command)
    }

    fn spawn(
        files: &ClusterFiles,
        replica: usize,
        env: &[(&str, &str)],
        mut command: Command,
    ) -> Daemon {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(files.log(replica))
            .expect("log file");
        let child = command
            .arg("--config")
            .arg(files.config(replica))
            .arg("--replica-id")
            .arg(replica.to_string())
            .env("APPLIANCE_ROOT_PASSWORD", ROOT_PASSWORD)
            .env(
                "RUST_LOG",
                std::env::var("E2E_RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn appliance");
        Daemon {
            child: Some(child),
            replica,
            log: files.log(replica),
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// SIGKILL now.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and the exit status code (None if it had to be killed).
    pub fn terminate(&mut self, within: Duration) -> Option<i32> {
        let mut child = self.child.take()?;
        // SAFETY: kill(2) on the PID of our own child.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "--- log of node {} ---\n{}",
                self.replica,
                log_of(&self.log)
            );
        }
    }
}

/// Waits until `GET /health` answers 200; fails at once if the process exited.
pub fn wait_healthy(files: &ClusterFiles, daemon: &mut Daemon, within: Duration) {
    let replica = daemon.replica;
    let deadline = Instant::now() + within;
    loop {
        if let Some(child) = daemon.child.as_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(files.log(replica)).unwrap_or_default();
                panic!("node {replica} exited ({status}); log:\n{log}");
            }
        }
        if http_get(files.http_addr(replica), "/health").is_some_and(|(code, _)| code == 200) {
            return;
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(files.log(replica)).unwrap_or_default();
            panic!("node {replica} not healthy within {within:?}; log:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// CPU seconds (user and system) process `pid` has spent so far (0 once it is gone).
pub fn cpu_seconds(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name's closing parenthesis: utime and stime are the 12th
    // and 13th (proc(5) numbers them 14 and 15).
    let fields: Vec<u64> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // SAFETY: sysconf takes a constant and has no other effect.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (fields.get(11).unwrap_or(&0) + fields.get(12).unwrap_or(&0)) as f64 / ticks
}

/// A minimal HTTP GET: status code and body.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let code = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Some((code, body))
}

/// `GET /stats`, parsed.
pub fn stats(files: &ClusterFiles, replica: usize) -> serde_json::Value {
    let (code, body) = http_get(files.http_addr(replica), "/stats").expect("GET /stats");
    assert_eq!(code, 200, "/stats: {body}");
    serde_json::from_str(&body).expect("/stats is JSON")
}

/// The `rejected` count of `label` in /stats (0 when absent). The snapshot is published
/// every ~100 ms, so this waits up to 2 s for it to reach `at_least`.
pub fn rejected(files: &ClusterFiles, replica: usize, label: &str, at_least: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let count = stats(files, replica)["rejected"][label]
            .as_u64()
            .unwrap_or(0);
        if count >= at_least || Instant::now() > deadline {
            return count;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A reply: header and body.
#[derive(Debug)]
pub struct Reply {
    pub header: ReplyHeader,
    pub body: Vec<u8>,
}

impl Reply {
    /// The status the reply's code (an Iggy error code) and body stand for.
    pub fn status(&self) -> Status {
        Status::from_reply(self.header.status, &self.body)
            .unwrap_or_else(|| panic!("unknown status code {}", self.header.status))
    }
}

/// `reply` with its body after the result section, where an accepted reply has one.
pub fn without_result_section(mut reply: Reply) -> Reply {
    if reply.header.status == 0 {
        let operation = reply.header.operation;
        reply.body = strip_result_section(operation, &reply.body)
            .expect("an empty result section")
            .to_vec();
    }
    reply
}

/// A Register body (Iggy's LoginRegister: protocol version, SDK name and version, user
/// name, password, no client context).
pub fn login_register_body(username: &str, password: &str) -> Vec<u8> {
    let mut body = appliance::protocol::request::PROTOCOL_VERSION
        .to_le_bytes()
        .to_vec();
    for text in ["e2e", "0", username, password] {
        body.extend_from_slice(&short(text));
    }
    body.extend_from_slice(&0u32.to_le_bytes());
    body
}

/// Where a Register reply's body holds the session: after the empty result section
/// (count u32) and the user id (u32).
pub const REGISTER_SESSION_AT: usize = 8;

/// A blocking client on one connection.
pub struct Client {
    pub stream: TcpStream,
    pub id: u128,
    pub session: u64,
    pub request: u64,
    /// The credentials of the last `login`, which `register` sends again.
    pub credentials: Option<(String, String)>,
}

pub const NON_REPLICATED: u8 = 2;

impl Client {
    pub fn connect(addr: SocketAddr, id: u128) -> std::io::Result<Client> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        stream.set_nodelay(true)?;
        Ok(Client {
            stream,
            id,
            session: 0,
            request: 0,
            credentials: None,
        })
    }

    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    pub fn frame(&self, operation: u8, read_command: u32, request: u64, body: &[u8]) -> Frame {
        let mut header = RequestHeader::new();
        header.client = self.id;
        header.operation = operation;
        header.read_command = read_command;
        header.request = request;
        header.session = self.session;
        Frame::build(&header, body)
    }

    pub fn read_reply(&mut self) -> std::io::Result<Reply> {
        let mut head = [0u8; 256];
        self.stream.read_exact(&mut head)?;
        let header = ReplyHeader::read_from_bytes(&head[..])
            .map_err(|_| std::io::Error::other("short header"))?;
        let size = header.frame.size as usize;
        if !(256..=64 << 20).contains(&size) {
            return Err(std::io::Error::other(format!("bad size {size}")));
        }
        let mut body = vec![0u8; size - 256];
        self.stream.read_exact(&mut body)?;
        Ok(Reply { header, body })
    }

    /// Sends and reads the reply for that request (skipping replies to other requests).
    /// An accepted reply's body comes without its result section (the metadata and
    /// consumer offset writes carry one: docs/client-protocol.md).
    pub fn call(
        &mut self,
        operation: u8,
        read_command: u32,
        request: u64,
        body: &[u8],
    ) -> std::io::Result<Reply> {
        let frame = self.frame(operation, read_command, request, body);
        self.send_raw(frame.as_bytes())?;
        loop {
            let reply = self.read_reply()?;
            if reply.header.request == request && reply.header.operation == operation {
                return Ok(without_result_section(reply));
            }
        }
    }

    pub fn read(&mut self, read_command: u32, body: &[u8]) -> std::io::Result<Reply> {
        self.call(NON_REPLICATED, read_command, 0, body)
    }

    /// LoginUser (read 38): authenticates the connection.
    pub fn login(&mut self, username: &str, password: &str) -> std::io::Result<Reply> {
        self.credentials = Some((username.to_owned(), password.to_owned()));
        let mut body = short(username);
        body.extend_from_slice(&short(password));
        body.extend_from_slice(&[0; 8]); // no version, no context
        self.read(38, &body)
    }

    /// Register with the credentials of the last `login` (root's without one).
    pub fn register(&mut self) -> std::io::Result<Reply> {
        self.session = 0;
        let (username, password) = self
            .credentials
            .clone()
            .unwrap_or_else(|| ("root".to_owned(), ROOT_PASSWORD.to_owned()));
        let body = login_register_body(&username, &password);
        let reply = self.call(Operation::Register as u8, 0, 0, &body)?;
        if reply.status() == Status::Ok && reply.body.len() >= REGISTER_SESSION_AT + 8 {
            self.session = u64_at(&reply.body, REGISTER_SESSION_AT);
        }
        Ok(reply)
    }

    /// A replicated request with the next request number.
    pub fn write(&mut self, operation: Operation, body: &[u8]) -> std::io::Result<Reply> {
        self.request += 1;
        self.call(operation as u8, 0, self.request, body)
    }
}

pub fn short(text: &str) -> Vec<u8> {
    let mut v = vec![text.len() as u8];
    v.extend_from_slice(text.as_bytes());
    v
}

/// A CreateTopic body (Iggy's layout): the stream by id, the partition count, the
/// name and an empty options block.
pub fn create_topic_body(stream: u32, name: &str, partitions: u32) -> Vec<u8> {
    let mut body = vec![1, 4];
    body.extend_from_slice(&stream.to_le_bytes());
    body.extend_from_slice(&partitions.to_le_bytes());
    body.extend_from_slice(&short(name));
    body
}

/// The 12-byte partition key the consumer-offset requests start with.
pub fn partition_key(stream: u32, topic: u32, partition: u32) -> Vec<u8> {
    let mut v = stream.to_le_bytes().to_vec();
    v.extend_from_slice(&topic.to_le_bytes());
    v.extend_from_slice(&partition.to_le_bytes());
    v
}

/// A raw client of node 0 logged in as root, with a session.
pub fn logged_in(files: &ClusterFiles, id: u128) -> Client {
    logged_in_at(files, 0, id)
}

/// A raw client `id` of node `replica`, logged in as root, with a session.
pub fn logged_in_at(files: &ClusterFiles, replica: usize, id: u128) -> Client {
    let mut client = Client::connect(files.client_addr(replica), id).expect("connect");
    let login = client.login("root", ROOT_PASSWORD).expect("login");
    assert_eq!(login.status(), Status::Ok, "login");
    let register = client.register().expect("register");
    assert_eq!(register.status(), Status::Ok, "register");
    assert_ne!(client.session, 0);
    client
}

/// The read command of Iggy's PollMessages.
pub const POLL: u32 = appliance::protocol::ReadCommand::PollMessages as u32;

/// A SendMessages body: `batch` to a partition named by numeric ids.
pub fn send_body(stream: u32, topic: u32, partition: u32, batch: &[u8]) -> Vec<u8> {
    use appliance::protocol::request::{Identifier, Partitioning};
    appliance::protocol::ClientRequest::SendMessages {
        stream: Identifier::Id(stream),
        topic: Identifier::Id(topic),
        partitioning: Partitioning::PartitionId(partition),
        messages_count: u32_at(batch, 48),
        batch,
    }
    .encode()
}

/// A PollMessages body: up to `count` messages at `offset` for consumer 1, without
/// auto commit.
pub fn poll_body(stream: u32, topic: u32, partition: u32, offset: u64, count: u32) -> Vec<u8> {
    use appliance::protocol::request::OffsetTarget;
    let partition = replication::wire::PartitionKey {
        stream,
        topic,
        partition,
    };
    appliance::protocol::ClientRequest::PollMessages {
        target: OffsetTarget::of(partition, appliance::protocol::Consumer::Single(1)),
        strategy: appliance::protocol::PollStrategy::Offset(offset),
        count,
        auto_commit: false,
    }
    .encode()
}

/// The base offset a SendMessages reply confirms (its one confirmation's).
pub fn sent_offset(body: &[u8]) -> u64 {
    assert_eq!(u32_at(body, 0), 1, "one confirmation");
    u64_at(body, 16)
}

pub fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

pub fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

pub fn log_of(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The payload `numbered_batch` gives message `id` (its id field is `id + 1`).
pub fn numbered_payload(id: u64, size: usize) -> Vec<u8> {
    let mut payload = vec![0u8; size];
    for (j, chunk) in payload.chunks_mut(8).enumerate() {
        let word = (id.wrapping_mul(31) ^ j as u64).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    payload
}

/// A batch of `count` messages of `size` bytes with ids `first + 1..`; each payload is
/// derived from its id, so a reader can tell any two apart.
pub fn numbered_batch(first: u64, count: usize, size: usize) -> Vec<u8> {
    let mut builder = replication::wire::batch::BatchBuilder::with_capacity(count * (size + 64));
    for id in first..first + count as u64 {
        let payload = numbered_payload(id, size);
        builder.push(replication::wire::batch::NewMessage {
            id: u128::from(id) + 1,
            timestamp_delta: 0,
            payload: &payload,
            user_headers: &[],
        });
    }
    builder.finish(1)
}

/// Messages node `replica` alone serves per partition (0 on any error), reading with a
/// client that knows only that node.
pub fn served_counts(
    files: &ClusterFiles,
    replica: usize,
    keys: &[replication::wire::PartitionKey],
) -> Vec<u64> {
    let Ok(mut client) = appliance::client::Client::connect(
        &[files.client_addr(replica)],
        appliance::client::ClientOptions::default(),
    ) else {
        return vec![0; keys.len()];
    };
    if client.login("root", ROOT_PASSWORD.as_bytes()).is_err() {
        return vec![0; keys.len()];
    }
    keys.iter()
        .map(|key| {
            let mut next = 0u64;
            loop {
                let Ok(body) = client.poll_messages(
                    *key,
                    appliance::protocol::Consumer::Single(1),
                    appliance::protocol::PollStrategy::Offset(next),
                    10_000,
                ) else {
                    return next;
                };
                let Ok(batches) = appliance::protocol::reply::split_poll_body(&body) else {
                    return next;
                };
                let Some(end) = batches
                    .iter()
                    .filter_map(|(bytes, _)| replication::wire::batch::verify(bytes).ok())
                    .map(|info| info.next_offset())
                    .max()
                else {
                    return next;
                };
                if end <= next {
                    return next;
                }
                next = end;
            }
        })
        .collect()
}

/// A client of the real library that knows `replicas` only, logged in as root.
pub fn library_client(files: &ClusterFiles, replicas: &[usize]) -> appliance::client::Client {
    let addrs: Vec<_> = replicas.iter().map(|r| files.client_addr(*r)).collect();
    let mut client =
        appliance::client::Client::connect(&addrs, appliance::client::ClientOptions::default())
            .expect("connect");
    client
        .login("root", ROOT_PASSWORD.as_bytes())
        .expect("login");
    client
}

/// Starts every node of `files` (with `env`), waits until each is healthy, and creates a
/// stream and a topic of `partitions` partitions: the nodes and the partition keys.
pub fn start_with_topic(
    files: &ClusterFiles,
    env: &[(&str, &str)],
    partitions: u32,
) -> (Vec<Daemon>, Vec<replication::wire::PartitionKey>) {
    let mut daemons: Vec<Daemon> = (0..files.ports.len())
        .map(|r| Daemon::start_with_env(files, r, env))
        .collect();
    for daemon in &mut daemons {
        wait_healthy(files, daemon, Duration::from_secs(60));
    }
    let all: Vec<usize> = (0..files.ports.len()).collect();
    let mut client = library_client(files, &all);
    client.register().expect("register");
    let stream = client.create_stream("data").expect("stream");
    let topic = client.create_topic(stream, "t", partitions).expect("topic");
    let keys = (0..partitions)
        .map(|partition| replication::wire::PartitionKey {
            stream,
            topic,
            partition,
        })
        .collect();
    (daemons, keys)
}

/// A TCP proxy on 127.0.0.1 in front of `target` that appends every byte it carries, in
/// both directions, to `capture`. Returns its port.
pub fn capturing_proxy(target: u16, capture: std::sync::Arc<std::sync::Mutex<Vec<u8>>>) -> u16 {
    proxy(
        target,
        || true,
        move |bytes| {
            if let Ok(mut capture) = capture.lock() {
                capture.extend_from_slice(bytes);
            }
        },
    )
}

/// A TCP proxy on 127.0.0.1 in front of `target` that carries bytes in both directions
/// while `open()` holds, showing each chunk it carried to `observe`. Once `open()` fails
/// it closes every connection it carries (what is on its way is dropped) and refuses new
/// ones until it holds again. Returns its port.
pub fn proxy(
    target: u16,
    open: impl Fn() -> bool + Clone + Send + 'static,
    observe: impl Fn(&[u8]) + Clone + Send + 'static,
) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("proxy port");
    let port = listener.local_addr().expect("bound").port();
    std::thread::spawn(move || {
        for inbound in listener.incoming().flatten() {
            if !open() {
                continue;
            }
            let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)) else {
                continue;
            };
            for (from, to) in [
                (inbound.try_clone(), outbound.try_clone()),
                (outbound.try_clone(), inbound.try_clone()),
            ] {
                let (Ok(from), Ok(to)) = (from, to) else {
                    continue;
                };
                let (open, observe) = (open.clone(), observe.clone());
                std::thread::spawn(move || pump(from, to, open, observe));
            }
        }
    });
    port
}

/// One direction of a `proxy` connection, until either end closes or `open()` fails.
fn pump(mut from: TcpStream, mut to: TcpStream, open: impl Fn() -> bool, observe: impl Fn(&[u8])) {
    // A short read timeout, so a closed gate is seen on an idle connection too.
    let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
    let mut buf = [0u8; 64 * 1024];
    while open() {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) if open() => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
                observe(&buf[..n]);
            }
            Ok(_) => break,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
    let _ = from.shutdown(std::net::Shutdown::Both);
}

/// A test CA (rcgen) and the leaves it signs, written as PEM files.
pub struct TestPki {
    pub ca: rcgen::Certificate,
    pub key: rcgen::KeyPair,
}

/// A leaf's files: its certificate, its key and the CA that signed it.
pub struct LeafFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl LeafFiles {
    /// The `[tcp.tls]` table serving this leaf on the client port.
    pub fn client_tls_table(&self) -> String {
        format!(
            "\n[tcp]\ntls = {{ enabled = true, cert_file = \"{}\", key_file = \"{}\" }}\n",
            self.cert.display(),
            self.key.display()
        )
    }

    /// The `[cluster.tls]` table presenting this leaf and trusting its CA.
    pub fn cluster_tls_table(&self) -> String {
        format!(
            "\n[cluster.tls]\nenabled = true\ncert_file = \"{}\"\nkey_file = \"{}\"\nca_file = \"{}\"\n",
            self.cert.display(),
            self.key.display(),
            self.ca.display()
        )
    }
}

impl ClusterFiles {
    /// Appends `text` (a TOML table) to node `replica`'s config.
    pub fn append_config(&self, replica: usize, text: &str) {
        let config = std::fs::read_to_string(self.config(replica)).expect("read config");
        std::fs::write(self.config(replica), format!("{config}{text}")).expect("write config");
    }
}

impl TestPki {
    pub fn new(name: &str) -> TestPki {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let ca = params.self_signed(&key).expect("ca");
        TestPki { ca, key }
    }

    /// Writes NAME-ca.pem, NAME.pem and NAME.key into `dir`: a leaf for server and client
    /// auth carrying `names` (DNS names or IP addresses).
    pub fn leaf(&self, dir: &Path, name: &str, names: &[&str]) -> LeafFiles {
        let key = rcgen::KeyPair::generate().expect("key");
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names).expect("params");
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.ca, &self.key).expect("leaf");
        let files = LeafFiles {
            ca: dir.join(format!("{name}-ca.pem")),
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}.key")),
        };
        std::fs::write(&files.ca, self.ca.pem()).expect("write ca");
        std::fs::write(&files.cert, cert.pem()).expect("write cert");
        std::fs::write(&files.key, key.serialize_pem()).expect("write key");
        files
    }
}
