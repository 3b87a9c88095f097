//! Durations ("250ms", "5s") and sizes ("64 MiB") as config values.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration written as a number and a unit: us, ms, s, m, h, d.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ConfigDuration(pub Duration);

/// A byte size written as a number and an optional unit: B, KiB, MiB, GiB, KB, MB, GB.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

fn split_number(text: &str) -> Option<(u64, &str)> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let number = text[..digits].parse().ok()?;
    Some((number, text[digits..].trim()))
}

/// Parses "250ms", "5s", "2m", "1h", "7d", "100us".
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let (n, unit) = split_number(text)
        .ok_or_else(|| format!("\"{text}\" is not a duration like \"250ms\" or \"5s\""))?;
    let duration = match unit {
        "us" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        "d" => Duration::from_secs(n.saturating_mul(86_400)),
        "" => return Err(format!("\"{text}\" needs a unit (us, ms, s, m, h, d)")),
        other => {
            return Err(format!(
                "\"{text}\" has an unknown unit \"{other}\" (us, ms, s, m, h, d)"
            ))
        }
    };
    Ok(duration)
}

/// Parses "64 MiB", "4KiB", "1GB", "512".
pub fn parse_size(text: &str) -> Result<u64, String> {
    let (n, unit) =
        split_number(text).ok_or_else(|| format!("\"{text}\" is not a size like \"64 MiB\""))?;
    let scale: u64 = match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "\"{text}\" has an unknown unit \"{other}\" (B, KiB, MiB, GiB, KB, MB, GB)"
            ))
        }
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("\"{text}\" overflows 64 bits"))
}

/// Formats a duration the way config files write it.
pub fn format_duration(duration: Duration) -> String {
    let ms = duration.as_millis();
    let s = duration.as_secs();
    if duration.subsec_nanos() == 0 && s > 0 && s.is_multiple_of(86_400) {
        format!("{}d", s / 86_400)
    } else if !duration.subsec_micros().is_multiple_of(1000) {
        format!("{}us", duration.as_micros())
    } else if ms.is_multiple_of(1000) && ms > 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// Formats a size the way config files write it.
pub fn format_size(bytes: u64) -> String {
    for (unit, scale) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= scale && bytes.is_multiple_of(scale) {
            return format!("{} {unit}", bytes / scale);
        }
    }
    format!("{bytes} B")
}

impl<'de> Deserialize<'de> for ConfigDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse_duration(&text)
            .map(ConfigDuration)
            .map_err(serde::de::Error::custom)
    }
}

impl Serialize for ConfigDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(u64),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Number(n) => Ok(ByteSize(n)),
            Raw::Text(text) => parse_size(&text)
                .map(ByteSize)
                .map_err(serde::de::Error::custom),
        }
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format_size(self.0))
    }
}

impl core::fmt::Display for ConfigDuration {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&format_duration(self.0))
    }
}

impl core::fmt::Display for ByteSize {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&format_size(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_refuse_bare_numbers() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration(" 2 m "), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("100us"), Ok(Duration::from_micros(100)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(format_duration(Duration::from_secs(7 * 86_400)), "7d");
        assert!(parse_duration("250").is_err());
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("5 fortnights").is_err());
    }

    #[test]
    fn sizes_parse_binary_and_decimal_units() {
        assert_eq!(parse_size("64 MiB"), Ok(64 << 20));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("512"), Ok(512));
        assert!(parse_size("64 MiBs").is_err());
        assert!(parse_size("99999999999999 TiB").is_err());
    }

    #[test]
    fn formatting_round_trips() {
        for d in ["250ms", "5s", "100us"] {
            assert_eq!(format_duration(parse_duration(d).unwrap()), d);
        }
        for s in ["64 MiB", "4 KiB", "3 B", "2 GiB"] {
            assert_eq!(format_size(parse_size(s).unwrap()), s);
        }
    }
}
