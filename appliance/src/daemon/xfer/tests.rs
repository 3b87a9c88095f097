//! The server's freezing and hashing of offers, driven directly (no replica executor:
//! what the thread would hand it is read from its queue).

use super::*;
use journal::Durability;

fn settings(dir: &Path) -> XferSettings {
    XferSettings {
        cluster: 7,
        replica: 0,
        data_dir: dir.to_path_buf(),
        partition: PartitionConfig {
            segment_size_max: 64 << 20,
            index_interval_bytes: 4096,
            durability: Durability::EveryBatch,
        },
        chunk_max: statexfer::server::CHUNK_MAX_DEFAULT,
        max_message_size: 1 << 20,
        fetcher: fetcher_config(),
        rate_max: 0,
    }
}

/// Runs `test` with an `Xfer` whose messages to the replica executor are kept in its
/// queue (never flushed).
fn with_xfer(test: impl FnOnce(&mut Xfer, &Path) + 'static) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().to_path_buf();
    journal::runtime::block_on(async move {
        let (sender, receiver) = glommio::channels::shared_channel::new_bounded(16);
        let (outbox, _inbox) =
            futures_lite::future::zip(sender.connect(), receiver.connect()).await;
        let stats = Arc::new(Mutex::new(StateTransferStats::default()));
        let mut xfer = Xfer::new(settings(&path), outbox, stats);
        test(&mut xfer, &path);
    })
    .expect("executor");
    drop(dir);
}

fn frozen(group: u64, commit_op: u64, file: &Path, len: u64) -> Frozen {
    Frozen {
        group,
        commit_op,
        commit_max: commit_op,
        artifacts: vec![
            (
                ArtifactKind::ClientTable,
                0,
                Content::Bytes(vec![commit_op as u8; 64]),
            ),
            (
                ArtifactKind::SegmentLog,
                0,
                Content::File {
                    path: file.to_path_buf(),
                    len,
                },
            ),
        ],
        links: None,
    }
}

/// Freezes the queue asks the replica executor for, by group.
fn freezes_asked(xfer: &Xfer) -> Vec<u64> {
    xfer.pending
        .borrow()
        .iter()
        .filter_map(|m| match m {
            FromXfer::Freeze { group } => Some(*group),
            _ => None,
        })
        .collect()
}

/// A job as `on_frozen` queues it, answered `age` ago.
fn job(frozen: Frozen, age: Duration) -> Hashing {
    Hashing {
        entries: Vec::new(),
        frozen,
        frozen_at: Instant::now() - age,
    }
}

#[test]
fn a_freeze_hashed_within_the_freshness_bound_is_offered() {
    with_xfer(|xfer, dir| {
        let file = dir.join("segment");
        std::fs::write(&file, vec![5u8; 100_000]).expect("segment");
        xfer.on_frozen(frozen(1, 40, &file, 100_000));
        let offer = xfer.offers.get(&1).expect("offered at once (unpaced)");
        assert_eq!(offer.offer.commit_op, 40);
        assert_eq!(offer.offer.manifest.entries.len(), 2);
        assert_eq!(
            offer.offer.manifest.entries[1].checksum,
            xxhash_rust::xxh3::xxh3_64(&[5u8; 100_000])
        );
        assert!(freezes_asked(xfer).is_empty());
        assert!(!xfer.freezing.contains_key(&1));
        assert_eq!(xfer.totals.refreezes, 0);
    });
}

#[test]
fn a_stale_freeze_is_frozen_again_and_a_second_stale_one_still_offered_after_the_bound() {
    with_xfer(|xfer, dir| {
        let file = dir.join("segment");
        std::fs::write(&file, vec![9u8; 200_000]).expect("segment");
        let stale = OFFER_FRESH + Duration::from_millis(200);
        for round in 1..=REFREEZES_MAX {
            xfer.finish_offer(job(frozen(3, 10 * u64::from(round), &file, 200_000), stale));
            assert!(!xfer.offers.contains_key(&3), "round {round}: not offered");
            assert_eq!(freezes_asked(xfer).len(), round as usize, "asked again");
            assert!(
                xfer.freezing.contains_key(&3),
                "answered transient meanwhile"
            );
            assert_eq!(xfer.totals.refreezes, u64::from(round));
        }
        // Past the bound a stale freeze is offered as it is (a cluster that outgrows
        // the paced hashing must still get an offer).
        xfer.finish_offer(job(frozen(3, 99, &file, 200_000), stale));
        assert_eq!(xfer.offers.get(&3).map(|o| o.offer.commit_op), Some(99));
        assert!(!xfer.refreezes.contains_key(&3));
        // And the count starts over for the next stale one.
        xfer.finish_offer(job(frozen(3, 120, &file, 200_000), stale));
        assert_eq!(freezes_asked(xfer).len(), REFREEZES_MAX as usize + 1);
    });
}

#[test]
fn a_refreeze_is_hashed_before_a_group_hashed_for_the_first_time() {
    with_xfer(|xfer, dir| {
        xfer.settings.rate_max = 1 << 20; // 52 KiB per step: hashing spans steps
        let big = dir.join("big");
        std::fs::write(&big, vec![1u8; 4 << 20]).expect("big segment");
        let small = dir.join("small");
        std::fs::write(&small, vec![2u8; 200_000]).expect("small segment");
        // Group 5's first freeze is being hashed, a step at a time.
        xfer.on_frozen(frozen(5, 50, &big, 4 << 20));
        assert!(!xfer.offers.contains_key(&5));
        // Group 6's stale freeze was replaced; the fresh one arrives.
        xfer.finish_offer(job(frozen(6, 60, &small, 150_000), OFFER_FRESH * 2));
        xfer.on_frozen(frozen(6, 61, &small, 200_000));
        for _ in 0..4 {
            xfer.hash_step();
        }
        assert_eq!(xfer.offers.get(&6).map(|o| o.offer.commit_op), Some(61));
        assert!(!xfer.offers.contains_key(&5), "group 5 still hashing");
        // Group 5 resumes where it was and completes with the right checksum.
        for _ in 0..200 {
            xfer.hash_step();
        }
        let offer = xfer.offers.get(&5).expect("group 5 offered");
        assert_eq!(
            offer.offer.manifest.entries[1].checksum,
            xxhash_rust::xxh3::xxh3_64(&vec![1u8; 4 << 20])
        );
    });
}
