//! Polls read off the node loop. The node answers a PollMessages in two steps: on the
//! node loop it checks the request and plans the read from memory (`Node::poll`: which
//! segment files and byte ranges, up to the commit point); the file reads, the batch
//! verification, the cut to the range asked and the sealing of the reply frame run on
//! reader threads of lower CPU priority (`PollRead::run`), and the sealed reply comes
//! back as an event for the node loop to send. A cold read of megabytes from the disk
//! then stalls no heartbeat, prepare or ack of the node loop, and on busy cores the
//! writes run first.
//!
//! One read runs per reader thread (`poll_readers`: one per core, 2 to 8); more wait
//! in a queue of `POLL_QUEUE_MAX`, past which a poll is answered Unavailable (counted
//! `poll_queue_full`). The node loop's side (a read started or queued, its reply sent)
//! is in messages.rs.

use std::collections::VecDeque;
use std::rc::Rc;

use journal::segment::ReadPlan;
use replication::bus::ClientId;
use replication::wire::{batch, Frame, FrameBuf, ReplyHeader, RequestHeader, HEADER_SIZE};

use crate::protocol::codec::Writer;
use crate::protocol::reply::{result_section, PollHeader};
use crate::protocol::{Consumer, Status};

/// Poll reads at once, one per reader thread (each holds a read window and a reply):
/// one per core, at least 2 and at most 8.
fn poll_readers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8))
}
/// Polls waiting for a read slot at most.
pub(super) const POLL_QUEUE_MAX: usize = 4096;

/// One poll's read, planned on the node loop.
pub(super) struct PollRead {
    /// The header of the reply (Ok), sealed with the body once it is read.
    pub reply: ReplyHeader,
    pub plan: ReadPlan,
    /// The offset serving starts at; None for a timestamp poll, which starts at the
    /// first batch the read finds (not below `first`).
    pub from: Option<u64>,
    /// The partition's first retained offset.
    pub first: u64,
    /// The commit point when planned: nothing at or past it is served.
    pub end: u64,
    /// Messages asked for (at least 1).
    pub count: u32,
    pub partition: u32,
    /// With auto_commit on the partition's primary: where to store the offset.
    pub commit: Option<AutoCommit>,
}

/// The offset a poll with auto_commit stores once it is served.
#[derive(Clone, Copy)]
pub struct AutoCommit {
    pub group: u64,
    pub user: u32,
    pub consumer: Consumer,
}

/// A poll's reply, built on a reader thread.
pub struct PollReply {
    pub status: Status,
    /// The sealed reply when `status` is Ok.
    pub frame: Option<Frame>,
    /// The last offset served, for auto_commit.
    pub last: Option<u64>,
    pub commit: Option<AutoCommit>,
    /// A batch on disk that failed verification (the reply holds those before it).
    pub invalid: bool,
    /// The read panicked (`caught`).
    pub panicked: bool,
    pub error: Option<String>,
}

impl PollReply {
    /// A poll answered Unavailable for `error` (logged by the node loop).
    fn unavailable(error: String) -> PollReply {
        PollReply {
            status: Status::Unavailable,
            frame: None,
            last: None,
            commit: None,
            invalid: false,
            panicked: false,
            error: Some(error),
        }
    }
}

impl PollRead {
    /// Reads the planned batches and builds the reply: its header, then the messages
    /// from `from` up to `count`, as served batches (`batch::append_served`). Blocking.
    pub fn run(self) -> PollReply {
        // The frame's header, Iggy's result section, the poll header, then the messages,
        // written in place into the buffer the frame is sealed in.
        let section = result_section(self.reply.operation);
        let poll_header_at = HEADER_SIZE + section.len();
        let mut buf =
            FrameBuf::for_overwrite(poll_header_at + PollHeader::SIZE + self.plan.bytes_hint());
        buf.resize(HEADER_SIZE);
        buf.extend_from_slice(section);
        buf.resize(poll_header_at + PollHeader::SIZE);
        let (mut served, mut next, mut invalid) = (0u32, None::<u64>, false);
        let read = self.plan.read(&mut |bytes, info| {
            let start = next.unwrap_or(match self.from {
                Some(from) => from,
                None => info.base_offset.max(self.first),
            });
            let to = self
                .end
                .min(start.saturating_add(u64::from(self.count - served)));
            if info.base_offset >= to {
                return false;
            }
            match batch::append_served(bytes, start, to, &mut buf) {
                Ok(appended) => served += appended,
                Err(_) => {
                    invalid = true;
                    return false;
                }
            }
            next = Some(info.next_offset().min(to));
            served < self.count && info.next_offset() < self.end
        });
        let error = match read {
            Ok(()) => None,
            // What was served before a damaged batch is answered; the next poll from
            // there meets the damage again.
            Err(journal::JournalError::SegmentCorrupt { .. }) if served > 0 => {
                invalid = true;
                None
            }
            Err(journal::JournalError::SegmentCorrupt { .. }) => {
                invalid = true;
                Some("segment batch failed verification".to_owned())
            }
            Err(error) => Some(error.to_string()),
        };
        if let Some(error) = error {
            return PollReply {
                invalid,
                ..PollReply::unavailable(error)
            };
        }
        let poll_header = &mut buf.as_bytes_mut()[poll_header_at..];
        write_header(poll_header, self.partition, self.end, served);
        PollReply {
            status: Status::Ok,
            frame: Some(Frame::build_in(&self.reply, buf)),
            last: next.filter(|_| served > 0).map(|n| n - 1),
            commit: self.commit,
            invalid,
            panicked: false,
            error: None,
        }
    }

    /// The reply to a poll with nothing to serve.
    pub fn empty_reply(partition: u32, end: u64) -> Vec<u8> {
        let mut body = vec![0; PollHeader::SIZE];
        write_header(&mut body, partition, end, 0);
        body
    }
}

/// Writes the reply's header over the first `PollHeader::SIZE` bytes of `body`.
fn write_header(body: &mut [u8], partition: u32, end: u64, served: u32) {
    let mut header = Writer::default();
    PollHeader {
        partition_id: partition,
        current_offset: end.saturating_sub(1),
        messages_count: served,
    }
    .write(&mut header);
    body[..PollHeader::SIZE].copy_from_slice(&header.finish());
}

/// A poll read waiting for a slot, with the request it answers.
pub(super) struct QueuedPoll {
    pub connection: ClientId,
    pub request: Box<RequestHeader>,
    pub read: PollRead,
}

/// Hands a finished read's reply to the node loop (as its event).
pub(super) type Deliver = Rc<dyn Fn(ClientId, Box<RequestHeader>, Box<PollReply>)>;

/// The poll reads of a node: how many run, and those waiting.
pub(super) struct PollReads {
    /// Reads at once (`poll_readers`).
    pub readers_max: usize,
    pub running: usize,
    pub queued: VecDeque<QueuedPoll>,
    /// The reader threads, started with the first poll.
    pub readers: Option<flume::Sender<QueuedPoll>>,
}

impl Default for PollReads {
    fn default() -> PollReads {
        PollReads {
            readers_max: poll_readers(),
            running: 0,
            queued: VecDeque::new(),
            readers: None,
        }
    }
}

/// Nice value of the reader threads: when the cores are busy, the node loop (nice 0)
/// and the journal's IO run first, and reads take what is left.
const READER_NICE: libc::c_int = 10;

/// Starts `count` reader threads and the task that hands their replies to the node
/// loop (`deliver`). None when no thread could start (the reads then use the blocking
/// pool).
pub(super) fn start_readers(count: usize, deliver: Deliver) -> Option<flume::Sender<QueuedPoll>> {
    let (jobs, inbox) = flume::unbounded::<QueuedPoll>();
    let (outbox, replies) = flume::unbounded::<(ClientId, Box<RequestHeader>, PollReply)>();
    let mut started = 0;
    for i in 0..count {
        let (inbox, outbox) = (inbox.clone(), outbox.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("poll-read-{i}"))
            .spawn(move || {
                unpin_and_renice(READER_NICE);
                while let Ok(job) = inbox.recv() {
                    let read = job.read;
                    let reply = caught(move || read.run());
                    if outbox.send((job.connection, job.request, reply)).is_err() {
                        break;
                    }
                }
            });
        match spawned {
            Ok(_) => started += 1,
            Err(error) => tracing::error!(%error, "cannot start a poll reader thread"),
        }
    }
    if started == 0 {
        return None;
    }
    glommio::spawn_local(async move {
        while let Ok((connection, request, reply)) = replies.recv_async().await {
            deliver(connection, request, Box::new(reply));
        }
    })
    .detach();
    Some(jobs)
}

/// Runs a poll read; a panic in it (a bug: every bound is checked when the read is
/// planned) answers that poll Unavailable, counted `poll_read_panicked`, and the
/// reader thread and its slot live on.
pub(super) fn caught(read: impl FnOnce() -> PollReply) -> PollReply {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)).unwrap_or_else(|_| PollReply {
        panicked: true,
        ..PollReply::unavailable("the poll read panicked".to_owned())
    })
}

/// Lets the calling thread run on any CPU the process may use (a thread inherits its
/// creator's affinity: the replica executor's one CPU under `runtime.pin_cpus`) and
/// lowers its priority to `nice` (on Linux a nice value is per thread).
pub(super) fn unpin_and_renice(nice: libc::c_int) {
    // SAFETY: a zeroed cpu_set_t is valid and CPU_SET writes only inside it;
    // sched_setaffinity reads it (the kernel keeps the CPUs the process's cpuset
    // allows); setpriority takes no pointers.
    unsafe {
        let mut every: libc::cpu_set_t = std::mem::zeroed();
        for cpu in 0..libc::CPU_SETSIZE as usize {
            libc::CPU_SET(cpu, &mut every);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &every);
        libc::setpriority(libc::PRIO_PROCESS, 0, nice);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::reply::split_poll_body;
    use journal::segment::{PartitionConfig, PartitionLog, ReadFrom};
    use journal::Durability;
    use replication::wire::batch::{stamp, BatchBuilder, NewMessage};
    use replication::wire::Header;

    const PARTITION_ID: u64 = 7;

    /// Batch `i`: 10 messages at offset 10i, stamped at 1000 + 100i.
    fn batch_at(i: u64) -> Vec<u8> {
        let mut builder = BatchBuilder::with_capacity(10 * 500);
        for m in 0..10u32 {
            builder.push(NewMessage {
                id: u128::from(10 * i + u64::from(m)),
                timestamp_delta: m,
                payload: &[m as u8; 400],
                user_headers: &[],
            });
        }
        let mut bytes = builder.finish(1_000);
        stamp(&mut bytes, PARTITION_ID, 10 * i, 1_000 + 100 * i).unwrap();
        bytes
    }

    /// A log of 40 batches (offsets 0..400) in segments of 64 KiB.
    fn log_of_40(dir: &std::path::Path) -> PartitionLog {
        journal::runtime::raise_memlock(64 << 20);
        journal::runtime::block_on(async {
            let config = PartitionConfig {
                segment_size_max: 64 << 10,
                index_interval_bytes: 4096,
                durability: Durability::None,
            };
            let (mut log, _) = PartitionLog::open(dir, PARTITION_ID, config).await.unwrap();
            for i in 0..40 {
                log.append(&batch_at(i)).await.unwrap();
            }
            log
        })
        .expect("executor")
    }

    fn read(
        log: &PartitionLog,
        from: ReadFrom,
        serve_from: Option<u64>,
        end: u64,
        count: u32,
    ) -> PollReply {
        PollRead {
            reply: ReplyHeader::new(),
            plan: log.read_plan(from, end, 4 << 20).unwrap(),
            from: serve_from,
            first: 0,
            end,
            count,
            partition: 3,
            commit: None,
        }
        .run()
    }

    /// (offset of the first message, messages) of each served batch, and the header's
    /// current offset and count.
    fn served(reply: &PollReply) -> (Vec<(u64, u32)>, u64, u32) {
        let frame = reply.frame.as_ref().unwrap();
        let body = &frame.as_bytes()[replication::wire::HEADER_SIZE..];
        let header = PollHeader::decode(body).unwrap();
        let batches = split_poll_body(body)
            .unwrap()
            .iter()
            .map(|(_, info)| (info.base_offset, info.message_count))
            .collect();
        (batches, header.current_offset, header.messages_count)
    }

    #[test]
    fn a_poll_read_serves_the_range_asked_up_to_the_commit_point() {
        let dir = tempfile::tempdir().unwrap();
        let log = log_of_40(dir.path());
        assert!(log.segments().len() > 2);
        // From the middle of batch 3, 25 messages: the rest of batch 3, batch 4, and
        // the start of batch 5, cut to the messages asked.
        let reply = read(&log, ReadFrom::Offset(35), Some(35), 400, 25);
        assert_eq!(reply.status, Status::Ok);
        assert_eq!(served(&reply), (vec![(35, 5), (40, 10), (50, 10)], 399, 25));
        assert_eq!(reply.last, Some(59));
        // Nothing at or past the commit point, even when more was asked.
        let reply = read(&log, ReadFrom::Offset(180), Some(180), 205, 1000);
        assert_eq!(
            served(&reply),
            (vec![(180, 10), (190, 10), (200, 5)], 204, 25)
        );
        // By timestamp: 1,250 is first reached by batch 3 (1,300); all of it is served.
        let reply = read(&log, ReadFrom::Timestamp(1_250), None, 400, 12);
        assert_eq!(served(&reply), (vec![(30, 10), (40, 2)], 399, 12));
        // Beyond every batch's stamp: nothing.
        let reply = read(&log, ReadFrom::Timestamp(99_999), None, 400, 12);
        assert_eq!(served(&reply), (vec![], 399, 0));
        assert_eq!(reply.last, None);
    }

    #[test]
    fn a_damaged_batch_ends_the_reply_and_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let log = log_of_40(dir.path());
        // Damage a payload byte of batch 2 (offsets 20..30) in its segment file.
        let (_, path, _) = &log.segments()[0];
        let mut bytes = std::fs::read(path).unwrap();
        let at = batch_at(0).len() + batch_at(1).len() + 1_000;
        bytes[at] ^= 0xff;
        std::fs::write(path, &bytes).unwrap();
        // Batches before it are served; the reply says the rest was damaged.
        let reply = read(&log, ReadFrom::Offset(0), Some(0), 400, 1000);
        assert_eq!(reply.status, Status::Ok);
        assert!(reply.invalid);
        assert_eq!(served(&reply).0, vec![(0, 10), (10, 10)]);
        // A poll starting at the damage is Unavailable, with the reason for the log.
        let reply = read(&log, ReadFrom::Offset(20), Some(20), 400, 1000);
        assert_eq!(reply.status, Status::Unavailable);
        assert!(reply.invalid && reply.error.is_some());
    }

    #[test]
    fn a_read_that_panics_is_answered_unavailable_and_the_reader_goes_on() {
        let reply = caught(|| panic!("a bug in a poll read"));
        assert_eq!(reply.status, Status::Unavailable);
        assert!(reply.panicked && reply.frame.is_none() && reply.error.is_some());
        // The same thread reads on.
        let dir = tempfile::tempdir().unwrap();
        let log = log_of_40(dir.path());
        let reply = caught(|| read(&log, ReadFrom::Offset(0), Some(0), 400, 10));
        assert!(!reply.panicked);
        assert_eq!(served(&reply).0, vec![(0, 10)]);
    }
}
