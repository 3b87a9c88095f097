//! Connection plumbing: the transport (plain TCP or TLS 1.3 over glommio TCP), a framing
//! reader (256-byte header, checks, body by size into a pooled aligned buffer) and a
//! vectored writer.

use std::cell::RefCell;
use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_lite::io::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;
use socket2::SockRef;

use crate::wire::{check_header, FrameBuf, FrameError, HeaderInfo, Limits, HEADER_SIZE};

/// Bytes of an established replica link's read-ahead stage: small frames are parsed from
/// it; a larger body is read straight into its frame buffer.
pub const STAGE_SIZE: usize = 64 * 1024;
/// Stage of a connection still in its handshake: up to 256 of them exist at once, most
/// possibly hostile, so each holds little memory until it is established.
pub const HANDSHAKE_STAGE_SIZE: usize = 1024;
/// Stage of a client connection (clients are many; their Requests are small).
pub const CLIENT_STAGE_SIZE: usize = 16 * 1024;
/// A body's buffer grows by at most this much ahead of the bytes actually received, so a
/// peer announcing a large frame cannot make us allocate it before sending it.
pub const BODY_GROW_STEP: usize = 4 * 1024 * 1024;
/// Frame buffers kept for reuse.
pub const POOL_BUFFERS_MAX: usize = 1024;
/// Buffers larger than this go back to the allocator instead of the pool.
pub const POOL_BUFFER_LEN_MAX: usize = 1024 * 1024;

const _: () = assert!(HANDSHAKE_STAGE_SIZE >= HEADER_SIZE && HANDSHAKE_STAGE_SIZE <= STAGE_SIZE);
const _: () = assert!(CLIENT_STAGE_SIZE >= HEADER_SIZE);

/// glommio TCP with a nonblocking `sendmsg` for vectored writes (glommio writes only the
/// first slice of a vectored write).
pub(crate) struct Tcp(pub(crate) TcpStream);

impl Tcp {
    fn try_send_vectored(&self, bufs: &[IoSlice<'_>]) -> Option<io::Result<usize>> {
        let socket = SockRef::from(&self.0);
        match socket.send_vectored_with_flags(bufs, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) {
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => None,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => None,
            result => Some(result),
        }
    }

    /// Closes both directions at once, so the peer and our own reader see the end.
    pub(crate) fn shutdown(&self) {
        let _ = SockRef::from(&self.0).shutdown(std::net::Shutdown::Both);
    }
}

impl AsyncRead for Tcp {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tcp {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(result) = self.try_send_vectored(bufs) {
            return Poll::Ready(result);
        }
        // Would block: glommio's single-slice write retries and arms the waker.
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &b[..]);
        Pin::new(&mut self.0).poll_write(cx, first)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_close(cx)
    }
}

/// Bytes a TLS transport reads from its socket at once. rustls asks for at most 4 KiB
/// per read; serving those from one larger read makes a 1 MiB frame about 32 receives
/// instead of 256. Allocated at the first read, so connections that never pass the
/// handshake hold none of it.
pub(crate) const TLS_READ_AHEAD: usize = 32 * 1024;

/// glommio TCP under TLS: reads ahead `TLS_READ_AHEAD` bytes; writes go straight through.
pub(crate) struct TlsTcp {
    tcp: Tcp,
    ahead: Vec<u8>,
    start: usize,
    end: usize,
}

impl TlsTcp {
    pub(crate) fn new(tcp: TcpStream) -> TlsTcp {
        TlsTcp {
            tcp: Tcp(tcp),
            ahead: Vec::new(),
            start: 0,
            end: 0,
        }
    }
}

impl AsyncRead for TlsTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.start == this.end {
            if out.len() >= TLS_READ_AHEAD {
                return Pin::new(&mut this.tcp).poll_read(cx, out);
            }
            if this.ahead.is_empty() {
                this.ahead = vec![0; TLS_READ_AHEAD];
            }
            let n = match Pin::new(&mut this.tcp).poll_read(cx, &mut this.ahead) {
                Poll::Ready(Ok(n)) => n,
                other => return other,
            };
            this.start = 0;
            this.end = n;
        }
        let n = (this.end - this.start).min(out.len());
        out[..n].copy_from_slice(&this.ahead[this.start..this.start + n]);
        this.start += n;
        Poll::Ready(Ok(n))
    }
}

impl AsyncWrite for TlsTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_close(cx)
    }
}

/// A connection's transport.
pub(crate) enum Stream {
    Plain(Tcp),
    TlsClient(Box<futures_rustls::client::TlsStream<TlsTcp>>),
    TlsServer(Box<futures_rustls::server::TlsStream<TlsTcp>>),
}

impl Stream {
    fn tcp(&self) -> &Tcp {
        match self {
            Stream::Plain(tcp) => tcp,
            Stream::TlsClient(tls) => &tls.get_ref().0.tcp,
            Stream::TlsServer(tls) => &tls.get_ref().0.tcp,
        }
    }

    pub(crate) fn shutdown(&self) {
        self.tcp().shutdown();
    }
}

macro_rules! each_stream {
    ($self:expr, $s:ident => $body:expr) => {
        match $self.get_mut() {
            Stream::Plain($s) => {
                let $s = Pin::new($s);
                $body
            }
            Stream::TlsClient($s) => {
                let $s = Pin::new(&mut **$s);
                $body
            }
            Stream::TlsServer($s) => {
                let $s = Pin::new(&mut **$s);
                $body
            }
        }
    };
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        each_stream!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        each_stream!(self, s => s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        each_stream!(self, s => s.poll_write_vectored(cx, bufs))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each_stream!(self, s => s.poll_flush(cx))
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each_stream!(self, s => s.poll_close(cx))
    }
}

/// The transport shared by a connection's reader and writer tasks. The executor is
/// single-threaded and each poll borrows only for its own duration.
pub(crate) type SharedStream = Rc<RefCell<Stream>>;

async fn read_some(stream: &SharedStream, buf: &mut [u8]) -> io::Result<usize> {
    poll_fn(|cx| Pin::new(&mut *stream.borrow_mut()).poll_read(cx, buf)).await
}

/// Writes all of `bufs` (vectored, resuming after partial writes) and flushes.
pub(crate) async fn write_all_vectored<T: AsRef<[u8]>>(
    stream: &SharedStream,
    frames: &[T],
) -> io::Result<usize> {
    let total: usize = frames.iter().map(|f| f.as_ref().len()).sum();
    let mut written = 0usize;
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(frames.len());
    while written < total {
        slices.clear();
        let mut skip = written;
        for frame in frames {
            let frame = frame.as_ref();
            if skip >= frame.len() {
                skip -= frame.len();
                continue;
            }
            slices.push(IoSlice::new(&frame[skip..]));
            skip = 0;
        }
        let n = poll_fn(|cx| Pin::new(&mut *stream.borrow_mut()).poll_write_vectored(cx, &slices))
            .await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        written += n;
    }
    poll_fn(|cx| Pin::new(&mut *stream.borrow_mut()).poll_flush(cx)).await?;
    Ok(total)
}

/// Why reading a frame stopped.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The peer closed cleanly between frames.
    Closed,
    /// The stream ended inside a frame, or failed.
    Io(io::Error),
    /// The header failed validation; the connection cannot be trusted to frame.
    Frame(FrameError),
}

impl ReadError {
    pub(crate) fn reason(&self) -> Option<&'static str> {
        match self {
            ReadError::Closed => None,
            ReadError::Io(error) if error.kind() == io::ErrorKind::UnexpectedEof => {
                Some("truncated_frame")
            }
            // rustls reports undecryptable or malformed records as InvalidData.
            ReadError::Io(error) if error.kind() == io::ErrorKind::InvalidData => {
                Some("tls_invalid_record")
            }
            ReadError::Io(_) => None,
            ReadError::Frame(error) => Some(error.reason()),
        }
    }
}

/// Reads frames off a stream through a read-ahead stage.
///
/// Small frames arrive many to a read. A large body is read straight into its frame
/// buffer; after a large frame the next header is read without read-ahead, so a stream of
/// large frames is copied once (socket to frame buffer), not twice.
///
/// Invariant behind every slice of the stage below: start <= end <= stage.len(); `fill`
/// is only asked for need <= stage.len() (a header, or one byte), and `read_body` bounds
/// `filled <= want <= size` with `buf` resized to `want` first.
pub(crate) struct FrameReader {
    stage: Box<[u8]>,
    start: usize,
    end: usize,
    read_ahead: bool,
}

impl FrameReader {
    /// A reader whose stage holds `stage_size` bytes.
    pub(crate) fn new(stage_size: usize) -> FrameReader {
        FrameReader {
            stage: vec![0u8; stage_size.max(HEADER_SIZE)].into_boxed_slice(),
            start: 0,
            end: 0,
            read_ahead: true,
        }
    }

    /// Grows the stage (keeping what it holds) once a handshake is done.
    pub(crate) fn grow_stage(&mut self, stage_size: usize) {
        if stage_size <= self.stage.len() {
            return;
        }
        let mut stage = vec![0u8; stage_size].into_boxed_slice();
        let held = self.buffered();
        stage[..held].copy_from_slice(&self.stage[self.start..self.end]);
        self.stage = stage;
        self.start = 0;
        self.end = held;
    }

    fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Reads until at least `need` bytes are staged.
    async fn fill(&mut self, stream: &SharedStream, need: usize) -> Result<(), ReadError> {
        let stage_size = self.stage.len();
        debug_assert!(need <= stage_size);
        if self.start + need > stage_size {
            self.stage.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        while self.buffered() < need {
            let limit = if self.read_ahead {
                stage_size
            } else {
                self.start + need
            };
            let n = read_some(stream, &mut self.stage[self.end..limit])
                .await
                .map_err(ReadError::Io)?;
            if n == 0 {
                return Err(if self.buffered() == 0 {
                    ReadError::Closed
                } else {
                    ReadError::Io(io::ErrorKind::UnexpectedEof.into())
                });
            }
            self.end += n;
        }
        Ok(())
    }

    fn consume(&mut self, len: usize) {
        self.start += len;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Reads exactly one 256-byte header into `buf` (resized to 256), unchecked.
    pub(crate) async fn read_header(
        &mut self,
        stream: &SharedStream,
        buf: &mut FrameBuf,
    ) -> Result<(), ReadError> {
        self.read_header_keep_len(stream, buf).await?;
        buf.resize(HEADER_SIZE);
        Ok(())
    }

    /// Reads a header into the front of `buf` without shrinking it: a pooled buffer
    /// keeps its length, so a body of the same size is not zero-filled again.
    async fn read_header_keep_len(
        &mut self,
        stream: &SharedStream,
        buf: &mut FrameBuf,
    ) -> Result<(), ReadError> {
        self.fill(stream, HEADER_SIZE).await?;
        if buf.len() < HEADER_SIZE {
            buf.resize_for_overwrite(HEADER_SIZE);
        }
        buf.as_bytes_mut()[..HEADER_SIZE]
            .copy_from_slice(&self.stage[self.start..self.start + HEADER_SIZE]);
        self.consume(HEADER_SIZE);
        Ok(())
    }

    /// Reads the body that follows a header already in `buf`, growing it to `size`.
    pub(crate) async fn read_body(
        &mut self,
        stream: &SharedStream,
        buf: &mut FrameBuf,
        size: usize,
    ) -> Result<(), ReadError> {
        let staged = self.buffered().min(size - HEADER_SIZE);
        let mut filled = HEADER_SIZE + staged;
        // A pooled buffer may already be long enough; otherwise grow in steps as bytes
        // arrive. Shrinking (to the exact size at the end) keeps the allocation.
        if buf.len() < filled {
            buf.resize_for_overwrite(filled);
        }
        buf.as_bytes_mut()[HEADER_SIZE..filled]
            .copy_from_slice(&self.stage[self.start..self.start + staged]);
        self.consume(staged);
        while filled < size {
            let want = size.min(filled + BODY_GROW_STEP);
            if buf.len() < want {
                buf.resize_for_overwrite(want);
            }
            let n = read_some(stream, &mut buf.as_bytes_mut()[filled..want])
                .await
                .map_err(ReadError::Io)?;
            if n == 0 {
                return Err(ReadError::Io(io::ErrorKind::UnexpectedEof.into()));
            }
            filled += n;
        }
        buf.resize_for_overwrite(size);
        self.read_ahead = size <= self.stage.len() / 4;
        Ok(())
    }

    /// Reads one frame: header, header-only checks (size bound first), then the body.
    pub(crate) async fn read_frame(
        &mut self,
        stream: &SharedStream,
        buf: &mut FrameBuf,
        limits: &Limits,
    ) -> Result<HeaderInfo, ReadError> {
        let info = self.read_checked_header(stream, buf, limits).await?;
        self.read_rest(stream, buf, info.size as usize).await?;
        Ok(info)
    }

    /// Reads a header into the front of `buf` and runs the header-only checks; the body
    /// is still on the stream (`read_rest` or `skip_rest` next).
    pub(crate) async fn read_checked_header(
        &mut self,
        stream: &SharedStream,
        buf: &mut FrameBuf,
        limits: &Limits,
    ) -> Result<HeaderInfo, ReadError> {
        self.read_header_keep_len(stream, buf).await?;
        check_header(buf.as_bytes(), limits).map_err(ReadError::Frame)
    }

    /// Reads the body of a frame of `size` bytes whose header is in `buf`.
    pub(crate) async fn read_rest(
        &mut self,
        stream: &SharedStream,
        buf: &mut FrameBuf,
        size: usize,
    ) -> Result<(), ReadError> {
        if size > HEADER_SIZE {
            self.read_body(stream, buf, size).await
        } else {
            buf.resize(HEADER_SIZE);
            self.read_ahead = true;
            Ok(())
        }
    }

    /// Discards the body of a refused frame of `size` bytes through the stage, without
    /// allocating for it, so the connection stays framed. `buf` keeps the header only.
    pub(crate) async fn skip_rest(
        &mut self,
        stream: &SharedStream,
        buf: &mut FrameBuf,
        size: usize,
    ) -> Result<(), ReadError> {
        buf.resize(HEADER_SIZE);
        let mut left = size.saturating_sub(HEADER_SIZE);
        while left > 0 {
            if self.buffered() == 0 {
                let was = self.read_ahead;
                self.read_ahead = true;
                let filled = self.fill(stream, 1).await;
                self.read_ahead = was;
                filled.map_err(|error| match error {
                    ReadError::Closed => ReadError::Io(io::ErrorKind::UnexpectedEof.into()),
                    other => other,
                })?;
            }
            let take = self.buffered().min(left);
            self.consume(take);
            left -= take;
        }
        self.read_ahead = true;
        Ok(())
    }
}

/// Client frames up to this size may use all of the frame memory.
pub(crate) const SMALL_FRAME_MAX: usize = 64 * 1024;
/// Larger frames may use this fraction (numerator, denominator) of it.
pub(crate) const LARGE_FRAME_SHARE: (usize, usize) = (3, 4);

/// The bytes of client frames held at once, bounded (limits.frame_memory_max). Atomic
/// so a `VerifiedFrame` stays `Send`; the bus itself runs on one executor.
pub(crate) struct FrameMemory {
    used: AtomicUsize,
    max: usize,
}

impl FrameMemory {
    pub(crate) fn new(max: usize) -> FrameMemory {
        FrameMemory {
            used: AtomicUsize::new(0),
            max,
        }
    }

    pub(crate) fn used(&self) -> usize {
        self.used.load(Relaxed)
    }

    /// Reserves `bytes` for one frame, or None when that would pass the bound. Frames
    /// above SMALL_FRAME_MAX may fill only LARGE_FRAME_SHARE of it, so senders of large
    /// frames (or a slow-sending flood of them) cannot starve ordinary requests.
    pub(crate) fn reserve(self: &Arc<Self>, bytes: usize) -> Option<Charge> {
        let bound = if bytes > SMALL_FRAME_MAX {
            self.max / LARGE_FRAME_SHARE.1 * LARGE_FRAME_SHARE.0
        } else {
            self.max
        };
        self.used
            .fetch_update(Relaxed, Relaxed, |used| {
                used.checked_add(bytes).filter(|total| *total <= bound)
            })
            .ok()?;
        Some(Charge {
            memory: self.clone(),
            bytes,
        })
    }
}

/// One frame's reservation, released on drop.
pub(crate) struct Charge {
    memory: Arc<FrameMemory>,
    bytes: usize,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.memory.used.fetch_sub(self.bytes, Relaxed);
    }
}

/// Aligned frame buffers for reuse, so steady-state receiving does not allocate.
#[derive(Default)]
pub(crate) struct BufPool {
    free: RefCell<Vec<FrameBuf>>,
}

impl BufPool {
    pub(crate) fn get(&self) -> FrameBuf {
        self.free.borrow_mut().pop().unwrap_or_default()
    }

    pub(crate) fn put(&self, buf: FrameBuf) {
        let mut free = self.free.borrow_mut();
        if free.len() < POOL_BUFFERS_MAX && buf.len() <= POOL_BUFFER_LEN_MAX {
            free.push(buf);
        }
    }
}

#[cfg(test)]
mod frame_memory_tests {
    use super::*;

    #[test]
    fn large_frames_leave_a_quarter_of_frame_memory_to_small_ones() {
        let memory = Arc::new(FrameMemory::new(1 << 20));
        let large = 128 * 1024;
        let held: Vec<Charge> = std::iter::from_fn(|| memory.reserve(large)).collect();
        assert_eq!(held.len(), 6, "3/4 of 1 MiB in 128 KiB frames");
        assert!(memory.reserve(large).is_none());
        let small: Vec<Charge> = std::iter::from_fn(|| memory.reserve(SMALL_FRAME_MAX)).collect();
        assert_eq!(small.len(), 4, "the last quarter still takes small frames");
        drop(held);
        assert_eq!(memory.used(), 4 * SMALL_FRAME_MAX);
        assert!(memory.reserve(large).is_some());
    }
}
