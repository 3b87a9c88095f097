//! Iggy's system replies: GetStats, and GetMe / GetClient / GetClients
//! (docs/client-protocol.md, "System").

use super::codec::{BodyError, Reader, Writer};

/// Iggy's transport code for TCP.
pub const TRANSPORT_TCP: u8 = 1;

/// One client connection (Iggy's ClientResponse): client_id u32, user_id u32 (u32::MAX
/// before login), transport u8, address (u32 length), consumer_groups_count u32; GetMe
/// and GetClient follow it with the groups (stream, topic, group ids, u32 each).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientReply {
    pub client_id: u32,
    pub user_id: u32,
    pub address: String,
    pub groups: Vec<(u32, u32, u32)>,
}

/// The user id of a connection that has not logged in.
pub const NO_USER: u32 = u32::MAX;

impl ClientReply {
    fn write_head(&self, w: &mut Writer) {
        w.u32(self.client_id)
            .u32(self.user_id)
            .u8(TRANSPORT_TCP)
            .u32(self.address.len() as u32)
            .raw(self.address.as_bytes())
            .u32(self.groups.len() as u32);
    }

    /// GetMe and GetClient: the connection and its groups.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        self.write_head(&mut w);
        for (stream, topic, group) in &self.groups {
            w.u32(*stream).u32(*topic).u32(*group);
        }
        w.finish()
    }

    /// GetClients: the connections, without their groups.
    pub fn encode_all(clients: &[ClientReply]) -> Vec<u8> {
        let mut w = Writer::default();
        for client in clients {
            client.write_head(&mut w);
        }
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<ClientReply, BodyError> {
        let mut r = Reader::new(body);
        let client_id = r.u32("client_id")?;
        let user_id = r.u32("user_id")?;
        r.u8("transport")?;
        let length = r.u32("address_length")? as usize;
        let address = String::from_utf8(r.bytes(length, "address")?.to_vec())
            .map_err(|_| BodyError::NotUtf8 { field: "address" })?;
        let count = r.u32("consumer_groups_count")?;
        let groups = (0..count)
            .map(|_| Ok((r.u32("stream_id")?, r.u32("topic_id")?, r.u32("group_id")?)))
            .collect::<Result<_, BodyError>>()?;
        r.finish()?;
        Ok(ClientReply {
            client_id,
            user_id,
            address,
            groups,
        })
    }
}

/// Iggy's StatsResponse, from this node's figures (docs/client-protocol.md lists where
/// each comes from). Times in microseconds, sizes in bytes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatsReply {
    pub process_id: u32,
    pub cpu_usage: f32,
    pub total_cpu_usage: f32,
    pub memory_usage: u64,
    pub total_memory: u64,
    pub available_memory: u64,
    pub run_time: u64,
    pub start_time: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub messages_size_bytes: u64,
    pub streams_count: u32,
    pub topics_count: u32,
    pub partitions_count: u32,
    pub segments_count: u32,
    pub messages_count: u64,
    pub clients_count: u32,
    pub consumer_groups_count: u32,
    pub hostname: String,
    pub os_name: String,
    pub os_version: String,
    pub kernel_version: String,
    pub server_version: String,
    pub threads_count: u32,
    pub free_disk_space: u64,
    pub total_disk_space: u64,
}

impl StatsReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u32(self.process_id)
            .u32(self.cpu_usage.to_bits())
            .u32(self.total_cpu_usage.to_bits())
            .u64(self.memory_usage)
            .u64(self.total_memory)
            .u64(self.available_memory)
            .u64(self.run_time)
            .u64(self.start_time)
            .u64(self.read_bytes)
            .u64(self.written_bytes)
            .u64(self.messages_size_bytes)
            .u32(self.streams_count)
            .u32(self.topics_count)
            .u32(self.partitions_count)
            .u32(self.segments_count)
            .u64(self.messages_count)
            .u32(self.clients_count)
            .u32(self.consumer_groups_count);
        for text in [
            &self.hostname,
            &self.os_name,
            &self.os_version,
            &self.kernel_version,
            &self.server_version,
        ] {
            w.u32(text.len() as u32).raw(text.as_bytes());
        }
        // No semantic version number, no cache metrics.
        w.u32(0).u32(0);
        w.u32(self.threads_count)
            .u64(self.free_disk_space)
            .u64(self.total_disk_space);
        w.finish()
    }
}
