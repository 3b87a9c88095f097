//! The journal file's meta record (its geometry, twice at the front of the file) and the
//! sans-IO scan of a whole journal image into per-slot evidence.

use xxhash_rust::xxh3::xxh3_64;

use crate::layout::{JournalLayout, HEADER_SIZE, META_COPIES, SECTOR_SIZE};
use crate::slot::{classify_slot, SlotEvidence};

/// Magic at the start of each meta copy.
pub const JOURNAL_MAGIC: [u8; 8] = *b"IGJRNL01";
/// Format version of the journal file.
pub const JOURNAL_VERSION: u32 = 1;
/// Bytes of the meta record (the rest of its sector is zero).
pub const META_SIZE: usize = 40;

/// Why a meta copy was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MetaFault {
    Short,
    Magic,
    Checksum,
    Version,
    Geometry,
}

/// Encodes the meta record for `layout` into a sector-sized buffer.
pub fn encode_meta(layout: &JournalLayout, sector: &mut [u8]) {
    assert!(sector.len() >= META_SIZE);
    sector.fill(0);
    sector[0..8].copy_from_slice(&JOURNAL_MAGIC);
    sector[8..12].copy_from_slice(&JOURNAL_VERSION.to_le_bytes());
    sector[16..24].copy_from_slice(&layout.slot_count.to_le_bytes());
    sector[24..32].copy_from_slice(&layout.slot_size.to_le_bytes());
    let checksum = xxh3_64(&sector[..32]);
    sector[32..40].copy_from_slice(&checksum.to_le_bytes());
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut le = [0u8; 8];
    le.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(le)
}

/// Decodes one meta copy.
pub fn decode_meta(bytes: &[u8]) -> Result<JournalLayout, MetaFault> {
    let record = bytes.get(..META_SIZE).ok_or(MetaFault::Short)?;
    if record[0..8] != JOURNAL_MAGIC {
        return Err(MetaFault::Magic);
    }
    if xxh3_64(&record[..32]) != u64_at(record, 32) {
        return Err(MetaFault::Checksum);
    }
    if record[8..12] != JOURNAL_VERSION.to_le_bytes() {
        return Err(MetaFault::Version);
    }
    JournalLayout::new(u64_at(record, 16), u64_at(record, 24)).map_err(|_| MetaFault::Geometry)
}

/// Decodes the geometry from the front of a journal image: the first valid copy wins
/// (both are written identically at format and never again). Returns each copy's fault.
pub fn decode_meta_copies(image: &[u8]) -> (Option<JournalLayout>, Vec<Option<MetaFault>>) {
    let mut layout = None;
    let mut faults = Vec::new();
    for copy in 0..META_COPIES {
        let at = JournalLayout::meta_offset(copy) as usize;
        let sector = image.get(at..at + SECTOR_SIZE as usize).unwrap_or(&[]);
        match decode_meta(sector) {
            Ok(found) => {
                layout.get_or_insert(found);
                faults.push(None);
            }
            Err(fault) => faults.push(Some(fault)),
        }
    }
    (layout, faults)
}

/// Classifies every slot of a journal image (the whole file, e.g. its mmap). The image
/// must be at least `layout.file_size()` bytes.
pub fn scan_image(image: &[u8], layout: &JournalLayout) -> Vec<SlotEvidence> {
    assert!(image.len() as u64 >= layout.file_size());
    (0..layout.slot_count)
        .map(|slot| {
            let header_at = layout.header_offset(slot) as usize;
            let prepare_at = layout.prepare_offset(slot) as usize;
            classify_slot(
                slot,
                layout.slot_count,
                layout.slot_size,
                &image[header_at..header_at + HEADER_SIZE as usize],
                &image[prepare_at..prepare_at + layout.slot_size as usize],
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_round_trips_and_detects_any_flipped_byte() {
        let layout = JournalLayout::new(64, 8192).unwrap();
        let mut sector = vec![0; SECTOR_SIZE as usize];
        encode_meta(&layout, &mut sector);
        assert_eq!(decode_meta(&sector), Ok(layout));
        for at in 0..META_SIZE {
            let mut bad = sector.clone();
            bad[at] ^= 0x10;
            assert!(decode_meta(&bad).is_err(), "flip at {at} accepted");
        }
    }

    #[test]
    fn second_meta_copy_serves_when_the_first_is_zeroed() {
        let layout = JournalLayout::new(64, 8192).unwrap();
        let mut image = vec![0; 2 * SECTOR_SIZE as usize];
        encode_meta(&layout, &mut image[SECTOR_SIZE as usize..]);
        let (found, faults) = decode_meta_copies(&image);
        assert_eq!(found, Some(layout));
        assert_eq!(faults, vec![Some(MetaFault::Magic), None]);
    }
}
