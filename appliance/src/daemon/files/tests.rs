use super::vsr_superblock::{
    encode_vsr_superblock, vsr_slot, MAGIC_VSR_SLOT, VSR_SLOT_BLOCK, VSR_SLOT_HEAD, VSR_SLOT_SIZE,
};
use super::*;
use replication::vsr::Superblock as VsrSuperblock;
use replication::wire::{Header, PrepareHeader};

#[test]
fn metadata_checkpoint_payload_round_trips_and_truncation_is_refused() {
    let bytes = encode_metadata_checkpoint(b"state", b"", b"anchor bytes");
    let (state, clients, anchor) = decode_metadata_checkpoint(&bytes).unwrap();
    assert_eq!(
        (state, clients, anchor),
        (&b"state"[..], &b""[..], &b"anchor bytes"[..])
    );
    assert!(decode_metadata_checkpoint(&bytes[..bytes.len() - 1]).is_err());
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(decode_metadata_checkpoint(&longer).is_err());
}

#[test]
fn vsr_superblock_round_trips_and_damage_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert_eq!(
        read_vsr_superblock(dir.path()).expect("absent is default"),
        VsrSuperblock::default()
    );
    let mut header = PrepareHeader::new();
    header.op = 3;
    let mut superblock = VsrSuperblock {
        view: 4,
        log_view: 4,
        headers: vec![header],
        replacement: false,
        unformed: false,
    };
    write_vsr_superblock(dir.path(), &superblock).expect("write");
    assert_eq!(read_vsr_superblock(dir.path()).expect("read"), superblock);
    superblock.replacement = true;
    write_vsr_superblock(dir.path(), &superblock).expect("write");
    assert_eq!(read_vsr_superblock(dir.path()).expect("read"), superblock);
    superblock.replacement = false;
    superblock.unformed = true;
    write_vsr_superblock(dir.path(), &superblock).expect("write");
    assert_eq!(read_vsr_superblock(dir.path()).expect("read"), superblock);
    // Three writes: slot 0, slot 1, slot 0 again. Damage to the newest copy leaves the
    // one before it; damage to both is refused.
    let path = dir.path().join(VSR_SUPERBLOCK_FILE);
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[VSR_SLOT_HEAD + 2] ^= 1;
    std::fs::write(&path, &bytes).expect("write");
    let previous = read_vsr_superblock(dir.path()).expect("older copy");
    assert!(previous.replacement && !previous.unformed);
    bytes[VSR_SLOT_SIZE + VSR_SLOT_HEAD + 2] ^= 1;
    std::fs::write(&path, &bytes).expect("write");
    assert!(read_vsr_superblock(dir.path()).is_err());
}

fn superblock_of_view(view: u32, headers: usize) -> VsrSuperblock {
    VsrSuperblock {
        view,
        log_view: view,
        headers: (0..headers)
            .map(|op| {
                let mut header = PrepareHeader::new();
                header.op = op as u64 + 1;
                header.frame.view = view;
                header
            })
            .collect(),
        replacement: false,
        unformed: false,
    }
}

#[test]
fn vsr_superblocks_written_unsynced_are_read_after_one_file_system_sync() {
    let root = tempfile::tempdir().expect("tempdir");
    let shared = SharedSync::open(root.path()).expect("handle");
    let dirs: Vec<_> = (0..3).map(|g| root.path().join(format!("g{g}"))).collect();
    for (g, dir) in dirs.iter().enumerate() {
        create_vsr_superblock(dir, true).expect("create");
        // The first write of an empty file, then one in place: both unsynced.
        write_vsr_superblock_unsynced(dir, &superblock_of_view(1, 1)).expect("write");
        write_vsr_superblock_unsynced(dir, &superblock_of_view(2 + g as u32, 2)).expect("write");
    }
    shared.sync().expect("syncfs");
    for (g, dir) in dirs.iter().enumerate() {
        assert_eq!(
            read_vsr_superblock(dir).expect("read"),
            superblock_of_view(2 + g as u32, 2)
        );
    }
    let missing = root.path().join("missing");
    assert!(SharedSync::open(&missing).is_err());
}

#[test]
fn staged_checkpoints_replace_the_old_only_when_committed() {
    let root = tempfile::tempdir().expect("tempdir");
    let checkpoint = |op: u64| StoredCheckpoint {
        op,
        position: replication::wire::batch::PartitionPosition {
            partition_id: 7,
            next_offset: op * 100,
            last_timestamp: op * 1_000,
        },
        clients: vec![op as u8; 40],
    };
    let shared = SharedSync::open(root.path()).expect("handle");
    let dirs: Vec<_> = (0..3).map(|g| root.path().join(format!("g{g}"))).collect();
    for dir in &dirs {
        std::fs::create_dir(dir).expect("dir");
        write_checkpoint(dir, &checkpoint(1)).expect("write");
        stage_checkpoint(dir, &checkpoint(2)).expect("stage");
        // Staged only: a crash here finds the old checkpoint.
        assert_eq!(read_checkpoint(dir).expect("read"), Some(checkpoint(1)));
    }
    shared.sync().expect("syncfs");
    for dir in &dirs[..2] {
        commit_staged_checkpoint(dir).expect("commit");
    }
    shared.sync().expect("syncfs");
    for dir in &dirs[..2] {
        assert_eq!(read_checkpoint(dir).expect("read"), Some(checkpoint(2)));
    }
    assert_eq!(
        read_checkpoint(&dirs[2]).expect("read"),
        Some(checkpoint(1))
    );
    // A leftover staged file is overwritten by the next one.
    stage_checkpoint(&dirs[2], &checkpoint(3)).expect("stage");
    commit_staged_checkpoint(&dirs[2]).expect("commit");
    assert_eq!(
        read_checkpoint(&dirs[2]).expect("read"),
        Some(checkpoint(3))
    );
    // Nothing staged: the commit fails and the checkpoint stays.
    assert!(commit_staged_checkpoint(&dirs[2]).is_err());
    assert_eq!(
        read_checkpoint(&dirs[2]).expect("read"),
        Some(checkpoint(3))
    );
}

#[test]
fn vsr_superblock_torn_write_keeps_the_newest_durable_copy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(VSR_SUPERBLOCK_FILE);
    create_vsr_superblock(dir.path(), true).expect("create");
    assert_eq!(
        read_vsr_superblock(dir.path()).expect("read"),
        VsrSuperblock::default()
    );
    // Each slot's first block is written, the rest of the first slot is a hole.
    let created = std::fs::metadata(&path).expect("metadata");
    assert_eq!(created.len(), (VSR_SLOT_SIZE + VSR_SLOT_BLOCK) as u64);
    use std::os::unix::fs::MetadataExt;
    assert!(created.blocks() * 512 <= 2 * VSR_SLOT_BLOCK as u64);
    for view in 1..=4 {
        let superblock = superblock_of_view(view, (view as usize * 40).min(SUFFIX_HEADERS_MAX));
        write_vsr_superblock(dir.path(), &superblock).expect("write");
        assert_eq!(read_vsr_superblock(dir.path()).expect("read"), superblock);
    }
    // View 4 is in slot 0 (sequence 5, after the default and three views); a write
    // of view 5 into slot 1 tears after every possible prefix: view 4 stays the
    // superblock.
    let newest = superblock_of_view(4, 128);
    let torn = vsr_slot(6, &encode_vsr_superblock(&superblock_of_view(5, 3)));
    let clean = std::fs::read(&path).expect("read");
    for cut in [1, VSR_SLOT_HEAD, VSR_SLOT_HEAD + 100, torn.len() - 1] {
        let mut bytes = clean.clone();
        bytes[VSR_SLOT_SIZE..VSR_SLOT_SIZE + cut].copy_from_slice(&torn[..cut]);
        std::fs::write(&path, &bytes).expect("write");
        assert_eq!(
            read_vsr_superblock(dir.path()).expect("read"),
            newest,
            "cut {cut}"
        );
        // The next write goes over the torn slot again, never over view 4.
        let mut next = superblock_of_view(6, 2);
        next.unformed = true;
        write_vsr_superblock(dir.path(), &next).expect("write");
        assert_eq!(read_vsr_superblock(dir.path()).expect("read"), next);
        let after = std::fs::read(&path).expect("read");
        assert_eq!(after[..VSR_SLOT_SIZE], clean[..VSR_SLOT_SIZE], "cut {cut}");
    }
}

#[test]
fn vsr_superblock_written_whole_is_read_and_replaced_by_slots() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(VSR_SUPERBLOCK_FILE);
    let old = superblock_of_view(7, 5);
    write_durable(&path, MAGIC_VSR, &encode_vsr_superblock(&old)).expect("write");
    assert_eq!(read_vsr_superblock(dir.path()).expect("read"), old);
    let new = superblock_of_view(8, 1);
    write_vsr_superblock(dir.path(), &new).expect("write");
    assert_eq!(&std::fs::read(&path).expect("read")[..4], MAGIC_VSR_SLOT);
    assert_eq!(read_vsr_superblock(dir.path()).expect("read"), new);
    // An empty file (created, never synced) is view 0; creating keeps a file there.
    std::fs::write(&path, b"").expect("write");
    assert_eq!(
        read_vsr_superblock(dir.path()).expect("read"),
        VsrSuperblock::default()
    );
    create_vsr_superblock(dir.path(), true).expect("create");
    assert!(std::fs::read(&path).expect("read").is_empty());
    write_vsr_superblock(dir.path(), &new).expect("write");
    assert_eq!(read_vsr_superblock(dir.path()).expect("read"), new);
    create_vsr_superblock(dir.path(), true).expect("create");
    assert_eq!(read_vsr_superblock(dir.path()).expect("read"), new);
    // A file with neither layout is refused, not taken for view 0.
    std::fs::write(&path, vec![7u8; 100]).expect("write");
    assert!(read_vsr_superblock(dir.path()).is_err());
}

#[test]
fn client_table_artifact_round_trips_and_damage_is_refused() {
    let artifact = ClientTableArtifact {
        op: 42,
        position: replication::wire::batch::PartitionPosition {
            partition_id: 7,
            next_offset: 1000,
            last_timestamp: 99,
        },
        clients: b"clients".to_vec(),
        anchor: vec![5; 300],
    };
    let bytes = artifact.encode();
    assert_eq!(ClientTableArtifact::decode(&bytes), Ok(artifact));
    for cut in [0, 3, 20, 40, bytes.len() - 1] {
        assert!(
            ClientTableArtifact::decode(&bytes[..cut]).is_err(),
            "cut {cut}"
        );
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(ClientTableArtifact::decode(&longer).is_err());
    let mut magic = bytes;
    magic[0] ^= 1;
    assert!(ClientTableArtifact::decode(&magic).is_err());
}

#[test]
fn genesis_round_trips_and_missing_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert!(read_genesis(dir.path()).is_err());
    write_genesis(dir.path(), b"state").expect("write");
    assert_eq!(read_genesis(dir.path()).expect("read"), b"state");
}
