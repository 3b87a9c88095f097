use replication::wire::{Header, Operation};

use super::*;

fn request(operation: Operation, number: u64) -> RequestHeader {
    let mut request = RequestHeader::new();
    request.client = 42;
    request.request = number;
    request.operation = operation as u8;
    request
}

#[test]
fn outcome_bytes_are_the_wire_tables_and_decode_back() {
    let register = [
        (Outcome::Ok, 0),
        (Outcome::NotPrimary, 1),
        (Outcome::NotCaughtUp, 2),
        (Outcome::PipelineFull, 3),
        (Outcome::InProgress, 4),
        (Outcome::Canceled, 5),
        (Outcome::ClientIdOwnedByAnotherUser, 6),
    ];
    for (outcome, code) in register {
        assert_eq!(outcome.code(false), code, "{outcome:?}");
        assert_eq!(Outcome::decode(code, false), Some(outcome));
    }
    let logout = [
        (Outcome::Ok, 0),
        (Outcome::NotPrimary, 1),
        (Outcome::PipelineFull, 2),
        (Outcome::InProgress, 3),
        (Outcome::Canceled, 4),
    ];
    for (outcome, code) in logout {
        assert_eq!(outcome.code(true), code, "{outcome:?}");
        assert_eq!(Outcome::decode(code, true), Some(outcome));
    }
    assert_eq!(Outcome::ClientIdOwnedByAnotherUser.code(true), 4);
    assert_eq!(Outcome::decode(7, false), None);
    assert_eq!(Outcome::decode(5, true), None);
}

#[test]
fn a_primary_tells_the_backup_at_once_only_what_will_not_commit() {
    assert_eq!(
        Outcome::of_request(&RequestOutcome::Prepared { op: 3 }),
        None
    );
    assert_eq!(Outcome::of_request(&RequestOutcome::Replied), None);
    assert_eq!(Outcome::of_request(&RequestOutcome::InProgress), None);
    assert_eq!(
        Outcome::of_request(&RequestOutcome::NotPrimary { primary: 1 }),
        Some(Outcome::NotPrimary)
    );
    assert_eq!(
        Outcome::of_request(&RequestOutcome::PipelineFull),
        Some(Outcome::PipelineFull)
    );
    for refused in [
        RequestOutcome::Stale,
        RequestOutcome::Evicted,
        RequestOutcome::Rejected,
    ] {
        assert_eq!(Outcome::of_request(&refused), Some(Outcome::Canceled));
    }
}

#[test]
fn an_ok_waits_for_the_local_commit_and_refusals_answer_at_once() {
    let t0 = Instant::now();
    let mut forwards = Forwards::new(7, 2);
    let register = forwards
        .begin("a", request(Operation::Register, 0), t0)
        .unwrap();
    let logout = forwards
        .begin("b", request(Operation::Logout, 5), t0)
        .unwrap();
    let full = forwards
        .begin("c", request(Operation::Register, 0), t0)
        .unwrap();
    assert_ne!(register, logout);
    assert_eq!(register >> 120, 2, "the replica in the nonce's top byte");

    // In progress: the result follows. Ok at watermark 10 with this node at 8: waits.
    assert!(matches!(
        forwards.on_result(register, 4, false, 0, 0, 8),
        OnResult::Waiting
    ));
    assert!(matches!(
        forwards.on_result(register, 0, false, 10, 10, 8),
        OnResult::Waiting
    ));
    assert!(forwards.release(9, t0).is_empty());
    let released = forwards.release(10, t0);
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].0.connection, "a");
    assert_eq!(released[0].1, Answer::Ok { epoch: 10 });
    assert!(matches!(
        forwards.on_result(register, 0, false, 10, 10, 10),
        OnResult::Unknown
    ));

    // A logout's Ok with the watermark committed already answers at once.
    match forwards.on_result(logout, 0, true, 0, 6, 10) {
        OnResult::Answer(pending, Answer::Ok { .. }) => assert_eq!(pending.request.request, 5),
        other => panic!("{other:?}"),
    }
    // PipelineFull answers PipelineFull; anything else (a byte out of range too)
    // Unavailable.
    match forwards.on_result(full, 3, false, 0, 0, 10) {
        OnResult::Answer(_, answer) => assert_eq!(answer, Answer::Refused(Status::PipelineFull)),
        other => panic!("{other:?}"),
    }
    let odd = forwards
        .begin("d", request(Operation::Register, 0), t0)
        .unwrap();
    match forwards.on_result(odd, 9, false, 0, 0, 10) {
        OnResult::Answer(_, answer) => assert_eq!(answer, Answer::Refused(Status::Unavailable)),
        other => panic!("{other:?}"),
    }
    assert!(forwards.is_empty());
}

#[test]
fn unanswered_requests_time_out_and_the_table_is_bounded() {
    let t0 = Instant::now();
    let mut forwards = Forwards::new(7, 0);
    for _ in 0..FORWARDS_MAX {
        assert!(forwards
            .begin(1u32, request(Operation::Register, 0), t0)
            .is_some());
    }
    assert_eq!(
        forwards.begin(1u32, request(Operation::Register, 0), t0),
        None
    );
    // The nonces count up from the base: cancel the last one sent.
    let last = forwards.nonce_base ^ u128::from(forwards.sent);
    assert!(forwards.cancel(last).is_some());
    assert!(forwards.cancel(last).is_none());
    assert_eq!(forwards.len(), FORWARDS_MAX - 1);
    assert!(forwards
        .release(u64::MAX, t0 + FORWARD_TIMEOUT / 2)
        .is_empty());
    let released = forwards.release(0, t0 + FORWARD_TIMEOUT);
    assert_eq!(released.len(), FORWARDS_MAX - 1);
    assert!(released
        .iter()
        .all(|(_, answer)| *answer == Answer::Refused(Status::Unavailable)));
    assert!(forwards.is_empty());
}

#[test]
fn a_primary_forgets_forwarded_clients_after_twice_the_timeout() {
    let t0 = Instant::now();
    let mut clients = ForwardedClients::default();
    clients.insert(1, 2, 99, false, t0);
    clients.insert(3, 1, 98, true, t0 + FORWARD_TIMEOUT);
    clients.expire(t0 + FORWARD_TIMEOUT * 2);
    assert_eq!(clients.take(1), None, "expired");
    let kept = clients.take(3).expect("kept");
    assert_eq!((kept.backup, kept.nonce, kept.logout), (1, 98, true));
    assert_eq!(clients.take(3), None, "taken once");
    assert!(clients.is_empty());
}
