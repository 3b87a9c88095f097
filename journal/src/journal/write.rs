//! How the journal writes: a group's prepares and the pending redundant headers issued
//! together through pooled O_DIRECT buffers, then one fdatasync.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::Duration;

use glommio::io::{DmaBuffer, DmaFile};
use replication::wire::PrepareHeader;

use super::{bump, prepare_invalid, Durable, Journal, COPY_CHUNK};
use crate::buffers::BufferPool;
use crate::error::{JournalError, Result};
use crate::layout::{HEADERS_PER_SECTOR, HEADER_SIZE, SECTOR_SIZE};
use crate::slot::EntryFault;

impl Journal {
    /// Writes a group's prepares (`fill` hands over each one's write buffer: copied and
    /// seal-checked, or built in place) together with the pending redundant headers of
    /// earlier appends, then syncs once. With `copying`, each write is submitted as soon
    /// as its buffer is filled, so copying the next overlaps the device. The new
    /// prepares' headers become pending: they must not reach the disk before the
    /// prepares are durable, which they now are.
    pub(super) async fn write_entries(
        &mut self,
        headers: &[PrepareHeader],
        copying: bool,
        mut fill: impl FnMut(&mut BufferPool, &DmaFile, usize, &PrepareHeader) -> Result<Rc<DmaBuffer>>,
    ) -> Result<Vec<Durable>> {
        for header in headers {
            self.forget_pages(
                self.layout.prepare_offset(self.layout.slot_of(header.op)),
                self.layout.slot_size,
            );
        }
        let pending = std::mem::take(&mut self.headers_pending);
        let mut inflight = Concurrent::with_capacity(pending.len() + headers.len());
        for sector in &pending {
            let (buffer, offset) = self.ring_sector_write(sector * HEADERS_PER_SECTOR);
            bump(&self.writes_issued);
            inflight.push(write_all(&self.file, &self.path, buffer, offset));
        }
        inflight.start().await;
        let mut used = Vec::with_capacity(headers.len());
        let mut refused = None;
        for (i, header) in headers.iter().enumerate() {
            let buffer = match fill(&mut self.prepare_buffers, &self.file, i, header) {
                Ok(buffer) => buffer,
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            };
            let offset = self.layout.prepare_offset(self.layout.slot_of(header.op));
            bump(&self.writes_issued);
            inflight.push(write_all(&self.file, &self.path, buffer.clone(), offset));
            used.push((buffer, offset));
            if copying {
                inflight.start().await;
                if i + 1 < headers.len() {
                    // Let the reactor submit it before copying the next one.
                    glommio::timer::sleep(Duration::from_micros(1)).await;
                }
            }
        }
        let written: Result<()> = inflight.join().await.into_iter().collect();
        let offsets: Vec<u64> = used.iter().map(|(_, offset)| *offset).collect();
        // The headers go into the ring once durable; the buffers go back to the pool now.
        let header_bytes: Vec<[u8; HEADER_SIZE as usize]> = used
            .iter()
            .map(|(buffer, _)| {
                let mut header = [0; HEADER_SIZE as usize];
                header.copy_from_slice(&buffer.as_bytes()[..HEADER_SIZE as usize]);
                header
            })
            .collect();
        self.recycle(used.into_iter().map(|(buffer, _)| buffer));
        // Until this flush succeeds, the pending headers are not known to be on disk.
        self.headers_pending.extend(pending.iter().copied());
        written?;
        if let Some(refused) = refused {
            // An earlier prepare of the group may have been written: invalidate it so
            // nothing past the head can reappear as an entry after a restart.
            let zero = self.zero_sector();
            let writes = offsets.iter().map(|o| (zero.clone(), *o)).collect();
            self.write_concurrently(writes).await?;
            self.sync().await?;
            return Err(refused);
        }
        self.sync().await?;
        for sector in &pending {
            self.headers_pending.remove(sector);
        }
        for (header, bytes) in headers.iter().zip(&header_bytes) {
            let slot = self.layout.slot_of(header.op);
            let at = (slot * HEADER_SIZE) as usize;
            self.ring[at..at + HEADER_SIZE as usize].copy_from_slice(bytes);
            self.headers_pending.insert(slot / HEADERS_PER_SECTOR);
        }
        Ok(headers
            .iter()
            .map(|h| Durable {
                op: h.op,
                checksum: h.frame.checksum,
            })
            .collect())
    }

    /// Returns write buffers to the pool.
    pub(super) fn recycle(&mut self, buffers: impl Iterator<Item = Rc<DmaBuffer>>) {
        for buffer in buffers {
            self.prepare_buffers.keep(buffer);
        }
    }

    /// Submits every write at once and waits for all of them (not synced).
    pub(super) async fn write_concurrently(&self, writes: Vec<(Rc<DmaBuffer>, u64)>) -> Result<()> {
        let mut futures = Concurrent::with_capacity(writes.len());
        for (buffer, offset) in writes {
            bump(&self.writes_issued);
            futures.push(write_all(&self.file, &self.path, buffer, offset));
        }
        futures.join().await.into_iter().collect()
    }

    /// Drops this process's mapping and the page cache of a file range before a direct
    /// write overwrites it: invalidating mapped, cached pages inside the write path
    /// measured several times slower than writing to an uncached range.
    pub(super) fn forget_pages(&self, offset: u64, len: u64) {
        use std::os::fd::AsRawFd;
        // SAFETY: the map is a read-only shared file mapping and no slice of it is
        // borrowed across a `&mut self` write; after MADV_DONTNEED the next access
        // faults the bytes back in from the file.
        let advised = unsafe {
            self.map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                offset as usize,
                len as usize,
            )
        };
        debug_assert!(advised.is_ok());
        // SAFETY: advisory call on a descriptor we own; only clean pages are dropped.
        unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                offset as i64,
                len as i64,
                libc::POSIX_FADV_DONTNEED,
            );
        }
    }

    pub(super) fn zero_sector(&self) -> Rc<DmaBuffer> {
        let mut zero = self.file.alloc_dma_buffer(SECTOR_SIZE as usize);
        zero.as_bytes_mut().fill(0);
        Rc::new(zero)
    }

    /// Forces completed writes to stable storage.
    pub(super) async fn sync(&self) -> Result<()> {
        bump(&self.syncs_issued);
        self.file
            .fdatasync()
            .await
            .map_err(|e| JournalError::io("fdatasync", &self.path, e))
    }

    /// The write of the header-ring sector holding `slot`'s redundant header.
    pub(super) fn ring_sector_write(&self, slot: u64) -> (Rc<DmaBuffer>, u64) {
        let sector = slot / HEADERS_PER_SECTOR;
        let at = (sector * SECTOR_SIZE) as usize;
        let mut buffer = self.file.alloc_dma_buffer(SECTOR_SIZE as usize);
        buffer
            .as_bytes_mut()
            .copy_from_slice(&self.ring[at..at + SECTOR_SIZE as usize]);
        (Rc::new(buffer), self.layout.header_sector_offset(slot))
    }
}

/// A pooled write buffer for `len` bytes (sector-padded).
pub(super) fn take_buffer(pool: &mut BufferPool, file: &DmaFile, len: usize) -> Rc<DmaBuffer> {
    pool.take(file, crate::layout::sector_ceil(len as u64) as usize)
}

/// `prepare` copied into a pooled write buffer, its body seal checked on the way.
pub(super) fn copy_into(
    pool: &mut BufferPool,
    file: &DmaFile,
    prepare: &[u8],
    header: &PrepareHeader,
) -> Result<Rc<DmaBuffer>> {
    let mut buffer = take_buffer(pool, file, prepare.len());
    let bytes = Rc::get_mut(&mut buffer)
        .unwrap_or_else(|| unreachable!("pooled buffers are not shared"))
        .as_bytes_mut();
    if copy_sealed(prepare, bytes, header.frame.checksum_body) {
        Ok(buffer)
    } else {
        pool.keep(buffer);
        Err(prepare_invalid(EntryFault::BodyChecksum))
    }
}

/// Copies `prepare` into the front of `buffer` and zeroes the rest, checking on the way
/// that its body matches `checksum_body` (the seal of `replication::wire::frame::seal_of`,
/// XxHash3-64, computed over each chunk just copied while it is still in cache).
fn copy_sealed(prepare: &[u8], buffer: &mut [u8], checksum_body: u128) -> bool {
    let header = HEADER_SIZE as usize;
    buffer[..header].copy_from_slice(&prepare[..header]);
    let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
    for (from, to) in prepare[header..]
        .chunks(COPY_CHUNK)
        .zip(buffer[header..].chunks_mut(COPY_CHUNK))
    {
        let to = &mut to[..from.len()];
        to.copy_from_slice(from);
        hasher.update(to);
    }
    buffer[prepare.len()..].fill(0);
    u128::from(hasher.digest()) == checksum_body
}

/// Runs `futures` (IO on this executor, e.g. syncs of several files) concurrently, so
/// their operations are in flight together; their outputs in order.
pub async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut all = Concurrent::with_capacity(0);
    for future in futures {
        all.push(future);
    }
    all.join().await
}

/// Futures (writes to one file) polled together: each is polled once as soon as it is
/// added, which queues its IO, and all are then awaited together.
struct Concurrent<F: Future> {
    futures: Vec<Pin<Box<F>>>,
    outputs: Vec<Option<F::Output>>,
}

impl<F: Future> Concurrent<F> {
    fn with_capacity(capacity: usize) -> Concurrent<F> {
        Concurrent {
            futures: Vec::with_capacity(capacity),
            outputs: Vec::with_capacity(capacity),
        }
    }

    fn push(&mut self, future: F) {
        self.futures.push(Box::pin(future));
        self.outputs.push(None);
    }

    /// Polls every unfinished future once; Ready if all have finished.
    fn poll_all(&mut self, cx: &mut std::task::Context<'_>) -> Poll<()> {
        let mut pending = false;
        for (future, output) in self.futures.iter_mut().zip(self.outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }

    /// Polls the futures not yet finished once (queueing new IO) without waiting.
    async fn start(&mut self) {
        std::future::poll_fn(|cx| {
            let _ = self.poll_all(cx);
            Poll::Ready(())
        })
        .await;
    }

    /// Waits for every future and returns their outputs in order.
    async fn join(mut self) -> Vec<F::Output> {
        std::future::poll_fn(|cx| self.poll_all(cx)).await;
        self.outputs.into_iter().flatten().collect()
    }
}

/// Writes a whole sector-aligned buffer at `offset` (not yet durable: sync after).
pub(crate) async fn write_all(
    file: &DmaFile,
    path: &Path,
    buffer: Rc<DmaBuffer>,
    offset: u64,
) -> Result<()> {
    assert_eq!(offset % SECTOR_SIZE, 0);
    assert_eq!(buffer.len() as u64 % SECTOR_SIZE, 0);
    let len = buffer.len();
    let written = file
        .write_rc_at(buffer, offset)
        .await
        .map_err(|e| JournalError::io("write", path, e))?;
    if written != len {
        return Err(JournalError::io(
            "write",
            path,
            std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                format!("short write {written} of {len}"),
            ),
        ));
    }
    Ok(())
}
