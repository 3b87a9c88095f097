use super::*;

const SEED: u64 = 9;
const SIZE: usize = 16;

fn stored(offset: u64, index: u64) -> Stored {
    let payload = derive::payload(SEED, index, SIZE);
    Stored {
        offset,
        id: derive::message_id(SEED, index),
        payload_hash: xxhash_rust::xxh3::xxh3_64(&payload),
        payload_ok: true,
    }
}

fn acked(partition: u32, seq: u64, count: u32, base: u64, t: u64) -> BatchRecord {
    BatchRecord {
        partition,
        first_index: index_of(partition, seq),
        count,
        outcome: Outcome::Acked,
        base_offset: Some(base),
        sent_ms: t,
        done_ms: t + 5,
        error: None,
    }
}

/// Partition 0 of every replica holds `indices` (seqs) at offsets 0, 1, 2 ...
fn replicas(nodes: usize, seqs: &[u64]) -> Vec<ReplicaLogs> {
    let log: Vec<Stored> = seqs
        .iter()
        .enumerate()
        .map(|(o, s)| stored(o as u64, index_of(0, *s)))
        .collect();
    (0..nodes)
        .map(|_| Ok(BTreeMap::from([(0u32, log.clone())])))
        .collect()
}

fn params() -> CheckParams {
    CheckParams {
        seed: SEED,
        partitions: 1,
        recovery_bound_ms: 1_000,
        failover_bound_ms: 0,
        slow_latency_bound_ms: 150,
    }
}

fn kinds(report: &Value) -> Vec<String> {
    report["violations_by_kind"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

#[test]
fn a_clean_history_passes() {
    let records = vec![acked(0, 0, 2, 0, 100), acked(0, 2, 2, 2, 200)];
    let report = analyze(params(), &records, &[], &replicas(3, &[0, 1, 2, 3]));
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["messages_acked"], 4);
}

#[test]
fn lost_duplicated_and_reordered_messages_are_violations() {
    let records = vec![acked(0, 0, 2, 0, 100), acked(0, 2, 2, 2, 200)];
    let lost = analyze(params(), &records, &[], &replicas(3, &[0, 1, 2]));
    assert_eq!(kinds(&lost), ["lost"], "{lost}");
    let dup = analyze(params(), &records, &[], &replicas(3, &[0, 1, 2, 3, 3]));
    assert_eq!(kinds(&dup), ["duplicate"], "{dup}");
    let reordered = analyze(params(), &records, &[], &replicas(3, &[0, 2, 1, 3]));
    assert!(
        kinds(&reordered).contains(&"reordered".to_string()),
        "{reordered}"
    );
}

#[test]
fn an_unknown_batch_may_be_stored_but_a_refused_one_may_not() {
    let mut unknown = acked(0, 2, 1, 2, 200);
    unknown.outcome = Outcome::Unknown;
    unknown.base_offset = None;
    let records = vec![acked(0, 0, 2, 0, 100), unknown.clone()];
    let stored_once = analyze(params(), &records, &[], &replicas(3, &[0, 1, 2]));
    assert_eq!(stored_once["ok"], true, "{stored_once}");
    assert_eq!(stored_once["messages_unacked_stored"], 1);
    unknown.outcome = Outcome::Refused;
    let refused = analyze(
        params(),
        &[records[0].clone(), unknown],
        &[],
        &replicas(3, &[0, 1, 2]),
    );
    assert_eq!(kinds(&refused), ["refused_but_present"], "{refused}");
}

#[test]
fn replicas_that_differ_or_lag_are_violations() {
    let records = vec![acked(0, 0, 3, 0, 100)];
    let mut reps = replicas(3, &[0, 1, 2]);
    if let Ok(logs) = &mut reps[1] {
        logs.get_mut(&0).expect("p0")[2].payload_hash ^= 1;
    }
    if let Ok(logs) = &mut reps[2] {
        logs.get_mut(&0).expect("p0").pop();
    }
    let report = analyze(params(), &records, &[], &reps);
    assert_eq!(
        kinds(&report),
        ["replica_behind", "replica_divergence"],
        "{report}"
    );
    reps[2] = Err("connection refused".into());
    let unreachable = analyze(params(), &records, &[], &reps);
    assert!(kinds(&unreachable).contains(&"replica_unreachable".to_string()));
}

#[test]
fn a_foreign_or_corrupt_message_is_a_violation() {
    let records = vec![acked(0, 0, 2, 0, 100)];
    let mut reps = replicas(1, &[0, 1]);
    if let Ok(logs) = &mut reps[0] {
        logs.get_mut(&0).expect("p0")[1].payload_ok = false;
        logs.get_mut(&0)
            .expect("p0")
            .push(stored(2, index_of(0, 77)));
    }
    let report = analyze(params(), &records, &[], &reps);
    assert_eq!(kinds(&report), ["corrupt", "foreign"], "{report}");
}

#[test]
fn writes_must_resume_within_the_bound_after_a_fault_that_leaves_a_quorum() {
    let kill = Event {
        t_ms: 1_000,
        kind: "kill".into(),
        node: Some(0),
        expect_writes: true,
    };
    let slow = vec![
        acked(0, 0, 1, 0, 500),
        acked(0, 1, 1, 1, 1_100),
        acked(0, 2, 1, 2, 9_000),
    ];
    let mut records = slow.clone();
    records[1].done_ms = 4_000;
    let late = analyze(
        params(),
        &records,
        std::slice::from_ref(&kill),
        &replicas(3, &[0, 1, 2]),
    );
    assert_eq!(kinds(&late), ["no_writes_after_fault"], "{late}");
    let fast = analyze(
        params(),
        &slow,
        std::slice::from_ref(&kill),
        &replicas(3, &[0, 1, 2]),
    );
    assert_eq!(fast["ok"], true, "{fast}");
    assert_eq!(fast["failover_ms"], json!([105]));
    let no_quorum = Event {
        expect_writes: false,
        ..kill.clone()
    };
    let report = analyze(params(), &records, &[no_quorum], &replicas(3, &[0, 1, 2]));
    assert_eq!(report["ok"], true, "{report}");
    // A failover bound tighter than the recovery bound: 105 ms passes 200, not 100.
    let kill = [kill];
    let bounded = |failover_bound_ms| CheckParams {
        failover_bound_ms,
        ..params()
    };
    let within = analyze(bounded(200), &slow, &kill, &replicas(3, &[0, 1, 2]));
    assert_eq!(within["ok"], true, "{within}");
    let over = analyze(bounded(100), &slow, &kill, &replicas(3, &[0, 1, 2]));
    assert_eq!(kinds(&over), ["failover_over_bound"], "{over}");
}

#[test]
fn a_fault_followed_by_the_loss_of_the_quorum_is_measured_from_the_restart() {
    // A backup wiped at 1 s (a quorum left), the primary killed 10 ms later (none
    // left), the primary back at 5 s: writes resume at 5.1 s.
    let event = |t_ms, kind: &str, expect_writes| Event {
        t_ms,
        kind: kind.into(),
        node: Some(1),
        expect_writes,
    };
    let events = [
        event(1_000, "wipe", true),
        event(1_010, "kill", false),
        event(5_000, "start", true),
    ];
    let mut records = vec![
        acked(0, 0, 1, 0, 500),
        acked(0, 1, 1, 1, 1_050),
        acked(0, 2, 1, 2, 5_050),
    ];
    records[1].done_ms = 5_100;
    let bounded = CheckParams {
        failover_bound_ms: 2_000,
        recovery_bound_ms: 1_000,
        ..params()
    };
    let report = analyze(bounded, &records, &events, &replicas(3, &[0, 1, 2]));
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["failover_ms"], json!([]), "{report}");
    assert_eq!(report["recovery_ms"], json!([55]), "{report}");
    assert_eq!(report["faults"][0]["superseded_by"]["kind"], "kill");
    // Writes that resumed before the quorum was lost still count as a failover.
    records[1].sent_ms = 1_002;
    records[1].done_ms = 1_005;
    let report = analyze(bounded, &records, &events, &replicas(3, &[0, 1, 2]));
    assert_eq!(report["failover_ms"], json!([5]), "{report}");
}

#[test]
fn acks_while_a_node_is_slowed_must_stay_within_the_latency_bound() {
    let event = |t_ms, kind: &str| Event {
        t_ms,
        kind: kind.into(),
        node: Some(1),
        expect_writes: true,
    };
    let events = [event(1_000, "slow_on"), event(3_000, "slow_off")];
    // Batches every 100 ms; in the window each takes 10 ms, or 300 ms (waiting for
    // the slowed node) when `stalled`.
    let run = |stalled: bool| -> Vec<BatchRecord> {
        (0..40u64)
            .map(|seq| {
                let t = seq * 100;
                let mut record = acked(0, seq, 1, seq, t);
                if stalled && (1_000..3_000).contains(&t) {
                    record.done_ms = t + 300;
                }
                record
            })
            .collect()
    };
    let seqs: Vec<u64> = (0..40).collect();
    let fine = analyze(params(), &run(false), &events, &replicas(1, &seqs));
    assert_eq!(fine["ok"], true, "{fine}");
    assert_eq!(fine["slow_windows"][0]["batches"], 20, "{fine}");
    assert_eq!(
        fine["failover_ms"],
        json!([]),
        "slow events are no failover: {fine}"
    );
    let stalled = analyze(params(), &run(true), &events, &replicas(1, &seqs));
    assert_eq!(kinds(&stalled), ["slow_node_latency"], "{stalled}");
    assert_eq!(stalled["slow_windows"][0]["p99_ms"], 300, "{stalled}");
}
