//! The metadata journal: a preallocated ring of prepare slots written with direct IO
//! (glommio `DmaFile`, O_DIRECT, each group of writes followed by one fdatasync) and read
//! through a read-only mmap. (fdatasync after the writes measured several times faster
//! than O_DSYNC writes through io_uring on ext4.)
//!
//! An append writes its prepares, together with the redundant headers of the appends
//! acknowledged before it, then one fdatasync, and only then returns a [`Durable`]
//! receipt: the caller sends PrepareOk only with one in hand. A redundant header is
//! written only once its prepare is durable (in a later flush), which is what lets
//! recovery (`crate::recovery`) tell a torn tail from a corrupt entry.

use std::cell::Cell;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use glommio::io::{DmaBuffer, DmaFile, OpenOptions};
use memmap2::Mmap;
use replication::wire::PrepareHeader;

use crate::buffers::BufferPool;
use crate::error::{JournalError, Result};
use crate::format::{decode_meta_copies, encode_meta, scan_image};
use crate::layout::{JournalLayout, HEADERS_PER_SECTOR, HEADER_SIZE, META_COPIES, SECTOR_SIZE};
use crate::recovery::{recover, Recovery, SlotStatus};
use crate::slot::{read_header, verify_header, verify_prepare, EntryFault};

mod write;

pub use write::join_all;
pub(crate) use write::write_all;
use write::{copy_into, take_buffer};

/// Most prepares one group commit may hold (bounds concurrent writes and buffers).
pub const APPEND_BATCH_MAX: u64 = 64;
/// Prepare buffers kept for reuse: up to a whole group commit's worth, within
/// `PREPARE_POOL_BYTES` (a fresh buffer costs a page fault per 4 KiB on first use).
const PREPARE_BUFFERS_POOLED: usize = APPEND_BATCH_MAX as usize;
const PREPARE_POOL_BYTES: usize = 64 * 1024 * 1024;

const _: () = {
    assert!(PREPARE_BUFFERS_POOLED as u64 <= APPEND_BATCH_MAX);
    // Each op of a group is checked against the checkpoint, so a group never overwrites
    // a required op; a group larger than the biggest ring could never be appended.
    assert!(APPEND_BATCH_MAX <= crate::layout::SLOT_COUNT_MAX);
    assert!(FORMAT_CHUNK.is_multiple_of(SECTOR_SIZE));
};

/// Bytes per write when formatting (zero-filling) a journal file.
const FORMAT_CHUNK: u64 = 1024 * 1024;
/// Bytes copied (and checksummed, while still in cache) per step into a write buffer.
const COPY_CHUNK: usize = 64 * 1024;

/// File name of the journal inside a data directory.
pub const JOURNAL_FILE: &str = "journal";

/// Proof that an op's prepare is on stable storage (its redundant header follows with
/// the next flush; recovery keeps a durable, verified prepare without it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a Durable receipt is what allows sending PrepareOk"]
pub struct Durable {
    pub op: u64,
    /// The prepare identity, echoed by PrepareOk as prepare_checksum.
    pub checksum: u128,
}

/// A prepare written straight into one of the journal's direct-IO buffers (sector-aligned
/// and sector-padded), so that [`Journal::append_buffers`] submits it without a copy: a
/// receive path reads a frame into it, a primary builds one in it. Get one from
/// [`Journal::prepare_buffer`]; it goes back to the journal's pool after the append.
pub struct PrepareBuffer {
    buffer: Rc<DmaBuffer>,
    len: usize,
}

impl PrepareBuffer {
    /// The prepare's bytes (`len` of them; the padding after them is not included).
    pub fn as_bytes(&self) -> &[u8] {
        &self.buffer.as_bytes()[..self.len]
    }

    /// The prepare's bytes, to fill.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut Rc::get_mut(&mut self.buffer)
            .unwrap_or_else(|| unreachable!("a PrepareBuffer's buffer is never shared"))
            .as_bytes_mut()[..len]
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl PrepareBuffer {
    /// The write buffer, its padding after the prepare zeroed.
    fn into_padded(mut self) -> Rc<DmaBuffer> {
        let len = self.len;
        Rc::get_mut(&mut self.buffer)
            .unwrap_or_else(|| unreachable!("a PrepareBuffer's buffer is never shared"))
            .as_bytes_mut()[len..]
            .fill(0);
        self.buffer
    }
}

impl std::fmt::Debug for PrepareBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrepareBuffer")
            .field("len", &self.len)
            .field("capacity", &self.buffer.len())
            .finish()
    }
}

/// What a journal can serve for a peer's RequestPrepares (docs/protocol.md,
/// "Journal repair"): verified prepares in op order straight from the mmap, or the
/// honest RangeEvicted answer when the front of the range is gone.
#[derive(Debug, PartialEq, Eq)]
pub enum RepairServe<'a> {
    /// Prepares from `from_op`, contiguous, ending at `last_op` (RepairDone.op).
    Prepares {
        prepares: Vec<&'a [u8]>,
        last_op: u64,
    },
    /// `from_op` is below what the journal retains; `op_min` is the oldest op it still
    /// holds (RangeEvicted.op).
    RangeEvicted { op_min: u64 },
}

/// Counts of the IO a [`Journal`] has issued since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalIo {
    /// Writes submitted (a prepare, a header-ring sector, an invalidating zero sector).
    pub writes: u64,
    /// fdatasyncs of the journal file.
    pub syncs: u64,
}

fn bump(counter: &Cell<u64>) {
    counter.set(counter.get() + 1);
}

/// An open metadata journal. Not `Send`: it lives on one glommio executor.
pub struct Journal {
    path: PathBuf,
    layout: JournalLayout,
    file: DmaFile,
    map: Mmap,
    /// In-memory copy of the header ring; sectors of it are written whole.
    ring: Vec<u8>,
    /// Prepare write buffers, reused when the next prepare needs the same size.
    prepare_buffers: BufferPool,
    /// Header-ring sectors whose in-memory copy holds redundant headers of acknowledged
    /// (durable) prepares that are not yet on disk: written with the next flush.
    headers_pending: BTreeSet<u64>,
    /// Whether an append ran since the last `tick`.
    appended_since_tick: bool,
    /// Writes and fdatasyncs issued since open (see [`Journal::io`]).
    writes_issued: Cell<u64>,
    syncs_issued: Cell<u64>,
    op_checkpoint: u64,
    op_head: u64,
    faulty: BTreeSet<u64>,
}

async fn open_dma(path: &Path, create: bool) -> Result<DmaFile> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(create)
        .dma_open(path)
        .await
        .map_err(|e| JournalError::io("open (O_DIRECT)", path, e))
}

/// Makes a created or renamed file's directory entry durable.
pub(crate) fn sync_parent_dir(path: &Path) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| JournalError::io("fsync directory", dir, e))
}

fn map_file(path: &Path, size_min: u64) -> Result<Mmap> {
    let file = std::fs::File::open(path).map_err(|e| JournalError::io("open", path, e))?;
    let size = file
        .metadata()
        .map_err(|e| JournalError::io("stat", path, e))?
        .len();
    if size < size_min {
        return Err(JournalError::FileTruncated {
            path: path.into(),
            size,
            expected: size_min,
        });
    }
    // SAFETY: the mapping is read-only; this process writes the file only through
    // O_DIRECT writes of slots that are not borrowed from the map across the write (every
    // borrow ends before the `&mut self` write methods run).
    unsafe { Mmap::map(&file) }.map_err(|e| JournalError::io("mmap", path, e))
}

impl Journal {
    /// Formats a new journal at `path` (which must not exist): writes zeros over the
    /// whole file (so later writes overwrite allocated blocks and a durable write needs
    /// no file-system metadata update), then both meta copies, durably.
    pub async fn create(path: &Path, layout: JournalLayout) -> Result<Journal> {
        let file = open_dma(path, true).await?;
        file.pre_allocate(layout.file_size(), false)
            .await
            .map_err(|e| JournalError::io("fallocate", path, e))?;
        let mut zero = file.alloc_dma_buffer(FORMAT_CHUNK as usize);
        zero.as_bytes_mut().fill(0);
        let zero = Rc::new(zero);
        let mut at = META_COPIES * SECTOR_SIZE;
        while at < layout.file_size() {
            let len = FORMAT_CHUNK.min(layout.file_size() - at);
            if len == FORMAT_CHUNK {
                write_all(&file, path, zero.clone(), at).await?;
            } else {
                let mut tail = file.alloc_dma_buffer(len as usize);
                tail.as_bytes_mut().fill(0);
                write_all(&file, path, Rc::new(tail), at).await?;
            }
            at += len;
        }
        let mut meta = file.alloc_dma_buffer(SECTOR_SIZE as usize);
        encode_meta(&layout, meta.as_bytes_mut());
        let meta = Rc::new(meta);
        for copy in 0..META_COPIES {
            write_all(&file, path, meta.clone(), JournalLayout::meta_offset(copy)).await?;
        }
        file.fdatasync()
            .await
            .map_err(|e| JournalError::io("fdatasync", path, e))?;
        sync_parent_dir(path)?;
        file.close()
            .await
            .map_err(|e| JournalError::io("close", path, e))?;
        let (journal, recovery) = Journal::open(path, 0).await?;
        if !recovery.is_clean() || recovery.op_head != 0 {
            return Err(JournalError::Format {
                path: path.into(),
                reason: "a freshly formatted journal does not read back empty",
            });
        }
        Ok(journal)
    }

    /// Opens and recovers the journal at `path`. `op_checkpoint` comes from the
    /// superblock: ops at or below it are covered by the snapshot and not required.
    /// Faulty ops do not prevent opening; they are reported for repair.
    pub async fn open(path: &Path, op_checkpoint: u64) -> Result<(Journal, Recovery)> {
        let head = map_file(path, META_COPIES * SECTOR_SIZE)?;
        let (layout, _) = decode_meta_copies(&head);
        let layout = layout.ok_or(JournalError::Format {
            path: path.into(),
            reason: "neither journal meta copy is valid",
        })?;
        drop(head);
        let map = map_file(path, layout.file_size())?;
        // The scan reads the whole ring once, front to back: ask for readahead of it all.
        let _ = map.advise(memmap2::Advice::Sequential);
        let _ = map.advise(memmap2::Advice::WillNeed);
        let evidence = scan_image(&map, &layout);
        let recovery = recover(&layout, &evidence, op_checkpoint);

        // Rebuild the header ring: a verified prepare's header for valid slots; a valid
        // redundant header for a faulty op (so it stays known as written); zero otherwise.
        let mut ring = vec![0u8; layout.header_ring_size() as usize];
        for (slot, status) in recovery.slots.iter().enumerate() {
            let source = match status {
                SlotStatus::Valid { .. } | SlotStatus::Stale { .. } => {
                    layout.prepare_offset(slot as u64)
                }
                SlotStatus::Faulty { op, .. }
                    if evidence[slot].header.valid().map(|id| id.op) == Some(*op) =>
                {
                    layout.header_offset(slot as u64)
                }
                _ => continue,
            } as usize;
            let at = slot * HEADER_SIZE as usize;
            ring[at..at + HEADER_SIZE as usize]
                .copy_from_slice(&map[source..source + HEADER_SIZE as usize]);
        }

        let file = open_dma(path, false).await?;
        let journal = Journal {
            path: path.into(),
            layout,
            file,
            map,
            ring,
            prepare_buffers: BufferPool::new(PREPARE_BUFFERS_POOLED, PREPARE_POOL_BYTES),
            headers_pending: BTreeSet::new(),
            appended_since_tick: false,
            writes_issued: Cell::new(0),
            syncs_issued: Cell::new(0),
            op_checkpoint,
            op_head: recovery.op_head,
            faulty: recovery.faulty.iter().copied().collect(),
        };
        // The scan faulted in every slot's first page; drop them before writes reuse slots.
        journal.forget_pages(0, journal.layout.file_size());
        // Rewrite damaged redundant headers, and invalidate torn-tail prepares so that a
        // verified but truncated entry can never reappear after later appends.
        let sectors: BTreeSet<u64> = recovery
            .header_repairs
            .iter()
            .map(|slot| slot / HEADERS_PER_SECTOR)
            .collect();
        let writes: Vec<(Rc<DmaBuffer>, u64)> = sectors
            .iter()
            .map(|sector| journal.ring_sector_write(sector * HEADERS_PER_SECTOR))
            .chain(recovery.torn.iter().map(|slot| {
                let zero = journal.zero_sector();
                (zero, journal.layout.prepare_offset(*slot))
            }))
            .collect();
        if !writes.is_empty() {
            journal.write_concurrently(writes).await?;
            journal.sync().await?;
        }
        Ok((journal, recovery))
    }

    /// Bytes of the (preallocated) journal file.
    pub fn file_bytes(&self) -> u64 {
        self.map.len() as u64
    }

    /// The journal's geometry.
    pub fn layout(&self) -> JournalLayout {
        self.layout
    }

    /// Highest op written (valid or faulty).
    pub fn op_head(&self) -> u64 {
        self.op_head
    }

    /// Ops at or below this are covered by the checkpoint.
    pub fn op_checkpoint(&self) -> u64 {
        self.op_checkpoint
    }

    /// Lowest op the journal is required to hold.
    pub fn op_min(&self) -> u64 {
        (self.op_checkpoint + 1).max((self.op_head + 1).saturating_sub(self.layout.slot_count))
    }

    /// Required ops that failed verification and await repair from peers.
    pub fn faulty(&self) -> impl Iterator<Item = u64> + '_ {
        self.faulty.iter().copied()
    }

    /// The highest op an append may use before a newer checkpoint is needed.
    pub fn op_append_max(&self) -> u64 {
        self.op_checkpoint + self.layout.slot_count
    }

    /// Appends the next prepare (`op == op_head + 1`), durably.
    pub async fn append(&mut self, prepare: &[u8]) -> Result<Durable> {
        let durable = self.append_batch(&[prepare]).await?;
        Ok(durable[0])
    }

    /// Appends consecutive prepares (starting at `op_head + 1`) as one group commit: all
    /// prepares (and the redundant headers still pending from earlier appends) are
    /// written concurrently and synced once. Each is durable when this returns; its
    /// redundant header goes to disk with the next flush (next append, [`sync_headers`],
    /// `truncate_after`, `write_repair` or `close`). A crash loses only unacknowledged
    /// entries: recovery truncates from the first torn one.
    ///
    /// [`sync_headers`]: Journal::sync_headers
    pub async fn append_batch(&mut self, prepares: &[&[u8]]) -> Result<Vec<Durable>> {
        let headers = self.check_group(prepares.iter().copied())?;
        let durable = self
            .write_entries(&headers, true, |pool, file, i, header| {
                copy_into(pool, file, prepares[i], header)
            })
            .await?;
        self.appended(&headers);
        Ok(durable)
    }

    /// A write buffer for a prepare of `len` bytes (from the pool when one of the right
    /// size is free), for [`Journal::append_buffers`]. Its bytes are unspecified until
    /// filled; the padding after them is zeroed when it is appended.
    pub fn prepare_buffer(&mut self, len: usize) -> Result<PrepareBuffer> {
        if len as u64 > self.layout.slot_size {
            return Err(JournalError::PrepareTooLarge {
                size: len as u64,
                slot_size: self.layout.slot_size,
            });
        }
        let buffer = take_buffer(&mut self.prepare_buffers, &self.file, len);
        Ok(PrepareBuffer { buffer, len })
    }

    /// As [`Journal::append_batch`], for prepares already in the journal's write buffers
    /// ([`Journal::prepare_buffer`]): nothing is copied, so a group of large prepares
    /// costs the device's time and little more. The header checksum, size and op order
    /// are checked as for `append_batch`, but not the body seal: the caller vouches for
    /// it, because it built the frame or because the bus verified checksum_body as the
    /// frame arrived in this buffer (recovery checks it again on every restart). The
    /// buffers return to the pool, whatever the outcome.
    pub async fn append_buffers(&mut self, prepares: Vec<PrepareBuffer>) -> Result<Vec<Durable>> {
        let checked = self.check_group(prepares.iter().map(PrepareBuffer::as_bytes));
        let headers = match checked {
            Ok(headers) => headers,
            Err(e) => {
                self.recycle(prepares.into_iter().map(|p| p.buffer));
                return Err(e);
            }
        };
        let mut buffers: Vec<Option<PrepareBuffer>> = prepares.into_iter().map(Some).collect();
        let durable = self
            .write_entries(&headers, false, |_, _, i, _| {
                Ok(buffers[i]
                    .take()
                    .unwrap_or_else(|| unreachable!("each buffer is written once"))
                    .into_padded())
            })
            .await?;
        self.appended(&headers);
        Ok(durable)
    }

    /// Checks a group commit's prepares: each well formed, fitting a slot, the next op
    /// in order, and within the ring before the checkpoint.
    fn check_group<'a>(
        &self,
        prepares: impl ExactSizeIterator<Item = &'a [u8]>,
    ) -> Result<Vec<PrepareHeader>> {
        assert!(
            prepares.len() as u64 <= APPEND_BATCH_MAX,
            "group commit too large"
        );
        let mut headers = Vec::with_capacity(prepares.len());
        for (i, prepare) in prepares.enumerate() {
            let header = self.check_prepare(prepare)?;
            let expected = self.op_head + 1 + i as u64;
            if header.op != expected {
                return Err(JournalError::OpOutOfOrder {
                    op: header.op,
                    expected,
                });
            }
            if header.op > self.op_append_max() {
                return Err(JournalError::WrapBeyondCheckpoint {
                    op: header.op,
                    op_checkpoint: self.op_checkpoint,
                    slot_count: self.layout.slot_count,
                });
            }
            headers.push(header);
        }
        Ok(headers)
    }

    /// Advances the head past a group commit just made durable.
    fn appended(&mut self, headers: &[PrepareHeader]) {
        self.appended_since_tick = true;
        if let Some(last) = headers.last() {
            self.op_head = last.op;
        }
    }

    /// Writes a prepare fetched from a peer for a faulty op, durably, and its redundant
    /// header durably after it (a repair is rare and waits for both flushes).
    pub async fn write_repair(&mut self, prepare: &[u8]) -> Result<Durable> {
        let header = self.check_prepare(prepare)?;
        if !self.faulty.contains(&header.op) {
            return Err(JournalError::RepairUnexpected { op: header.op });
        }
        let durable = self
            .write_entries(
                std::slice::from_ref(&header),
                true,
                |pool, file, _, header| copy_into(pool, file, prepare, header),
            )
            .await?;
        self.faulty.remove(&header.op);
        self.sync_headers().await?;
        Ok(durable[0])
    }

    /// Call on a timer: writes the pending redundant headers ([`sync_headers`]) once a
    /// whole tick has passed without an append. While appends keep coming they carry the
    /// headers themselves, so a busy journal pays no extra flush; an idle one has no
    /// pending header for longer than two ticks.
    ///
    /// [`sync_headers`]: Journal::sync_headers
    pub async fn tick(&mut self) -> Result<()> {
        if std::mem::take(&mut self.appended_since_tick) {
            return Ok(());
        }
        self.sync_headers().await
    }

    /// Writes the redundant headers of acknowledged appends that are still only in memory,
    /// durably (no IO when there are none). Appends carry them with their own flush, so
    /// this matters only when the journal goes idle (see [`Journal::tick`]). Until then
    /// a crash loses nothing, but a prepare of the last acknowledged append that is also
    /// damaged before the restart cannot be told from a torn one (see README).
    pub async fn sync_headers(&mut self) -> Result<()> {
        self.appended_since_tick = false;
        if self.headers_pending.is_empty() {
            return Ok(());
        }
        let writes = self
            .headers_pending
            .iter()
            .map(|sector| self.ring_sector_write(sector * HEADERS_PER_SECTOR))
            .collect();
        self.write_concurrently(writes).await?;
        self.sync().await?;
        self.headers_pending.clear();
        Ok(())
    }

    /// The writes and fdatasyncs this journal has issued since it was opened.
    pub fn io(&self) -> JournalIo {
        JournalIo {
            writes: self.writes_issued.get(),
            syncs: self.syncs_issued.get(),
        }
    }

    /// Removes every op after `op` (a view change discarding an uncommitted suffix):
    /// clears their redundant headers, then invalidates their prepares, durably.
    pub async fn truncate_after(&mut self, op: u64) -> Result<()> {
        if op < self.op_checkpoint {
            return Err(JournalError::TruncateBelowCheckpoint {
                op,
                op_checkpoint: self.op_checkpoint,
            });
        }
        if op >= self.op_head {
            return Ok(());
        }
        let removed: Vec<u64> = (op + 1..=self.op_head)
            .map(|o| self.layout.slot_of(o))
            .collect();
        for slot in &removed {
            let at = (*slot * HEADER_SIZE) as usize;
            self.ring[at..at + HEADER_SIZE as usize].fill(0);
        }
        let mut sectors: BTreeSet<u64> = removed.iter().map(|s| s / HEADERS_PER_SECTOR).collect();
        sectors.extend(self.headers_pending.iter().copied());
        let writes = sectors
            .iter()
            .map(|sector| self.ring_sector_write(sector * HEADERS_PER_SECTOR))
            .collect();
        self.write_concurrently(writes).await?;
        self.sync().await?;
        self.headers_pending.clear();
        let zero = self.zero_sector();
        let writes = removed
            .iter()
            .map(|slot| (zero.clone(), self.layout.prepare_offset(*slot)))
            .collect();
        self.write_concurrently(writes).await?;
        self.sync().await?;
        self.op_head = op;
        self.faulty.retain(|o| *o <= op);
        Ok(())
    }

    /// Records that a snapshot now covers every op up to `op` (call after the superblock
    /// naming it is durable), which frees their slots for reuse. An `op` beyond the head
    /// is a snapshot installed by state transfer: the journal then continues after it.
    pub fn set_checkpoint(&mut self, op: u64) -> Result<()> {
        if op < self.op_checkpoint {
            return Err(JournalError::CheckpointInvalid {
                op,
                reason: "checkpoint goes backwards",
            });
        }
        self.op_checkpoint = op;
        self.op_head = self.op_head.max(op);
        self.faulty.retain(|o| *o > op);
        Ok(())
    }

    /// The verified prepare (header + body) for `op`, read from the mmap without copying.
    pub fn entry(&self, op: u64) -> Result<&[u8]> {
        if op < self.op_min() || op > self.op_head || self.faulty.contains(&op) {
            return Err(JournalError::EntryMissing { op });
        }
        let slot = self.layout.slot_of(op);
        let at = self.layout.prepare_offset(slot) as usize;
        let bytes = &self.map[at..at + self.layout.slot_size as usize];
        let ring_at = (slot * HEADER_SIZE) as usize;
        let ring = &self.ring[ring_at..ring_at + HEADER_SIZE as usize];
        match verify_prepare(bytes, self.layout.slot_size) {
            // The ring copy also covers `view`, which the identity does not.
            Ok((id, frame)) if id.op == op && frame[..HEADER_SIZE as usize] == *ring => Ok(frame),
            Ok((id, _)) if id.op == op => Err(JournalError::SlotChecksum { slot, op }),
            Ok(_) => Err(JournalError::EntryMissing { op }),
            Err(_) => Err(JournalError::SlotChecksum { slot, op }),
        }
    }

    /// Serves `from_op..=to_op` for repair: at most `count_max` verified prepares in op
    /// order, stopping before the first op this journal cannot vouch for (missing,
    /// faulty or beyond the head), so what is served is always a contiguous run.
    pub fn serve_repair(&self, from_op: u64, to_op: u64, count_max: usize) -> RepairServe<'_> {
        if from_op < self.op_min() {
            return RepairServe::RangeEvicted {
                op_min: self.op_min(),
            };
        }
        let mut prepares = Vec::new();
        let mut last_op = from_op.saturating_sub(1);
        for op in from_op..=to_op.min(self.op_head) {
            if prepares.len() >= count_max {
                break;
            }
            match self.entry(op) {
                Ok(prepare) => {
                    prepares.push(prepare);
                    last_op = op;
                }
                Err(_) => break,
            }
        }
        RepairServe::Prepares { prepares, last_op }
    }

    /// The header of `op` from the in-memory ring (no disk read, body not verified).
    pub fn header(&self, op: u64) -> Option<PrepareHeader> {
        if op < self.op_min() || op > self.op_head {
            return None;
        }
        let at = (self.layout.slot_of(op) * HEADER_SIZE) as usize;
        read_header(&self.ring[at..]).filter(|h| h.op == op && h.frame.checksum != 0)
    }

    /// Writes the pending redundant headers durably, then closes the file.
    pub async fn close(mut self) -> Result<()> {
        self.sync_headers().await?;
        self.file
            .close()
            .await
            .map_err(|e| JournalError::io("close", &self.path, e))
    }

    /// Checks everything but the body seal, which `write_entries` checks as it copies.
    fn check_prepare(&self, prepare: &[u8]) -> Result<PrepareHeader> {
        let size = prepare.len() as u64;
        if size > self.layout.slot_size {
            return Err(JournalError::PrepareTooLarge {
                size,
                slot_size: self.layout.slot_size,
            });
        }
        let header = read_header(prepare).ok_or(JournalError::PrepareInvalid {
            reason: "shorter than a header",
        })?;
        verify_header(&header, self.layout.slot_size).map_err(prepare_invalid)?;
        if u64::from(header.frame.size) != size {
            return Err(prepare_invalid(EntryFault::SizeInvalid));
        }
        if header.op == 0 {
            return Err(JournalError::PrepareInvalid {
                reason: "op 0 is the root and never journaled",
            });
        }
        Ok(header)
    }
}

fn prepare_invalid(fault: EntryFault) -> JournalError {
    JournalError::PrepareInvalid {
        reason: match fault {
            EntryFault::HeaderChecksum => "header identity checksum mismatch",
            EntryFault::NotPrepare => "command is not Prepare",
            EntryFault::SizeInvalid => "header size does not match the bytes",
            EntryFault::BodyChecksum => "body does not match checksum_body (unsealed?)",
        },
    }
}
