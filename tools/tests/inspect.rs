//! appliance-inspect frame, run as a process the way operators and scripts run it.

use std::process::Command;

use replication::wire::{CommitHeader, Frame, Header, RequestPreparesHeader, METADATA_GROUP};
use serde_json::Value;

fn inspect(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_appliance-inspect"))
        .args(args)
        .output()
        .expect("appliance-inspect runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn commit_frame() -> Frame {
    let mut h = CommitHeader::new();
    h.frame.view = 3;
    h.commit = 17;
    h.timestamp_monotonic = 99;
    h.group = METADATA_GROUP;
    Frame::build(&h, &[])
}

#[test]
fn json_report_names_every_field_with_decimal_strings() {
    let (code, stdout, _) = inspect(&["frame", "--json", "--hex", &hex(commit_frame().as_bytes())]);
    assert_eq!(code, 0);
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["command"], "Commit");
    assert_eq!(report["valid"], true);
    assert_eq!(report["body_len"], 0);
    assert_eq!(report["fields"]["commit"], "17");
    assert_eq!(report["fields"]["timestamp_monotonic"], "99");
    assert_eq!(report["fields"]["view"], "3");
    assert_eq!(report["fields"]["group"], (1u64 << 63).to_string());
    assert_eq!(report["fields"]["command"], "9");
    assert!(report["fields"].get("reserved_tail").is_none());
}

#[test]
fn concatenated_frames_from_a_file_are_each_reported_and_a_bad_one_exits_1() {
    let mut bytes = commit_frame().as_bytes().to_vec();
    let mut repair = RequestPreparesHeader::new();
    repair.nonce = 1;
    repair.from_op = 5;
    repair.to_op = 4;
    repair.group = METADATA_GROUP;
    bytes.extend_from_slice(Frame::build(&repair, &[]).as_bytes());
    let dir = std::env::temp_dir().join(format!("inspect-frame-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("frames.bin");
    std::fs::write(&path, &bytes).unwrap();
    let (code, stdout, _) = inspect(&["frame", "--json", "--file", path.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(code, 1);
    let reports: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(reports.len(), 2);
    assert_eq!(reports[0]["valid"], true);
    assert_eq!(reports[1]["command"], "RequestPrepares");
    assert_eq!(reports[1]["valid"], false);
    assert_eq!(reports[1]["reason_code"], "repair_range_invalid");
    assert_eq!(reports[1]["fields"]["from_op"], "5");
}

#[test]
fn a_tampered_frame_is_reported_invalid_with_its_reason() {
    let mut bytes = commit_frame().as_bytes().to_vec();
    bytes[152] ^= 1;
    let (code, stdout, _) = inspect(&["frame", "--json", "--hex", &hex(&bytes)]);
    assert_eq!(code, 1);
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["reason_code"], "frame_seal_mismatch");
}

#[test]
fn bad_hex_is_a_usage_error_with_one_line_on_stderr() {
    let (code, _, stderr) = inspect(&["frame", "--hex", "zz"]);
    assert_eq!(code, 2);
    assert_eq!(stderr.lines().count(), 1);
    assert!(stderr.contains("hex"));
    let (code, _, _) = inspect(&["frame"]);
    assert_eq!(code, 2);
}

#[test]
fn manifest_report_lists_artifacts_and_flags_a_corrupt_file() {
    use statexfer::{ArtifactKind, Manifest, ManifestEntry};
    let manifest = Manifest {
        entries: vec![ManifestEntry {
            kind: ArtifactKind::SegmentLog,
            frontier: 4096,
            len: 10,
            checksum: 0xab,
        }],
    };
    let dir = std::env::temp_dir().join(format!("inspect-manifest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("manifest.ism1");
    std::fs::write(&path, manifest.encode()).unwrap();
    let (code, stdout, _) = inspect(&["manifest", "--json", path.to_str().unwrap()]);
    assert_eq!(code, 0);
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["entries"][0]["kind"], "SEGMENT_LOG");
    assert_eq!(report["entries"][0]["frontier"], "4096");
    let mut corrupt = manifest.encode();
    corrupt[12] ^= 1;
    std::fs::write(&path, corrupt).unwrap();
    let (code, stdout, _) = inspect(&["manifest", path.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(code, 1);
    assert!(stdout.contains("trailer"), "{stdout}");
}

fn formatted_dir(name: &str) -> std::path::PathBuf {
    use journal::superblock::Superblock;
    let dir = std::env::temp_dir().join(format!("inspect-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let layout = journal::JournalLayout::new(64, 64 * 1024).unwrap();
    let identity = Superblock {
        sequence: 0,
        cluster: 42,
        replica: 0,
        replica_count: 3,
        view: 0,
        log_view: 0,
        commit: 0,
        op_checkpoint: 0,
        snapshot_checksum: 0,
        snapshot_len: 0,
    };
    let target = dir.clone();
    journal::runtime::block_on(async move {
        journal::data_dir::format(&target, layout, identity).await
    })
    .unwrap()
    .unwrap();
    dir
}

#[test]
fn journal_and_superblock_reports_of_a_fresh_data_dir_are_ok() {
    let dir = formatted_dir("fresh");
    let path = dir.to_str().unwrap();
    let (code, stdout, stderr) = inspect(&["journal", "verify", "--json", path]);
    assert_eq!(code, 0, "{stderr}");
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["ok"], true);
    assert_eq!(report["layout"]["slot_count"], 64);
    let (code, stdout, _) = inspect(&["superblock", "--json", path]);
    assert_eq!(code, 0);
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["current"]["cluster"], "42");
    assert_eq!(report["current"]["replica_count"], 3);
    let (code, _, _) = inspect(&["journal", "dump", path]);
    assert_eq!(code, 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_damaged_superblock_copy_is_reported_and_a_missing_dir_is_a_runtime_error() {
    let dir = formatted_dir("damaged");
    let file = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .contains("superblock")
        })
        .expect("a superblock file");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[40] ^= 0xff;
    std::fs::write(&file, &bytes).unwrap();
    let (code, stdout, _) = inspect(&["superblock", "--json", dir.to_str().unwrap()]);
    assert_eq!(code, 1, "a damaged copy makes the report not ok");
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["ok"], false);
    assert!(report["current"].is_object(), "another copy still wins");
    std::fs::remove_dir_all(&dir).unwrap();
    let (code, _, stderr) = inspect(&["journal", "verify", "/nonexistent/appliance-data"]);
    assert_eq!(code, 1);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn a_garbage_segment_file_is_not_reported_ok() {
    let dir = std::env::temp_dir().join(format!("inspect-segment-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("00000000000000000000.log");
    std::fs::write(&path, vec![0xa5u8; 8192]).unwrap();
    for action in ["verify", "dump"] {
        let (code, stdout, stderr) =
            inspect(&["segment", action, "--json", path.to_str().unwrap()]);
        assert_eq!(code, 1, "{stdout}{stderr}");
        if let Ok(report) = serde_json::from_str::<Value>(stdout.trim()) {
            let ok = report.get("ok").or_else(|| report["report"].get("ok"));
            assert_eq!(ok, Some(&Value::Bool(false)), "{report}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn partition_prepare(body: &[u8]) -> Frame {
    use replication::wire::{Operation, PartitionKey, PrepareHeader};
    let mut h = PrepareHeader::new();
    h.op = 5;
    h.operation = Operation::SendMessages as u8;
    h.group = PartitionKey {
        stream: 1,
        topic: 1,
        partition: 0,
    }
    .pack()
    .expect("key");
    Frame::build(&h, body)
}

#[test]
fn a_partition_prepare_gets_a_frame_verdict_and_a_batch_verdict_apart() {
    let (code, stdout, _) = inspect(&[
        "frame",
        "--json",
        "--hex",
        &hex(partition_prepare(&[7; 64]).as_bytes()),
    ]);
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["command"], "Prepare");
    assert_eq!(report["valid"], true, "{report}");
    assert_eq!(report["batch"]["valid"], false, "{report}");
    assert!(report["batch"]["reason"].as_str().is_some());
    assert_eq!(
        code, 1,
        "a prepare whose batch replicas refuse is not a good frame"
    );
    // A frame without a batch has none to report.
    let (_, stdout, _) = inspect(&["frame", "--json", "--hex", &hex(commit_frame().as_bytes())]);
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert!(report["batch"].is_null());
}

#[test]
fn a_routed_request_shows_its_target_group() {
    use replication::wire::{Operation, RequestHeader};
    let mut h = RequestHeader::new();
    h.client = 9;
    h.operation = Operation::NonReplicated as u8;
    let frame = Frame::build(&h, &[]);
    let mut bytes = frame.as_bytes().to_vec();
    let (_, stdout, _) = inspect(&["frame", "--json", "--hex", &hex(&bytes)]);
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert!(report["fields"].get("group").is_none(), "{report}");
    let group = 42u64 << 32 | 7;
    bytes[248..256].copy_from_slice(&group.to_le_bytes());
    let (code, stdout, _) = inspect(&["frame", "--json", "--hex", &hex(&bytes)]);
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["valid"], true, "{report}");
    assert_eq!(report["fields"]["group"], group.to_string());
    assert_eq!(code, 0);
}
