//! `appliance-cli topic create | update | show`: topics and their retention.

use appliance::client::Client;
use appliance::config::units::{format_duration, format_size, parse_duration, parse_size};
use appliance::protocol::reply::TopicInfo;
use appliance::protocol::Retention;
use clap::{Args, Subcommand};
use serde_json::json;

use super::{connect, stream_id, topic as topic_of, CliError, Global, Report};

#[derive(Subcommand, Debug)]
pub enum TopicCmd {
    /// Create a topic in STREAM (id or name).
    Create {
        stream: String,
        name: String,
        #[arg(long)]
        partitions: u32,
        #[command(flatten)]
        retention: RetentionArgs,
    },
    /// Change a topic's retention (what is not given stays as it is).
    Update {
        stream: String,
        topic: String,
        #[command(flatten)]
        retention: RetentionArgs,
    },
    /// A topic's retention and, per partition, the offsets this node retains.
    Show { stream: String, topic: String },
}

#[derive(Args, Debug, Default)]
pub struct RetentionArgs {
    /// Delete sealed segments whose newest message is older than this ("7d", "12h"),
    /// "never", or "default" (the server's [retention] message_expiry).
    #[arg(long)]
    pub message_expiry: Option<String>,
    /// Delete the oldest sealed segments while the topic holds more than this
    /// ("10GiB"), "unlimited", or "default" (the server's [retention] max_topic_size).
    #[arg(long)]
    pub max_size: Option<String>,
}

/// A `--message-expiry` value as CreateTopic carries it (microseconds).
pub fn parse_expiry(text: &str) -> Result<u64, CliError> {
    match text.trim() {
        "default" => Ok(Retention::SERVER_DEFAULT),
        "never" | "none" => Ok(Retention::NEVER),
        text => {
            let duration = parse_duration(text)
                .map_err(|e| CliError::Usage(format!("--message-expiry: {e}")))?;
            match duration.as_micros() {
                0 => Err(CliError::Usage(
                    "--message-expiry: use \"never\" rather than 0".into(),
                )),
                us => Ok(u64::try_from(us).unwrap_or(Retention::NEVER - 1)),
            }
        }
    }
}

/// A `--max-size` value as CreateTopic carries it (bytes).
pub fn parse_max_size(text: &str) -> Result<u64, CliError> {
    match text.trim() {
        "default" => Ok(Retention::SERVER_DEFAULT),
        "unlimited" | "none" => Ok(Retention::NEVER),
        text => match parse_size(text).map_err(|e| CliError::Usage(format!("--max-size: {e}")))? {
            0 => Err(CliError::Usage(
                "--max-size: use \"unlimited\" rather than 0".into(),
            )),
            bytes => Ok(bytes.min(Retention::NEVER - 1)),
        },
    }
}

fn expiry_text(value: u64) -> String {
    match value {
        Retention::SERVER_DEFAULT => "default".into(),
        Retention::NEVER => "never".into(),
        us => format_duration(std::time::Duration::from_micros(us)),
    }
}

fn size_text(value: u64) -> String {
    match value {
        Retention::SERVER_DEFAULT => "default".into(),
        Retention::NEVER => "unlimited".into(),
        bytes => format_size(bytes),
    }
}

impl RetentionArgs {
    /// The retention these flags ask for, over `current` where a flag is absent.
    fn over(&self, current: Retention) -> Result<Retention, CliError> {
        Ok(Retention {
            message_expiry: match &self.message_expiry {
                Some(text) => parse_expiry(text)?,
                None => current.message_expiry,
            },
            max_topic_size: match &self.max_size {
                Some(text) => parse_max_size(text)?,
                None => current.max_topic_size,
            },
        })
    }
}

fn info(client: &mut Client, stream_id: u32, topic_id: u32) -> Result<TopicInfo, CliError> {
    client
        .list_topics(stream_id)?
        .topics
        .into_iter()
        .find(|t| t.topic_id == topic_id)
        .ok_or_else(|| CliError::runtime(format!("no topic {topic_id} in stream {stream_id}")))
}

fn show(stream_id: u32, t: &TopicInfo) -> Report {
    let mut text = format!(
        "topic {:?} (id {}) in stream {stream_id}: {} partitions, message expiry {}, max size {}",
        t.name,
        t.topic_id,
        t.partitions,
        expiry_text(t.message_expiry),
        size_text(t.max_topic_size)
    );
    for p in &t.stored {
        text.push_str(&format!(
            "\n  partition {}: offsets {}..{} retained, {} in {} segments",
            p.partition,
            p.first_offset,
            p.end_offset,
            format_size(p.bytes),
            p.segments
        ));
    }
    let partitions: Vec<_> = t
        .stored
        .iter()
        .map(|p| {
            json!({
                "partition": p.partition,
                "first_offset": p.first_offset,
                "end_offset": p.end_offset,
                "bytes": p.bytes,
                "segments": p.segments,
            })
        })
        .collect();
    Report {
        text,
        json: json!({
            "stream_id": stream_id,
            "topic_id": t.topic_id,
            "name": t.name,
            "partitions": t.partitions,
            "message_expiry": expiry_text(t.message_expiry),
            "max_size": size_text(t.max_topic_size),
            "retained": partitions,
        }),
    }
}

pub fn run(global: &Global, action: &TopicCmd) -> Result<Report, CliError> {
    match action {
        TopicCmd::Create {
            stream,
            name,
            partitions,
            retention,
        } => {
            if *partitions == 0 {
                return Err(CliError::Usage("--partitions must be at least 1".into()));
            }
            let retention = retention.over(Retention::default())?;
            let mut client = connect(global)?;
            let stream_id = stream_id(&mut client, stream)?;
            let id = client.create_topic_with(stream_id, name, *partitions, retention)?;
            Ok(Report {
                text: format!(
                    "topic {name:?} created in stream {stream_id} with id {id} and {partitions} \
                     partitions (message expiry {}, max size {})",
                    expiry_text(retention.message_expiry),
                    size_text(retention.max_topic_size)
                ),
                json: json!({"stream_id": stream_id, "topic_id": id, "name": name,
                    "partitions": partitions,
                    "message_expiry": expiry_text(retention.message_expiry),
                    "max_size": size_text(retention.max_topic_size)}),
            })
        }
        TopicCmd::Update {
            stream,
            topic,
            retention,
        } => {
            if retention.message_expiry.is_none() && retention.max_size.is_none() {
                return Err(CliError::Usage(
                    "give --message-expiry, --max-size or both".into(),
                ));
            }
            let mut client = connect(global)?;
            let stream_id = stream_id(&mut client, stream)?;
            let (topic_id, _) = topic_of(&mut client, stream_id, topic)?;
            let current = info(&mut client, stream_id, topic_id)?;
            let retention = retention.over(Retention {
                message_expiry: current.message_expiry,
                max_topic_size: current.max_topic_size,
            })?;
            client.update_topic(stream_id, topic_id, retention)?;
            Ok(show(stream_id, &info(&mut client, stream_id, topic_id)?))
        }
        TopicCmd::Show { stream, topic } => {
            let mut client = connect(global)?;
            let stream_id = stream_id(&mut client, stream)?;
            let (topic_id, _) = topic_of(&mut client, stream_id, topic)?;
            Ok(show(stream_id, &info(&mut client, stream_id, topic_id)?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_flags_parse_to_the_wire_values() {
        assert_eq!(parse_expiry("7d").unwrap(), 7 * 86_400 * 1_000_000);
        assert_eq!(parse_expiry("never").unwrap(), Retention::NEVER);
        assert_eq!(parse_expiry("default").unwrap(), Retention::SERVER_DEFAULT);
        assert!(parse_expiry("0s").is_err());
        assert!(parse_expiry("7 days").is_err());
        assert_eq!(parse_max_size("10GiB").unwrap(), 10 << 30);
        assert_eq!(parse_max_size("unlimited").unwrap(), Retention::NEVER);
        assert!(parse_max_size("10 parsecs").is_err());
        assert_eq!(expiry_text(3_600_000_000), "3600s");
        assert_eq!(size_text(10 << 30), "10 GiB");
    }
}
