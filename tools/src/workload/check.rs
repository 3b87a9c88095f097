//! The checker: what the producer recorded (every batch it sent and whether it was
//! acknowledged), what the fault schedule did (events), and what every replica holds,
//! turned into a report and a list of violations. Pure: reading replicas and files is
//! done by the caller, so every rule is unit-tested on hand-made histories.
//!
//! Rules (each violation names the partition, offset or event it is about):
//! - `lost`: an acknowledged message is not at the offset its ack named on the longest
//!   replica log (found elsewhere: `moved`).
//! - `duplicate`: one message index appears twice (any partition).
//! - `reordered`: within a partition the indices of one producer do not increase with
//!   the offset (every partition has one sequential producer).
//! - `misplaced`: a message is in a partition other than the one it was sent to.
//! - `foreign`: a message nobody sent (bad tag, or an index never produced).
//! - `corrupt`: a payload that differs from its derivation.
//! - `refused_but_present`: a batch whose every attempt was refused unapplied is stored.
//! - `offset_gap`: a replica log whose offsets do not run 0, 1, 2 ...
//! - `replica_divergence`: two replicas hold different messages at one offset.
//! - `replica_behind`: a replica still shorter than the longest one after the settle
//!   time (with no state transfer yet, a node too far behind cannot catch up).
//! - `replica_unreachable`: a replica could not be read at all.
//! - `no_writes_after_fault`: after an event that leaves a quorum, no write sent after it
//!   was acknowledged within the recovery bound.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::cli::derive;

/// Bits of a message index below the partition number: index = partition << 48 | seq.
pub const SEQ_BITS: u32 = 48;

/// The index of the `seq`th message the producer of `partition` sends.
pub fn index_of(partition: u32, seq: u64) -> u64 {
    u64::from(partition) << SEQ_BITS | seq
}

/// The partition an index was produced for.
pub fn partition_of(index: u64) -> u32 {
    (index >> SEQ_BITS) as u32
}

/// How one batch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Acknowledged at `base_offset`.
    Acked,
    /// Failed after an attempt that may have reached the primary: may be stored, once.
    Unknown,
    /// Every attempt was refused unapplied or never delivered: must not be stored.
    Refused,
}

/// One batch the producer sent: a line of the acks file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchRecord {
    pub partition: u32,
    pub first_index: u64,
    pub count: u32,
    pub outcome: Outcome,
    /// Where the batch landed (acked only).
    #[serde(default)]
    pub base_offset: Option<u64>,
    /// Wall clock (ms since the epoch) when the send started and when it ended.
    pub sent_ms: u64,
    pub done_ms: u64,
    #[serde(default)]
    pub error: Option<String>,
}

/// One step of the fault schedule: a line of the events file, written by the script.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub t_ms: u64,
    /// kill, start, stop, link_down, link_up, netem_on, netem_off, wipe, kill_all, ...
    pub kind: String,
    /// The node it was done to (absent for cluster-wide events).
    #[serde(default)]
    pub node: Option<u32>,
    /// Whether a quorum is up and connected after it: writes must then resume within
    /// the recovery bound.
    pub expect_writes: bool,
}

/// One stored message as a replica served it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stored {
    pub offset: u64,
    pub id: u128,
    /// XxHash3-64 of the payload (replicas are compared by it).
    pub payload_hash: u64,
    /// The payload equals derive::payload(seed, index, size) for its id.
    pub payload_ok: bool,
}

/// What one replica served: its log per partition, or why it could not be read.
pub type ReplicaLogs = Result<BTreeMap<u32, Vec<Stored>>, String>;

/// Settings of one check.
#[derive(Clone, Copy, Debug)]
pub struct CheckParams {
    pub seed: u64,
    pub partitions: u32,
    /// Longest time a write may take to be acknowledged after an event that leaves a
    /// quorum (the failover or recovery time bound).
    pub recovery_bound_ms: u64,
    /// Tighter bound for a failover (a kill, stop or isolation): the cluster's
    /// heartbeat timeout + 500 ms. 0: only `recovery_bound_ms` applies.
    pub failover_bound_ms: u64,
    /// While a node is slowed (between `slow_on` and `slow_off` events), the 99th
    /// percentile of ack latency of the batches sent may not pass this.
    pub slow_latency_bound_ms: u64,
}

/// Events that slow a node down without taking it out: they bound ack latency, not the
/// time to the next write.
const SLOW_ON: &str = "slow_on";
const SLOW_OFF: &str = "slow_off";

/// Examples kept per violation kind (the count is always complete).
const EXAMPLES_MAX: usize = 5;

#[derive(Default)]
struct Violations {
    counts: BTreeMap<&'static str, u64>,
    examples: Vec<Value>,
    shown: HashMap<&'static str, usize>,
}

impl Violations {
    fn add(&mut self, kind: &'static str, detail: Value) {
        *self.counts.entry(kind).or_default() += 1;
        let shown = self.shown.entry(kind).or_default();
        if *shown < EXAMPLES_MAX {
            *shown += 1;
            let mut detail = detail;
            detail["kind"] = json!(kind);
            self.examples.push(detail);
        }
    }

    fn total(&self) -> u64 {
        self.counts.values().sum()
    }
}

/// The longest log of each partition over the replicas that could be read: the
/// reference the others are compared with.
fn reference_logs(replicas: &[ReplicaLogs], partitions: u32) -> BTreeMap<u32, Vec<Stored>> {
    let mut out = BTreeMap::new();
    for p in 0..partitions {
        let longest = replicas
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .filter_map(|logs| logs.get(&p))
            .max_by_key(|log| log.len())
            .cloned()
            .unwrap_or_default();
        out.insert(p, longest);
    }
    out
}

fn check_replicas(
    replicas: &[ReplicaLogs],
    reference: &BTreeMap<u32, Vec<Stored>>,
    v: &mut Violations,
) {
    for (node, replica) in replicas.iter().enumerate() {
        let logs = match replica {
            Ok(logs) => logs,
            Err(error) => {
                v.add("replica_unreachable", json!({"node": node, "error": error}));
                continue;
            }
        };
        for (p, reference_log) in reference {
            let empty = Vec::new();
            let log = logs.get(p).unwrap_or(&empty);
            for (position, stored) in log.iter().enumerate() {
                if stored.offset != position as u64 {
                    v.add(
                        "offset_gap",
                        json!({"node": node, "partition": p, "expected_offset": position, "offset": stored.offset}),
                    );
                    break;
                }
            }
            if let Some(at) = log
                .iter()
                .zip(reference_log)
                .position(|(a, b)| (a.id, a.payload_hash) != (b.id, b.payload_hash))
            {
                v.add(
                    "replica_divergence",
                    json!({"node": node, "partition": p, "offset": log[at].offset,
                           "id": log[at].id.to_string(), "reference_id": reference_log[at].id.to_string()}),
                );
            }
            if log.len() < reference_log.len() {
                v.add(
                    "replica_behind",
                    json!({"node": node, "partition": p, "messages": log.len(), "reference_messages": reference_log.len()}),
                );
            }
        }
    }
}

/// Runs every rule; returns the report (`"ok"` false when anything was violated).
pub fn analyze(
    params: CheckParams,
    records: &[BatchRecord],
    events: &[Event],
    replicas: &[ReplicaLogs],
) -> Value {
    let mut v = Violations::default();
    let reference = reference_logs(replicas, params.partitions);
    check_replicas(replicas, &reference, &mut v);
    // Every index that was sent, with the batch outcome.
    let mut sent: HashMap<u64, Outcome> = HashMap::new();
    for r in records {
        for i in 0..u64::from(r.count) {
            sent.insert(r.first_index + i, r.outcome);
        }
    }
    let stored = check_stored(&reference, &sent, derive::tag(params.seed), &mut v);
    let acks = check_acked(records, &stored.found, &mut v);
    let recovery = recovery_times(params, records, events, &mut v);
    let slow_windows = slow_window_latency(params, records, events, &mut v);
    let per_node: Vec<Value> = replicas
        .iter()
        .enumerate()
        .map(|(node, r)| match r {
            Ok(logs) => {
                json!({"node": node, "messages": logs.values().map(Vec::len).sum::<usize>(),
                               "partitions": logs.values().map(Vec::len).collect::<Vec<_>>()})
            }
            Err(e) => json!({"node": node, "error": e}),
        })
        .collect();
    let total = v.total();
    json!({
        "ok": total == 0,
        "messages_acked": acks.acked,
        "messages_unacked": acks.unacked,
        "messages_unacked_stored": acks.unacked_stored,
        "messages_stored": stored.total,
        "batches": records.len(),
        "replicas": per_node,
        "faults": recovery["events"].clone(),
        "failover_ms": recovery["failover_ms"].clone(),
        "recovery_ms": recovery["recovery_ms"].clone(),
        "max_write_gap_ms": recovery["max_write_gap_ms"].clone(),
        "failover_bound_ms": params.failover_bound_ms,
        "slow_windows": slow_windows,
        "producer": producer_summary(records),
        "violation_count": total,
        "violations_by_kind": v.counts,
        "violations": v.examples,
    })
}

/// What the reference logs hold: where each index is stored (partition, offset), and how
/// many messages they hold in all.
struct StoredIndexes {
    found: HashMap<u64, (u32, u64)>,
    total: u64,
}

/// Walks the reference logs: every stored message must be one this run sent (`tag`),
/// intact, on the partition it was sent to, once, in the order sent, and not from a
/// batch that was refused.
fn check_stored(
    reference: &BTreeMap<u32, Vec<Stored>>,
    sent: &HashMap<u64, Outcome>,
    tag: u64,
    v: &mut Violations,
) -> StoredIndexes {
    let mut found: HashMap<u64, (u32, u64)> = HashMap::new();
    let mut total = 0u64;
    for (p, log) in reference {
        let mut last_index: Option<u64> = None;
        for s in log {
            total += 1;
            let (id_tag, index) = derive::split_id(s.id);
            if id_tag != tag || !sent.contains_key(&index) {
                v.add(
                    "foreign",
                    json!({"partition": p, "offset": s.offset, "id": s.id.to_string()}),
                );
                continue;
            }
            if !s.payload_ok {
                v.add(
                    "corrupt",
                    json!({"partition": p, "offset": s.offset, "index": index}),
                );
            }
            if partition_of(index) != *p {
                v.add(
                    "misplaced",
                    json!({"partition": p, "offset": s.offset, "index": index, "sent_to": partition_of(index)}),
                );
            }
            if let Some((fp, fo)) = found.get(&index).copied() {
                v.add(
                    "duplicate",
                    json!({"index": index, "first": {"partition": fp, "offset": fo}, "again": {"partition": p, "offset": s.offset}}),
                );
            } else {
                found.insert(index, (*p, s.offset));
                if let Some(last) = last_index.filter(|l| index <= *l && partition_of(index) == *p)
                {
                    v.add(
                        "reordered",
                        json!({"partition": p, "offset": s.offset, "index": index, "after_index": last}),
                    );
                }
            }
            if partition_of(index) == *p {
                last_index = Some(last_index.map_or(index, |l| l.max(index)));
            }
            if sent.get(&index) == Some(&Outcome::Refused) {
                v.add(
                    "refused_but_present",
                    json!({"partition": p, "offset": s.offset, "index": index}),
                );
            }
        }
    }
    StoredIndexes { found, total }
}

/// Messages by outcome: acknowledged, not acknowledged, and not acknowledged yet stored.
struct Acks {
    acked: u64,
    unacked: u64,
    unacked_stored: u64,
}

/// Every acknowledged message must be stored at the partition and offset its ack gave.
fn check_acked(
    records: &[BatchRecord],
    found: &HashMap<u64, (u32, u64)>,
    v: &mut Violations,
) -> Acks {
    let mut acks = Acks {
        acked: 0,
        unacked: 0,
        unacked_stored: 0,
    };
    for r in records {
        for i in 0..u64::from(r.count) {
            let index = r.first_index + i;
            match (r.outcome, r.base_offset) {
                (Outcome::Acked, Some(base)) => {
                    acks.acked += 1;
                    let want = (r.partition, base + i);
                    match found.get(&index) {
                        Some(at) if *at == want => {}
                        Some(at) => v.add(
                            "moved",
                            json!({"index": index, "acked_partition": want.0, "acked_offset": want.1, "stored_partition": at.0, "stored_offset": at.1}),
                        ),
                        None => v.add(
                            "lost",
                            json!({"index": index, "partition": want.0, "offset": want.1, "acked_ms": r.done_ms}),
                        ),
                    }
                }
                (Outcome::Acked, None) => {
                    acks.acked += 1;
                    v.add(
                        "lost",
                        json!({"index": index, "partition": r.partition, "offset": null}),
                    );
                }
                _ => {
                    acks.unacked += 1;
                    acks.unacked_stored += u64::from(found.contains_key(&index));
                }
            }
        }
    }
    acks
}

/// Batches acknowledged and failed per partition, and why batches failed, most frequent
/// first: the first thing to read when writes stall.
fn producer_summary(records: &[BatchRecord]) -> Value {
    let mut errors: HashMap<String, u64> = HashMap::new();
    let mut batches_by_partition: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for r in records {
        let entry = batches_by_partition.entry(r.partition).or_default();
        if r.outcome == Outcome::Acked {
            entry.0 += 1;
        } else {
            entry.1 += 1;
        }
        if let Some(e) = &r.error {
            *errors.entry(e.chars().take(160).collect()).or_default() += 1;
        }
    }
    let mut errors: Vec<(String, u64)> = errors.into_iter().collect();
    errors.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    errors.truncate(EXAMPLES_MAX);
    json!({
        "batches_acked_failed": batches_by_partition.iter().map(|(p, (a, f))| (p.to_string(), json!([a, f]))).collect::<serde_json::Map<_, _>>(),
        "errors": errors.iter().map(|(e, n)| json!({"error": e, "count": n})).collect::<Vec<_>>(),
    })
}

/// For each slow window (a `slow_on` event up to the next `slow_off`): the ack latency of
/// the batches sent in it (p50, p99, max, count); a p99 over the bound is a violation.
fn slow_window_latency(
    params: CheckParams,
    records: &[BatchRecord],
    events: &[Event],
    v: &mut Violations,
) -> Value {
    let mut windows = Vec::new();
    let mut on: Option<&Event> = None;
    for event in events {
        match event.kind.as_str() {
            SLOW_ON => on = Some(event),
            SLOW_OFF => {
                if let Some(start) = on.take() {
                    windows.push((start, event.t_ms));
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for (start, end) in windows {
        let mut latencies: Vec<u64> = records
            .iter()
            .filter(|r| r.outcome == Outcome::Acked && r.sent_ms >= start.t_ms && r.sent_ms < end)
            .map(|r| r.done_ms.saturating_sub(r.sent_ms))
            .collect();
        latencies.sort_unstable();
        let at = |q: f64| -> Option<u64> {
            let last = latencies.len().checked_sub(1)?;
            latencies.get((last as f64 * q).round() as usize).copied()
        };
        let (p50, p99, max) = (at(0.5), at(0.99), latencies.last().copied());
        if let Some(p99) = p99.filter(|p99| *p99 > params.slow_latency_bound_ms) {
            v.add(
                "slow_node_latency",
                json!({"node": start.node, "t_ms": start.t_ms, "p99_ms": p99,
                       "bound_ms": params.slow_latency_bound_ms}),
            );
        }
        out.push(
            json!({"node": start.node, "t_ms": start.t_ms, "batches": latencies.len(),
                        "p50_ms": p50, "p99_ms": p99, "max_ms": max,
                        "bound_ms": params.slow_latency_bound_ms}),
        );
    }
    json!(out)
}

/// For each event: how long until a write sent after it was acknowledged, per
/// partition (the slowest partition counts). Kill, stop and isolation events that
/// leave a quorum give failover times; start and heal events give recovery times.
fn recovery_times(
    params: CheckParams,
    records: &[BatchRecord],
    events: &[Event],
    v: &mut Violations,
) -> Value {
    let last_sent = records.iter().map(|r| r.sent_ms).max().unwrap_or(0);
    let mut by_partition: BTreeMap<u32, Vec<&BatchRecord>> = BTreeMap::new();
    for r in records {
        by_partition.entry(r.partition).or_default().push(r);
    }
    let mut out_events = Vec::new();
    let mut failover = Vec::new();
    let mut recovery = Vec::new();
    for (i, event) in events.iter().enumerate() {
        // A later event that left no quorum, before writes resumed, takes this one over:
        // the wait then includes an outage the scenario made on purpose, and the events
        // after it (the restarts) measure the recovery.
        let quorum_lost = events[i + 1..]
            .iter()
            .find(|e| !e.expect_writes && e.t_ms >= event.t_ms);
        let mut slowest: Option<u64> = Some(0);
        let mut measured = true;
        for p in 0..params.partitions {
            let first_ack = by_partition
                .get(&p)
                .into_iter()
                .flatten()
                .filter(|r| r.outcome == Outcome::Acked && r.sent_ms >= event.t_ms)
                .map(|r| r.done_ms.saturating_sub(event.t_ms))
                .min();
            match first_ack {
                Some(ms) => slowest = slowest.map(|s| s.max(ms)),
                None => {
                    slowest = None;
                    // Nothing sent long enough after it to tell.
                    measured = last_sent.saturating_sub(event.t_ms) >= params.recovery_bound_ms;
                }
            }
        }
        let mut entry = json!({"t_ms": event.t_ms, "kind": event.kind, "node": event.node,
                               "expect_writes": event.expect_writes, "writes_resumed_ms": slowest});
        let superseded = quorum_lost.filter(|lost| {
            slowest.is_none_or(|ms| event.t_ms + ms > lost.t_ms) && event.expect_writes
        });
        if let Some(lost) = superseded {
            entry["superseded_by"] = json!({"kind": lost.kind, "t_ms": lost.t_ms});
        } else if event.expect_writes {
            match slowest {
                Some(ms) if ms <= params.recovery_bound_ms => {}
                None if !measured => entry["unmeasured"] = json!(true),
                _ => v.add(
                    "no_writes_after_fault",
                    json!({"event": event.kind, "node": event.node, "t_ms": event.t_ms,
                           "writes_resumed_ms": slowest, "bound_ms": params.recovery_bound_ms}),
                ),
            }
            let slowing = matches!(event.kind.as_str(), SLOW_ON | SLOW_OFF);
            if let (Some(ms), false) = (slowest, slowing) {
                let heal = matches!(
                    event.kind.as_str(),
                    "start" | "start_all" | "link_up" | "netem_off" | "restart"
                );
                if heal {
                    recovery.push(ms)
                } else {
                    if params.failover_bound_ms > 0 && ms > params.failover_bound_ms {
                        v.add(
                            "failover_over_bound",
                            json!({"event": event.kind, "node": event.node, "t_ms": event.t_ms,
                                   "writes_resumed_ms": ms, "bound_ms": params.failover_bound_ms}),
                        );
                    }
                    failover.push(ms)
                }
            }
        }
        out_events.push(entry);
    }
    let mut gaps = BTreeMap::new();
    for (p, rs) in &by_partition {
        let mut done: Vec<u64> = rs
            .iter()
            .filter(|r| r.outcome == Outcome::Acked)
            .map(|r| r.done_ms)
            .collect();
        done.sort_unstable();
        let gap = done.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        gaps.insert(p.to_string(), gap);
    }
    json!({"events": out_events, "failover_ms": failover, "recovery_ms": recovery, "max_write_gap_ms": gaps})
}

#[cfg(test)]
mod tests;
