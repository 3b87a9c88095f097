//! State transfer between a server and a fetcher, every frame through wire::decode:
//! lockstep chunking, whole-artifact verification and refetch, stalls and peer
//! switching, refusals, and atomic install under crashes.

use std::collections::HashMap;

use replication::wire::{decode, FrameBuf, Limits, Message, METADATA_GROUP};
use statexfer::install::{self, FileSink, InstallStep};
use statexfer::{
    ArtifactKind, FetchError, Fetcher, FetcherConfig, MemoryArtifacts, Outcome, Server,
};

const CLUSTER: u128 = 7;
const GROUP: u64 = METADATA_GROUP;

fn source(seed: u8) -> MemoryArtifacts {
    let bytes = |len: usize, salt: u8| {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ salt ^ seed)
            .collect::<Vec<u8>>()
    };
    MemoryArtifacts::offering(
        900,
        vec![
            (ArtifactKind::MetadataSnapshot, 900, bytes(10_000, 1)),
            (ArtifactKind::ClientTable, 900, Vec::new()),
            (ArtifactKind::SegmentLog, 0, bytes(70_001, 2)),
            (ArtifactKind::ConsumerOffsets, 900, bytes(33, 3)),
        ],
    )
}

fn config() -> FetcherConfig {
    FetcherConfig {
        chunk_len: 4096,
        artifacts_in_flight_max: 2,
        stall_ticks: 5,
        retries_max: 2,
        refetches_max: 2,
        peer_rounds_max: 2,
        transient_retry_ticks: 1,
    }
}

/// A tiny network: peers by id, each a server with its source; `drop_from` silences a
/// peer; `corrupt_chunk` flips a byte in the n-th chunk body delivered.
struct Net {
    servers: HashMap<u8, (Server, MemoryArtifacts)>,
    drop_from: Vec<u8>,
    corrupt_chunk: Option<usize>,
    chunks_delivered: usize,
    /// The process "dies" after this many chunks.
    stop_after_chunks: Option<usize>,
    /// Chunk requests sent and not yet answered, per artifact, and the worst seen.
    pending: HashMap<u32, usize>,
    max_in_flight_per_artifact: usize,
    /// The offset of the first chunk asked of each artifact.
    first_offsets: HashMap<u32, u64>,
}

impl Net {
    fn new(peers: &[(u8, MemoryArtifacts)], chunk_max: u32) -> Net {
        Net {
            servers: peers
                .iter()
                .map(|(id, src)| {
                    (
                        *id,
                        (Server::new(CLUSTER, *id, chunk_max, 64 << 20), src.clone()),
                    )
                })
                .collect(),
            drop_from: Vec::new(),
            corrupt_chunk: None,
            chunks_delivered: 0,
            stop_after_chunks: None,
            pending: HashMap::new(),
            max_in_flight_per_artifact: 0,
            first_offsets: HashMap::new(),
        }
    }

    /// Runs the transfer to an outcome or `ticks_max` ticks.
    fn run(
        &mut self,
        fetcher: &mut Fetcher,
        sink: &mut dyn statexfer::ArtifactSink,
        ticks_max: u64,
    ) -> Outcome {
        let limits = Limits::default();
        for now in 1..=ticks_max {
            while let Some((to, request)) = fetcher.poll_send() {
                if self
                    .stop_after_chunks
                    .is_some_and(|n| self.chunks_delivered >= n)
                {
                    return Outcome::InProgress;
                }
                let request = FrameBuf::from_bytes(request.as_bytes());
                let message = decode(request.as_bytes(), &limits).expect("fetcher frames decode");
                if self.drop_from.contains(&to) {
                    continue;
                }
                if let Message::RequestStateChunk(h) = message {
                    self.first_offsets.entry(h.artifact).or_insert(h.offset);
                    let pending = self.pending.entry(h.artifact).or_default();
                    *pending += 1;
                    self.max_in_flight_per_artifact = self.max_in_flight_per_artifact.max(*pending);
                }
                let Some((server, src)) = self.servers.get_mut(&to) else {
                    continue;
                };
                let reply = match message {
                    Message::RequestStateTransfer(h) => Some(server.on_request_transfer(h, src)),
                    Message::RequestStateChunk(h) => server.on_request_chunk(h, src),
                    other => panic!("unexpected {:?}", other.command()),
                };
                let Some(reply) = reply else { continue };
                let mut reply = FrameBuf::from_bytes(reply.as_bytes());
                match decode(reply.as_bytes(), &limits).expect("server frames decode") {
                    Message::StateTransferTarget(h, body) => fetcher.on_target(h, body, sink),
                    Message::StateChunk(h, _) => {
                        *self.pending.entry(h.artifact).or_default() -= 1;
                        self.chunks_delivered += 1;
                        if self.corrupt_chunk == Some(self.chunks_delivered) && reply.len() > 256 {
                            // Chunks carry no per-chunk integrity: the flip passes decode.
                            reply.as_bytes_mut()[256] ^= 0x40;
                        }
                        let Ok(Message::StateChunk(h, body)) = decode(reply.as_bytes(), &limits)
                        else {
                            panic!("a corrupted chunk body still decodes");
                        };
                        fetcher.on_chunk(h, body, sink);
                    }
                    other => panic!("unexpected reply {:?}", other.command()),
                }
            }
            match fetcher.outcome() {
                Outcome::InProgress => fetcher.tick(now),
                done => return done,
            }
        }
        fetcher.outcome()
    }
}

fn assert_same(sink: &MemoryArtifacts, src: &MemoryArtifacts) {
    assert_eq!(sink.artifacts.len(), src.artifacts.len());
    for (i, (a, b)) in sink.artifacts.iter().zip(&src.artifacts).enumerate() {
        assert!(
            a == b,
            "artifact {i} differs ({} vs {} bytes)",
            a.len(),
            b.len()
        );
    }
}

#[test]
fn fetcher_copies_every_artifact_in_lockstep_chunks() {
    let src = source(0);
    let mut net = Net::new(&[(1, src.clone())], 4096);
    let mut sink = MemoryArtifacts::default();
    let mut fetcher = Fetcher::start(CLUSTER, 0, GROUP, vec![1], config(), 11, 0);
    let outcome = net.run(&mut fetcher, &mut sink, 1_000);
    assert!(
        matches!(outcome, Outcome::Complete { commit_op: 900, .. }),
        "{outcome:?}"
    );
    assert_same(&sink, &src);
    assert_eq!(
        net.max_in_flight_per_artifact, 1,
        "at most one chunk in flight per artifact"
    );
    assert_eq!(fetcher.progress.bytes_done, fetcher.progress.bytes_total);
    assert_eq!(fetcher.progress.artifacts_done, 4);
}

#[test]
fn server_clamps_chunks_to_its_maximum() {
    let src = source(0);
    let mut net = Net::new(&[(1, src.clone())], 1000);
    let mut sink = MemoryArtifacts::default();
    let mut fetcher = Fetcher::start(CLUSTER, 0, GROUP, vec![1], config(), 11, 0);
    assert!(matches!(
        net.run(&mut fetcher, &mut sink, 1_000),
        Outcome::Complete { .. }
    ));
    assert_same(&sink, &src);
    // 10,000 + 70,001 + 33 bytes in chunks of at most 1,000.
    assert!(
        net.chunks_delivered >= 82,
        "{} chunks",
        net.chunks_delivered
    );
    let server = Server::new(CLUSTER, 1, 1 << 30, 4096);
    assert_eq!(server.chunk_max(), 4096 - 256, "clamped to the frame limit");
}

#[test]
fn a_chunk_corrupted_in_flight_is_caught_by_the_artifact_check_and_refetched() {
    let src = source(0);
    let mut net = Net::new(&[(1, src.clone())], 4096);
    net.corrupt_chunk = Some(3);
    let mut sink = MemoryArtifacts::default();
    let mut fetcher = Fetcher::start(CLUSTER, 0, GROUP, vec![1], config(), 11, 0);
    assert!(matches!(
        net.run(&mut fetcher, &mut sink, 1_000),
        Outcome::Complete { .. }
    ));
    assert_same(&sink, &src);
    assert_eq!(fetcher.progress.refetches, 1);
}

#[test]
fn a_silent_peer_is_abandoned_for_another() {
    let src = source(0);
    let mut net = Net::new(&[(1, src.clone()), (2, src.clone())], 4096);
    net.drop_from = vec![1];
    let mut sink = MemoryArtifacts::default();
    let mut fetcher = Fetcher::start(CLUSTER, 0, GROUP, vec![1, 2], config(), 11, 0);
    assert!(matches!(
        net.run(&mut fetcher, &mut sink, 1_000),
        Outcome::Complete { .. }
    ));
    assert_same(&sink, &src);
    assert!(
        fetcher.progress.stalls >= 3 && fetcher.progress.peer_switches == 1,
        "{:?}",
        fetcher.progress
    );
}

#[test]
fn a_refusing_peer_is_skipped_and_a_transient_one_asked_again() {
    let src = source(0);
    // A node that holds no state for the group.
    let empty = MemoryArtifacts::default();
    let mut busy = src.clone();
    busy.transient = true;
    let mut net = Net::new(&[(1, empty), (2, busy)], 4096);
    let mut sink = MemoryArtifacts::default();
    let mut fetcher = Fetcher::start(CLUSTER, 0, GROUP, vec![1, 2], config(), 11, 0);
    // Peer 1 refuses for good, peer 2 is busy: nothing completes yet.
    assert_eq!(net.run(&mut fetcher, &mut sink, 3), Outcome::InProgress);
    net.servers.get_mut(&2).unwrap().1.transient = false;
    assert!(matches!(
        net.run(&mut fetcher, &mut sink, 1_000),
        Outcome::Complete { .. }
    ));
    assert_same(&sink, &src);
}

#[test]
fn a_transfer_with_no_live_peer_fails_within_its_bounds() {
    let mut net = Net::new(&[(1, source(0))], 4096);
    net.drop_from = vec![1, 2];
    let mut sink = MemoryArtifacts::default();
    let mut fetcher = Fetcher::start(CLUSTER, 0, GROUP, vec![1, 2], config(), 11, 0);
    let outcome = net.run(&mut fetcher, &mut sink, 1_000);
    assert_eq!(
        outcome,
        Outcome::Failed(FetchError::PeersExhausted { rounds: 2 })
    );
}

#[test]
fn answers_to_an_old_nonce_are_ignored() {
    let src = source(0);
    let mut net = Net::new(&[(1, src.clone())], 4096);
    let mut sink = MemoryArtifacts::default();
    // A previous transfer's fetcher asked with another nonce; its answer must not count.
    let mut old = Fetcher::start(CLUSTER, 0, GROUP, vec![1], config(), 99, 0);
    let (_, request) = old.poll_send().unwrap();
    let request = FrameBuf::from_bytes(request.as_bytes());
    let Message::RequestStateTransfer(h) = decode(request.as_bytes(), &Limits::default()).unwrap()
    else {
        panic!()
    };
    let (server, source) = net.servers.get_mut(&1).unwrap();
    let stale = server.on_request_transfer(h, source);
    let stale = FrameBuf::from_bytes(stale.as_bytes());
    let mut fetcher = Fetcher::start(CLUSTER, 0, GROUP, vec![1], config(), 11, 0);
    let Message::StateTransferTarget(h, body) =
        decode(stale.as_bytes(), &Limits::default()).unwrap()
    else {
        panic!()
    };
    fetcher.on_target(h, body, &mut sink);
    assert_eq!(fetcher.progress.stale_frames, 1);
    assert!(matches!(
        net.run(&mut fetcher, &mut sink, 1_000),
        Outcome::Complete { .. }
    ));
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("statexfer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn fetch_into_files(staging: &std::path::Path, src: &MemoryArtifacts) -> statexfer::Manifest {
    let mut net = Net::new(&[(1, src.clone())], 4096);
    let mut sink = FileSink::create(staging).unwrap();
    let mut fetcher = Fetcher::start(CLUSTER, 0, GROUP, vec![1], config(), 11, 0);
    match net.run(&mut fetcher, &mut sink, 1_000) {
        Outcome::Complete { manifest, .. } => manifest,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_fetcher_killed_mid_transfer_and_restarted_completes() {
    let dir = temp_dir("restart");
    let staging = dir.join("staging");
    let src = source(5);
    // First attempt: stop after a few ticks, as if the process died.
    let mut net = Net::new(&[(1, src.clone())], 4096);
    let mut sink = FileSink::create(&staging).unwrap();
    net.stop_after_chunks = Some(5);
    let mut first = Fetcher::start(CLUSTER, 0, GROUP, vec![1], config(), 11, 0);
    assert_eq!(net.run(&mut first, &mut sink, 1_000), Outcome::InProgress);
    assert!(
        first.progress.bytes_done > 0 && first.progress.bytes_done < first.progress.bytes_total
    );
    drop((first, sink));
    // The restarted process recovers (clears staging) and fetches again.
    install::recover(&staging).unwrap();
    let manifest = fetch_into_files(&staging, &src);
    let live = dir.join("live");
    install::install(&staging, &live, &manifest, None).unwrap();
    assert_eq!(install::verify_installed(&live).unwrap(), manifest);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_crash_at_any_install_step_leaves_the_old_state_or_the_new_one() {
    for stop in [
        InstallStep::Synced,
        InstallStep::Swapped,
        InstallStep::Cleaned,
    ] {
        let dir = temp_dir(&format!("install-{stop:?}"));
        let (staging, live) = (dir.join("staging"), dir.join("live"));
        // The old state, installed.
        let old = fetch_into_files(&staging, &source(1));
        install::install(&staging, &live, &old, None).unwrap();
        // The new state, installed up to `stop`, then "crash" and recover.
        let new = fetch_into_files(&staging, &source(2));
        assert_ne!(old, new);
        install::install(&staging, &live, &new, Some(stop)).unwrap();
        install::recover(&staging).unwrap();
        let found = install::verify_installed(&live).unwrap();
        let expected = if stop == InstallStep::Synced {
            &old
        } else {
            &new
        };
        assert_eq!(&found, expected, "stopped after {stop:?}");
        assert!(!staging.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// A sink that already holds the bytes of some artifacts (sealed segments shared with
/// the server) and offers them instead of fetching; `wrong` holds bytes that differ.
struct ReusingSink {
    inner: MemoryArtifacts,
    held: HashMap<u32, Vec<u8>>,
    offered: Vec<u32>,
}

impl statexfer::ArtifactSink for ReusingSink {
    fn begin(&mut self, index: u32) -> std::io::Result<()> {
        self.inner.begin(index)
    }
    fn append(&mut self, index: u32, bytes: &[u8]) -> std::io::Result<()> {
        self.inner.append(index, bytes)
    }
    fn reuse(&mut self, index: u32, entry: &statexfer::ManifestEntry) -> bool {
        self.offered.push(index);
        let Some(bytes) = self.held.get(&index) else {
            return false;
        };
        if !entry.matches(bytes) {
            return false;
        }
        self.inner.begin(index).expect("begin");
        self.inner.append(index, bytes).expect("append");
        true
    }
}

#[test]
fn artifacts_the_fetcher_already_holds_are_reused_and_mismatching_ones_fetched() {
    let src = source(4);
    let mut net = Net::new(&[(1, src.clone())], 4096);
    let mut wrong = src.artifacts[0].clone();
    wrong[17] ^= 1;
    let mut sink = ReusingSink {
        inner: MemoryArtifacts::default(),
        // The segment is held as it is; the snapshot is held with one byte different.
        held: HashMap::from([(2, src.artifacts[2].clone()), (0, wrong)]),
        offered: Vec::new(),
    };
    let mut fetcher = Fetcher::start(CLUSTER, 0, GROUP, vec![1], config(), 21, 0);
    let outcome = net.run(&mut fetcher, &mut sink, 1_000);
    assert!(matches!(outcome, Outcome::Complete { .. }), "{outcome:?}");
    assert_same(&sink.inner, &src);
    let segment = src.artifacts[2].len() as u64;
    assert_eq!(fetcher.progress.bytes_reused, segment);
    assert_eq!(fetcher.progress.bytes_done, fetcher.progress.bytes_total);
    // Only the segment's chunks were never asked for.
    assert!(
        !net.pending.contains_key(&2),
        "the reused segment was fetched"
    );
    assert!(
        net.pending.contains_key(&0),
        "the differing snapshot was fetched"
    );
    assert_eq!(
        sink.offered,
        vec![0, 2, 3],
        "every non-empty artifact is offered"
    );
}

/// A sink that holds the first bytes of some artifacts (the part of the server's open
/// segment a node installed in an earlier round) and stages them instead of fetching.
struct PrefixSink {
    inner: MemoryArtifacts,
    prefixes: HashMap<u32, Vec<u8>>,
}

impl statexfer::ArtifactSink for PrefixSink {
    fn begin(&mut self, index: u32) -> std::io::Result<()> {
        self.inner.begin(index)
    }
    fn append(&mut self, index: u32, bytes: &[u8]) -> std::io::Result<()> {
        self.inner.append(index, bytes)
    }
    fn reuse_prefix(
        &mut self,
        index: u32,
        _entry: &statexfer::ManifestEntry,
    ) -> Option<(u64, xxhash_rust::xxh3::Xxh3Default)> {
        let prefix = self.prefixes.get(&index)?.clone();
        self.inner.begin(index).ok()?;
        self.inner.append(index, &prefix).ok()?;
        let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
        hasher.update(&prefix);
        Some((prefix.len() as u64, hasher))
    }
}

#[test]
fn a_held_prefix_of_an_artifact_is_staged_and_only_the_rest_fetched() {
    let src = source(5);
    let mut net = Net::new(&[(1, src.clone())], 4096);
    let held = 30_000;
    let mut sink = PrefixSink {
        inner: MemoryArtifacts::default(),
        prefixes: HashMap::from([(2, src.artifacts[2][..held].to_vec())]),
    };
    let mut fetcher = Fetcher::start(CLUSTER, 0, GROUP, vec![1], config(), 23, 0);
    let outcome = net.run(&mut fetcher, &mut sink, 1_000);
    assert!(matches!(outcome, Outcome::Complete { .. }), "{outcome:?}");
    assert_same(&sink.inner, &src);
    assert_eq!(fetcher.progress.bytes_reused, held as u64);
    assert_eq!(fetcher.progress.bytes_done, fetcher.progress.bytes_total);
    assert_eq!(fetcher.progress.refetches, 0);
    assert_eq!(net.first_offsets.get(&2), Some(&(held as u64)));
    assert_eq!(net.first_offsets.get(&0), Some(&0));
}

#[test]
fn a_held_prefix_that_differs_is_caught_by_the_artifact_check_and_fetched_whole() {
    let src = source(6);
    let mut net = Net::new(&[(1, src.clone())], 4096);
    let mut prefix = src.artifacts[2][..30_000].to_vec();
    prefix[12_345] ^= 0x10;
    let mut sink = PrefixSink {
        inner: MemoryArtifacts::default(),
        prefixes: HashMap::from([(2, prefix)]),
    };
    let mut fetcher = Fetcher::start(CLUSTER, 0, GROUP, vec![1], config(), 25, 0);
    let outcome = net.run(&mut fetcher, &mut sink, 1_000);
    assert!(matches!(outcome, Outcome::Complete { .. }), "{outcome:?}");
    assert_same(&sink.inner, &src);
    assert_eq!(fetcher.progress.refetches, 1);
    assert_eq!(fetcher.progress.bytes_done, fetcher.progress.bytes_total);
}

#[test]
fn a_held_prefix_as_long_as_the_artifact_is_not_taken_as_a_prefix() {
    // A sink that claims the whole artifact through reuse_prefix gets it fetched: only
    // `reuse` (checked against the manifest) may skip an artifact.
    let src = source(7);
    let mut net = Net::new(&[(1, src.clone())], 4096);
    let mut sink = PrefixSink {
        inner: MemoryArtifacts::default(),
        prefixes: HashMap::from([(2, src.artifacts[2].clone())]),
    };
    let mut fetcher = Fetcher::start(CLUSTER, 0, GROUP, vec![1], config(), 27, 0);
    let outcome = net.run(&mut fetcher, &mut sink, 1_000);
    assert!(matches!(outcome, Outcome::Complete { .. }), "{outcome:?}");
    assert_same(&sink.inner, &src);
    assert_eq!(net.first_offsets.get(&2), Some(&0));
    assert_eq!(fetcher.progress.bytes_reused, 0);
}

/// Stages into files written back as they grow, and checks that the fetcher finishes
/// each artifact once, only when all of its bytes were appended.
struct Recording {
    files: FileSink,
    appended: HashMap<u32, u64>,
    finished: Vec<u32>,
}

impl statexfer::ArtifactSink for Recording {
    fn begin(&mut self, index: u32) -> std::io::Result<()> {
        self.appended.insert(index, 0);
        self.files.begin(index)
    }

    fn append(&mut self, index: u32, bytes: &[u8]) -> std::io::Result<()> {
        *self.appended.entry(index).or_default() += bytes.len() as u64;
        self.files.append(index, bytes)
    }

    fn finish(&mut self, index: u32, manifest: &statexfer::Manifest) -> std::io::Result<()> {
        assert_eq!(
            self.appended.get(&index).copied(),
            Some(manifest.entries[index as usize].len),
            "artifact {index} finished whole"
        );
        self.finished.push(index);
        self.files.finish(index, manifest)
    }
}

#[test]
fn a_writing_back_file_sink_stages_interleaved_artifacts_whole_and_each_finishes_once() {
    let dir = temp_dir("write-back");
    let staging = dir.join("staging");
    let artifacts = (0..20u8)
        .map(|i| {
            let len = 5_000 + usize::from(i) * 777;
            let bytes = (0..len).map(|b| (b as u8).wrapping_mul(13) ^ i).collect();
            (ArtifactKind::SegmentLog, u64::from(i) * 100_000, bytes)
        })
        .collect();
    let src = MemoryArtifacts::offering(900, artifacts);
    let mut net = Net::new(&[(1, src.clone())], 4096);
    let mut sink = Recording {
        files: FileSink::create(&staging).unwrap().write_back_every(3000),
        appended: HashMap::new(),
        finished: Vec::new(),
    };
    // Several artifacts in flight: their chunks interleave in the sink.
    let config = FetcherConfig {
        artifacts_in_flight_max: 4,
        ..config()
    };
    let mut fetcher = Fetcher::start(CLUSTER, 0, GROUP, vec![1], config, 11, 0);
    let manifest = match net.run(&mut fetcher, &mut sink, 10_000) {
        Outcome::Complete { manifest, .. } => manifest,
        other => panic!("{other:?}"),
    };
    let mut finished = sink.finished.clone();
    finished.sort_unstable();
    assert_eq!(finished, (0..20).collect::<Vec<u32>>());
    for (index, want) in src.artifacts.iter().enumerate() {
        let staged = std::fs::read(staging.join(install::artifact_file(index as u32))).unwrap();
        assert!(&staged == want, "artifact {index} staged as sent");
    }
    let live = dir.join("live");
    install::install(&staging, &live, &manifest, None).unwrap();
    assert_eq!(install::verify_installed(&live).unwrap(), manifest);
}
