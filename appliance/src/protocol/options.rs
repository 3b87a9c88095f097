//! Iggy's options block (the `Create*` requests' trailing key-value entries): each entry
//! is `key_kind u8` (2: string), `key_len u32`, key, `value_kind u8`, `value_len u32`,
//! value (docs/client-protocol.md, "Options"). The appliance reads the topic options
//! it honours and refuses every other key by name.

use super::codec::{BodyError, Reader, Writer};
use super::Status;
use crate::config::units::{parse_duration, parse_size};

/// A topic's retention as CreateTopic and UpdateTopic carry it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    /// Microseconds after which a sealed segment's messages expire; `SERVER_DEFAULT`
    /// takes `[retention] message_expiry`, `NEVER` keeps them.
    pub message_expiry: u64,
    /// Bytes a topic may hold; `SERVER_DEFAULT` takes `[retention] max_topic_size`,
    /// `NEVER` sets no limit.
    pub max_topic_size: u64,
}

impl Retention {
    pub const SERVER_DEFAULT: u64 = 0;
    pub const NEVER: u64 = u64::MAX;
}

/// Entries an options block may hold.
pub const OPTIONS_MAX: usize = 1024;
/// Bytes a key or a value may hold.
const FIELD_MAX: usize = 255;

/// Value kinds (Iggy's header kinds) the appliance reads.
const KIND_STRING: u8 = 2;
const KIND_UINT64: u8 = 12;

pub const COMPRESSION_ALGORITHM: &str = "compression_algorithm";
pub const MESSAGE_EXPIRY: &str = "message_expiry";
pub const MAX_TOPIC_SIZE: &str = "max_topic_size";
pub const DURABILITY: &str = "durability";
pub const CONSUMER_OFFSET_DURABILITY: &str = "consumer_offset_durability";

/// One entry of an options block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptionEntry<'a> {
    pub key: &'a str,
    pub kind: u8,
    pub value: &'a [u8],
}

/// The entries of a block, checked for structure: string keys of UTF-8, kinds not 0,
/// fields of 1 to 255 bytes, no key twice, at most `OPTIONS_MAX` entries.
pub fn entries(block: &[u8]) -> Result<Vec<OptionEntry<'_>>, BodyError> {
    let entries = Reader::new(block).until_end("options", OPTIONS_MAX, |r| {
        if r.u8("option.key_kind")? != KIND_STRING {
            return Err(BodyError::Invalid {
                field: "option.key_kind",
                rule: "an option key is a string (kind 2)",
            });
        }
        let key = field(r, "option.key")?;
        let key = core::str::from_utf8(key).map_err(|_| BodyError::NotUtf8 {
            field: "option.key",
        })?;
        let kind = r.u8("option.value_kind")?;
        if kind == 0 {
            return Err(BodyError::Invalid {
                field: "option.value_kind",
                rule: "kind 0 is reserved",
            });
        }
        let value = field(r, "option.value")?;
        Ok(OptionEntry { key, kind, value })
    })?;
    for (i, entry) in entries.iter().enumerate() {
        if entries[..i].iter().any(|e| e.key == entry.key) {
            return Err(BodyError::Invalid {
                field: "option.key",
                rule: "a key appears once",
            });
        }
    }
    Ok(entries)
}

fn field<'a>(r: &mut Reader<'a>, name: &'static str) -> Result<&'a [u8], BodyError> {
    let len = r.u32(name)? as usize;
    if len == 0 || len > FIELD_MAX {
        return Err(BodyError::Invalid {
            field: name,
            rule: "an option field holds 1 to 255 bytes",
        });
    }
    r.bytes(len, name)
}

fn write_entry(w: &mut Writer, key: &str, kind: u8, value: &[u8]) {
    w.u8(KIND_STRING)
        .text(key)
        .u8(kind)
        .u32(value.len() as u32)
        .raw(value);
}

/// Why a topic's options are refused, and the key that is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptionRefusal {
    pub status: Status,
    pub key: String,
}

impl OptionRefusal {
    fn unsupported(key: &str) -> OptionRefusal {
        OptionRefusal {
            status: Status::UnsupportedOption,
            key: key.to_owned(),
        }
    }

    fn invalid(key: &str) -> OptionRefusal {
        OptionRefusal {
            status: Status::InvalidOptionValue,
            key: key.to_owned(),
        }
    }
}

/// What a CreateTopic's options ask for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TopicOptions {
    /// `Retention::SERVER_DEFAULT` where the block does not set it.
    pub retention: Retention,
    /// Whether `durability` asked for a message's ack after it is on disk
    /// ("persisted"); "replicated" asks for the ack once a quorum holds it.
    pub messages_persisted: bool,
    /// The same for consumer offsets (`consumer_offset_durability`).
    pub offsets_persisted: bool,
}

impl TopicOptions {
    /// Reads a well-formed block (`entries`): compression "none", message expiry
    /// (microseconds as a u64, or a duration such as "7d"), max topic size (bytes as a
    /// u64, or a size such as "1 GiB"), durability and consumer offset durability
    /// ("replicated" or "persisted"). Any other key is refused by name.
    pub fn parse(block: &[u8]) -> Result<TopicOptions, OptionRefusal> {
        let entries = entries(block).map_err(|_| OptionRefusal::invalid("options"))?;
        let mut options = TopicOptions::default();
        for entry in entries {
            let text = || {
                (entry.kind == KIND_STRING)
                    .then(|| core::str::from_utf8(entry.value).ok())
                    .flatten()
                    .map(str::trim)
                    .ok_or_else(|| OptionRefusal::invalid(entry.key))
            };
            let number = |from_text: fn(&str) -> Result<u64, String>| match entry.kind {
                KIND_UINT64 => entry
                    .value
                    .try_into()
                    .map(u64::from_le_bytes)
                    .map_err(|_| OptionRefusal::invalid(entry.key)),
                _ => from_text(text()?).map_err(|_| OptionRefusal::invalid(entry.key)),
            };
            match entry.key {
                COMPRESSION_ALGORITHM => {
                    // Messages are stored as sent.
                    if !text()?.eq_ignore_ascii_case("none") {
                        return Err(OptionRefusal::invalid(entry.key));
                    }
                }
                MESSAGE_EXPIRY => {
                    options.retention.message_expiry = number(|t| {
                        parse_duration(t).map(|d| d.as_micros().min(u128::from(u64::MAX)) as u64)
                    })?;
                }
                MAX_TOPIC_SIZE => options.retention.max_topic_size = number(parse_size)?,
                DURABILITY | CONSUMER_OFFSET_DURABILITY => {
                    let persisted = match text()? {
                        "replicated" => false,
                        "persisted" => true,
                        _ => return Err(OptionRefusal::invalid(entry.key)),
                    };
                    if entry.key == DURABILITY {
                        options.messages_persisted = persisted;
                    } else {
                        options.offsets_persisted = persisted;
                    }
                }
                other => return Err(OptionRefusal::unsupported(other)),
            }
        }
        Ok(options)
    }

    /// The block of a CreateTopic that asks for `retention` (its values as u64s;
    /// server defaults left out).
    pub fn encode(retention: Retention) -> Vec<u8> {
        Self::write(retention, false)
    }

    /// The block of an UpdateTopic that sets both values of `retention`, server
    /// defaults (0) included.
    pub fn encode_all(retention: Retention) -> Vec<u8> {
        Self::write(retention, true)
    }

    fn write(retention: Retention, defaults: bool) -> Vec<u8> {
        let mut w = Writer::default();
        for (key, value) in [
            (MESSAGE_EXPIRY, retention.message_expiry),
            (MAX_TOPIC_SIZE, retention.max_topic_size),
        ] {
            if defaults || value != Retention::SERVER_DEFAULT {
                write_entry(&mut w, key, KIND_UINT64, &value.to_le_bytes());
            }
        }
        w.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(entries: &[(&str, u8, &[u8])]) -> Vec<u8> {
        let mut w = Writer::default();
        for (key, kind, value) in entries {
            write_entry(&mut w, key, *kind, value);
        }
        w.finish()
    }

    #[test]
    fn topic_options_read_numbers_texts_and_durability() {
        let parsed = TopicOptions::parse(&block(&[
            (MESSAGE_EXPIRY, KIND_STRING, b"7d"),
            (MAX_TOPIC_SIZE, KIND_UINT64, &(1u64 << 30).to_le_bytes()),
            (COMPRESSION_ALGORITHM, KIND_STRING, b"none"),
            (DURABILITY, KIND_STRING, b"replicated"),
            (CONSUMER_OFFSET_DURABILITY, KIND_STRING, b"persisted"),
        ]))
        .unwrap();
        assert_eq!(parsed.retention.message_expiry, 7 * 86_400_000_000);
        assert_eq!(parsed.retention.max_topic_size, 1 << 30);
        assert!(!parsed.messages_persisted);
        assert!(parsed.offsets_persisted);
        assert_eq!(TopicOptions::parse(&[]), Ok(TopicOptions::default()));
        let retention = Retention {
            message_expiry: 5_000_000,
            max_topic_size: Retention::NEVER,
        };
        let encoded = TopicOptions::encode(retention);
        assert_eq!(TopicOptions::parse(&encoded).unwrap().retention, retention);
    }

    #[test]
    fn unknown_keys_and_values_the_appliance_cannot_honour_are_refused_by_name() {
        let refused = |entries: &[(&str, u8, &[u8])]| TopicOptions::parse(&block(entries));
        assert_eq!(
            refused(&[("segment_size", KIND_UINT64, &[0; 8])]),
            Err(OptionRefusal::unsupported("segment_size"))
        );
        for (key, kind, value) in [
            (COMPRESSION_ALGORITHM, KIND_STRING, &b"gzip"[..]),
            (MESSAGE_EXPIRY, KIND_STRING, b"soon"),
            (MESSAGE_EXPIRY, KIND_UINT64, &[1, 2, 3]),
            (DURABILITY, KIND_STRING, b"eventually"),
        ] {
            assert_eq!(
                refused(&[(key, kind, value)]),
                Err(OptionRefusal::invalid(key)),
                "{key}"
            );
        }
    }

    #[test]
    fn malformed_blocks_are_refused() {
        let good = block(&[(MESSAGE_EXPIRY, KIND_UINT64, &[0; 8])]);
        for cut in 1..good.len() {
            assert!(entries(&good[..cut]).is_err(), "cut at {cut}");
        }
        let twice = [good.clone(), good].concat();
        assert!(entries(&twice).is_err());
        let mut numeric_key = block(&[(MESSAGE_EXPIRY, KIND_UINT64, &[0; 8])]);
        numeric_key[0] = KIND_UINT64;
        assert!(entries(&numeric_key).is_err());
    }
}
