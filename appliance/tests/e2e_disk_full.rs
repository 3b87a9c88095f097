//! A single node on a small loop-mounted ext4 file system (needs root, as CI runs): a
//! producer that fills the storage budget gets StorageFull while reads go on; a foreign
//! file that fills the disk outright gets the same, the node stays up, restarts on the
//! full disk and serves reads, and takes writes again once the file is gone. Every
//! acknowledged message reads back throughout.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use appliance::client::{Client, ClientError, ClientOptions, RetryPolicy};
use appliance::protocol::reply::split_poll_body;
use appliance::protocol::{Consumer, PollStrategy, Retention, Status};
use common::*;
use replication::wire::batch;
use replication::wire::PartitionKey;

/// Messages per batch and bytes per message payload.
const PER_BATCH: u64 = 100;
const PAYLOAD: usize = 1024;

/// An ext4 image mounted on a loop device for the test's life.
struct LoopMount {
    mount: PathBuf,
}

impl LoopMount {
    /// None when not root (mounting needs it); the test then says it did not run,
    /// unless REQUIRE_LOOP_MOUNT is set (CI), where that is a failure.
    fn new(dir: &Path, mib: u64) -> Option<LoopMount> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var_os("REQUIRE_LOOP_MOUNT").is_none(),
                "REQUIRE_LOOP_MOUNT is set but the test does not run as root"
            );
            return None;
        }
        let image = dir.join("disk.img");
        let mount = dir.join("mnt");
        std::fs::create_dir_all(&mount).expect("mount point");
        let file = std::fs::File::create(&image).expect("image");
        file.set_len(mib << 20).expect("image size");
        run("mkfs.ext4", &["-q", "-F", &image.display().to_string()]);
        run(
            "mount",
            &[
                "-o",
                "loop",
                &image.display().to_string(),
                &mount.display().to_string(),
            ],
        );
        Some(LoopMount { mount })
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(status.success(), "{program} {args:?}: {status}");
}

/// Free bytes of the file system at `path`.
fn free_bytes(path: &Path) -> u64 {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and statvfs buffer.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut stat) }, 0);
    stat.f_bavail as u64 * stat.f_frsize as u64
}

fn batch_at(first: u64) -> Vec<u8> {
    numbered_batch(first, PER_BATCH as usize, PAYLOAD)
}

fn connect(files: &ClusterFiles) -> Client {
    let options = ClientOptions {
        request_timeout: Duration::from_secs(2),
        retry: RetryPolicy {
            total_timeout: Duration::from_secs(15),
            ..RetryPolicy::default()
        },
        ..ClientOptions::default()
    };
    let mut client = Client::connect(&[files.client_addr(0)], options).expect("connect");
    client
        .login("root", ROOT_PASSWORD.as_bytes())
        .expect("login");
    client.register().expect("register");
    client
}

/// Reads the partition from offset 0 and checks it holds exactly the acknowledged
/// messages `0..acked`, in order, with their payloads.
fn read_back(client: &mut Client, key: PartitionKey, acked: u64) {
    let mut offset = 0u64;
    while offset < acked {
        let body = client
            .poll_messages(key, Consumer::Single(1), PollStrategy::Offset(offset), 1000)
            .expect("poll");
        let batches = split_poll_body(&body).expect("verified batches");
        assert!(!batches.is_empty(), "the log ended at {offset} of {acked}");
        for (bytes, _) in batches {
            for message in batch::messages(bytes) {
                if message.offset < offset {
                    continue;
                }
                assert_eq!(message.offset, offset, "gap or duplicate");
                assert_eq!(message.id, u128::from(offset) + 1);
                assert_eq!(message.payload, &numbered_payload(offset, PAYLOAD)[..]);
                offset += 1;
            }
        }
    }
    assert_eq!(offset, acked);
}

/// Sends batches until one is refused; returns the messages acknowledged (the offsets
/// are dense from `acked`) and the refusal.
fn produce_until_refused(
    client: &mut Client,
    key: PartitionKey,
    mut acked: u64,
    bytes_max: u64,
) -> (u64, ClientError) {
    let started = acked;
    loop {
        assert!(
            (acked - started) * PAYLOAD as u64 <= bytes_max,
            "no refusal after {} messages",
            acked - started
        );
        match client.send_messages(key, &batch_at(acked)) {
            Ok(reply) => {
                assert_eq!(reply.base_offset, acked, "dense offsets");
                acked += PER_BATCH;
            }
            Err(error) => return (acked, error),
        }
    }
}

fn one_partition(client: &mut Client) -> PartitionKey {
    let stream = client.create_stream("s").expect("stream");
    let topic = client.create_topic(stream, "t", 1).expect("topic");
    PartitionKey {
        stream,
        topic,
        partition: 0,
    }
}

fn alive(daemon: &mut Daemon) -> bool {
    daemon
        .child
        .as_mut()
        .is_some_and(|c| c.try_wait().ok().flatten().is_none())
}

/// Waits for /stats to say `storage.full` is `full` and `counted` of the storage
/// object; returns the storage object.
fn wait_storage(
    files: &ClusterFiles,
    full: bool,
    counted: impl Fn(&serde_json::Value) -> bool,
    within: Duration,
) -> serde_json::Value {
    let deadline = Instant::now() + within;
    loop {
        if let Some((200, body)) = http_get(files.http_addr(0), "/stats") {
            let stats: serde_json::Value = serde_json::from_str(&body).expect("json");
            let storage = &stats["storage"];
            if storage["full"].as_bool() == Some(full) && counted(storage) {
                return storage.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "storage.full never became {full}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn any(_: &serde_json::Value) -> bool {
    true
}

fn setup(files: &ClusterFiles, mount: &LoopMount, storage: &str) {
    let data = mount.mount.join("data");
    files.edit_configs(&[
        (
            &format!("data_dir = \"{}\"\n", files.data_dir(0).display()),
            &format!("data_dir = \"{}\"\n", data.display()),
        ),
        (
            "reserve_bytes = \"4 MiB\"\nmin_free_bytes = \"256 MiB\"\n",
            &format!("{storage}\n"),
        ),
    ]);
}

#[test]
fn a_producer_that_fills_the_budget_is_refused_and_reads_go_on() {
    let files = ClusterFiles::new(1);
    let Some(mount) = LoopMount::new(files.dir.path(), 160) else {
        eprintln!("not run: mounting a test file system needs root");
        return;
    };
    // The journal (16 MiB) and the reserve (4 MiB) come first; then about 24 MiB of
    // messages fit before free space falls below the budget.
    let min_free = free_bytes(&mount.mount) - (44 << 20);
    setup(
        &files,
        &mount,
        &format!("min_free_bytes = {min_free}\nreserve_bytes = \"4 MiB\""),
    );
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(30));
    let mut client = connect(&files);
    let key = one_partition(&mut client);

    let (acked, refusal) = produce_until_refused(&mut client, key, 0, 60 << 20);
    assert_eq!(refusal.status(), Some(Status::StorageFull), "{refusal:?}");
    assert!(acked * PAYLOAD as u64 >= 16 << 20, "refused after {acked}");
    let storage = wait_storage(
        &files,
        true,
        |s| s["writes_refused"].as_u64() >= Some(1),
        Duration::from_secs(5),
    );
    assert!(
        storage["full_reason"]
            .as_str()
            .is_some_and(|r| r.contains("min_free_bytes")),
        "{storage}"
    );
    let (code, body) = http_get(files.http_addr(0), "/health").expect("health");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("storage full"), "{body}");
    // Creations are refused too; reads go on and every acknowledged message is there.
    let create = client.create_stream("more").expect_err("refused");
    assert_eq!(create.status(), Some(Status::StorageFull));
    read_back(&mut client, key, acked);
    assert!(alive(&mut daemon), "the node is up");

    // Retention frees space (the topic may hold 8 MiB): writes resume by themselves.
    client
        .update_topic(
            key.stream,
            key.topic,
            Retention {
                message_expiry: Retention::NEVER,
                max_topic_size: 8 << 20,
            },
        )
        .expect("update topic");
    let deadline = Instant::now() + Duration::from_secs(30);
    let resumed_at = loop {
        match client.send_messages(key, &batch_at(acked)) {
            Ok(reply) => break reply.base_offset,
            Err(error) => {
                assert_eq!(error.status(), Some(Status::StorageFull), "{error:?}");
                assert!(Instant::now() < deadline, "writes never resumed");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    };
    assert_eq!(resumed_at, acked, "offsets go on where they were");
    wait_storage(&files, false, any, Duration::from_secs(5));
    let first =
        client.list_topics(key.stream).expect("list topics").topics[0].stored[0].first_offset;
    assert!(first > 0, "retention moved the first offset");
    assert!(alive(&mut daemon), "the node is up");
}

#[test]
fn a_disk_filled_by_another_file_stops_writes_not_the_node() {
    let files = ClusterFiles::new(1);
    let Some(mount) = LoopMount::new(files.dir.path(), 128) else {
        eprintln!("not run: mounting a test file system needs root");
        return;
    };
    // No budget margin: the first sign of trouble is a write that meets ENOSPC.
    setup(
        &files,
        &mount,
        "min_free_bytes = 0\nreserve_bytes = \"4 MiB\"",
    );
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(30));
    let mut client = connect(&files);
    let key = one_partition(&mut client);
    let mut acked = 0;
    for _ in 0..20 {
        client.send_messages(key, &batch_at(acked)).expect("send");
        acked += PER_BATCH;
    }

    // Another process fills the file system to the last block.
    let filler = mount.mount.join("filler");
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&filler).expect("filler");
        let block = vec![0x5au8; 1 << 20];
        while file.write_all(&block).is_ok() {}
        let small = [0u8; 4096];
        while file.write_all(&small).is_ok() {}
        let _ = file.sync_all();
    }
    let (acked_full, refusal) = produce_until_refused(&mut client, key, acked, 8 << 20);
    assert_eq!(refusal.status(), Some(Status::StorageFull), "{refusal:?}");
    acked = acked_full;
    let storage = wait_storage(
        &files,
        true,
        |s| s["no_space_errors"].as_u64() >= Some(1),
        Duration::from_secs(5),
    );
    assert_eq!(storage["stopped_groups"].as_u64(), Some(1), "{storage}");
    assert!(alive(&mut daemon), "the node is up");
    read_back(&mut client, key, acked);

    // A restart on the full disk opens and serves reads.
    daemon.kill();
    let mut daemon = Daemon::start(&files, 0);
    // It gave its reserve back before: with no room to take it again, it refuses writes.
    let storage = wait_storage(&files, true, any, Duration::from_secs(30));
    assert!(
        storage["full_reason"]
            .as_str()
            .is_some_and(|r| r.contains("reserve")),
        "{storage}"
    );
    let mut client = connect(&files);
    read_back(&mut client, key, acked);
    assert!(alive(&mut daemon), "the node is up on the full disk");

    // The operator frees space: writes resume by themselves.
    std::fs::remove_file(&filler).expect("remove filler");
    wait_storage(&files, false, any, Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match client.send_messages(key, &batch_at(acked)) {
            Ok(reply) => {
                assert_eq!(reply.base_offset, acked);
                acked += PER_BATCH;
                break;
            }
            Err(error) => {
                assert!(Instant::now() < deadline, "writes never resumed: {error:?}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    for _ in 0..5 {
        client
            .send_messages(key, &batch_at(acked))
            .expect("send after space returned");
        acked += PER_BATCH;
    }
    read_back(&mut client, key, acked);
    let stats = stats(&files, 0);
    assert_eq!(stats["storage"]["stopped_groups"].as_u64(), Some(0));
}
