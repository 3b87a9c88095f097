//! The `vsr` core driven by hand-built frames: merges, refusals and hand-offs that are
//! easier to pin down without the simulator.

use replication::vsr::{
    Action, Applied, Config, JournalEntry, Replica, RequestOutcome, Status, Superblock,
};
use replication::wire::batch::{self, BatchBuilder, NewMessage};
use replication::wire::{
    cluster_id, decode, Command, DoViewChangeHeader, Frame, FrameBuf, Header, Limits, Message,
    Operation, PrepareChain, PrepareHeader, RequestHeader, StartViewChangeHeader, METADATA_GROUP,
};
use zerocopy::IntoBytes;

fn cluster() -> u128 {
    cluster_id("units")
}

fn metadata_prepares(count: u64) -> Vec<Frame> {
    let mut chain = PrepareChain::after(0);
    (1..=count)
        .map(|op| {
            let mut h = PrepareHeader::new();
            h.frame.cluster = cluster();
            h.frame.replica = 0;
            h.client = 0x42;
            h.op = op;
            h.timestamp = op;
            h.request = op;
            h.operation = Operation::CreateStream as u8;
            h.group = METADATA_GROUP;
            chain.append(&mut h, format!("op{op}").as_bytes())
        })
        .collect()
}

fn header_of(frame: &Frame) -> PrepareHeader {
    match decode(frame.as_bytes(), &Limits::default()) {
        Ok(Message::Prepare(h, _)) => *h,
        other => panic!("not a prepare: {other:?}"),
    }
}

fn do_view_change(from: u8, prepares: &[Frame], nack: u128, present: u128) -> Frame {
    do_view_change_at(from, prepares, nack, present, 0)
}

/// A StartViewChange of `view` from `from` (metadata group).
fn start_view_change(from: u8, view: u32) -> Frame {
    let mut svc = StartViewChangeHeader::new();
    svc.frame.cluster = cluster();
    svc.frame.view = view;
    svc.frame.replica = from;
    svc.group = METADATA_GROUP;
    Frame::build(&svc, &[])
}

/// As `do_view_change`, from a sender whose commit point is `commit`.
fn do_view_change_at(
    from: u8,
    prepares: &[Frame],
    nack: u128,
    present: u128,
    commit: u64,
) -> Frame {
    let mut h = DoViewChangeHeader::new();
    h.commit = commit;
    h.frame.cluster = cluster();
    h.frame.view = 1;
    h.frame.replica = from;
    h.op = prepares.len() as u64;
    h.group = METADATA_GROUP;
    h.log_view = 0;
    h.nack_bitset = nack;
    h.present_bitset = present;
    let mut body = Vec::new();
    for prepare in prepares.iter().rev() {
        body.extend_from_slice(header_of(prepare).as_bytes());
    }
    Frame::build(&h, &body)
}

/// Drives a forming primary: journals complete at once, peers answer RequestPrepares
/// with the ops they hold. Returns the StartView broadcast, if one was sent, and the
/// (peer, from_op) of every repair request.
fn pump(
    replica: &mut Replica,
    prepares: &[Frame],
    holds: impl Fn(u8, u64) -> bool,
    ticks: u64,
) -> (Option<Frame>, Vec<(u8, u64)>) {
    let mut requests = Vec::new();
    for _ in 0..ticks {
        replica.on_tick();
        let mut inbound = Vec::new();
        let mut durable = Vec::new();
        for action in replica.drain_actions() {
            match action {
                Action::JournalAppend { op, frame } => durable.push((op, frame.checksum())),
                Action::Broadcast { frame } => {
                    if let Ok(Message::StartView(..)) = decode(frame.as_bytes(), &Limits::default())
                    {
                        return (Some(frame), requests);
                    }
                }
                Action::Send { to, frame } => {
                    if let Ok(Message::RequestPrepares(h)) =
                        decode(frame.as_bytes(), &Limits::default())
                    {
                        requests.push((to, h.from_op));
                        for op in h.from_op..=h.to_op {
                            if holds(to, op) {
                                inbound
                                    .push(Frame::repair_of(prepares[op as usize - 1].as_bytes()));
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        for (op, checksum) in durable {
            replica.on_journal_durable(op, checksum);
        }
        for frame in inbound {
            replica.on_message(frame.as_bytes());
        }
    }
    (None, requests)
}

#[test]
fn dvcs_from_the_same_log_view_with_different_present_bits_are_merged_by_repair() {
    let prepares = metadata_prepares(4);
    // Replica 1 is the primary of view 1; it holds nothing itself.
    let mut r1 = Replica::new(Config::new(cluster(), METADATA_GROUP, 1, 3));
    r1.on_message(start_view_change(2, 1).as_bytes());
    assert_eq!(r1.status(), Status::ViewChange);
    // r2 holds the bodies of ops 1 and 2 (suffix index 3 and 2), r0 those of 3 and 4.
    r1.on_message(do_view_change(2, &prepares, 0, 0b1100).as_bytes());
    let holds = |peer: u8, op: u64| match peer {
        2 => op <= 2,
        0 => op >= 3,
        _ => false,
    };
    // Fewer ticks than the view-change timeout, which would move on to view 2.
    let (start_view, _) = pump(&mut r1, &prepares, holds, 40);
    assert!(
        start_view.is_none(),
        "started a view before anyone offered ops 3 and 4"
    );
    r1.on_message(do_view_change(0, &prepares, 0, 0b0011).as_bytes());
    let (start_view, requests) = pump(&mut r1, &prepares, holds, 50);
    let start_view = start_view.expect("the view starts once every body is repaired");
    match decode(start_view.as_bytes(), &Limits::default()) {
        Ok(Message::StartView(h, suffix)) => {
            assert_eq!(h.op, 4);
            assert_eq!(suffix.len(), 4);
            assert_eq!(suffix[0].frame.checksum, prepares[3].checksum());
        }
        other => panic!("expected StartView, got {other:?}"),
    }
    assert_eq!(r1.status(), Status::Normal);
    assert_eq!(r1.op(), 4);
    for (peer, from_op) in requests {
        assert!(
            holds(peer, from_op),
            "asked r{peer} for op {from_op} it never offered"
        );
    }
}

/// A forming primary whose DVCs present no body asks every peer in turn, not only the
/// one the rotation happened to land on: in a cluster of 3 it used to ask one peer
/// forever (seeds 1122470 and 1162933, 20,000 ticks), here the one that holds nothing.
#[test]
fn a_forming_primary_asks_every_peer_for_bodies_no_dvc_presents() {
    let prepares = metadata_prepares(4);
    let mut r1 = Replica::new(Config::new(cluster(), METADATA_GROUP, 1, 3));
    r1.on_message(start_view_change(2, 1).as_bytes());
    // r2 committed past every op but presents no body; r0 presents none either, yet holds
    // them all (it knows no identity to vouch with).
    r1.on_message(do_view_change_at(2, &prepares, 0, 0, 4).as_bytes());
    r1.on_message(do_view_change(0, &prepares, 0, 0).as_bytes());
    let holds = |peer: u8, _op: u64| peer == 0;
    let (start_view, requests) = pump(&mut r1, &prepares, holds, 90);
    assert!(
        requests.iter().any(|(peer, _)| *peer == 0),
        "never asked r0: {requests:?}"
    );
    assert!(start_view.is_some(), "no view: asked {requests:?}");
}

/// A replica serves every prepare its journal holds durably, its identity known or not:
/// the requester takes it only by the identity its own chain gives the op.
/// A journal holding `prepares` (ops 1..) with the entry of op `unreadable` unreadable.
fn journal_unreadable_at(prepares: &[Frame], unreadable: u64) -> Vec<JournalEntry> {
    (1..)
        .zip(prepares)
        .map(|(op, frame)| JournalEntry {
            op,
            bytes: (op != unreadable).then(|| FrameBuf::from_bytes(frame.as_bytes())),
        })
        .collect()
}

#[test]
fn a_restarted_replica_serves_prepares_it_holds_below_an_unreadable_one() {
    let prepares = metadata_prepares(6);
    let config = Config::new(cluster(), METADATA_GROUP, 2, 3);
    // Op 5 unreadable, and the superblock of view 1 names only op 6 (the prepares are of
    // view 0): the hash chain from op 6 stops at op 5, so ops 1 to 4 have no known
    // identity here.
    let journal = journal_unreadable_at(&prepares, 5);
    let superblock = Superblock {
        view: 1,
        log_view: 1,
        headers: vec![header_of(&prepares[5])],
        ..Superblock::default()
    };
    let mut r2 = Replica::restart(config, &superblock, &journal);
    let _ = r2.drain_actions();
    let request = request_prepares(0, 1, 6);
    // Asked during a view change (a restarted replica answers once it takes part in one),
    // before any StartView taught it the identities below its unreadable entry.
    r2.on_message(start_view_change(0, 2).as_bytes());
    assert_eq!(r2.status(), Status::ViewChange);
    let _ = r2.drain_actions();
    r2.on_message(request.as_bytes());
    let served: Vec<u64> = r2
        .drain_actions()
        .into_iter()
        .filter_map(|action| match action {
            Action::Send { frame, .. } => match decode(frame.as_bytes(), &Limits::default()) {
                Ok(Message::RepairPrepare(h, _)) => Some(h.op),
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert_eq!(served, [1, 2, 3, 4, 6], "served {served:?}");
}

#[test]
fn an_op_nacked_by_a_quorum_is_truncated_not_repaired() {
    let prepares = metadata_prepares(4);
    let mut r1 = Replica::new(Config::new(cluster(), METADATA_GROUP, 1, 3));
    // r1 prepared ops 1..3 in view 0.
    for prepare in &prepares[..3] {
        r1.on_message(prepare.as_bytes());
    }
    let (_, _) = pump(&mut r1, &prepares, |_, _| false, 1);
    assert_eq!(r1.op(), 3);
    r1.on_message(start_view_change(2, 1).as_bytes());
    // r2 knows op 4's header but never prepared it (nack, not present); with r1 never
    // having reached op 4 that is a nack quorum: op 4 cannot have committed.
    r1.on_message(do_view_change(2, &prepares, 0b0001, 0b1110).as_bytes());
    let (start_view, _) = pump(&mut r1, &prepares, |_, _| true, 500);
    match decode(
        start_view.expect("view starts").as_bytes(),
        &Limits::default(),
    ) {
        Ok(Message::StartView(h, _)) => assert_eq!(h.op, 3, "op 4 was resurrected"),
        other => panic!("expected StartView, got {other:?}"),
    }
}

/// Seed 1000236: an op unreadable on every replica that may have acknowledged it (torn
/// or corrupted, a replica cannot tell) and unknown to the rest may have committed, and
/// nobody can serve it: the view change waits (the simulator no longer tears a second
/// copy). Once one of them holds no entry there, its nack truncates the op.
#[test]
fn an_op_unreadable_where_it_may_have_committed_holds_the_view_change() {
    let prepares = metadata_prepares(4);
    let dvc = |from: u8, op: u64| {
        let mut h = DoViewChangeHeader::new();
        h.commit = 4;
        h.frame.cluster = cluster();
        h.frame.view = 1;
        h.frame.replica = from;
        h.op = op;
        h.group = METADATA_GROUP;
        h.present_bitset = 0b1111;
        let mut body = Vec::new();
        for prepare in prepares.iter().rev() {
            body.extend_from_slice(header_of(prepare).as_bytes());
        }
        Frame::build(&h, &body)
    };
    for r0_op in [5, 4] {
        // r1, the primary of view 1, never had op 5; r2 has an unreadable entry there.
        let mut r1 = Replica::new(Config::new(cluster(), METADATA_GROUP, 1, 3));
        r1.on_message(start_view_change(2, 1).as_bytes());
        r1.on_message(dvc(2, 5).as_bytes());
        r1.on_message(dvc(0, r0_op).as_bytes());
        // Fewer ticks than the view-change timeout.
        let (start_view, _) = pump(&mut r1, &prepares, |_, _| true, 60);
        if r0_op == 5 {
            assert!(
                start_view.is_none(),
                "op 5 was truncated without a nack quorum"
            );
            continue;
        }
        match decode(
            start_view.expect("view starts").as_bytes(),
            &Limits::default(),
        ) {
            Ok(Message::StartView(h, _)) => assert_eq!(h.op, 4),
            other => panic!("expected StartView, got {other:?}"),
        }
    }
}

/// A replica with an unreadable entry inside its DVC window still votes: its DVC ends
/// below that op, leaving it and the ops above unclaimed (never nacked), and it keeps
/// repairing the op so that a later DVC covers more. (Withholding the DVC instead let a
/// view whose other voter also had an op it could not vouch for never form.)
#[test]
fn an_unreadable_entry_narrows_the_dvc_instead_of_withholding_it() {
    let prepares = metadata_prepares(8);
    let journal = journal_unreadable_at(&prepares, 6);
    let config = Config::new(cluster(), METADATA_GROUP, 0, 3);
    let mut r0 = Replica::restart(config, &Superblock::default(), &journal);
    let _ = r0.drain_actions();
    r0.on_message(start_view_change(1, 1).as_bytes());
    r0.on_message(start_view_change(2, 1).as_bytes());
    assert_eq!(r0.status(), Status::ViewChange);
    let mut dvc = None;
    let mut repairs = Vec::new();
    for _ in 0..200 {
        for action in r0.drain_actions() {
            let (Action::Broadcast { frame } | Action::Send { frame, .. }) = action else {
                continue;
            };
            match decode(frame.as_bytes(), &Limits::default()) {
                Ok(Message::DoViewChange(h, body)) => {
                    let ops: Vec<u64> = body.iter().map(|h| h.op).collect();
                    dvc = Some((h.op, h.nack_bitset, h.present_bitset, ops));
                }
                Ok(Message::RequestPrepares(h)) => repairs.push((h.from_op, h.to_op)),
                _ => {}
            }
        }
        r0.on_tick();
    }
    let (op, nack, present, ops) = dvc.expect("a DVC despite the unreadable op 6");
    assert_eq!(op, 8, "the DVC claims the whole log");
    assert_eq!(ops, [5, 4, 3, 2, 1], "the body ends below op 6");
    assert_eq!(nack, 0);
    assert_eq!(present, 0b11111);
    assert!(
        repairs.iter().any(|(from, to)| *from <= 6 && 6 <= *to),
        "op 6 is repaired during the view change: {repairs:?}"
    );
}

fn partition_group() -> u64 {
    replication::sim::partition_plane_group()
}

fn stamped_batch(group: u64, base_offset: u64) -> Vec<u8> {
    let mut builder = BatchBuilder::with_capacity(64);
    builder.push(NewMessage {
        id: 1,
        timestamp_delta: 0,
        payload: b"hello",
        user_headers: &[],
    });
    let mut batch = builder.finish(5);
    batch::stamp(&mut batch, group, base_offset, 10).expect("stamp");
    batch
}

fn partition_prepare(group: u64, op: u64, parent: u128, base_offset: u64) -> Frame {
    let mut h = PrepareHeader::new();
    h.frame.cluster = cluster();
    h.frame.replica = 0;
    h.client = 0x42;
    h.parent = parent;
    h.op = op;
    h.timestamp = 10;
    h.request = op;
    h.operation = Operation::SendMessages as u8;
    h.group = group;
    Frame::build(&h, &stamped_batch(group, base_offset))
}

fn prepare_op(frame: &Frame) -> u64 {
    use zerocopy::FromBytes;
    PrepareHeader::read_from_prefix(frame.as_bytes())
        .expect("a prepare header")
        .0
        .op
}

fn journaled(replica: &mut Replica) -> Vec<u64> {
    replica
        .drain_actions()
        .into_iter()
        .filter_map(|a| match a {
            Action::JournalAppend { op, .. } => Some(op),
            _ => None,
        })
        .collect()
}

#[test]
fn backup_refuses_a_partition_prepare_whose_stamp_it_cannot_rederive() {
    let group = partition_group();
    let mut backup = Replica::new(Config::new(cluster(), group, 1, 3));
    let first = partition_prepare(group, 1, 0, 0);
    backup.on_message(first.as_bytes());
    assert_eq!(journaled(&mut backup), vec![1]);
    // The batch says base_offset 5; this backup's partition is at offset 1.
    let wrong = partition_prepare(group, 2, first.checksum(), 5);
    backup.on_message(wrong.as_bytes());
    assert!(journaled(&mut backup).is_empty());
    assert_eq!(backup.counters().batch_stamp_mismatch, 1);
    let right = partition_prepare(group, 2, first.checksum(), 1);
    backup.on_message(right.as_bytes());
    assert_eq!(journaled(&mut backup), vec![2]);
}

#[test]
fn a_repair_prepare_extending_the_log_is_journaled_and_acked_but_not_forwarded() {
    let group = partition_group();
    let mut backup = Replica::new(Config::new(cluster(), group, 1, 3));
    backup.set_connected(0, true);
    backup.set_connected(2, true);
    let sends = |actions: &[Action]| -> Vec<(u8, Command)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Send { to, frame } => {
                    Some((*to, Command::from_u8(frame.header().command).unwrap()))
                }
                _ => None,
            })
            .collect()
    };
    // Delivers `prepare` as a RepairPrepare, checks nothing is forwarded, and returns
    // the actions it gave.
    let repaired = |backup: &mut Replica, prepare: &Frame| {
        backup.on_message(Frame::repair_of(prepare.as_bytes()).as_bytes());
        let actions = backup.drain_actions();
        assert!(
            sends(&actions).is_empty(),
            "forwarded: {:?}",
            sends(&actions)
        );
        actions
    };
    // A Prepare goes on down the chain.
    let first = partition_prepare(group, 1, 0, 0);
    backup.on_message(first.as_bytes());
    assert_eq!(sends(&backup.drain_actions()), vec![(2, Command::Prepare)]);
    // A primary that skips this backup as slow sends the next op as a repair: its stamp
    // is checked as a Prepare's would be.
    let wrong = partition_prepare(group, 2, first.checksum(), 5);
    backup.on_message(Frame::repair_of(wrong.as_bytes()).as_bytes());
    assert!(journaled(&mut backup).is_empty());
    assert_eq!(backup.counters().batch_stamp_mismatch, 1);
    let right = partition_prepare(group, 2, first.checksum(), 1);
    let actions = repaired(&mut backup, &right);
    assert!(matches!(actions[..], [Action::JournalAppend { op: 2, .. }]));
    // Durable: acknowledged to the primary as a Prepare is.
    backup.on_journal_durable(2, right.checksum());
    assert_eq!(
        sends(&backup.drain_actions()),
        vec![(0, Command::PrepareOk)]
    );
    // One lost on the way: the next is canonical above the gap (this view's primary
    // stamped it), and the missing one is then known by the hash chain.
    let third = partition_prepare(group, 3, right.checksum(), 2);
    let fourth = partition_prepare(group, 4, third.checksum(), 3);
    let actions = repaired(&mut backup, &fourth);
    assert!(matches!(actions[..], [Action::JournalAppend { op: 4, .. }]));
    backup.on_message(Frame::repair_of(third.as_bytes()).as_bytes());
    assert_eq!(journaled(&mut backup), vec![3]);
}

#[test]
fn a_prepare_held_already_is_not_forwarded_again() {
    let group = partition_group();
    let mut backup = Replica::new(Config::new(cluster(), group, 1, 5));
    for peer in [0, 2, 3, 4] {
        backup.set_connected(peer, true);
    }
    let forwarded = |backup: &mut Replica| -> Vec<(u8, u64)> {
        backup
            .drain_actions()
            .iter()
            .filter_map(|a| match a {
                Action::Send { to, frame } if frame.header().command == Command::Prepare as u8 => {
                    Some((*to, prepare_op(frame)))
                }
                _ => None,
            })
            .collect()
    };
    let first = partition_prepare(group, 1, 0, 0);
    backup.on_message(first.as_bytes());
    assert_eq!(forwarded(&mut backup), vec![(2, 1)]);
    // Again before it is durable (a retransmit, or a skipped predecessor's late
    // forward): journaled once, sent on once.
    backup.on_message(first.as_bytes());
    assert_eq!(forwarded(&mut backup), vec![]);
    backup.on_journal_durable(1, first.checksum());
    backup.drain_actions();
    // And after: acknowledged again, not forwarded.
    backup.on_message(first.as_bytes());
    let actions = backup.drain_actions();
    assert!(actions.iter().all(|a| !matches!(
        a,
        Action::Send { frame, .. } if frame.header().command == Command::Prepare as u8
    )));
    assert!(actions.iter().any(|a| matches!(
        a,
        Action::Send { to: 0, frame } if frame.header().command == Command::PrepareOk as u8
    )));
    assert_eq!(backup.counters().prepares_received_again, 2);
    // A new op goes on down the chain, past a disconnected successor.
    backup.set_connected(2, false);
    let second = partition_prepare(group, 2, first.checksum(), 1);
    backup.on_message(second.as_bytes());
    assert_eq!(forwarded(&mut backup), vec![(3, 2)]);
}

#[test]
fn backup_never_acks_before_the_journal_reports_durable() {
    let prepares = metadata_prepares(1);
    let mut backup = Replica::new(Config::new(cluster(), METADATA_GROUP, 1, 3));
    backup.on_message(prepares[0].as_bytes());
    let acked = |actions: &[Action]| {
        actions.iter().any(|a| match a {
            Action::Send { frame, .. } => matches!(
                decode(frame.as_bytes(), &Limits::default()),
                Ok(Message::PrepareOk(_))
            ),
            _ => false,
        })
    };
    let actions = backup.drain_actions();
    assert!(!acked(&actions), "PrepareOk before the append was durable");
    backup.on_journal_durable(1, prepares[0].checksum());
    assert!(acked(&backup.drain_actions()));
}

#[test]
fn range_evicted_hands_off_to_state_transfer() {
    use replication::wire::RepairResultHeader;
    let mut backup = Replica::new(Config::new(cluster(), METADATA_GROUP, 1, 3));
    let mut h = RepairResultHeader::new();
    h.frame.cluster = cluster();
    h.frame.command = replication::wire::Command::RangeEvicted as u8;
    h.frame.replica = 0;
    h.op = 500;
    h.group = METADATA_GROUP;
    backup.on_message(Frame::build(&h, &[]).as_bytes());
    let handed_off = backup.drain_actions().into_iter().any(|a| {
        matches!(
            a,
            Action::StateTransfer {
                from: 0,
                op_min: 500
            }
        )
    });
    assert!(handed_off);
}

fn request(client: u128, operation: Operation, session: u64, number: u64) -> Frame {
    let mut h = replication::wire::RequestHeader::new();
    h.client = client;
    h.operation = operation as u8;
    h.session = session;
    h.request = number;
    let body: &[u8] = if operation == Operation::Register {
        &[]
    } else {
        b"stream"
    };
    Frame::build(&h, body)
}

/// Commits whatever the primary prepared: journals complete and replica 1 acknowledges;
/// each commit is applied with an empty result and its reply given as an Action::Reply.
fn commit_all(primary: &mut Replica) -> Vec<Action> {
    let mut out = Vec::new();
    for _ in 0..4 {
        let mut acks = Vec::new();
        for action in primary.drain_actions() {
            match &action {
                Action::Commit { op, .. } => {
                    let applied = Applied {
                        status: 0,
                        body: &[],
                        keep_body: true,
                        reply_as: None,
                    };
                    if let Some((client, frame)) = primary.on_applied(*op, applied) {
                        out.push(Action::Reply { client, frame });
                    }
                    out.push(action);
                }
                Action::JournalAppend { op, frame } => {
                    let header = header_of(frame);
                    let mut ok = replication::wire::PrepareOkHeader::new();
                    ok.frame.cluster = cluster();
                    ok.frame.replica = 1;
                    ok.parent = header.parent;
                    ok.prepare_checksum = header.frame.checksum;
                    ok.op = *op;
                    ok.group = METADATA_GROUP;
                    acks.push((*op, frame.checksum(), Frame::build(&ok, &[])));
                }
                _ => out.push(action),
            }
        }
        for (op, checksum, ok) in acks {
            primary.on_journal_durable(op, checksum);
            primary.on_message(ok.as_bytes());
        }
    }
    out
}

#[test]
fn the_oldest_session_is_evicted_past_the_bound_and_told_so() {
    use replication::vsr::RequestOutcome;
    let mut config = Config::new(cluster(), METADATA_GROUP, 0, 3);
    config.clients_max = 1;
    let mut primary = Replica::new(config);
    let outcome = primary.on_request(request(0xa, Operation::Register, 0, 0).as_bytes());
    assert_eq!(outcome, RequestOutcome::Prepared { op: 1 });
    let actions = commit_all(&mut primary);
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::Reply { client: 0xa, .. })));
    assert_eq!(primary.commit(), 1);
    // A second client takes the only slot: client 0xa is evicted and told so.
    primary.on_request(request(0xb, Operation::Register, 0, 0).as_bytes());
    let actions = commit_all(&mut primary);
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::Evict { client: 0xa, .. })));
    let outcome = primary.on_request(request(0xa, Operation::CreateStream, 1, 1).as_bytes());
    assert_eq!(outcome, RequestOutcome::Evicted);
    // Client 0xb's request commits once; its retry is answered from the table.
    let outcome = primary.on_request(request(0xb, Operation::CreateStream, 2, 1).as_bytes());
    assert_eq!(outcome, RequestOutcome::Prepared { op: 3 });
    commit_all(&mut primary);
    let outcome = primary.on_request(request(0xb, Operation::CreateStream, 2, 1).as_bytes());
    assert_eq!(outcome, RequestOutcome::Replied);
    assert_eq!(primary.op(), 3);
}

/// Registers `client` on a one-replica metadata group's primary, its op 1 committed
/// and applied.
fn register_applied(primary: &mut Replica, client: u128) {
    primary.on_request(request(client, Operation::Register, 0, 0).as_bytes());
    let _ = primary.drain_actions();
    primary.on_journal_durable(1, primary.log().identity(1).expect("held"));
    let _ = primary.drain_actions();
    let registered = Applied {
        status: 0,
        body: b"",
        keep_body: true,
        reply_as: None,
    };
    assert!(primary.on_applied(1, registered).is_some());
}

#[test]
fn a_reply_carries_the_applied_result_and_a_retry_gets_it_from_the_table() {
    use replication::vsr::{RequestOutcome, REPLY_BODY_KEPT_MAX};
    use replication::wire::{decode, Message};
    let mut primary = Replica::new(Config::new(cluster(), METADATA_GROUP, 0, 1));
    // Commits the next request of client 0xb and returns the Commit's op, not applied.
    let commit = |primary: &mut Replica, request_number: u64| -> u64 {
        let create = request(0xb, Operation::CreateStream, 1, request_number);
        let outcome = primary.on_request(create.as_bytes());
        let RequestOutcome::Prepared { op } = outcome else {
            panic!("{outcome:?}");
        };
        let _ = primary.drain_actions();
        primary.on_journal_durable(op, primary.log().identity(op).expect("held"));
        let actions = primary.drain_actions();
        assert!(actions
            .iter()
            .any(|a| matches!(a, Action::Commit { op: o, .. } if *o == op)));
        // No reply before the result is known.
        assert!(!actions.iter().any(|a| matches!(a, Action::Reply { .. })));
        op
    };
    let reply_of = |frame: &Frame| -> (u32, Vec<u8>) {
        match decode(frame.as_bytes(), &Default::default()) {
            Ok(Message::Reply(header, body)) => (header.status, body.to_vec()),
            other => panic!("not a reply: {other:?}"),
        }
    };
    let retry = |primary: &mut Replica, request_number: u64| -> RequestOutcome {
        let create = request(0xb, Operation::CreateStream, 1, request_number);
        primary.on_request(create.as_bytes())
    };
    register_applied(&mut primary, 0xb);
    // Committed, not applied: a retry is in progress, not answered without its result.
    let op = commit(&mut primary, 1);
    assert_eq!(retry(&mut primary, 1), RequestOutcome::InProgress);
    let applied = Applied {
        status: 5,
        body: b"the stream",
        keep_body: true,
        reply_as: None,
    };
    let (client, frame) = primary
        .on_applied(op, applied)
        .expect("the primary replies");
    assert_eq!(client, 0xb);
    assert_eq!(reply_of(&frame), (5, b"the stream".to_vec()));
    assert!(primary.on_applied(op, applied).is_none(), "reported twice");
    // A retry gets the same reply from the client table, and so does a checkpoint's copy.
    assert_eq!(retry(&mut primary, 1), RequestOutcome::Replied);
    let resent = primary.drain_actions().into_iter().find_map(|a| match a {
        Action::Reply { frame, .. } => Some(frame),
        _ => None,
    });
    assert_eq!(
        resent.map(|f| reply_of(&f)),
        Some((5, b"the stream".to_vec()))
    );
    let table =
        replication::vsr::ClientTable::decode(&primary.clients().encode(), 64).expect("decodes");
    let kept = table.get(0xb).map(|s| reply_of(&s.reply));
    assert_eq!(kept, Some((5, b"the stream".to_vec())));
    // A secret, or a body past the bound, is kept as its status alone.
    let big = vec![7u8; REPLY_BODY_KEPT_MAX + 1];
    for (request_number, body, keep_body) in [(2, &b"token"[..], false), (3, &big[..], true)] {
        let op = commit(&mut primary, request_number);
        let applied = Applied {
            status: 0,
            body,
            keep_body,
            reply_as: None,
        };
        let (_, frame) = primary.on_applied(op, applied).expect("replied");
        assert_eq!(reply_of(&frame).1, body, "the first reply carries the body");
        assert_eq!(retry(&mut primary, request_number), RequestOutcome::Replied);
        let resent = primary.drain_actions().into_iter().find_map(|a| match a {
            Action::Reply { frame, .. } => Some(frame),
            _ => None,
        });
        assert_eq!(resent.map(|f| reply_of(&f)), Some((0, Vec::new())));
    }
    // A large body within the bound (a topic of many partitions) is kept whole, in the
    // table and in its checkpoint's copy.
    let wide = vec![9u8; 64 << 10];
    let op = commit(&mut primary, 4);
    let applied = Applied {
        status: 0,
        body: &wide,
        keep_body: true,
        reply_as: None,
    };
    assert!(primary.on_applied(op, applied).is_some());
    assert_eq!(retry(&mut primary, 4), RequestOutcome::Replied);
    let resent = primary.drain_actions().into_iter().find_map(|a| match a {
        Action::Reply { frame, .. } => Some(frame),
        _ => None,
    });
    assert_eq!(resent.map(|f| reply_of(&f)), Some((0, wide.clone())));
    let table =
        replication::vsr::ClientTable::decode(&primary.clients().encode(), 64).expect("decodes");
    assert_eq!(table.get(0xb).map(|s| reply_of(&s.reply)), Some((0, wide)));
}

#[test]
fn a_prepared_request_carries_the_drivers_operation_and_body() {
    use replication::vsr::RequestOutcome;
    let mut primary = Replica::new(Config::new(cluster(), METADATA_GROUP, 0, 1));
    let outcome = primary.on_request(request(0xb, Operation::Register, 0, 0).as_bytes());
    assert_eq!(outcome, RequestOutcome::Prepared { op: 1 });
    let _ = primary.drain_actions();
    primary.on_journal_durable(1, primary.log().identity(1).expect("held"));
    let _ = primary.drain_actions();
    assert_eq!(primary.commit(), 1);
    let create = request(0xb, Operation::CreateTopic, 1, 1);
    let outcome = primary.on_request_prepared(
        create.as_bytes(),
        Operation::CreateTopicWithAssignments,
        b"prepared body",
    );
    assert_eq!(outcome, RequestOutcome::Prepared { op: 2 });
    let frame = primary
        .drain_actions()
        .into_iter()
        .find_map(|a| match a {
            Action::JournalAppend { frame, .. } => Some(frame),
            _ => None,
        })
        .expect("journaled");
    let header = header_of(&frame);
    assert_eq!(
        header.operation,
        Operation::CreateTopicWithAssignments as u8
    );
    assert_eq!(&frame.as_bytes()[256..], b"prepared body");
    // Register cannot be re-labelled as another operation, nor the reverse.
    let register = request(0xc, Operation::Register, 0, 0);
    assert_eq!(
        primary.on_request_prepared(register.as_bytes(), Operation::CreateStream, b"x"),
        RequestOutcome::Rejected
    );
}

#[test]
fn a_reply_is_sealed_once_in_the_clients_terms_and_kept_so() {
    use replication::vsr::RequestOutcome;
    use replication::wire::ReplyHeader;
    use zerocopy::FromBytes;
    let mut primary = Replica::new(Config::new(cluster(), METADATA_GROUP, 0, 1));
    register_applied(&mut primary, 0xb);
    // Prepared under an internal operation and the driver's own request number.
    let create = request(0xb, Operation::CreateTopic, 1, (7 << 32) | 1);
    let outcome = primary.on_request_prepared(
        create.as_bytes(),
        Operation::CreateTopicWithAssignments,
        b"prepared body",
    );
    assert_eq!(outcome, RequestOutcome::Prepared { op: 2 });
    let _ = primary.drain_actions();
    primary.on_journal_durable(2, primary.log().identity(2).expect("held"));
    let _ = primary.drain_actions();
    let head = |frame: &Frame| {
        let (header, _) = ReplyHeader::read_from_prefix(frame.as_bytes()).expect("a reply");
        (header.operation, header.request, header.status)
    };
    let client_terms = (Operation::CreateTopic as u8, 1, 0);
    let applied = Applied {
        status: 0,
        body: b"topic",
        keep_body: true,
        reply_as: Some((Operation::CreateTopic as u8, 1)),
    };
    let (_, frame) = primary.on_applied(2, applied).expect("the primary replies");
    assert_eq!(head(&frame), client_terms);
    // The retry, under the driver's number, gets the kept copy in the client's terms.
    let outcome = primary.on_request_prepared(
        create.as_bytes(),
        Operation::CreateTopicWithAssignments,
        b"prepared body",
    );
    assert_eq!(outcome, RequestOutcome::Replied);
    let resent = primary.drain_actions().into_iter().find_map(|a| match a {
        Action::Reply { frame, .. } => Some(frame),
        _ => None,
    });
    assert_eq!(resent.as_ref().map(head), Some(client_terms));
    let kept = primary.clients().get(0xb).map(|s| head(&s.reply));
    assert_eq!(kept, Some(client_terms));
}

/// An unstamped batch of one message, and a SendMessages request header for it.
fn one_message_request(client: u128, id: u128, payload: &[u8]) -> (RequestHeader, Vec<u8>) {
    let mut builder = BatchBuilder::with_capacity(64);
    builder.push(NewMessage {
        id,
        timestamp_delta: 0,
        payload,
        user_headers: &[],
    });
    let mut h = RequestHeader::new();
    h.client = client;
    h.operation = Operation::SendMessages as u8;
    h.session = 1;
    h.request = 1;
    (h, builder.finish(1))
}

#[test]
fn a_seeded_partition_group_stamps_after_the_reopened_log() {
    use replication::vsr::RequestOutcome;
    let group = partition_group();
    let mut primary = Replica::new(Config::new(cluster(), group, 0, 1));
    assert!(primary.seed_partition_position(batch::PartitionPosition {
        partition_id: group,
        next_offset: 7,
        last_timestamp: 3,
    }));
    let (h, body) = one_message_request(0xd, 9, b"after restart");
    let frame = Frame::build(&h, &body);
    assert_eq!(
        primary.on_request(frame.as_bytes()),
        RequestOutcome::Prepared { op: 1 }
    );
    let prepare = primary
        .drain_actions()
        .into_iter()
        .find_map(|a| match a {
            Action::JournalAppend { frame, .. } => Some(frame),
            _ => None,
        })
        .expect("journaled");
    let info = batch::verify(&prepare.as_bytes()[256..]).expect("stamped");
    assert_eq!(info.base_offset, 7);
    // Only before the first op.
    assert!(!primary.seed_partition_position(batch::PartitionPosition {
        partition_id: group,
        next_offset: 0,
        last_timestamp: 0,
    }));
}

/// Runs a replica's actions as a driver would: appends are durable at once.
fn drive(replica: &mut Replica, journal: &mut Vec<JournalEntry>) {
    loop {
        let actions = replica.drain_actions();
        if actions.is_empty() {
            return;
        }
        for action in actions {
            if let Action::JournalAppend { op, frame } = action {
                journal.retain(|e| e.op != op);
                journal.push(JournalEntry {
                    op,
                    bytes: Some(FrameBuf::from_bytes(frame.as_bytes())),
                });
                replica.on_journal_durable(op, frame.checksum());
            }
        }
    }
}

/// A one-replica metadata group that committed three Registers (ops 1..=3), and its
/// journal.
fn single_replica_with_three_sessions() -> (Config, Replica, Vec<JournalEntry>) {
    let config = Config::new(cluster(), METADATA_GROUP, 0, 1);
    let mut primary = Replica::new(config.clone());
    let mut journal = Vec::new();
    for client in 1..=3u128 {
        let frame = request(client, Operation::Register, 0, 0);
        primary.on_request(frame.as_bytes());
        drive(&mut primary, &mut journal);
    }
    (config, primary, journal)
}

#[test]
fn a_restarted_single_replica_elects_itself_without_waiting_for_probes() {
    let (config, primary, mut journal) = single_replica_with_three_sessions();
    assert_eq!((primary.op(), primary.commit()), (3, 3));
    let superblock = Superblock {
        view: primary.view(),
        log_view: primary.log_view(),
        headers: Vec::new(),
        ..Superblock::default()
    };
    let mut restarted = Replica::restart(config, &superblock, &journal);
    drive(&mut restarted, &mut journal);
    // Well inside one probe interval: it did not wait for anyone to answer.
    restarted.on_tick();
    drive(&mut restarted, &mut journal);
    assert_eq!(restarted.status(), Status::Normal);
    assert_eq!(restarted.op(), 3);
    assert!(restarted.view() > primary.view());
}

#[test]
fn a_replica_restarted_from_a_checkpoint_resumes_there_with_its_client_table() {
    let (config, primary, mut journal) = single_replica_with_three_sessions();
    let checkpoint = primary.checkpoint().expect("the commit point is in memory");
    assert_eq!(checkpoint.op, 3);
    let superblock = Superblock {
        view: primary.view(),
        log_view: primary.log_view(),
        headers: Vec::new(),
        ..Superblock::default()
    };
    // Only the checkpoint's anchor survives below it: ops 1 and 2 are gone.
    journal.retain(|e| e.op > 3);
    let mut restarted =
        Replica::restart_from_checkpoint(config.clone(), &superblock, checkpoint, &journal)
            .expect("valid anchor");
    drive(&mut restarted, &mut journal);
    restarted.on_tick();
    drive(&mut restarted, &mut journal);
    assert_eq!(restarted.status(), Status::Normal);
    assert_eq!(
        restarted.commit(),
        3,
        "nothing below the checkpoint is replayed"
    );
    // The sessions came with the checkpoint: client 2's retried Register is answered
    // from the table, not prepared again.
    let retry = request(2, Operation::Register, 0, 0);
    restarted.on_request(retry.as_bytes());
    let actions = restarted.drain_actions();
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::JournalAppend { .. })),
        "a retried Register was prepared again: {actions:?}"
    );
    assert_eq!(restarted.op(), 3);
    // A wrong anchor is refused.
    let mut bad = primary.checkpoint().expect("checkpoint");
    bad.op = 2;
    assert!(Replica::restart_from_checkpoint(config, &superblock, bad, &journal).is_none());
}

#[test]
fn a_checkpoint_at_the_commit_point_keeps_the_chain_anchor() {
    let (_, mut primary, mut journal) = single_replica_with_three_sessions();
    primary.on_checkpoint(3);
    assert!(
        primary.log().header(3).is_some(),
        "the commit point's prepare stays"
    );
    let frame = request(4, Operation::Register, 0, 0);
    assert!(matches!(
        primary.on_request(frame.as_bytes()),
        RequestOutcome::Prepared { op: 4 }
    ));
    drive(&mut primary, &mut journal);
    assert_eq!(primary.commit(), 4);
}

/// After a whole-cluster restart nobody is normal, so nobody answers RequestStartView:
/// a recovering member must stand for election after PROBE_ATTEMPTS_MAX unanswered
/// probes at the probe interval, not after an exponentially growing wait (which made
/// every group of a restarted cluster sit out about ten seconds).
#[test]
fn an_unanswered_recovering_replica_starts_a_view_change_within_its_probe_budget() {
    let config = Config::new(cluster(), METADATA_GROUP, 1, 3);
    let interval = config.view_change_retransmit_interval_ticks;
    let mut replica = Replica::restart(config, &Superblock::default(), &[]);
    assert_eq!(replica.status(), Status::Recovering);
    let mut probes = 0;
    let mut ticks = 0u64;
    while replica.status() == Status::Recovering {
        replica.on_tick();
        ticks += 1;
        for action in replica.drain_actions() {
            if let Action::Broadcast { frame } = action {
                if let Ok(Message::RequestStartView(..)) =
                    decode(frame.as_bytes(), &Limits::default())
                {
                    probes += 1;
                }
            }
        }
        // Each probe waits at most 1.5 intervals (base plus jitter).
        let budget = (u64::from(replication::vsr::PROBE_ATTEMPTS_MAX) + 2) * interval * 3 / 2;
        assert!(
            ticks <= budget,
            "still recovering after {ticks} ticks ({probes} probes)"
        );
    }
    assert_eq!(replica.status(), Status::ViewChange);
    assert!(probes >= 1, "it probed before standing for election");
}

#[test]
fn a_verified_prepare_is_journaled_as_received_and_its_stamp_still_checked() {
    use replication::vsr::Groups;
    let group = partition_group();
    let mut groups = Groups::new();
    groups.insert(Replica::new(Config::new(cluster(), group, 1, 3)));
    let first = partition_prepare(group, 1, 0, 0);
    assert_eq!(groups.on_frame(first.clone()), Ok(group));
    let appended: Vec<Frame> = groups
        .drain_actions()
        .into_iter()
        .filter_map(|(_, a)| match a {
            Action::JournalAppend { frame, .. } => Some(frame),
            _ => None,
        })
        .collect();
    assert_eq!(appended.len(), 1);
    assert_eq!(appended[0].as_bytes(), first.as_bytes());
    // The stamp is re-derived on this path too: base_offset 5 where the log is at 1.
    let wrong = partition_prepare(group, 2, first.checksum(), 5);
    assert_eq!(groups.on_frame(wrong), Ok(group));
    let replica = groups.get_mut(group).expect("hosted");
    assert!(journaled(replica).is_empty());
    assert_eq!(replica.counters().batch_stamp_mismatch, 1);
}

#[test]
fn a_request_given_as_header_and_body_prepares_what_its_frame_would() {
    let group = partition_group();
    let mut by_frame = Replica::new(Config::new(cluster(), group, 0, 1));
    let mut by_parts = Replica::new(Config::new(cluster(), group, 0, 1));
    for replica in [&mut by_frame, &mut by_parts] {
        assert!(replica.seed_partition_position(batch::PartitionPosition {
            partition_id: group,
            next_offset: 3,
            last_timestamp: 0,
        }));
    }
    let (mut h, body) = one_message_request(0xe, 4, b"parts");
    let frame = Frame::build(&h, &body);
    let prepared = RequestOutcome::Prepared { op: 1 };
    assert_eq!(by_frame.on_request(frame.as_bytes()), prepared);
    assert_eq!(by_parts.on_request_parts(&h, &body), prepared);
    let prepare = |replica: &mut Replica| {
        replica
            .drain_actions()
            .into_iter()
            .find_map(|a| match a {
                Action::JournalAppend { frame, .. } => Some(frame),
                _ => None,
            })
            .expect("journaled")
    };
    let (a, b) = (prepare(&mut by_frame), prepare(&mut by_parts));
    assert_eq!(a.as_bytes(), b.as_bytes());
    assert_eq!(
        batch::verify(&b.as_bytes()[256..]).map(|i| i.base_offset),
        Ok(3)
    );
    // The header's field rules still apply: no client id.
    h.client = 0;
    h.request = 2;
    assert_eq!(
        by_parts.on_request_parts(&h, &body),
        RequestOutcome::Rejected
    );
}

/// The livelock seen in e2e_client_library (partition group cycling views with commit
/// stuck): a backup's driver deferred an append (the prepare arrived past its journal's
/// head) and never reported it durable; the core held the body, so repair never asked
/// for it again and no PrepareOk ever went out for it. The core now asks the driver to
/// journal such ops again on its repair timeout, and acks once they are durable.
#[test]
fn an_op_never_reported_durable_is_journaled_again_and_then_acked() {
    let prepares = metadata_prepares(2);
    let mut backup = Replica::new(Config::new(cluster(), METADATA_GROUP, 1, 3));
    backup.on_message(prepares[0].as_bytes());
    backup.on_message(prepares[1].as_bytes());
    assert_eq!(journaled(&mut backup), vec![1, 2]);
    // The driver made op 1 durable and deferred op 2 (reported nothing for it).
    backup.on_journal_durable(1, prepares[0].checksum());
    let _ = backup.drain_actions();
    let acks_of = |actions: &[Action]| -> Vec<u64> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Send { frame, .. } => match decode(frame.as_bytes(), &Limits::default()) {
                    Ok(Message::PrepareOk(h)) => Some(h.op),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    };
    let mut again = Vec::new();
    for _ in 0..2000 {
        backup.on_tick();
        let actions = backup.drain_actions();
        again.extend(actions.iter().filter_map(|a| match a {
            Action::JournalAppend { op, frame } => Some((*op, frame.checksum())),
            _ => None,
        }));
        if !again.is_empty() {
            break;
        }
    }
    assert_eq!(
        again,
        vec![(2, prepares[1].checksum())],
        "op 2 asked again, only op 2"
    );
    assert_eq!(backup.counters().journal_again, 1);
    backup.on_journal_durable(2, prepares[1].checksum());
    assert_eq!(acks_of(&backup.drain_actions()), vec![2]);
    // Durable now: never asked again.
    for _ in 0..2000 {
        backup.on_tick();
        assert!(
            !backup
                .drain_actions()
                .iter()
                .any(|a| matches!(a, Action::JournalAppend { .. })),
            "a durable op journaled again"
        );
    }
}

/// (tick, to, op) of every Prepare the primary sends over `ticks` ticks, its journal
/// reporting at once and no backup acknowledging; a Register from a new client is
/// prepared at each tick of `requests_at`.
fn prepare_sends(requests_at: &[u64], ticks: u64) -> Vec<(u64, u8, u64)> {
    let mut config = Config::new(cluster(), METADATA_GROUP, 0, 3);
    // Nobody acknowledges: keep the chain as it is (no backup skipped as slow), so the
    // only resends are the retransmit's.
    config.slow_lag_min_ticks = 10 * ticks;
    let mut primary = Replica::new(config);
    primary.set_connected(1, true);
    primary.set_connected(2, true);
    let mut sends = Vec::new();
    for tick in 0..ticks {
        if requests_at.contains(&tick) {
            let client = 0x100 + u128::from(tick);
            let outcome = primary.on_request(request(client, Operation::Register, 0, 0).as_bytes());
            assert!(
                matches!(outcome, RequestOutcome::Prepared { .. }),
                "{outcome:?}"
            );
        }
        primary.on_tick();
        for action in primary.drain_actions() {
            match action {
                Action::JournalAppend { op, frame } => {
                    primary.on_journal_durable(op, frame.checksum())
                }
                Action::Send { to, frame } => {
                    if let Ok(Message::Prepare(header, _)) =
                        decode(frame.as_bytes(), &Limits::default())
                    {
                        sends.push((tick, to, header.op));
                    }
                }
                _ => {}
            }
        }
    }
    sends
}

#[test]
fn the_prepare_retransmit_resends_only_prepares_sent_half_an_interval_ago() {
    let interval = Config::new(cluster(), METADATA_GROUP, 0, 3).prepare_retransmit_interval_ticks;
    // Op 1 at tick 0, never acknowledged: resent at each firing of the timer.
    let alone = prepare_sends(&[0], 8 * interval);
    let firings: Vec<u64> = alone
        .iter()
        .filter(|(tick, to, op)| *op == 1 && *tick > 0 && *to == 2)
        .map(|(tick, ..)| *tick)
        .collect();
    assert!(firings.len() >= 3, "op 1 resent at {firings:?}");
    // Never before half an interval after it was last sent, and to both backups each time
    // (the chain sent it to replica 1 only).
    let mut last = 0;
    for firing in &firings {
        assert!(
            firing - last >= interval / 2,
            "resent at {firing} after {last}"
        );
        assert!(alone.contains(&(*firing, 1, 1)));
        last = *firing;
    }
    // The same run with op 2 sent three ticks before the second firing (the primary is
    // deterministic): that firing resends op 1 but not op 2, which goes out again only
    // at the next one.
    let second = firings[1];
    let both = prepare_sends(&[0, second - 3], 8 * interval);
    let sends_of = |op: u64| -> Vec<u64> {
        both.iter()
            .filter(|(_, to, o)| *o == op && *to == 2)
            .map(|(tick, ..)| *tick)
            .collect()
    };
    assert!(sends_of(1).contains(&second), "{:?}", sends_of(1));
    assert!(
        !sends_of(2).contains(&second),
        "op 2, sent at {}, resent at the firing right after: {:?}",
        second - 3,
        sends_of(2)
    );
    assert!(
        sends_of(2).iter().any(|tick| *tick > second),
        "op 2 never resent"
    );
}

/// A PrepareOk from `from` for the prepare `frame` (view 0, metadata group).
fn prepare_ok(from: u8, frame: &Frame) -> Frame {
    prepare_ok_to(from, &header_of(frame))
}

fn prepare_ok_to(from: u8, header: &PrepareHeader) -> Frame {
    let mut ok = replication::wire::PrepareOkHeader::new();
    ok.frame.cluster = cluster();
    ok.frame.replica = from;
    ok.parent = header.parent;
    ok.prepare_checksum = header.frame.checksum;
    ok.op = header.op;
    ok.group = METADATA_GROUP;
    Frame::build(&ok, &[])
}

/// One tick of a 3-replica primary with a new Register prepared every other tick, its
/// journal reporting at once; the backups in `ackers` acknowledge every prepare sent to
/// them. Returns the (to, op, sent as a RepairPrepare) of each prepare sent.
fn tick_with_ackers(primary: &mut Replica, tick: u64, ackers: &[u8]) -> Vec<(u8, u64, bool)> {
    if tick.is_multiple_of(2) {
        let client = 0x1000 + u128::from(tick);
        let outcome = primary.on_request(request(client, Operation::Register, 0, 0).as_bytes());
        assert!(
            matches!(outcome, RequestOutcome::Prepared { .. }),
            "{outcome:?}"
        );
    }
    primary.on_tick();
    let mut sends = Vec::new();
    let mut acks = Vec::new();
    for action in primary.drain_actions() {
        match action {
            Action::JournalAppend { op, frame } => primary.on_journal_durable(op, frame.checksum()),
            Action::Send { to, frame } => match decode(frame.as_bytes(), &Limits::default()) {
                Ok(Message::Prepare(header, _)) => {
                    sends.push((to, header.op, false));
                    // A chain: what replica 1 acknowledges it also forwarded to 2.
                    for acker in ackers {
                        if *acker == to || (to == 1 && *acker == 2 && ackers.contains(&1)) {
                            acks.push(prepare_ok(*acker, &frame));
                        }
                    }
                }
                // A backup skipped as slow gets the prepare as a repair: it acknowledges
                // it and forwards nothing.
                Ok(Message::RepairPrepare(header, _)) => {
                    sends.push((to, header.op, true));
                    if ackers.contains(&to) {
                        acks.push(prepare_ok_to(to, header));
                    }
                }
                _ => {}
            },
            _ => {}
        }
    }
    for ack in acks {
        primary.on_message(ack.as_bytes());
    }
    sends
}

#[test]
fn a_backup_that_stops_acknowledging_is_skipped_by_the_chain_then_readmitted() {
    let config = Config::new(cluster(), METADATA_GROUP, 0, 3);
    let (lag_min, readmit) = (config.slow_lag_min_ticks, config.slow_readmit_ticks);
    let mut primary = Replica::new(config);
    primary.set_connected(1, true);
    primary.set_connected(2, true);
    let mut tick = 0;
    // Healthy: the chain's head is replica 1 only, nobody is skipped.
    for _ in 0..50 {
        let sends = tick_with_ackers(&mut primary, tick, &[1, 2]);
        assert!(sends.iter().all(|s| *s == (1, s.1, false)), "{sends:?}");
        tick += 1;
    }
    assert_eq!(primary.slow_peers(), 0);
    let commit = primary.commit();
    // Replica 1 stalls (and so forwards nothing): within the bound it is skipped, the
    // pipeline goes to replica 2, and commits flow again.
    let stalled_at = tick;
    let mut skipped_at = None;
    let mut to_two = Vec::new();
    for _ in 0..3 * lag_min {
        let was_skipped = primary.slow_peers() != 0;
        let sends = tick_with_ackers(&mut primary, tick, &[2]);
        if skipped_at.is_none() && primary.slow_peers() != 0 {
            skipped_at = Some(tick);
        }
        if skipped_at.is_some() {
            to_two.extend(sends.iter().filter(|s| s.0 == 2).map(|s| s.1));
        }
        if was_skipped {
            // The skipped backup gets each new prepare as a repair, which it does not
            // forward: replica 2 has it from the primary.
            assert!(sends.iter().all(|s| s.0 == 2 || s.2), "{sends:?}");
        }
        tick += 1;
    }
    let skipped_at = skipped_at.expect("replica 1 skipped");
    assert_eq!(primary.slow_peers(), 0b010);
    assert!(
        skipped_at - stalled_at <= lag_min + 1,
        "skipped after {} ticks",
        skipped_at - stalled_at
    );
    assert_eq!(primary.slow_since(1), Some(skipped_at + 1));
    assert!(!to_two.is_empty());
    assert!(
        primary.commit() > commit + lag_min / 2,
        "commits stalled at {}",
        primary.commit()
    );
    // Back and keeping up: readmitted only after `readmit` ticks of keeping up.
    let back_at = tick;
    let mut readmitted_at = None;
    let mut repairs_to_one = 0;
    for _ in 0..readmit + 4 * lag_min {
        let was_skipped = primary.slow_peers() != 0;
        let sends = tick_with_ackers(&mut primary, tick, &[1, 2]);
        if was_skipped && primary.slow_peers() != 0 {
            assert!(sends.iter().all(|s| s.0 == 2 || s.2), "{sends:?}");
            repairs_to_one += sends.iter().filter(|s| s.0 == 1).count();
        }
        if readmitted_at.is_none() && primary.slow_peers() == 0 {
            readmitted_at = Some(tick);
        }
        tick += 1;
    }
    let readmitted_at = readmitted_at.expect("replica 1 readmitted");
    assert!(
        readmitted_at - back_at >= readmit,
        "readmitted after {}",
        readmitted_at - back_at
    );
    assert_eq!(primary.slow_counts(), (1, 1));
    assert!(repairs_to_one > 0);
    // And the chain's head is replica 1 alone again, sent Prepares.
    let sends = tick_with_ackers(&mut primary, tick, &[1, 2]);
    assert!(
        !sends.is_empty() && sends.iter().all(|s| *s == (1, s.1, false)),
        "{sends:?}"
    );
}

#[test]
fn a_restart_knows_the_ops_it_received_below_one_it_never_did() {
    let prepares = metadata_prepares(6);
    let config = Config::new(cluster(), METADATA_GROUP, 1, 3);
    // Op 4 never arrived (its journal has no entry), ops 5 and 6 did; a view change then
    // persisted the suffix, which ends at the hole. Ops 1 to 3 may have been
    // acknowledged: their own prepares, chained from the root, say what they are.
    let journal: Vec<JournalEntry> = (1..)
        .zip(&prepares)
        .filter(|(op, _)| *op != 4)
        .map(|(op, frame)| JournalEntry {
            op,
            bytes: Some(FrameBuf::from_bytes(frame.as_bytes())),
        })
        .collect();
    let superblock = Superblock {
        view: 1,
        log_view: 0,
        headers: vec![header_of(&prepares[5]), header_of(&prepares[4])],
        ..Superblock::default()
    };
    let r1 = Replica::restart(config, &superblock, &journal);
    for op in [1u64, 2, 3, 5, 6] {
        let expected = header_of(&prepares[op as usize - 1]).frame.checksum;
        assert_eq!(
            r1.log().header(op).map(|h| h.frame.checksum),
            Some(expected),
            "op {op}"
        );
    }
    assert_eq!(r1.log().header(4), None);
}

#[test]
fn a_group_starts_in_its_initial_view_and_a_restart_before_any_view_change_is_there() {
    let mut config = Config::new(cluster(), METADATA_GROUP, 1, 3);
    config.initial_view = 4;
    let fresh = Replica::new(config.clone());
    assert_eq!((fresh.view(), fresh.log_view()), (4, 4));
    assert!(
        fresh.is_primary(),
        "view 4 of 3 replicas is led by replica 1"
    );
    assert_eq!(fresh.status(), Status::Normal);
    // Nothing persisted yet (an absent or default superblock): the initial view.
    let restarted = Replica::restart(config.clone(), &Superblock::default(), &[]);
    assert_eq!((restarted.view(), restarted.log_view()), (4, 4));
    // A persisted later view stays; a replacement learns its view from its peers.
    let later = Superblock {
        view: 7,
        log_view: 5,
        ..Superblock::default()
    };
    let restarted = Replica::restart(config.clone(), &later, &[]);
    assert_eq!((restarted.view(), restarted.log_view()), (7, 5));
    let replacement = Superblock {
        replacement: true,
        ..Superblock::default()
    };
    let restarted = Replica::restart(config, &replacement, &[]);
    assert_eq!((restarted.view(), restarted.log_view()), (0, 0));
}

/// A formatted replica whose peers remember no op but report later views (the group
/// changed views before any op, and this replica may have voted in them before it lost
/// its disk) forms as a member but never votes below the highest view reported: a view
/// change of a lower view leaves it alone, and it asks that view's primary for its
/// StartView.
#[test]
fn a_formatted_replica_never_votes_below_the_views_its_census_reported() {
    use replication::wire::{Command, RepairResultHeader};
    let mut r2 = Replica::unformed(Config::new(cluster(), METADATA_GROUP, 2, 3));
    let nonce = r2
        .drain_actions()
        .into_iter()
        .find_map(|action| match action {
            Action::Send { frame, .. } => match decode(frame.as_bytes(), &Limits::default()) {
                Ok(Message::RequestPrepares(h)) => Some(h.nonce),
                _ => None,
            },
            _ => None,
        })
        .expect("a census question");
    for (peer, view) in [(1u8, 12u32), (0, 9)] {
        let mut h = RepairResultHeader::new();
        h.frame.cluster = cluster();
        h.frame.command = Command::RepairDone as u8;
        h.frame.replica = peer;
        h.frame.view = view;
        h.nonce = nonce;
        h.op = 0;
        h.group = METADATA_GROUP;
        r2.on_message(Frame::build(&h, &[]).as_bytes());
    }
    assert!(r2.is_voter(), "no op anywhere: it forms as a member");
    assert_eq!(r2.view(), 12, "the highest view reported");
    assert_eq!(r2.log_view(), 0, "its log is still the empty one");
    assert_eq!(r2.status(), Status::Recovering);
    let asked = r2.drain_actions().into_iter().any(|action| match action {
        Action::Broadcast { frame } => matches!(
            decode(frame.as_bytes(), &Limits::default()),
            Ok(Message::RequestStartView(h)) if h.frame.view == 12
        ),
        _ => false,
    });
    assert!(asked, "it asks for the StartView of view 12");
    // Replica 0 starts a view change of view 10: replica 2 does not take part.
    let mut svc = StartViewChangeHeader::new();
    svc.frame.cluster = cluster();
    svc.frame.view = 10;
    svc.frame.replica = 0;
    svc.group = METADATA_GROUP;
    r2.on_message(Frame::build(&svc, &[]).as_bytes());
    assert_eq!(r2.view(), 12);
    assert!(r2.drain_actions().is_empty(), "no vote in a view below 12");
}

/// A forming primary whose merge is done but whose view never starts (the bodies it must
/// repair never arrive) votes in the next view with the merged log under the merged
/// view. Under its older log_view those headers could contradict a replica that was
/// normal in that older view, and no later merge could choose between them: the group
/// stayed without a primary for good (many-group simulator seed 8241).
#[test]
fn a_merge_whose_view_never_starts_is_presented_under_its_view() {
    let prepares = metadata_prepares(4);
    let mut r1 = Replica::new(Config::new(cluster(), METADATA_GROUP, 1, 3));
    r1.on_message(start_view_change(2, 1).as_bytes());
    assert_eq!(r1.log_view(), 0);
    // r2 presents every body, but never answers a repair request.
    r1.on_message(do_view_change(2, &prepares, 0, 0b1111).as_bytes());
    let persisted = r1.drain_actions().into_iter().any(|action| {
        matches!(action, Action::PersistSuperblock(sb) if sb.view == 1 && sb.log_view == 1)
    });
    assert!(
        persisted,
        "the merged view is made durable before the merge is used"
    );
    assert_eq!(r1.status(), Status::ViewChange, "no body repaired, no view");
    assert_eq!(r1.log_view(), 1);
    for _ in 0..1_000 {
        r1.on_tick();
        if r1.view() > 1 {
            break;
        }
    }
    assert!(r1.view() > 1, "the view change times out and moves on");
    r1.drain_actions();
    // A peer joins the next view change: r1 sends its DVC.
    r1.on_message(start_view_change(0, r1.view()).as_bytes());
    let dvc = r1
        .drain_actions()
        .into_iter()
        .find_map(|action| match action {
            Action::Send { frame, .. } | Action::Broadcast { frame } => {
                match decode(frame.as_bytes(), &Limits::default()) {
                    Ok(Message::DoViewChange(h, _)) => Some(*h),
                    _ => None,
                }
            }
            _ => None,
        });
    let dvc = dvc.expect("a DVC for the next view");
    assert_eq!(dvc.log_view, 1, "the merged log is the view-1 log");
    assert_eq!(dvc.op, 4);
}

/// Metadata prepares 1..=count prepared in `view`, each committing the op below; from
/// op `fork` on their bodies carry `tag`, so two tags fork the chain there.
fn forked_prepares(count: u64, fork: u64, tag: &str, view: u32) -> Vec<Frame> {
    let mut chain = PrepareChain::after(0);
    (1..=count)
        .map(|op| {
            let mut h = PrepareHeader::new();
            h.frame.cluster = cluster();
            h.frame.view = view;
            h.client = 0x42;
            h.op = op;
            h.commit = op - 1;
            h.timestamp = op;
            h.request = op;
            h.operation = Operation::CreateStream as u8;
            h.group = METADATA_GROUP;
            let body = if op < fork {
                format!("op{op}")
            } else {
                format!("{tag}{op}")
            };
            chain.append(&mut h, body.as_bytes())
        })
        .collect()
}

/// A merge vouches only for the headers it decided. The forming primary's own header
/// of an op above its commit that no canonical DVC gave, below a gap of the chain, is
/// one of an older log view (here op 6, replaced in a later view): presented under the
/// merged view it would outrank the op that committed there (simulator seed 104989 of
/// 5 replicas, where two replicas then waited for a body nobody held).
#[test]
fn a_merge_does_not_vouch_for_headers_it_never_decided() {
    let stale = forked_prepares(6, 6, "stale", 0);
    let committed = forked_prepares(8, 6, "kept", 2);
    let config = Config::new(cluster(), METADATA_GROUP, 1, 3);
    // Op 0 is never journaled: every entry reads back.
    let journal = journal_unreadable_at(&stale, 0);
    let superblock = Superblock {
        view: 3,
        log_view: 0,
        headers: stale.iter().rev().map(header_of).collect(),
        ..Superblock::default()
    };
    let mut r1 = Replica::restart(config, &superblock, &journal);
    r1.on_message(start_view_change(2, 4).as_bytes());
    assert_eq!((r1.view(), r1.status()), (4, Status::ViewChange));
    // r2 was normal in view 3 and committed op 8; its DVC carries op 8's header only.
    let mut h = DoViewChangeHeader::new();
    h.frame.cluster = cluster();
    h.frame.view = 4;
    h.frame.replica = 2;
    h.op = 8;
    h.commit = 8;
    h.group = METADATA_GROUP;
    h.log_view = 3;
    h.present_bitset = 1;
    r1.on_message(Frame::build(&h, header_of(&committed[7]).as_bytes()).as_bytes());
    assert_eq!(r1.log_view(), 4, "merged");
    assert_eq!(r1.op(), 8);
    let stale_6 = header_of(&stale[5]).frame.checksum;
    assert_ne!(
        r1.log().header(6).map(|h| h.frame.checksum),
        Some(stale_6),
        "the stale op 6 is not part of view 4's log"
    );
    for _ in 0..1_000 {
        r1.on_tick();
        if r1.view() > 4 {
            break;
        }
    }
    r1.drain_actions();
    r1.on_message(start_view_change(0, r1.view()).as_bytes());
    let (dvc, headers) = r1
        .drain_actions()
        .into_iter()
        .find_map(|action| match action {
            Action::Send { frame, .. } | Action::Broadcast { frame } => {
                match decode(frame.as_bytes(), &Limits::default()) {
                    Ok(Message::DoViewChange(h, headers)) => Some((*h, headers.to_vec())),
                    _ => None,
                }
            }
            _ => None,
        })
        .expect("a DVC for the next view");
    assert_eq!(dvc.log_view, 4);
    assert!(
        headers.iter().all(|h| h.frame.checksum != stale_6),
        "the DVC of view {} presents the stale op 6 under log view 4",
        dvc.frame.view
    );
    assert!(headers.iter().any(|h| h.op == 8));
}

/// A metadata-group RequestPrepares of `from..=to` from `replica`.
fn request_prepares(replica: u8, from: u64, to: u64) -> Frame {
    let mut request = replication::wire::RequestPreparesHeader::new();
    request.frame.cluster = cluster();
    request.frame.replica = replica;
    request.nonce = 7;
    request.from_op = from;
    request.to_op = to;
    request.group = METADATA_GROUP;
    Frame::build(&request, &[])
}

/// What replica 1's RequestPrepares for `from..=to` gets back from `primary`: the ops
/// served and the RangeEvicted op, if any.
fn ask_prepares(primary: &mut Replica, from: u64, to: u64) -> (Vec<u64>, Option<u64>) {
    primary.on_message(request_prepares(1, from, to).as_bytes());
    let (mut served, mut evicted) = (Vec::new(), None);
    for action in primary.drain_actions() {
        if let Action::Send { to: 1, frame } = action {
            match decode(frame.as_bytes(), &Limits::default()) {
                Ok(Message::RepairPrepare(h, _)) => served.push(h.op),
                Ok(Message::RangeEvicted(h)) => evicted = Some(h.op),
                _ => {}
            }
        }
    }
    (served, evicted)
}

#[test]
fn a_released_commit_point_is_evicted_for_repair_and_read_back_for_a_checkpoint() {
    let config = Config::new(cluster(), METADATA_GROUP, 0, 3);
    let mut primary = Replica::new(config);
    primary.set_connected(1, true);
    primary.set_connected(2, true);
    for tick in 0..12 {
        tick_with_ackers(&mut primary, tick, &[1, 2]);
    }
    let commit = primary.commit();
    assert!(commit >= 4, "commit {commit}");
    // Ops below the commit point may go, but not the commit point's prepare while
    // anything below it is held.
    assert!(!primary.release_anchor(), "released with ops below it held");
    let kept = primary
        .checkpoint()
        .expect("the commit point's prepare is held");
    primary.on_checkpoint(commit);
    assert_eq!(
        ask_prepares(&mut primary, commit, commit),
        (vec![commit], None)
    );
    assert!(primary.release_anchor());
    assert_eq!(primary.released_anchor(), Some(commit));
    assert!(
        primary.checkpoint().is_none(),
        "no checkpoint without the prepare"
    );
    // Asked for, it is evicted: the requester catches up by state transfer.
    assert_eq!(
        ask_prepares(&mut primary, commit, commit),
        (vec![], Some(commit + 1))
    );
    // Bytes that are not that prepare are refused; the prepare itself is taken back.
    let mut damaged = kept.anchor.as_bytes().to_vec();
    let last = damaged.len() - 1;
    damaged[last] ^= 1;
    assert!(!primary.restore_anchor(&damaged));
    assert!(!primary.restore_anchor(&[]));
    assert!(primary.restore_anchor(kept.anchor.as_bytes()));
    assert_eq!(primary.released_anchor(), None);
    let again = primary.checkpoint().expect("restored");
    assert_eq!(again.anchor.checksum(), kept.anchor.checksum());
    // Released again, the chain still grows from its header.
    assert!(primary.release_anchor());
    for tick in 12..20 {
        tick_with_ackers(&mut primary, tick, &[1, 2]);
    }
    assert!(
        primary.commit() > commit,
        "no commit past a released anchor"
    );
}

/// A forming primary that starts its view right after the merge (nothing to repair)
/// persists the merged view once: the superblock it would write when the view starts is
/// the one the merge already wrote, and each write is a round of superblock writes on the
/// node's critical path of a failover.
#[test]
fn a_view_started_right_after_the_merge_is_persisted_once() {
    let mut r1 = Replica::new(Config::new(cluster(), METADATA_GROUP, 1, 3));
    r1.on_message(start_view_change(2, 1).as_bytes());
    let bumped: Vec<(u32, u32)> = r1
        .drain_actions()
        .into_iter()
        .filter_map(|action| match action {
            Action::PersistSuperblock(sb) => Some((sb.view, sb.log_view)),
            _ => None,
        })
        .collect();
    assert_eq!(bumped, vec![(1, 0)], "the view is promised before the vote");
    r1.on_message(do_view_change(2, &[], 0, 0).as_bytes());
    let mut persisted = Vec::new();
    let mut started_after = None;
    for action in r1.drain_actions() {
        match action {
            Action::PersistSuperblock(sb) => persisted.push((sb.view, sb.log_view)),
            Action::Broadcast { frame } => {
                if let Ok(Message::StartView(..)) = decode(frame.as_bytes(), &Limits::default()) {
                    started_after = Some(persisted.len());
                }
            }
            _ => {}
        }
    }
    assert_eq!(
        r1.status(),
        Status::Normal,
        "nothing to repair: the view starts"
    );
    assert_eq!(
        persisted,
        vec![(1, 1)],
        "one write for the merge and the start"
    );
    assert_eq!(
        started_after,
        Some(1),
        "the StartView goes out after that write"
    );
}

/// The commit numbers of the Commit messages among `actions`.
fn commits_broadcast(actions: &[Action]) -> Vec<u64> {
    actions
        .iter()
        .filter_map(|action| match action {
            Action::Broadcast { frame } => match decode(frame.as_bytes(), &Limits::default()) {
                Ok(Message::Commit(header)) => Some(header.commit),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

#[test]
fn the_metadata_primary_announces_a_commit_that_empties_its_pipeline_at_once() {
    let mut primary = Replica::new(Config::new(cluster(), METADATA_GROUP, 0, 3));
    primary.set_connected(1, true);
    primary.set_connected(2, true);
    let mut prepares = Vec::new();
    for client in [0xa1, 0xa2] {
        let outcome = primary.on_request(request(client, Operation::Register, 0, 0).as_bytes());
        assert!(matches!(outcome, RequestOutcome::Prepared { .. }));
        for action in primary.drain_actions() {
            if let Action::JournalAppend { op, frame } = action {
                primary.on_journal_durable(op, frame.checksum());
                prepares.push(frame);
            }
        }
    }
    assert_eq!(prepares.len(), 2);
    // Op 1 commits while op 2 is in flight: op 2's commit will announce both.
    primary.on_message(prepare_ok(1, &prepares[0]).as_bytes());
    assert_eq!(primary.commit(), 1);
    let actions = primary.drain_actions();
    assert!(commits_broadcast(&actions).is_empty(), "{actions:?}");
    // Op 2 empties the pipeline: the backups hear commit 2 now, not a heartbeat later.
    primary.on_message(prepare_ok(1, &prepares[1]).as_bytes());
    assert_eq!(primary.commit(), 2);
    assert_eq!(commits_broadcast(&primary.drain_actions()), vec![2]);
    // No new commit, no announcement until the heartbeat's interval.
    primary.on_message(prepare_ok(2, &prepares[1]).as_bytes());
    assert!(commits_broadcast(&primary.drain_actions()).is_empty());
}
