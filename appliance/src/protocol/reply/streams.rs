//! Iggy's stream, topic and partition replies.

use super::{decode_all, list_len, LIST_MAX};
use crate::protocol::codec::{BodyError, Reader, Writer};

/// Iggy's compression code for "none", the only one the appliance stores.
pub const COMPRESSION_NONE: u8 = 1;
/// Iggy's stream (CreateStream's reply, each entry of GetStreams, the head of
/// GetStream). Sizes count what the answering node stores; options are empty (the
/// appliance takes none for streams).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamReply {
    pub id: u32,
    /// Microseconds since the Unix epoch.
    pub created_at: u64,
    pub topics_count: u32,
    pub size_bytes: u64,
    pub messages_count: u64,
    pub name: String,
}

impl StreamReply {
    fn write(&self, w: &mut Writer) {
        w.u32(self.id)
            .u64(self.created_at)
            .u32(self.topics_count)
            .u64(self.size_bytes)
            .u64(self.messages_count)
            .short_bytes(self.name.as_bytes())
            .u32(0);
    }

    fn read(r: &mut Reader<'_>) -> Result<StreamReply, BodyError> {
        let reply = StreamReply {
            id: r.u32("stream.id")?,
            created_at: r.u64("stream.created_at")?,
            topics_count: r.u32("stream.topics_count")?,
            size_bytes: r.u64("stream.size_bytes")?,
            messages_count: r.u64("stream.messages_count")?,
            name: r.name("stream.name")?,
        };
        empty_options(r, "stream.options")?;
        Ok(reply)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        self.write(&mut w);
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<StreamReply, BodyError> {
        decode_all(body, StreamReply::read)
    }
}

/// An options block the appliance sends: always empty (u32 length 0).
fn empty_options(r: &mut Reader<'_>, field: &'static str) -> Result<(), BodyError> {
    match r.u32(field)? {
        0 => Ok(()),
        _ => Err(BodyError::Invalid {
            field,
            rule: "the appliance sends no options",
        }),
    }
}

/// GetStreams: every stream the user may read, one after another.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamsReply {
    pub streams: Vec<StreamReply>,
}

impl StreamsReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        for stream in &self.streams {
            stream.write(&mut w);
        }
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<StreamsReply, BodyError> {
        decode_all(body, |r| {
            let streams = r.until_end("streams", LIST_MAX, StreamReply::read)?;
            Ok(StreamsReply { streams })
        })
    }
}

/// Iggy's topic header, as GetStream lists a stream's topics. `message_expiry` and
/// `max_topic_size` as set (0 the server default, u64::MAX never / unlimited).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicReply {
    pub id: u32,
    pub created_at: u64,
    pub partitions_count: u32,
    pub message_expiry: u64,
    pub max_topic_size: u64,
    pub size_bytes: u64,
    pub messages_count: u64,
    pub name: String,
}

impl TopicReply {
    fn write(&self, w: &mut Writer) {
        w.u32(self.id)
            .u64(self.created_at)
            .u32(self.partitions_count)
            .u64(self.message_expiry)
            .u8(COMPRESSION_NONE)
            .u64(self.max_topic_size)
            .u64(self.size_bytes)
            .u64(self.messages_count)
            .short_bytes(self.name.as_bytes())
            .u32(0)
            .u32(0);
    }

    fn read(r: &mut Reader<'_>) -> Result<TopicReply, BodyError> {
        let id = r.u32("topic.id")?;
        let created_at = r.u64("topic.created_at")?;
        let partitions_count = r.u32("topic.partitions_count")?;
        let message_expiry = r.u64("topic.message_expiry")?;
        if r.u8("topic.compression")? != COMPRESSION_NONE {
            return Err(BodyError::Invalid {
                field: "topic.compression",
                rule: "the appliance stores messages uncompressed",
            });
        }
        let reply = TopicReply {
            id,
            created_at,
            partitions_count,
            message_expiry,
            max_topic_size: r.u64("topic.max_topic_size")?,
            size_bytes: r.u64("topic.size_bytes")?,
            messages_count: r.u64("topic.messages_count")?,
            name: r.name("topic.name")?,
        };
        empty_options(r, "topic.options")?;
        empty_options(r, "topic.derived_options")?;
        Ok(reply)
    }
}

/// A partition in Iggy's GetTopic and CreateTopic replies, as the answering node stores
/// it: `current_offset` is the offset of its last message (0 when empty).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionReply {
    pub id: u32,
    pub created_at: u64,
    pub segments_count: u32,
    pub current_offset: u64,
    pub size_bytes: u64,
    pub messages_count: u64,
}

/// GetTopic and CreateTopic: the topic header, then its `partitions_count` partitions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicDetailsReply {
    pub topic: TopicReply,
    pub partitions: Vec<PartitionReply>,
}

impl TopicDetailsReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        self.topic.write(&mut w);
        for p in &self.partitions {
            w.u32(p.id)
                .u64(p.created_at)
                .u32(p.segments_count)
                .u64(p.current_offset)
                .u64(p.size_bytes)
                .u64(p.messages_count);
        }
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<TopicDetailsReply, BodyError> {
        decode_all(body, |r| {
            let topic = TopicReply::read(r)?;
            let count = topic.partitions_count as usize;
            if count.saturating_mul(40) > r.remaining() {
                return Err(BodyError::Truncated {
                    field: "partitions",
                });
            }
            let partitions = (0..count)
                .map(|_| {
                    Ok(PartitionReply {
                        id: r.u32("partition.id")?,
                        created_at: r.u64("partition.created_at")?,
                        segments_count: r.u32("partition.segments_count")?,
                        current_offset: r.u64("partition.current_offset")?,
                        size_bytes: r.u64("partition.size_bytes")?,
                        messages_count: r.u64("partition.messages_count")?,
                    })
                })
                .collect::<Result<Vec<_>, BodyError>>()?;
            Ok(TopicDetailsReply { topic, partitions })
        })
    }
}

/// GetTopics: `count u32`, then the topic headers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicsReply {
    pub topics: Vec<TopicReply>,
}

impl TopicsReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u32(self.topics.len() as u32);
        for topic in &self.topics {
            topic.write(&mut w);
        }
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<TopicsReply, BodyError> {
        decode_all(body, |r| {
            let count = list_len(r, "topics", 59, LIST_MAX)?;
            let topics = (0..count)
                .map(|_| TopicReply::read(r))
                .collect::<Result<Vec<_>, BodyError>>()?;
            Ok(TopicsReply { topics })
        })
    }
}

/// GetStream: the stream, then its `topics_count` topics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamDetailsReply {
    pub stream: StreamReply,
    pub topics: Vec<TopicReply>,
}

impl StreamDetailsReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        self.stream.write(&mut w);
        for topic in &self.topics {
            topic.write(&mut w);
        }
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<StreamDetailsReply, BodyError> {
        decode_all(body, |r| {
            let stream = StreamReply::read(r)?;
            // Each topic header holds at least 59 bytes.
            let count = stream.topics_count as usize;
            if count.saturating_mul(59) > r.remaining() {
                return Err(BodyError::Truncated { field: "topics" });
            }
            let topics = (0..count)
                .map(|_| TopicReply::read(r))
                .collect::<Result<Vec<_>, BodyError>>()?;
            Ok(StreamDetailsReply { stream, topics })
        })
    }
}
