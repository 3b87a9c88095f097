//! Crash-test writer: appends prepares to a journal (and bumps the superblock) forever,
//! printing a line for each write only after it is durable. A driver SIGKILLs it at
//! random points and checks that every acknowledged write survived
//! (journal/tests/crash.rs).
//!
//! Usage: `journal-crash-writer format DIR` | `journal-crash-writer run DIR GENERATION`
//! | `journal-crash-writer segments DIR GENERATION` | `journal-crash-writer planned DIR GENERATION`
//!
//! Journal output lines: `recovered HEAD CHECKPOINT FAULTY_COUNT`, `ack OP CHECKSUM_HEX`,
//! `view VIEW`, `checkpoint OP`. Segment output lines: `recovered NEXT_OFFSET START`,
//! `ack BASE_OFFSET NEXT_OFFSET BATCH_CHECKSUM_HEX`, `retained START_OFFSET`.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use journal::data_dir;
use journal::segment::{PartitionConfig, PartitionLog};
use journal::{JournalLayout, Superblock};
use replication::wire::{Header, PrepareChain, PrepareHeader, METADATA_GROUP};

/// Slots in the crash-test journal: small, so runs wrap and checkpoint often.
const SLOT_COUNT: u64 = 32;
/// Largest body the writer produces.
const BODY_SIZE_MAX: u64 = 12 * 1024;
/// Appends between superblock view bumps.
const VIEW_EVERY_OPS: u64 = 5;

/// Deterministic body for `op` in `generation`.
fn body(op: u64, generation: u64) -> Vec<u8> {
    let mut state = op.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ generation.rotate_left(17) | 1;
    let len = (state % BODY_SIZE_MAX) as usize;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn prepare(op: u64, generation: u64) -> Vec<u8> {
    let mut header = PrepareHeader::new();
    header.op = op;
    header.group = METADATA_GROUP;
    header.operation = 128;
    header.client = u128::from(generation);
    header.request = op;
    PrepareChain::after(0)
        .append(&mut header, &body(op, generation))
        .as_bytes()
        .to_vec()
}

/// The metadata state snapshotted at `op` (the driver rebuilds it to check snapshots).
fn state_of(op: u64) -> Vec<u8> {
    format!("metadata state at op {op};")
        .repeat(100)
        .into_bytes()
}

async fn format(dir: &Path) -> journal::Result<()> {
    let layout = JournalLayout::for_body_size(SLOT_COUNT, BODY_SIZE_MAX)?;
    data_dir::format(dir, layout, Superblock::default()).await
}

async fn run(dir: &Path, generation: u64) -> journal::Result<()> {
    let mut data = data_dir::open(dir).await?;
    let recovery = &data.recovery;
    say(format!(
        "recovered {} {} {}",
        recovery.op_head,
        recovery.op_checkpoint,
        recovery.faulty.len()
    ));
    loop {
        let op = data.journal.op_head() + 1;
        if op > data.journal.op_append_max() {
            // Checkpoint half the ring (snapshot, superblock, journal) so appends wrap.
            let checkpoint = data.journal.op_head() - SLOT_COUNT / 2;
            data.checkpoint(checkpoint, &state_of(checkpoint)).await?;
            say(format!("checkpoint {checkpoint}"));
        }
        let journal = &mut data.journal;
        let superblock = &mut data.superblock;
        // Mostly single appends, sometimes a group commit of up to 4 ops.
        let group = (1 + (op * 31 + generation) % 4).min(journal.op_append_max() + 1 - op);
        let frames: Vec<Vec<u8>> = (op..op + group).map(|o| prepare(o, generation)).collect();
        let frames: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        for durable in journal.append_batch(&frames).await? {
            say(format!("ack {} {:x}", durable.op, durable.checksum));
        }
        let op = op + group - 1;
        if op / VIEW_EVERY_OPS != (op - group) / VIEW_EVERY_OPS {
            let current = *superblock.current();
            let next = Superblock {
                view: current.view + 1,
                log_view: current.view + 1,
                commit: current.commit.max(op.saturating_sub(1)),
                ..current
            };
            superblock.write(next).await?;
            say(format!("view {}", next.view));
        }
    }
}

/// Partition id of the segment crash test.
const PARTITION: u64 = 77;
/// Small segments so runs roll often.
const SEGMENT_SIZE: u64 = 64 * 1024;
/// Segments kept before retention deletes the oldest.
const SEGMENTS_KEPT: usize = 6;

fn batch(base_offset: u64, generation: u64) -> Vec<u8> {
    use replication::wire::batch::{stamp, BatchBuilder, NewMessage};
    let count = 1 + ((base_offset * 7 + generation) % 9) as u32;
    let mut builder = BatchBuilder::with_capacity(8 * 1024);
    for i in 0..count {
        let offset = base_offset + u64::from(i);
        let payload = body(offset, generation);
        builder.push(NewMessage {
            id: u128::from(offset) << 64 | u128::from(generation),
            timestamp_delta: i,
            payload: &payload[..payload.len().min(2000)],
            user_headers: &[],
        });
    }
    let mut bytes = builder.finish(base_offset);
    // Timestamps follow offsets, so they never go backwards across restarts.
    let stamped = stamp(&mut bytes, PARTITION, base_offset, base_offset);
    assert!(stamped.is_ok(), "a freshly built batch stamps");
    bytes
}

/// Prints one output line at once (the driver reads them as they come; if it is gone,
/// so are we).
fn say(text: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

/// The checksum field of a stamped batch.
fn batch_checksum(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes[40..48].try_into().unwrap_or([0; 8]))
}

/// Opens the crash test's partition log and prints what it recovered.
async fn open_partition(dir: &Path) -> journal::Result<PartitionLog> {
    let config = PartitionConfig {
        segment_size_max: SEGMENT_SIZE,
        index_interval_bytes: 4096,
        durability: journal::Durability::EveryBatch,
    };
    let (log, _) = PartitionLog::open(dir, PARTITION, config).await?;
    say(format!(
        "recovered {} {}",
        log.next_offset(),
        log.start_offset()
    ));
    Ok(log)
}

/// Keeps the newest SEGMENTS_KEPT segments, printing the new start when it deletes.
fn retain(log: &mut PartitionLog) -> journal::Result<()> {
    let segments = log.segments();
    if segments.len() > SEGMENTS_KEPT {
        let keep_from = segments[segments.len() - SEGMENTS_KEPT].0;
        log.delete_segments_before(keep_from)?;
        say(format!("retained {}", log.start_offset()));
    }
    Ok(())
}

async fn run_segments(dir: &Path, generation: u64) -> journal::Result<()> {
    let mut log = open_partition(dir).await?;
    loop {
        let bytes = batch(log.next_offset(), generation);
        let receipt = log.append(&bytes).await?;
        assert!(receipt.durable, "every-batch durability syncs each append");
        ack(&[(
            receipt.base_offset,
            receipt.next_offset,
            batch_checksum(&bytes),
        )]);
        retain(&mut log)?;
    }
}

/// The daemon's path (its group commit): groups of 1 to 5 batches planned into one write
/// (`plan_many_verified`), each write started while the sync of the one before it still
/// runs, a batch acknowledged only once a sync that started after its write completed
/// has completed. Same output as `run_segments`.
async fn run_planned(dir: &Path, generation: u64) -> journal::Result<()> {
    use journal::segment::Plan;
    let mut log = open_partition(dir).await?;
    // Written, waiting for a sync; the sync in flight and what it covers.
    let mut written: Vec<Acked> = Vec::new();
    let mut syncing: Option<(journal::segment::Syncer, Vec<Acked>)> = None;
    let mut round = 0u64;
    loop {
        round += 1;
        let count = 1 + ((round * 13 + generation) % 5) as usize;
        let mut next = log.next_offset();
        let batches: Vec<Vec<u8>> = (0..count)
            .map(|_| {
                let bytes = batch(next, generation);
                next += u64::from(u32::from_le_bytes(
                    bytes[48..52].try_into().unwrap_or([0; 4]),
                ));
                bytes
            })
            .collect();
        let slices: Vec<&[u8]> = batches.iter().map(Vec::as_slice).collect();
        let planned = match log.plan_many_verified(&slices)? {
            Plan::Planned(planned) => planned,
            Plan::RollFirst => {
                // Nothing in flight across a roll: the sync completes (and acks) first.
                if let Some((sync, ops)) = syncing.take() {
                    sync.run().await?;
                    log.note_synced();
                    ack(&ops);
                }
                log.roll().await?;
                continue;
            }
        };
        assert!(
            planned.refused.is_none(),
            "freshly built batches follow the log"
        );
        let covered: Vec<Acked> = planned
            .receipts
            .iter()
            .zip(&batches)
            .map(|(receipt, bytes)| {
                (
                    receipt.base_offset,
                    receipt.next_offset,
                    batch_checksum(bytes),
                )
            })
            .collect();
        let write = planned.write.map(|w| w.run());
        // The write runs beside the sync of what was written before it.
        match (write, syncing.take()) {
            (Some(write), Some((sync, ops))) => {
                let (w, s) = futures_lite::future::zip(write, sync.run()).await;
                w?;
                s?;
                log.note_synced();
                ack(&ops);
            }
            (Some(write), None) => write.await?,
            (None, Some((sync, ops))) => {
                sync.run().await?;
                ack(&ops);
            }
            (None, None) => {}
        }
        written.extend(covered);
        // A sync started now covers every write completed so far.
        syncing = Some((log.syncer(), std::mem::take(&mut written)));
        // Sealed segments only (a roll waited for every sync): all acknowledged.
        retain(&mut log)?;
    }
}

/// A batch to acknowledge: base offset, next offset, batch checksum.
type Acked = (u64, u64, u64);

fn ack(ops: &[Acked]) {
    for (base, next, checksum) in ops {
        say(format!("ack {base} {next} {checksum:x}"));
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    journal::runtime::raise_memlock(64 << 20);
    let result = match args.get(1..).unwrap_or(&[]) {
        [cmd, dir] if cmd == "format" => journal::runtime::block_on(format(Path::new(dir))),
        [cmd, dir, generation] if cmd == "run" || cmd == "segments" || cmd == "planned" => {
            let Ok(generation) = generation.parse() else {
                eprintln!("journal-crash-writer: GENERATION must be an integer");
                return ExitCode::from(2);
            };
            if cmd == "run" {
                journal::runtime::block_on(run(Path::new(dir), generation))
            } else if cmd == "segments" {
                journal::runtime::block_on(run_segments(Path::new(dir), generation))
            } else {
                journal::runtime::block_on(run_planned(Path::new(dir), generation))
            }
        }
        _ => {
            eprintln!("usage: journal-crash-writer format DIR | run DIR GENERATION | segments DIR GENERATION | planned DIR GENERATION");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("journal-crash-writer: {e}");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("journal-crash-writer: executor: {e}");
            ExitCode::from(1)
        }
    }
}
