//! Little-endian body codec for the client protocol: bounded reads that return typed
//! errors, never panic, and refuse trailing bytes.

/// Why a request or reply body does not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BodyError {
    /// The body ended inside `field`.
    Truncated { field: &'static str },
    /// Bytes left after the last field.
    TrailingBytes { count: usize },
    /// A string field is not UTF-8.
    NotUtf8 { field: &'static str },
    /// A field's value is out of its range.
    Invalid {
        field: &'static str,
        rule: &'static str,
    },
    /// A list is longer than its bound.
    TooMany {
        field: &'static str,
        count: u64,
        max: u64,
    },
}

impl core::fmt::Display for BodyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            BodyError::Truncated { field } => write!(f, "body ends inside {field}"),
            BodyError::TrailingBytes { count } => write!(f, "{count} bytes follow the last field"),
            BodyError::NotUtf8 { field } => write!(f, "{field} is not UTF-8"),
            BodyError::Invalid { field, rule } => write!(f, "{field}: {rule}"),
            BodyError::TooMany { field, count, max } => {
                write!(f, "{field}: {count} entries exceed {max}")
            }
        }
    }
}

impl std::error::Error for BodyError {}

/// Reads fields off a body in order.
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes }
    }

    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], BodyError> {
        if self.bytes.len() < n {
            return Err(BodyError::Truncated { field });
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], BodyError> {
        self.take(n, field)
    }

    pub fn u8(&mut self, field: &'static str) -> Result<u8, BodyError> {
        Ok(self.take(1, field)?[0])
    }

    pub fn u16(&mut self, field: &'static str) -> Result<u16, BodyError> {
        let b = self.take(2, field)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    pub fn u32(&mut self, field: &'static str) -> Result<u32, BodyError> {
        let b = self.take(4, field)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u64(&mut self, field: &'static str) -> Result<u64, BodyError> {
        let b = self.take(8, field)?;
        let mut word = [0u8; 8];
        word.copy_from_slice(b);
        Ok(u64::from_le_bytes(word))
    }

    pub fn u128(&mut self, field: &'static str) -> Result<u128, BodyError> {
        let b = self.take(16, field)?;
        let mut word = [0u8; 16];
        word.copy_from_slice(b);
        Ok(u128::from_le_bytes(word))
    }

    /// A string: u8 length, then UTF-8 bytes; empty strings are refused.
    pub fn name(&mut self, field: &'static str) -> Result<String, BodyError> {
        let len = usize::from(self.u8(field)?);
        if len == 0 {
            return Err(BodyError::Invalid {
                field,
                rule: "must not be empty",
            });
        }
        let bytes = self.take(len, field)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| BodyError::NotUtf8 { field })
    }

    /// A secret: u8 length, then bytes (1 to 255).
    pub fn secret(&mut self, field: &'static str) -> Result<Vec<u8>, BodyError> {
        let len = usize::from(self.u8(field)?);
        if len == 0 {
            return Err(BodyError::Invalid {
                field,
                rule: "must not be empty",
            });
        }
        Ok(self.take(len, field)?.to_vec())
    }

    /// An optional text: u32 length (0: none), then UTF-8 bytes (at most `max`).
    pub fn optional_text(
        &mut self,
        field: &'static str,
        max: usize,
    ) -> Result<Option<String>, BodyError> {
        let text = self.text(field, max)?;
        Ok((!text.is_empty()).then_some(text))
    }

    /// A text: u32 length, then UTF-8 bytes (at most `max`; may be empty).
    pub fn text(&mut self, field: &'static str, max: usize) -> Result<String, BodyError> {
        let len = self.u32(field)? as usize;
        if len > max {
            return Err(BodyError::Invalid {
                field,
                rule: "longer than the server accepts",
            });
        }
        let bytes = self.take(len, field)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| BodyError::NotUtf8 { field })
    }

    /// Items read by `item` until the body ends (a list without a count), at most
    /// `max` of them.
    pub fn until_end<T>(
        &mut self,
        field: &'static str,
        max: usize,
        mut item: impl FnMut(&mut Reader<'a>) -> Result<T, BodyError>,
    ) -> Result<Vec<T>, BodyError> {
        let mut items = Vec::new();
        while self.remaining() > 0 {
            if items.len() == max {
                return Err(BodyError::TooMany {
                    field,
                    count: max as u64 + 1,
                    max: max as u64,
                });
            }
            items.push(item(self)?);
        }
        Ok(items)
    }

    /// Bytes not read yet (to bound a list count before allocating for it).
    pub fn remaining(&self) -> usize {
        self.bytes.len()
    }

    /// Everything left (for a message batch that ends the body).
    pub fn rest(&mut self) -> &'a [u8] {
        core::mem::take(&mut self.bytes)
    }

    /// Refuses trailing bytes.
    pub fn finish(self) -> Result<(), BodyError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(BodyError::TrailingBytes {
                count: self.bytes.len(),
            })
        }
    }
}

/// Appends fields to a body.
#[derive(Default)]
pub struct Writer {
    pub bytes: Vec<u8>,
}

impl Writer {
    pub fn u8(&mut self, v: u8) -> &mut Writer {
        self.bytes.push(v);
        self
    }

    pub fn u16(&mut self, v: u16) -> &mut Writer {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u32(&mut self, v: u32) -> &mut Writer {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Writer {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u128(&mut self, v: u128) -> &mut Writer {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A string or secret of 1 to 255 bytes (callers validate lengths first; longer
    /// input is cut at 255 bytes rather than written with a wrong length).
    pub fn short_bytes(&mut self, v: &[u8]) -> &mut Writer {
        let len = v.len().min(255);
        self.bytes.push(len as u8);
        self.bytes.extend_from_slice(&v[..len]);
        self
    }

    /// An optional text in the layout `Reader::optional_text` reads.
    pub fn optional_text(&mut self, v: Option<&str>) -> &mut Writer {
        self.text(v.unwrap_or_default())
    }

    /// A text in the layout `Reader::text` reads.
    pub fn text(&mut self, v: &str) -> &mut Writer {
        self.u32(v.len() as u32).raw(v.as_bytes())
    }

    pub fn raw(&mut self, v: &[u8]) -> &mut Writer {
        self.bytes.extend_from_slice(v);
        self
    }

    pub fn finish(&mut self) -> Vec<u8> {
        core::mem::take(&mut self.bytes)
    }
}
