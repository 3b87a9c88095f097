//! The server's freezing and hashing of offers, driven directly (no replica executor:
//! what the thread would hand it is read from its queue).

use super::*;
use journal::Durability;
use replication::wire::Header;
use statexfer::ArtifactKind;

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
        keep: Links(None),
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

fn request(group: u64, nonce: u128) -> RequestStateTransferHeader {
    let mut request = RequestStateTransferHeader::new();
    request.group = group;
    request.nonce = nonce;
    request
}

#[test]
fn a_request_asks_for_a_freeze_and_the_hashed_files_are_offered() {
    with_xfer(|xfer, dir| {
        let file = dir.join("segment");
        std::fs::write(&file, vec![5u8; 100_000]).expect("segment");
        xfer.on_request_transfer(2, &request(1, 77));
        xfer.on_request_transfer(2, &request(1, 78));
        assert_eq!(freezes_asked(xfer), vec![1], "asked once");
        xfer.on_frozen(frozen(1, 40, &file, 100_000));
        let offer = xfer.offers.offer(1).expect("offered at once (unpaced)");
        assert_eq!(offer.offer.commit_op, 40);
        assert_eq!(offer.offer.manifest.entries.len(), 2);
        assert_eq!(
            offer.offer.manifest.entries[1].checksum,
            xxhash_rust::xxh3::xxh3_64(&[5u8; 100_000])
        );
        assert!(!xfer.offers.freezing(1));
        let offered = xfer.server.stats.targets_offered;
        xfer.on_request_transfer(2, &request(1, 79));
        assert_eq!(xfer.server.stats.targets_offered, offered + 1);
        assert_eq!(xfer.offers.serving_len(), 1);
    });
}

#[test]
fn paced_hashing_resumes_where_it_was_and_a_refreeze_reads_only_what_grew() {
    with_xfer(|xfer, dir| {
        xfer.settings.rate_max = 1 << 20; // 52 KiB per step: hashing spans steps
        xfer.offers = Offers::new(offer_policy(&xfer.settings));
        let big = dir.join("big");
        std::fs::write(&big, vec![1u8; 4 << 20]).expect("big segment");
        xfer.on_frozen(frozen(5, 50, &big, 3 << 20));
        let mut steps = 0;
        while xfer.offers.offer(5).is_none() {
            xfer.hash_step();
            steps += 1;
        }
        assert!(steps >= 55, "3 MiB at 52 KiB a step: {steps} steps");
        assert_eq!(
            xfer.offers
                .offer(5)
                .map(|o| o.offer.manifest.entries[1].checksum),
            Some(xxhash_rust::xxh3::xxh3_64(&vec![1u8; 3 << 20]))
        );
        // The segment grew by 100 KiB: a new freeze hashes that, not the whole file.
        xfer.on_frozen(frozen(5, 60, &big, (3 << 20) + 100_000));
        let mut steps = 0;
        while xfer.offers.offer(5).map(|o| o.offer.commit_op) != Some(60) {
            xfer.hash_step();
            steps += 1;
        }
        assert!(steps <= 2, "{steps} steps for 100 KB");
        assert_eq!(
            xfer.offers
                .offer(5)
                .map(|o| o.offer.manifest.entries[1].checksum),
            Some(xxhash_rust::xxh3::xxh3_64(&vec![1u8; (3 << 20) + 100_000]))
        );
    });
}

#[test]
fn an_unreadable_freeze_removes_its_links_and_a_released_offer_too() {
    with_xfer(|xfer, dir| {
        let links = dir.join("links-1");
        std::fs::create_dir_all(&links).expect("links");
        let mut bad = frozen(1, 10, &links.join("gone"), 10);
        bad.keep = Links(Some(links.clone()));
        xfer.on_frozen(bad);
        assert!(xfer.offers.offer(1).is_none());
        assert!(!links.exists(), "abandoned freeze's links removed");

        let links = dir.join("links-2");
        std::fs::create_dir_all(&links).expect("links");
        let file = links.join("segment");
        std::fs::write(&file, vec![3u8; 1000]).expect("segment");
        let mut good = frozen(2, 20, &file, 1000);
        good.keep = Links(Some(links.clone()));
        xfer.on_frozen(good);
        assert!(xfer.offers.offer(2).is_some());
        xfer.offers.expire(Instant::now() + OFFER_FRESH);
        assert!(xfer.offers.offer(2).is_none());
        assert!(!links.exists(), "released offer's links removed");
    });
}
