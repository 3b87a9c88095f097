use super::*;
use replication::wire::batch::{stamp, BatchBuilder, NewMessage};
use std::collections::BTreeMap;

const KEY: PartitionKey = PartitionKey {
    stream: 3,
    topic: 4,
    partition: 5,
};

/// A stamped batch of `count` messages at `base_offset`.
fn batch(base_offset: u64, count: u32) -> Vec<u8> {
    let mut builder = BatchBuilder::with_capacity(count as usize * 64);
    for i in 0..count {
        builder.push(NewMessage {
            id: u128::from(base_offset + u64::from(i)) + 1,
            timestamp_delta: 0,
            payload: &[7; 20],
            user_headers: &[],
        });
    }
    let mut bytes = builder.finish(1_000);
    stamp(&mut bytes, u64::from(KEY.partition), base_offset, 1_000).unwrap();
    bytes
}

/// A consumer-offset table in memory.
#[derive(Default)]
struct Offsets(BTreeMap<u64, u64>);

impl OffsetTable for Offsets {
    fn holds(&self, consumer: u64) -> bool {
        self.0.contains_key(&consumer)
    }

    fn consumers(&self) -> usize {
        self.0.len()
    }
}

impl Offsets {
    /// Performs an applied op's effect, as the daemon does with the stored table.
    fn perform(&mut self, effect: Effect) {
        match effect {
            Effect::None => {}
            Effect::StoreOffset { consumer, offset } => {
                self.0.insert(consumer, offset);
            }
            Effect::DeleteOffset { consumer } => {
                self.0.remove(&consumer);
            }
        }
    }
}

const SEND: u8 = Operation::SendMessages as u8;
const STORE: u8 = Operation::StoreConsumerOffset as u8;
const DELETE: u8 = Operation::DeleteConsumerOffset as u8;

#[test]
fn a_batch_moves_the_committed_end_and_is_confirmed_with_its_base_offset() {
    let mut state = PartitionState::opened(0, 0);
    let offsets = Offsets::default();
    let first = state.apply(KEY, 1, SEND, &batch(0, 10), &offsets).unwrap();
    let second = state.apply(KEY, 2, SEND, &batch(10, 5), &offsets).unwrap();
    assert_eq!((state.committed_op, state.committed_end), (2, 15));
    let confirmed = SendConfirmations::decode(&second.body)
        .unwrap()
        .confirmations;
    assert_eq!(first.status, Status::Ok);
    assert_eq!(second.effect, Effect::None);
    assert_eq!(
        (
            confirmed.len(),
            confirmed[0].base_offset,
            confirmed[0].topic_id,
            confirmed[0].partition_id
        ),
        (1, 10, KEY.topic, KEY.partition)
    );
}

#[test]
fn a_damaged_batch_is_an_error_and_applies_nothing() {
    let mut state = PartitionState::opened(4, 100);
    let mut damaged = batch(100, 3);
    damaged.truncate(100);
    assert!(state
        .apply(KEY, 5, SEND, &damaged, &Offsets::default())
        .is_err());
    assert_eq!(state, PartitionState::opened(4, 100));
}

#[test]
fn offsets_are_stored_deleted_and_refused_from_the_applied_state_alone() {
    let mut state = PartitionState::opened(0, 0);
    let mut offsets = Offsets::default();
    let mut op = 0;
    let mut apply = |operation, body: Vec<u8>, offsets: &mut Offsets| {
        op += 1;
        let applied = state.apply(KEY, op, operation, &body, offsets).unwrap();
        offsets.perform(applied.effect);
        (applied.status, applied.body)
    };
    let group = Consumer::Group(9);
    assert_eq!(
        apply(DELETE, offset_op_body(group, None), &mut offsets).0,
        Status::NotFound
    );
    assert_eq!(
        apply(STORE, offset_op_body(group, Some(42)), &mut offsets).0,
        Status::Ok
    );
    assert_eq!(offsets.0.get(&consumer_key(group)), Some(&42));
    // A single consumer of the same id is another consumer.
    assert!(!offsets.holds(consumer_key(Consumer::Single(9))));
    assert_eq!(
        apply(DELETE, offset_op_body(group, None), &mut offsets).0,
        Status::Ok
    );
    assert!(offsets.0.is_empty());
    // Bodies that name no consumer or no offset, an unknown kind, a foreign operation.
    let mut unknown_kind = offset_op_body(group, Some(1));
    unknown_kind[0] = 2;
    for (operation, body) in [
        (STORE, offset_op_body(group, None)),
        (STORE, unknown_kind),
        (DELETE, vec![0, 1]),
        (Operation::CreateTopic as u8, Vec::new()),
    ] {
        assert_eq!(
            apply(operation, body, &mut offsets).0,
            Status::InvalidRequest
        );
    }
    assert!(offsets.0.is_empty());
}

#[test]
fn a_consumer_past_the_limit_is_refused_and_a_known_one_still_moves() {
    let offsets = Offsets((0..CONSUMERS_MAX as u64).map(|c| (c, 0)).collect());
    let mut state = PartitionState::opened(0, 0);
    let past = offset_op_body(Consumer::Single(CONSUMERS_MAX as u32), Some(1));
    let refused = state.apply(KEY, 1, STORE, &past, &offsets).unwrap();
    assert_eq!(
        (refused.status, refused.body.as_slice(), refused.effect),
        (Status::LimitReached, &b"consumers"[..], Effect::None)
    );
    let known = offset_op_body(Consumer::Single(0), Some(7));
    let moved = state.apply(KEY, 2, STORE, &known, &offsets).unwrap();
    assert_eq!(
        moved.effect,
        Effect::StoreOffset {
            consumer: 0,
            offset: 7
        }
    );
    assert_eq!(state.committed_op, 2);
}

#[test]
fn a_checkpoint_is_needed_once_the_commit_point_is_applied_past_it() {
    let mut state = PartitionState::opened(3, 30);
    assert!(!state.applied_past_checkpoint() && !state.needs_checkpoint(3));
    state
        .apply(KEY, 4, SEND, &batch(30, 1), &Offsets::default())
        .unwrap();
    assert!(state.applied_past_checkpoint());
    // The group committed further than applied here: not yet.
    assert!(!state.needs_checkpoint(5) && state.needs_checkpoint(4));
    state.on_checkpoint(4);
    assert!(!state.applied_past_checkpoint() && !state.needs_checkpoint(4));
}

#[test]
#[should_panic(expected = "applied again")]
fn an_op_applied_twice_panics() {
    let mut state = PartitionState::opened(0, 0);
    let offsets = Offsets::default();
    state.apply(KEY, 1, SEND, &batch(0, 1), &offsets).unwrap();
    let _ = state.apply(KEY, 1, SEND, &batch(0, 1), &offsets);
}

#[test]
#[should_panic(expected = "past the committed op")]
fn a_checkpoint_past_the_applied_state_panics() {
    PartitionState::opened(2, 20).on_checkpoint(3);
}
