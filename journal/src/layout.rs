//! On-disk geometry shared by every file this crate writes: the sector, the header size,
//! the bounds on slot counts and sizes, and the byte layout of the metadata journal file.
//!
//! The journal file is, in order:
//! `[meta copy 0: 1 sector][meta copy 1: 1 sector][header ring][prepare ring]`.
//! The header ring holds one redundant 256-byte copy of each slot's prepare header,
//! 16 per sector; the prepare ring holds `slot_count` slots of `slot_size` bytes. Every
//! region starts on a sector boundary so each write is a whole number of sectors.

use crate::error::JournalError;

/// Unit of every direct-IO write and of every region boundary. 4 KiB covers both 512-byte
/// and 4 KiB logical-block devices.
pub const SECTOR_SIZE: u64 = 4096;
/// A prepare header, and its redundant copy, is exactly this many bytes.
pub const HEADER_SIZE: u64 = replication::wire::HEADER_SIZE as u64;
/// Redundant headers per header-ring sector.
pub const HEADERS_PER_SECTOR: u64 = SECTOR_SIZE / HEADER_SIZE;
/// Copies of the journal meta record at the front of the file.
pub const META_COPIES: u64 = 2;
/// Fewest slots a journal may have (a pipeline needs room to wrap).
pub const SLOT_COUNT_MIN: u64 = 4;
/// Most slots a journal may have (bounds the in-memory header ring to 256 MiB).
pub const SLOT_COUNT_MAX: u64 = 1 << 20;
/// Largest slot: the largest frame message_bus.max_message_size allows (64 MiB).
pub const SLOT_SIZE_LIMIT: u64 = 64 * 1024 * 1024;

const _: () = {
    assert!(SECTOR_SIZE.is_power_of_two());
    assert!(SECTOR_SIZE.is_multiple_of(HEADER_SIZE));
    assert!(HEADERS_PER_SECTOR == 16);
    assert!(SLOT_SIZE_LIMIT.is_multiple_of(SECTOR_SIZE));
    assert!(
        SLOT_SIZE_LIMIT as usize == replication::wire::decode::MAX_MESSAGE_SIZE_DEFAULT as usize
    );
    assert!(SLOT_COUNT_MIN >= 2);
};

/// Rounds `value` up to a multiple of the sector.
pub const fn sector_ceil(value: u64) -> u64 {
    value.div_ceil(SECTOR_SIZE) * SECTOR_SIZE
}

/// Rounds `value` down to a multiple of the sector.
pub const fn sector_floor(value: u64) -> u64 {
    value / SECTOR_SIZE * SECTOR_SIZE
}

/// The geometry of one journal file, derived from its slot count and slot size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct JournalLayout {
    /// Slots in the ring; op `o` lives in slot `o % slot_count`.
    pub slot_count: u64,
    /// Bytes per prepare slot (header + largest body), a multiple of the sector.
    pub slot_size: u64,
}

impl JournalLayout {
    /// A layout, checked against the bounds above.
    pub fn new(slot_count: u64, slot_size: u64) -> Result<JournalLayout, JournalError> {
        if !(SLOT_COUNT_MIN..=SLOT_COUNT_MAX).contains(&slot_count) {
            return Err(JournalError::Config {
                key: "slot_count",
                value: slot_count,
                rule: "must be within SLOT_COUNT_MIN..=SLOT_COUNT_MAX (4..=1048576)",
            });
        }
        if !(SECTOR_SIZE..=SLOT_SIZE_LIMIT).contains(&slot_size)
            || !slot_size.is_multiple_of(SECTOR_SIZE)
        {
            return Err(JournalError::Config {
                key: "slot_size",
                value: slot_size,
                rule: "must be a multiple of 4096 within 4096..=64 MiB",
            });
        }
        Ok(JournalLayout {
            slot_count,
            slot_size,
        })
    }

    /// A layout whose slots hold a header plus a body of up to `body_size_max` bytes.
    pub fn for_body_size(
        slot_count: u64,
        body_size_max: u64,
    ) -> Result<JournalLayout, JournalError> {
        JournalLayout::new(slot_count, sector_ceil(HEADER_SIZE + body_size_max))
    }

    /// Offset of meta copy `copy`.
    pub const fn meta_offset(copy: u64) -> u64 {
        copy * SECTOR_SIZE
    }

    /// Offset of the header ring.
    pub const fn header_ring_offset(&self) -> u64 {
        META_COPIES * SECTOR_SIZE
    }

    /// Bytes of the header ring (sector-padded).
    pub const fn header_ring_size(&self) -> u64 {
        sector_ceil(self.slot_count * HEADER_SIZE)
    }

    /// Offset of the redundant header of `slot`.
    pub const fn header_offset(&self, slot: u64) -> u64 {
        self.header_ring_offset() + slot * HEADER_SIZE
    }

    /// Offset of the header-ring sector that holds `slot`'s redundant header.
    pub const fn header_sector_offset(&self, slot: u64) -> u64 {
        self.header_ring_offset() + slot / HEADERS_PER_SECTOR * SECTOR_SIZE
    }

    /// Offset of the prepare ring.
    pub const fn prepare_ring_offset(&self) -> u64 {
        self.header_ring_offset() + self.header_ring_size()
    }

    /// Offset of prepare slot `slot`.
    pub const fn prepare_offset(&self, slot: u64) -> u64 {
        self.prepare_ring_offset() + slot * self.slot_size
    }

    /// Total file size.
    pub const fn file_size(&self) -> u64 {
        self.prepare_ring_offset() + self.slot_count * self.slot_size
    }

    /// The slot op `op` lives in.
    pub const fn slot_of(&self, op: u64) -> u64 {
        op % self.slot_count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_sector_aligned_and_disjoint() {
        let layout = JournalLayout::new(20, 8192).unwrap();
        assert_eq!(layout.header_ring_offset() % SECTOR_SIZE, 0);
        assert_eq!(layout.header_ring_size(), 2 * SECTOR_SIZE);
        assert_eq!(layout.prepare_ring_offset(), 4 * SECTOR_SIZE);
        assert_eq!(layout.prepare_offset(1) - layout.prepare_offset(0), 8192);
        assert_eq!(layout.file_size(), 4 * SECTOR_SIZE + 20 * 8192);
        assert_eq!(
            layout.header_sector_offset(17),
            layout.header_ring_offset() + SECTOR_SIZE
        );
    }

    #[test]
    fn layout_rejects_out_of_bounds_geometry() {
        assert!(JournalLayout::new(2, 4096).is_err());
        assert!(JournalLayout::new(16, 4000).is_err());
        assert!(JournalLayout::new(16, SLOT_SIZE_LIMIT + SECTOR_SIZE).is_err());
        assert_eq!(
            JournalLayout::for_body_size(16, 1 << 20).unwrap().slot_size,
            (1 << 20) + SECTOR_SIZE
        );
    }
}
