//! Iggy's reads of users, personal access tokens, client connections and the node's
//! stats (GetUser, GetUsers, GetPersonalAccessTokens, GetMe, GetClient, GetClients,
//! GetStats), answered from this node's committed metadata and its own figures.

use replication::bus::ClientId;
use replication::wire::PartitionKey;

use super::client::now_us;
use super::node::Node;
use crate::protocol::request::SERVER_VERSION;
use crate::protocol::system::{ClientReply, StatsReply, NO_USER};
use crate::protocol::users::{TokenReply, UserReply};
use crate::protocol::{ClientRequest, Status};
use crate::state::Right;

impl Node {
    /// Answers one of the reads above for `user` on `connection`. An unknown user in
    /// GetUser, or an unknown client in GetClient, is an empty answer (the SDK's
    /// "none"). Listing users, clients or the stats takes the cluster-wide read right.
    pub(super) fn user_read(
        &self,
        user: u32,
        connection: ClientId,
        request: &ClientRequest<'_>,
    ) -> (Status, Vec<u8>) {
        let cluster_reader = self.state.allows(user, 0, Right::Read);
        let denied = (Status::PermissionDenied, Vec::new());
        match request {
            ClientRequest::GetUser { user: target } => {
                let id = self.state.user_id(target);
                // Without the right, only one's own record: whether another user
                // exists is not told either.
                if id != Some(user) && !cluster_reader {
                    return denied;
                }
                match id {
                    Some(id) => (Status::Ok, self.state.users[&id].details(id).encode()),
                    None => (Status::Ok, Vec::new()),
                }
            }
            ClientRequest::GetUsers if cluster_reader => {
                let users: Vec<UserReply> = self
                    .state
                    .users
                    .iter()
                    .map(|(id, u)| u.reply(*id))
                    .collect();
                (Status::Ok, UserReply::encode_all(&users))
            }
            ClientRequest::GetTokens => {
                let tokens: Vec<TokenReply> = self
                    .state
                    .users
                    .get(&user)
                    .map(|u| {
                        u.tokens
                            .iter()
                            .map(|(name, t)| TokenReply {
                                name: name.clone(),
                                expiry_at: t.expiry_at,
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                (Status::Ok, TokenReply::encode_all(&tokens))
            }
            ClientRequest::GetMe => (Status::Ok, self.client_reply(connection).encode()),
            ClientRequest::GetClient { client_id } if cluster_reader => {
                let connection = ClientId(u64::from(*client_id));
                if !self.connections.contains_key(&connection) {
                    return (Status::Ok, Vec::new());
                }
                (Status::Ok, self.client_reply(connection).encode())
            }
            ClientRequest::GetClients if cluster_reader => {
                let mut ids: Vec<ClientId> = self.connections.keys().copied().collect();
                ids.sort_by_key(|c| c.0);
                let clients: Vec<ClientReply> =
                    ids.into_iter().map(|c| self.client_reply(c)).collect();
                (Status::Ok, ClientReply::encode_all(&clients))
            }
            ClientRequest::GetStats if cluster_reader => (Status::Ok, self.stats_reply().encode()),
            ClientRequest::GetUsers
            | ClientRequest::GetClient { .. }
            | ClientRequest::GetClients
            | ClientRequest::GetStats => denied,
            _ => (Status::InvalidRequest, Vec::new()),
        }
    }

    /// A client connection as Iggy describes it: its id on this node, its user, the
    /// address it comes from and the consumer groups its sessions belong to.
    fn client_reply(&self, connection: ClientId) -> ClientReply {
        let user_id = self
            .connections
            .get(&connection)
            .and_then(|c| c.user)
            .unwrap_or(NO_USER);
        let sessions: Vec<u128> = self
            .client_connections
            .iter()
            .filter(|(_, c)| **c == connection)
            .map(|(session, _)| *session)
            .collect();
        let mut groups = Vec::new();
        for (stream_id, stream) in &self.state.streams {
            for (topic_id, topic) in &stream.topics {
                for (group_id, group) in &topic.groups {
                    if sessions.iter().any(|s| group.members.contains(s)) {
                        groups.push((*stream_id, *topic_id, *group_id));
                    }
                }
            }
        }
        ClientReply {
            client_id: connection.0 as u32,
            user_id,
            address: self
                .bus
                .client_address(connection)
                .map_or_else(String::new, |a| a.to_string()),
            groups,
        }
    }

    /// Iggy's stats from this node: its process, its host, and what it stores.
    fn stats_reply(&self) -> StatsReply {
        let mut reply = StatsReply {
            process_id: std::process::id(),
            run_time: self.started.elapsed().as_micros() as u64,
            server_version: SERVER_VERSION.to_string(),
            clients_count: self.connections.len() as u32,
            os_name: "Linux".to_string(),
            ..StatsReply::default()
        };
        reply.start_time = now_us().saturating_sub(reply.run_time);
        (reply.free_disk_space, reply.total_disk_space) =
            super::storage::file_system_space(&self.settings.data_dir)
                .unwrap_or((self.storage.free_bytes, self.storage.total_bytes));
        for (stream_id, stream) in &self.state.streams {
            reply.streams_count += 1;
            for (topic_id, topic) in &stream.topics {
                reply.topics_count += 1;
                reply.partitions_count += topic.partition_count;
                reply.consumer_groups_count += topic.groups.len() as u32;
                let (bytes, messages) = self.topic_sizes(*stream_id, *topic_id);
                reply.messages_size_bytes += bytes;
                reply.messages_count += messages;
                for partition in 0..topic.partition_count {
                    let key = PartitionKey {
                        stream: *stream_id,
                        topic: *topic_id,
                        partition,
                    };
                    if let Some(log) = key
                        .pack()
                        .ok()
                        .and_then(|group| self.partitions.by_group.get(&group))
                    {
                        reply.segments_count += log.log.segment_count() as u32;
                    }
                }
            }
        }
        host::fill(&mut reply, self.started.elapsed().as_secs_f64());
        reply
    }
}

/// The process's and the host's figures, read from /proc (a figure that cannot be read
/// stays 0).
mod host {
    use crate::protocol::system::StatsReply;

    fn read(path: &str) -> String {
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// The value of `key` in a "key: value [unit]" file such as /proc/meminfo.
    fn field(text: &str, key: &str) -> u64 {
        text.lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    pub(super) fn fill(reply: &mut StatsReply, run_seconds: f64) {
        let meminfo = read("/proc/meminfo");
        reply.total_memory = field(&meminfo, "MemTotal") * 1024;
        reply.available_memory = field(&meminfo, "MemAvailable") * 1024;
        let status = read("/proc/self/status");
        reply.memory_usage = field(&status, "VmRSS") * 1024;
        reply.threads_count = field(&status, "Threads") as u32;
        let io = read("/proc/self/io");
        reply.read_bytes = field(&io, "read_bytes");
        reply.written_bytes = field(&io, "write_bytes");
        reply.hostname = read("/proc/sys/kernel/hostname").trim().to_string();
        reply.kernel_version = read("/proc/sys/kernel/osrelease").trim().to_string();
        reply.os_version = read("/etc/os-release")
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|v| v.trim_matches('"').to_string())
            .unwrap_or_default();
        // SAFETY: sysconf has no preconditions.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        // SAFETY: as above.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as f64;
        // /proc/self/stat: utime and stime are fields 14 and 15, after the command's
        // closing parenthesis (which may itself hold spaces).
        let stat = read("/proc/self/stat");
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = after.split_whitespace().collect();
        let cpu_ticks: f64 = [11, 12]
            .iter()
            .filter_map(|i| fields.get(*i)?.parse::<f64>().ok())
            .sum();
        if run_seconds > 0.0 {
            reply.cpu_usage = (cpu_ticks / ticks / run_seconds / cpus * 100.0) as f32;
        }
        // The host's CPU use since boot: 1 - idle share of /proc/stat's first line.
        let host: Vec<f64> = read("/proc/stat")
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        let total: f64 = host.iter().sum();
        if total > 0.0 && host.len() > 4 {
            reply.total_cpu_usage = ((1.0 - (host[3] + host[4]) / total) * 100.0) as f32;
        }
    }
}
