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
