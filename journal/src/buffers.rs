//! Direct-IO write buffers kept for reuse: a fresh buffer costs a page fault per 4 KiB on
//! first use, and the writes of a steady workload come in few sizes.

use std::rc::Rc;

use glommio::io::{DmaBuffer, DmaFile};

/// Buffers matched by exact length, bounded in count and bytes; the newest stay.
pub(crate) struct BufferPool {
    buffers: Vec<Rc<DmaBuffer>>,
    count_max: usize,
    bytes_max: usize,
}

impl BufferPool {
    pub(crate) const fn new(count_max: usize, bytes_max: usize) -> BufferPool {
        BufferPool {
            buffers: Vec::new(),
            count_max,
            bytes_max,
        }
    }

    /// A kept buffer of exactly `len` bytes, else a fresh one from `file`.
    pub(crate) fn take(&mut self, file: &DmaFile, len: usize) -> Rc<DmaBuffer> {
        match self.buffers.iter().position(|b| b.len() == len) {
            Some(at) => self.buffers.swap_remove(at),
            None => Rc::new(file.alloc_dma_buffer(len)),
        }
    }

    /// A buffer of exactly `len` bytes for writes whose length varies from one to the
    /// next (coalesced appends): the smallest kept buffer at least that long, cut to
    /// `len`, else a fresh one allocated `slack` bytes longer and cut, so that later
    /// writes a little longer still find it. Cutting is for good (glommio cannot grow a
    /// buffer back), so a buffer serves writes of its length and shorter afterwards.
    pub(crate) fn take_at_least(
        &mut self,
        file: &DmaFile,
        len: usize,
        slack: usize,
    ) -> Rc<DmaBuffer> {
        let best = self
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= len)
            .min_by_key(|(_, b)| b.len())
            .map(|(at, _)| at);
        let mut buffer = match best {
            Some(at) => self.buffers.swap_remove(at),
            None => Rc::new(file.alloc_dma_buffer(file.align_up((len + slack) as u64) as usize)),
        };
        Rc::get_mut(&mut buffer)
            .unwrap_or_else(|| unreachable!("pooled buffers are not shared"))
            .trim_to_size(len);
        buffer
    }

    /// Keeps `buffer` for reuse; the oldest (perhaps of a size no longer used) go beyond
    /// the bounds. A buffer still shared (a write may still hold it), or larger than the
    /// byte bound alone (it would only push out every other), is not kept.
    pub(crate) fn keep(&mut self, buffer: Rc<DmaBuffer>) {
        if Rc::strong_count(&buffer) != 1 || buffer.len() > self.bytes_max {
            return;
        }
        self.buffers.push(buffer);
        while self.buffers.len() > self.count_max
            || self.buffers.iter().map(|b| b.len()).sum::<usize>() > self.bytes_max
        {
            self.buffers.remove(0);
        }
    }
}
