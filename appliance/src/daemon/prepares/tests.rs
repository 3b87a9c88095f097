use super::*;
use replication::wire::{Header, PrepareChain};

/// Records of ops 1..=n chained by identity, batch i covering offsets 10i..10i+10.
fn chain(n: u64) -> Vec<Record> {
    let mut chain = PrepareChain::after(0);
    (1..=n)
        .map(|op| {
            let mut header = PrepareHeader::new();
            header.op = op;
            header.group = 7;
            let frame = chain.append(&mut header, &[]);
            let (header, _) = PrepareHeader::read_from_prefix(frame.as_bytes()).unwrap();
            Record {
                header,
                base_offset: (op - 1) * 10,
                next_offset: op * 10,
                last_timestamp: op,
                inline: if op % 3 == 0 {
                    vec![op as u8; 13]
                } else {
                    Vec::new()
                },
            }
        })
        .collect()
}

fn ops(records: &[Record]) -> Vec<u64> {
    records.iter().map(Record::op).collect()
}

fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    journal::runtime::block_on(future).expect("executor")
}

#[test]
fn a_failed_read_names_the_record_and_an_io_error_keeps_its_os_code() {
    let dir = tempfile::tempdir().unwrap();
    let records = chain(3);
    block_on(async {
        let (mut log, _) = PrepareLog::open(dir.path()).await.unwrap();
        log.append_many(&records).await.unwrap();
        log.sync().await.unwrap();
        assert!(matches!(
            log.read_record(9),
            Err(PrepareLogError::NoRecord { op: 9 })
        ));
        let path = dir.path().join(PREPARES_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        let second = Record::decode(&bytes).unwrap().1;
        bytes[second + 40] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let damaged = log.read_record(2).unwrap_err();
        assert!(
            matches!(damaged, PrepareLogError::Corrupt { op: Some(2), .. }),
            "{damaged}"
        );
        assert!(damaged
            .to_string()
            .ends_with("the record of op 2 is damaged"));
        log.close().await.unwrap();
    });
    // A folder where the file should be: the read's OS error is the source.
    let other = tempfile::tempdir().unwrap();
    std::fs::create_dir(other.path().join(PREPARES_FILE)).unwrap();
    let error = match block_on(PrepareLog::open(other.path())) {
        Err(error) => error,
        Ok(_) => panic!("a folder read as a prepare log"),
    };
    let source = std::error::Error::source(&error).expect("an IO source");
    let source = source
        .downcast_ref::<std::io::Error>()
        .expect("an io::Error");
    assert_eq!(source.raw_os_error(), Some(libc::EISDIR), "{error}");
}

#[test]
fn records_survive_a_reopen_and_a_torn_or_unchained_tail_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let records = chain(6);
    block_on(async {
        let (mut log, held) = PrepareLog::open(dir.path()).await.unwrap();
        assert!(held.is_empty());
        for record in &records {
            log.append(record).await.unwrap();
        }
        log.close().await.unwrap();
        let (log, held) = PrepareLog::open(dir.path()).await.unwrap();
        assert_eq!(ops(&held), [1, 2, 3, 4, 5, 6]);
        assert_eq!(held[2].inline, vec![3u8; 13]);
        assert_eq!(log.get(4).map(|e| e.base_offset), Some(30));
        log.close().await.unwrap();
    });
    // Tear the last record: it goes, the rest stays.
    let path = dir.path().join(PREPARES_FILE);
    let len = std::fs::metadata(&path).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(len - 5).unwrap();
    // A record from another chain appended after op 5 breaks the chain there.
    block_on(async {
        let (log, held) = PrepareLog::open(dir.path()).await.unwrap();
        assert_eq!(ops(&held), [1, 2, 3, 4, 5]);
        log.close().await.unwrap();
    });
    let mut foreign = chain(6).pop().unwrap();
    foreign.header.parent ^= 1;
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(&foreign.encode());
    std::fs::write(&path, &bytes).unwrap();
    block_on(async {
        let (log, held) = PrepareLog::open(dir.path()).await.unwrap();
        assert_eq!(ops(&held), [1, 2, 3, 4, 5], "unchained record dropped");
        log.close().await.unwrap();
    });
    // A flipped byte in the middle ends the log there.
    let mut bytes = std::fs::read(&path).unwrap();
    let second = Record::decode(&bytes).unwrap().1;
    bytes[second + 100] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    block_on(async {
        let (log, held) = PrepareLog::open(dir.path()).await.unwrap();
        assert_eq!(ops(&held), [1]);
        log.close().await.unwrap();
    });
}

#[test]
fn records_appended_together_read_back_like_records_appended_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let records = chain(9);
    block_on(async {
        let (mut log, _) = PrepareLog::open(dir.path()).await.unwrap();
        log.append(&records[0]).await.unwrap();
        log.append_many(&records[1..5]).await.unwrap();
        assert_eq!(log.head(), 5);
        assert_eq!(log.get(3).map(|e| e.base_offset), Some(20));
        // A group that skips an op is refused whole.
        let gapped = [records[5].clone(), records[7].clone()];
        assert!(matches!(
            log.append_many(&gapped).await,
            Err(PrepareLogError::OutOfOrder { op: 8, after: 6 })
        ));
        assert_eq!(log.head(), 5);
        log.append_many(&records[5..]).await.unwrap();
        log.close().await.unwrap();
        let (log, held) = PrepareLog::open(dir.path()).await.unwrap();
        assert_eq!(ops(&held), (1..=9).collect::<Vec<_>>());
        assert_eq!(held[5].inline, vec![6u8; 13]);
        log.close().await.unwrap();
    });
}

/// Descriptors of this process open on `path`.
fn descriptors_on(path: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target == path)
        .count()
}

#[test]
fn an_idle_log_holds_no_file_open_and_reopens_for_the_next_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().canonicalize().unwrap().join(PREPARES_FILE);
    let records = chain(8);
    block_on(async {
        let (mut log, _) = PrepareLog::open(dir.path()).await.unwrap();
        assert!(!log.is_open());
        assert!(
            matches!(
                log.plan_many(&records[..1]),
                Err(PrepareLogError::NotOpen { .. })
            ),
            "planned only when open"
        );
        log.append_many(&records[..3]).await.unwrap();
        assert!(log.is_open());
        assert_eq!(descriptors_on(&path), 1);
        // Written within the idle time: kept open.
        assert!(!log.close_idle(Duration::from_secs(60)).await.unwrap());
        // A planned write holds the file: not closed under it.
        let planned = log.plan_many(&records[3..4]).unwrap();
        assert!(!log.close_idle(Duration::ZERO).await.unwrap());
        planned.run().await.unwrap();
        assert!(log.close_idle(Duration::ZERO).await.unwrap());
        assert!(!log.is_open());
        assert_eq!(descriptors_on(&path), 0);
        // Closed: the index still answers, truncation and compaction work on the
        // file, a sync has nothing to do, and the next write opens it again.
        assert_eq!(log.get(4).map(|e| e.base_offset), Some(30));
        log.sync().await.unwrap();
        log.compact(2).await.unwrap();
        assert!(!log.is_open(), "compaction leaves a closed log closed");
        log.truncate_after(3).await.unwrap();
        assert_eq!(log.head(), 3);
        assert!(!log.is_open(), "truncation leaves a closed log closed");
        assert_eq!(descriptors_on(&path), 0);
        log.append_many(&records[3..8]).await.unwrap();
        assert!(log.is_open());
        log.close().await.unwrap();
        assert_eq!(descriptors_on(&path), 0);
        let (log, held) = PrepareLog::open(dir.path()).await.unwrap();
        assert_eq!(ops(&held), [2, 3, 4, 5, 6, 7, 8]);
        assert!(
            !log.is_open(),
            "opening reads the records, the file stays closed"
        );
        assert_eq!(descriptors_on(&path), 0);
        log.close().await.unwrap();
    });
}

#[test]
fn truncation_and_compaction_keep_the_right_records() {
    let dir = tempfile::tempdir().unwrap();
    let records = chain(10);
    block_on(async {
        let (mut log, _) = PrepareLog::open(dir.path()).await.unwrap();
        for record in &records[..8] {
            log.append(record).await.unwrap();
        }
        assert!(
            matches!(
                log.append(&records[9]).await,
                Err(PrepareLogError::OutOfOrder { op: 10, after: 8 })
            ),
            "a gap is refused"
        );
        log.truncate_after(6).await.unwrap();
        assert_eq!(log.head(), 6);
        log.append(&records[6]).await.unwrap();
        log.compact(4).await.unwrap();
        assert!(log.get(3).is_none());
        assert_eq!(log.get(4).map(|e| e.next_offset), Some(40));
        log.append(&records[7]).await.unwrap();
        log.close().await.unwrap();
        let (log, held) = PrepareLog::open(dir.path()).await.unwrap();
        assert_eq!(ops(&held), [4, 5, 6, 7, 8]);
        assert_eq!(held[2].inline, vec![6u8; 13]);
        log.close().await.unwrap();
    });
}
