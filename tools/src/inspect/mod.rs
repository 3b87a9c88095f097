//! Offline inspection: decode what is on the wire or on disk and report it.

pub mod frame;
pub mod manifest;

/// A report failure: bad usage (exit 2) or a runtime failure (exit 1).
#[derive(Debug)]
pub enum InspectError {
    Usage(String),
    Runtime(String),
}

impl InspectError {
    /// The process exit code (README.md: 0 ok, 1 runtime failure, 2 bad usage).
    pub fn exit_code(&self) -> i32 {
        match self {
            InspectError::Usage(_) => 2,
            InspectError::Runtime(_) => 1,
        }
    }
}

impl core::fmt::Display for InspectError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            InspectError::Usage(message) | InspectError::Runtime(message) => f.write_str(message),
        }
    }
}

/// Lower-case hex of bytes.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses hex, ignoring whitespace; an optional `0x` prefix is allowed.
pub fn from_hex(text: &str) -> Result<Vec<u8>, String> {
    let digits: Vec<u8> = text
        .trim()
        .trim_start_matches("0x")
        .bytes()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    if !digits.len().is_multiple_of(2) {
        return Err(format!(
            "hex input has an odd number of digits ({})",
            digits.len()
        ));
    }
    let value = |d: u8| match d {
        b'0'..=b'9' => Ok(d - b'0'),
        b'a'..=b'f' => Ok(d - b'a' + 10),
        b'A'..=b'F' => Ok(d - b'A' + 10),
        _ => Err(format!("'{}' is not a hex digit", d as char)),
    };
    digits
        .chunks(2)
        .map(|pair| Ok(value(pair[0])? << 4 | value(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_bad_digits() {
        assert_eq!(from_hex("0x00ff 10").unwrap(), vec![0, 255, 16]);
        assert_eq!(to_hex(&[0, 255, 16]), "00ff10");
        assert!(from_hex("abc").is_err());
        assert!(from_hex("zz").is_err());
    }
}
