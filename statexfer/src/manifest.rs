//! The ISM1 state manifest and the artifact kinds (docs/protocol.md, "State transfer").
//! Little-endian:
//!
//! `[magic "ISM1"][count u32][entry_len u8] count x {kind u8, frontier u64, len u64,
//! checksum u64} [trailer: XxHash3-64 over everything above]`
//!
//! Entries longer than 25 bytes decode with their tail skipped (forward compatibility);
//! shorter ones, unknown kinds, more than 65,536 entries and a bad trailer are refused.

use xxhash_rust::xxh3::xxh3_64;

/// The manifest's magic bytes.
pub const MAGIC: [u8; 4] = *b"ISM1";
/// Bytes of one entry in this version.
pub const ENTRY_LEN: u8 = 25;
/// A manifest lists at most this many artifacts.
pub const ENTRIES_MAX: u32 = 65_536;
/// magic + count + entry_len.
const PREFIX_LEN: usize = 4 + 4 + 1;
/// The XxHash3-64 trailer.
const TRAILER_LEN: usize = 8;

/// The artifact kinds (docs/protocol.md, "State transfer").
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ArtifactKind {
    /// frontier = the commit op the snapshot is taken at.
    MetadataSnapshot = 0,
    /// frontier = the commit op of the table.
    ClientTable = 1,
    /// frontier = the base offset of the segment.
    SegmentLog = 2,
    /// frontier = the commit op of the offsets.
    ConsumerOffsets = 3,
}

impl ArtifactKind {
    /// Parses a kind byte; unknown kinds are refused.
    pub fn from_u8(value: u8) -> Option<ArtifactKind> {
        Some(match value {
            0 => ArtifactKind::MetadataSnapshot,
            1 => ArtifactKind::ClientTable,
            2 => ArtifactKind::SegmentLog,
            3 => ArtifactKind::ConsumerOffsets,
            _ => return None,
        })
    }

    /// The table's name.
    pub fn name(self) -> &'static str {
        match self {
            ArtifactKind::MetadataSnapshot => "METADATA_SNAPSHOT",
            ArtifactKind::ClientTable => "CLIENT_TABLE",
            ArtifactKind::SegmentLog => "SEGMENT_LOG",
            ArtifactKind::ConsumerOffsets => "CONSUMER_OFFSETS",
        }
    }
}

/// One artifact: what it is, where it stands, and how to verify it whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ManifestEntry {
    pub kind: ArtifactKind,
    pub frontier: u64,
    pub len: u64,
    /// XxHash3-64 of the artifact's bytes.
    pub checksum: u64,
}

impl ManifestEntry {
    /// Whether `bytes` is this artifact, by length and XxHash3-64.
    pub fn matches(&self, bytes: &[u8]) -> bool {
        bytes.len() as u64 == self.len && xxh3_64(bytes) == self.checksum
    }
}

/// A decoded manifest: the artifacts of one consistent state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    pub entries: Vec<ManifestEntry>,
}

/// Why a manifest was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ManifestError {
    /// Fewer bytes than magic, count, entry_len and trailer.
    TooShort { len: usize },
    /// The magic is not "ISM1".
    BadMagic { magic: [u8; 4] },
    /// More than 65,536 entries.
    TooManyEntries { count: u32 },
    /// entry_len below 25.
    EntryTooShort { entry_len: u8 },
    /// The bytes do not hold exactly count entries and the trailer.
    LengthMismatch { expected: u64, len: usize },
    /// The trailer does not match.
    TrailerMismatch { stored: u64, computed: u64 },
    /// An entry's kind is unknown.
    UnknownKind { index: u32, kind: u8 },
}

impl core::fmt::Display for ManifestError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ManifestError::TooShort { len } => write!(f, "manifest of {len} bytes is too short"),
            ManifestError::BadMagic { magic } => write!(f, "magic {magic:02x?} is not ISM1"),
            ManifestError::TooManyEntries { count } => {
                write!(f, "{count} entries exceed the limit of {ENTRIES_MAX}")
            }
            ManifestError::EntryTooShort { entry_len } => {
                write!(f, "entry_len {entry_len} is below {ENTRY_LEN}")
            }
            ManifestError::LengthMismatch { expected, len } => {
                write!(
                    f,
                    "manifest holds {len} bytes, its header implies {expected}"
                )
            }
            ManifestError::TrailerMismatch { stored, computed } => {
                write!(f, "trailer {stored:#x} != computed {computed:#x}")
            }
            ManifestError::UnknownKind { index, kind } => {
                write!(f, "entry {index} has unknown kind {kind}")
            }
        }
    }
}

impl std::error::Error for ManifestError {}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

impl Manifest {
    /// Encodes with this version's 25-byte entries and the trailer.
    pub fn encode(&self) -> Vec<u8> {
        assert!(
            self.entries.len() <= ENTRIES_MAX as usize,
            "a manifest is built with at most {ENTRIES_MAX} entries"
        );
        let mut out =
            Vec::with_capacity(PREFIX_LEN + self.entries.len() * ENTRY_LEN as usize + TRAILER_LEN);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        out.push(ENTRY_LEN);
        for entry in &self.entries {
            out.push(entry.kind as u8);
            out.extend_from_slice(&entry.frontier.to_le_bytes());
            out.extend_from_slice(&entry.len.to_le_bytes());
            out.extend_from_slice(&entry.checksum.to_le_bytes());
        }
        let trailer = xxh3_64(&out);
        out.extend_from_slice(&trailer.to_le_bytes());
        out
    }

    /// Decodes and verifies a manifest. Never panics on any input.
    pub fn decode(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        if bytes.len() < PREFIX_LEN + TRAILER_LEN {
            return Err(ManifestError::TooShort { len: bytes.len() });
        }
        let magic = [bytes[0], bytes[1], bytes[2], bytes[3]];
        if magic != MAGIC {
            return Err(ManifestError::BadMagic { magic });
        }
        let count = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        if count > ENTRIES_MAX {
            return Err(ManifestError::TooManyEntries { count });
        }
        let entry_len = bytes[8];
        if entry_len < ENTRY_LEN {
            return Err(ManifestError::EntryTooShort { entry_len });
        }
        let expected = (PREFIX_LEN + TRAILER_LEN) as u64 + u64::from(count) * u64::from(entry_len);
        if expected != bytes.len() as u64 {
            return Err(ManifestError::LengthMismatch {
                expected,
                len: bytes.len(),
            });
        }
        let body_len = bytes.len() - TRAILER_LEN;
        let stored = u64_at(bytes, body_len);
        let computed = xxh3_64(&bytes[..body_len]);
        if stored != computed {
            return Err(ManifestError::TrailerMismatch { stored, computed });
        }
        let entries = bytes[PREFIX_LEN..body_len]
            .chunks_exact(usize::from(entry_len))
            .enumerate()
            .map(|(index, entry)| {
                let kind = ArtifactKind::from_u8(entry[0]).ok_or(ManifestError::UnknownKind {
                    index: index as u32,
                    kind: entry[0],
                })?;
                // Bytes past the 25 this version knows are skipped.
                Ok(ManifestEntry {
                    kind,
                    frontier: u64_at(entry, 1),
                    len: u64_at(entry, 9),
                    checksum: u64_at(entry, 17),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Manifest { entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Manifest {
        Manifest {
            entries: vec![
                ManifestEntry {
                    kind: ArtifactKind::MetadataSnapshot,
                    frontier: 900,
                    len: 4096,
                    checksum: 1,
                },
                ManifestEntry {
                    kind: ArtifactKind::ClientTable,
                    frontier: 900,
                    len: 512,
                    checksum: 2,
                },
                ManifestEntry {
                    kind: ArtifactKind::SegmentLog,
                    frontier: 0,
                    len: 1 << 30,
                    checksum: 3,
                },
                ManifestEntry {
                    kind: ArtifactKind::ConsumerOffsets,
                    frontier: 900,
                    len: 64,
                    checksum: 4,
                },
            ],
        }
    }

    fn retrail(bytes: &mut [u8]) {
        let body = bytes.len() - 8;
        let trailer = xxh3_64(&bytes[..body]);
        bytes[body..].copy_from_slice(&trailer.to_le_bytes());
    }

    #[test]
    fn manifest_round_trips_with_the_documented_layout() {
        let bytes = sample().encode();
        assert_eq!(&bytes[..4], b"ISM1");
        assert_eq!(u32::from_le_bytes(bytes[4..8].try_into().unwrap()), 4);
        assert_eq!(bytes[8], 25);
        assert_eq!(bytes.len(), 9 + 4 * 25 + 8);
        assert_eq!(bytes[9], 0);
        assert_eq!(u64_at(&bytes, 10), 900);
        assert_eq!(Manifest::decode(&bytes), Ok(sample()));
    }

    #[test]
    fn longer_entries_decode_with_their_tail_skipped() {
        let short = sample().encode();
        let mut long = short[..9].to_vec();
        long[8] = 30;
        for entry in short[9..short.len() - 8].chunks(25) {
            long.extend_from_slice(entry);
            long.extend_from_slice(&[0xee; 5]);
        }
        long.extend_from_slice(&[0; 8]);
        retrail(&mut long);
        assert_eq!(Manifest::decode(&long), Ok(sample()));
    }

    #[test]
    fn shorter_entries_are_rejected() {
        let mut bytes = sample().encode();
        bytes[8] = 24;
        retrail(&mut bytes);
        assert_eq!(
            Manifest::decode(&bytes),
            Err(ManifestError::EntryTooShort { entry_len: 24 })
        );
    }

    #[test]
    fn unknown_kinds_are_rejected() {
        let mut bytes = sample().encode();
        bytes[9 + 25] = 4;
        retrail(&mut bytes);
        assert_eq!(
            Manifest::decode(&bytes),
            Err(ManifestError::UnknownKind { index: 1, kind: 4 })
        );
    }

    #[test]
    fn more_than_65536_entries_are_rejected_before_reading_them() {
        let mut bytes = sample().encode();
        bytes[4..8].copy_from_slice(&65_537u32.to_le_bytes());
        assert_eq!(
            Manifest::decode(&bytes),
            Err(ManifestError::TooManyEntries { count: 65_537 })
        );
        let max = Manifest {
            entries: vec![
                ManifestEntry {
                    kind: ArtifactKind::SegmentLog,
                    frontier: 0,
                    len: 0,
                    checksum: 0
                };
                65_536
            ],
        };
        assert_eq!(
            Manifest::decode(&max.encode()).map(|m| m.entries.len()),
            Ok(65_536)
        );
    }

    #[test]
    fn bad_magic_trailer_and_length_are_rejected() {
        let good = sample().encode();
        let mut bytes = good.clone();
        bytes[0] = b'X';
        assert!(matches!(
            Manifest::decode(&bytes),
            Err(ManifestError::BadMagic { .. })
        ));
        let mut bytes = good.clone();
        bytes[20] ^= 1;
        assert!(matches!(
            Manifest::decode(&bytes),
            Err(ManifestError::TrailerMismatch { .. })
        ));
        assert!(matches!(
            Manifest::decode(&good[..good.len() - 1]),
            Err(ManifestError::LengthMismatch { .. })
        ));
        assert!(matches!(
            Manifest::decode(&good[..10]),
            Err(ManifestError::TooShort { .. })
        ));
    }

    #[test]
    fn an_entry_verifies_an_artifact_by_length_and_checksum() {
        let artifact = b"segment bytes".to_vec();
        let entry = ManifestEntry {
            kind: ArtifactKind::SegmentLog,
            frontier: 0,
            len: artifact.len() as u64,
            checksum: xxh3_64(&artifact),
        };
        assert!(entry.matches(&artifact));
        assert!(!entry.matches(&artifact[1..]));
        let mut flipped = artifact.clone();
        flipped[3] ^= 1;
        assert!(!entry.matches(&flipped));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_and_any_bit_flip_is_caught(
            bytes in proptest::collection::vec(any::<u8>(), 0..512),
            entries in proptest::collection::vec((0u8..4, any::<u64>(), any::<u64>(), any::<u64>()), 0..20),
            bit in any::<usize>(),
        ) {
            let _ = Manifest::decode(&bytes);
            let manifest = Manifest {
                entries: entries
                    .into_iter()
                    .map(|(k, frontier, len, checksum)| ManifestEntry {
                        kind: ArtifactKind::from_u8(k).unwrap(),
                        frontier,
                        len,
                        checksum,
                    })
                    .collect(),
            };
            let mut encoded = manifest.encode();
            prop_assert_eq!(Manifest::decode(&encoded), Ok(manifest));
            let bit = bit % (encoded.len() * 8);
            encoded[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(Manifest::decode(&encoded).is_err());
        }
    }
}
