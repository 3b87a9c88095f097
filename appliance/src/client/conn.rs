//! One blocking TCP connection to a node's client port: send a Request frame, read back
//! one Reply or Eviction, validated by `replication::wire` before anything reads it.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use replication::wire::{
    check_header, decode, Frame, FrameBuf, Limits, Message, ReplyHeader, HEADER_SIZE,
};

use super::error::ClientError;

/// The ReplyHeader fields a client checks and acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyFields {
    pub client: u128,
    pub request: u64,
    pub operation: u8,
    pub status: u32,
}

impl ReplyFields {
    fn of(header: &ReplyHeader) -> ReplyFields {
        ReplyFields {
            client: header.client,
            request: header.request,
            operation: header.operation,
            status: header.status,
        }
    }
}

/// What came back for a request.
#[derive(Clone, Debug)]
pub enum Incoming {
    Reply { header: ReplyFields, body: Vec<u8> },
    Eviction { client: u128, reason: u8 },
}

/// Why one exchange failed, and whether the request may have reached the server.
#[derive(Debug)]
pub struct ExchangeError {
    pub error: ClientError,
    /// The whole frame was handed to the kernel: the server may have applied it.
    pub delivered: bool,
}

/// A connection and whether it has logged in.
#[derive(Debug)]
pub struct Connection {
    stream: TcpStream,
    addr: SocketAddr,
    pub logged_in: bool,
    buf: FrameBuf,
}

impl Connection {
    pub fn open(addr: SocketAddr, connect_timeout: Duration) -> Result<Connection, ClientError> {
        let stream = TcpStream::connect_timeout(&addr, connect_timeout).map_err(|e| {
            if e.kind() == ErrorKind::TimedOut || e.kind() == ErrorKind::WouldBlock {
                ClientError::Timeout {
                    server: addr,
                    after: connect_timeout,
                }
            } else {
                ClientError::io(addr, &e)
            }
        })?;
        // Requests are single frames written whole; Nagle would only add latency.
        stream
            .set_nodelay(true)
            .map_err(|e| ClientError::io(addr, &e))?;
        Ok(Connection {
            stream,
            addr,
            logged_in: false,
            buf: FrameBuf::default(),
        })
    }

    /// Sends `frame` and waits up to `timeout` for the answer.
    pub fn exchange(
        &mut self,
        frame: &Frame,
        timeout: Duration,
        limits: &Limits,
    ) -> Result<Incoming, ExchangeError> {
        let deadline = Instant::now() + timeout;
        let addr = self.addr;
        let not_delivered = |error| ExchangeError {
            error,
            delivered: false,
        };
        self.stream
            .set_write_timeout(Some(timeout.max(Duration::from_millis(1))))
            .map_err(|e| not_delivered(ClientError::io(addr, &e)))?;
        self.stream
            .write_all(frame.as_bytes())
            .map_err(|e| not_delivered(timeout_or_io(addr, timeout, &e)))?;
        self.receive(deadline, timeout, limits)
            .map_err(|error| ExchangeError {
                error,
                delivered: true,
            })
    }

    fn receive(
        &mut self,
        deadline: Instant,
        timeout: Duration,
        limits: &Limits,
    ) -> Result<Incoming, ClientError> {
        let addr = self.addr;
        self.buf.resize(HEADER_SIZE);
        read_exact_by(
            &mut self.stream,
            self.buf.as_bytes_mut(),
            deadline,
            addr,
            timeout,
        )?;
        let info =
            check_header(self.buf.as_bytes(), limits).map_err(|error| ClientError::Protocol {
                server: addr,
                error,
            })?;
        self.buf.resize(info.size as usize);
        read_exact_by(
            &mut self.stream,
            &mut self.buf.as_bytes_mut()[HEADER_SIZE..],
            deadline,
            addr,
            timeout,
        )?;
        match decode(self.buf.as_bytes(), limits) {
            Ok(Message::Reply(header, body)) => Ok(Incoming::Reply {
                header: ReplyFields::of(header),
                body: body.to_vec(),
            }),
            Ok(Message::Eviction(header)) => Ok(Incoming::Eviction {
                client: header.client,
                reason: header.reason,
            }),
            Ok(other) => Err(ClientError::UnexpectedReply {
                server: addr,
                what: format!("command {} on the client plane", other.command().name()),
            }),
            Err(error) => Err(ClientError::Protocol {
                server: addr,
                error,
            }),
        }
    }
}

fn timeout_or_io(addr: SocketAddr, timeout: Duration, e: &std::io::Error) -> ClientError {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => ClientError::Timeout {
            server: addr,
            after: timeout,
        },
        _ => ClientError::io(addr, e),
    }
}

/// read_exact with a deadline over the whole read, not per read() call, so a server
/// trickling bytes cannot hold a call past its timeout.
fn read_exact_by(
    stream: &mut TcpStream,
    mut out: &mut [u8],
    deadline: Instant,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<(), ClientError> {
    while !out.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ClientError::Timeout {
                server: addr,
                after: timeout,
            });
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| ClientError::io(addr, &e))?;
        match stream.read(out) {
            Ok(0) => {
                return Err(ClientError::Io {
                    server: addr,
                    kind: ErrorKind::UnexpectedEof,
                    message: "connection closed by the server".into(),
                })
            }
            Ok(n) => out = &mut out[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(timeout_or_io(addr, timeout, &e)),
        }
    }
    Ok(())
}
