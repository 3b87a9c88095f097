//! The inspection reports `appliance-inspect` prints: they serialize to JSON with the
//! fields operators and scripts rely on, u128 values as decimal strings.

mod common;

use common::{batch, body, prepare, run};
use journal::data_dir::format;
use journal::inspect::{journal_dump, journal_verify, segment_dump, segment_verify, superblock};
use journal::journal::JOURNAL_FILE;
use journal::segment::{PartitionConfig, PartitionLog};
use journal::{Durability, Journal, JournalLayout, Superblock};

#[test]
fn journal_and_superblock_reports_serialize_with_their_verdicts() {
    let dir = tempfile::tempdir().unwrap();
    let identity = Superblock {
        cluster: u128::MAX - 1,
        ..Superblock::default()
    };
    run(async {
        format(
            dir.path(),
            JournalLayout::for_body_size(16, 1000).unwrap(),
            identity,
        )
        .await
        .unwrap();
        let (mut journal, _) = Journal::open(&dir.path().join(JOURNAL_FILE), 0)
            .await
            .unwrap();
        for op in 1..=3 {
            let _ = journal
                .append(&prepare(op, &body(op, 0, 50)))
                .await
                .unwrap();
        }
        journal.close().await.unwrap();
    });
    let verify = serde_json::to_value(journal_verify(dir.path()).unwrap()).unwrap();
    assert_eq!(verify["ok"], true);
    assert_eq!(verify["recovery"]["op_head"], 3);
    assert_eq!(verify["recovery"]["slots"][2]["status"], "valid");
    assert!(verify["recovery"]["slots"][2]["checksum"].is_string());
    let dump = serde_json::to_value(journal_dump(dir.path()).unwrap()).unwrap();
    assert_eq!(dump["slots"].as_array().unwrap().len(), 3);
    assert_eq!(dump["slots"][0]["op"], 1);
    let sb = serde_json::to_value(superblock(dir.path()).unwrap()).unwrap();
    assert_eq!(sb["current"]["cluster"], (u128::MAX - 1).to_string());
    assert_eq!(sb["copies"].as_array().unwrap().len(), 4);
    assert_eq!(sb["ok"], true);
}

#[test]
fn segment_reports_serialize_every_batch_and_message() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let config = PartitionConfig {
            segment_size_max: 1 << 20,
            index_interval_bytes: 4096,
            durability: Durability::EveryBatch,
        };
        let (mut log, _) = PartitionLog::open(dir.path(), 3, config).await.unwrap();
        let _ = log.append(&batch(3, 0, 10, 2, 20)).await.unwrap();
        let _ = log.append(&batch(3, 2, 11, 3, 20)).await.unwrap();
        log.close().await.unwrap();
    });
    let path = dir.path().join(format!("{:020}.log", 0));
    let report = serde_json::to_value(segment_verify(&path).unwrap()).unwrap();
    assert_eq!(report["ok"], true);
    assert_eq!(
        (report["batches"].clone(), report["next_offset"].clone()),
        (2.into(), 5.into())
    );
    assert_eq!(report["tail"]["kind"], "clean");
    let dump = serde_json::to_value(segment_dump(&path).unwrap()).unwrap();
    assert_eq!(dump["batches"][1]["base_offset"], 2);
    assert_eq!(dump["batches"][1]["messages"][2]["offset"], 4);
    assert_eq!(dump["batches"][1]["messages"][2]["id"], "4");
}
