//! `consume`: reads a partition back by offset. Every batch is verified (message
//! checksums, tiling, batch_checksum) by the client; this checks that offsets run on
//! without a gap or a repeat and, with --verify, that every message is the one its id
//! says (cli::derive) and that no message index appears twice.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use appliance::protocol::reply::split_poll_body;
use appliance::protocol::{Consumer, PollStrategy};
use clap::Args;
use replication::wire::batch;
use replication::wire::PartitionKey;
use serde_json::json;

use super::{connect, derive, stream_id, topic, CliError, Global, Report};

/// Messages asked for per poll.
pub const POLL_BATCH_MAX: u32 = 10_000;
const _: () = assert!(POLL_BATCH_MAX <= appliance::protocol::request::POLL_COUNT_MAX);
/// Pause between polls that found nothing new.
const EMPTY_POLL_PAUSE: Duration = Duration::from_millis(50);

#[derive(Args, Debug)]
pub struct ConsumeArgs {
    /// Stream id or name.
    #[arg(long)]
    pub stream: String,
    /// Topic id or name.
    #[arg(long)]
    pub topic: String,
    #[arg(long)]
    pub partition: u32,
    /// First offset to read.
    #[arg(long, default_value_t = 0)]
    pub from: u64,
    /// Messages to read.
    #[arg(long)]
    pub count: u64,
    /// Check every message's id and payload against --seed (cli::derive).
    #[arg(long)]
    pub verify: bool,
    /// The seed the producer used.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// With --verify: the payload size every message must have.
    #[arg(long)]
    pub size: Option<usize>,
    /// How long to wait for messages not yet committed, milliseconds.
    #[arg(long, default_value_t = 5_000)]
    pub wait_ms: u64,
}

/// Where consumption stands, for the report.
struct Progress {
    from: u64,
    next: u64,
    started: Instant,
    verified: bool,
}

impl Progress {
    fn report(&self, error: Option<&str>) -> Report {
        let consumed = self.next - self.from;
        let last = (consumed > 0).then(|| self.next - 1);
        let elapsed_ms = self.started.elapsed().as_millis() as u64;
        let mut json = json!({
            "consumed": consumed,
            "first_offset": (consumed > 0).then_some(self.from),
            "last_offset": last,
            "verified": self.verified && error.is_none(),
            "elapsed_ms": elapsed_ms,
        });
        if let Some(error) = error {
            json["error"] = json!(error);
        }
        let text = match last {
            Some(last) => format!(
                "consumed {consumed} messages, offsets {}..={last}{} in {elapsed_ms} ms",
                self.from,
                if self.verified {
                    ", content verified"
                } else {
                    ""
                }
            ),
            None => format!("consumed 0 messages in {elapsed_ms} ms"),
        };
        Report { text, json }
    }
}

/// Checks one message against what its id says it must be.
fn verify_content(
    args: &ConsumeArgs,
    message: &batch::MessageRef<'_>,
    seen: &mut HashMap<u64, u64>,
) -> Result<(), String> {
    let (tag, index) = derive::split_id(message.id);
    let offset = message.offset;
    if tag != derive::tag(args.seed) {
        return Err(format!(
            "mismatch at offset {offset}: id {:#x} was not produced with seed {}",
            message.id, args.seed
        ));
    }
    if let Some(size) = args.size {
        if message.payload.len() != size {
            return Err(format!(
                "mismatch at offset {offset}: payload of message index {index} is {} bytes, expected {size}",
                message.payload.len()
            ));
        }
    }
    let expected = derive::payload(args.seed, index, message.payload.len());
    if let Some(at) = expected
        .iter()
        .zip(message.payload)
        .position(|(a, b)| a != b)
    {
        return Err(format!(
            "mismatch at offset {offset}: payload of message index {index} differs from its derivation at byte {at}"
        ));
    }
    if let Some(first) = seen.insert(index, offset) {
        return Err(format!(
            "duplicate: message index {index} at offsets {first} and {offset}"
        ));
    }
    Ok(())
}

pub fn run(global: &Global, args: &ConsumeArgs) -> Result<Report, CliError> {
    if args.count == 0 {
        return Err(CliError::Usage("--count must be at least 1".into()));
    }
    let end = args
        .from
        .checked_add(args.count)
        .ok_or_else(|| CliError::Usage("--from + --count overflows".into()))?;
    let mut client = connect(global)?;
    let stream = stream_id(&mut client, &args.stream)?;
    let (topic_id, _) = topic(&mut client, stream, &args.topic)?;
    let key = PartitionKey {
        stream,
        topic: topic_id,
        partition: args.partition,
    };
    let mut progress = Progress {
        from: args.from,
        next: args.from,
        started: Instant::now(),
        verified: args.verify,
    };
    let fail = |progress: &Progress, message: String| CliError::Runtime {
        report: Some(progress.report(Some(&message))),
        message,
    };
    let mut seen: HashMap<u64, u64> = HashMap::new();
    let mut last_progress = Instant::now();
    while progress.next < end {
        let want = (end - progress.next).min(u64::from(POLL_BATCH_MAX)) as u32;
        let body = client
            .poll_messages(
                key,
                Consumer::Single(0),
                PollStrategy::Offset(progress.next),
                want,
            )
            .map_err(|e| fail(&progress, format!("poll at offset {}: {e}", progress.next)))?;
        let batches = split_poll_body(&body)
            .map_err(|e| fail(&progress, format!("poll at offset {}: {e}", progress.next)))?;
        let before = progress.next;
        for (bytes, _) in &batches {
            for message in batch::messages(bytes) {
                if message.offset < progress.next {
                    // A poll serves from the offset asked for: anything going
                    // backwards is a repeat.
                    return Err(fail(
                        &progress,
                        format!(
                            "duplicate: offset {} served again after offset {}",
                            message.offset,
                            progress.next - 1
                        ),
                    ));
                }
                if message.offset >= end {
                    break;
                }
                if message.offset > progress.next {
                    return Err(fail(
                        &progress,
                        format!(
                            "gap: expected offset {}, the next message is at offset {}",
                            progress.next, message.offset
                        ),
                    ));
                }
                if args.verify {
                    verify_content(args, &message, &mut seen).map_err(|e| fail(&progress, e))?;
                }
                progress.next += 1;
            }
        }
        if progress.next == before {
            if last_progress.elapsed() >= Duration::from_millis(args.wait_ms) {
                return Err(fail(
                    &progress,
                    format!(
                        "only {} of {} messages available: nothing at offset {} after {} ms",
                        progress.next - args.from,
                        args.count,
                        progress.next,
                        args.wait_ms
                    ),
                ));
            }
            std::thread::sleep(EMPTY_POLL_PAUSE);
        } else {
            last_progress = Instant::now();
        }
    }
    Ok(progress.report(None))
}
