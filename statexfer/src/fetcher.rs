//! The state-transfer fetcher: pull-based and lockstep (at most one chunk in flight per
//! artifact), because per-peer queues drop overruns. Each artifact is verified whole by
//! length and XxHash3 against its manifest entry and refetched on mismatch; a stalled
//! peer is retried a bounded number of times, then the fetcher moves to another peer.
//! Sans-IO: verified frames and ticks in, frames out.

use std::collections::VecDeque;

use replication::wire::{
    Frame, Header, RequestStateChunkHeader, RequestStateTransferHeader, StateChunkHeader,
    StateTransferTargetHeader,
};
use xxhash_rust::xxh3::Xxh3Default;

use crate::artifact::ArtifactSink;
use crate::manifest::Manifest;

/// Bounds of one transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FetcherConfig {
    /// Bytes asked for per chunk (the server may clamp it).
    pub chunk_len: u32,
    /// Artifacts fetched at once, each with one chunk in flight.
    pub artifacts_in_flight_max: usize,
    /// Ticks without an answer before a request is sent again.
    pub stall_ticks: u64,
    /// Resends of one request before the fetcher moves to another peer.
    pub retries_max: u32,
    /// Whole-artifact refetches (checksum mismatch) before moving to another peer.
    pub refetches_max: u32,
    /// Rounds over every peer before the transfer fails.
    pub peer_rounds_max: u32,
    /// Ticks before asking again after an "unavailable, transient" answer (the server
    /// is freezing its state; it answers as soon as it is ready).
    pub transient_retry_ticks: u64,
}

impl Default for FetcherConfig {
    fn default() -> FetcherConfig {
        FetcherConfig {
            chunk_len: 1 << 20,
            artifacts_in_flight_max: 4,
            stall_ticks: 20,
            retries_max: 3,
            refetches_max: 2,
            peer_rounds_max: 3,
            transient_retry_ticks: 5,
        }
    }
}

/// Progress for the stats endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    pub commit_op: u64,
    pub artifacts_total: u64,
    pub artifacts_done: u64,
    pub bytes_total: u64,
    pub bytes_done: u64,
    pub refetches: u64,
    pub stalls: u64,
    pub peer_switches: u64,
    pub stale_frames: u64,
    /// Bytes staged from what this node already held instead of fetched.
    pub bytes_reused: u64,
}

/// Why a transfer failed for good.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FetchError {
    /// Every peer refused, stalled or served bad data for `rounds` rounds.
    PeersExhausted { rounds: u32 },
    /// The staging area could not be written.
    Sink(String),
}

impl core::fmt::Display for FetchError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            FetchError::PeersExhausted { rounds } => {
                write!(f, "no peer completed the transfer in {rounds} rounds")
            }
            FetchError::Sink(e) => write!(f, "writing the staged state failed: {e}"),
        }
    }
}

/// Where a transfer stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    InProgress,
    /// Every artifact is staged and verified: install it, then repair from commit_op.
    Complete {
        commit_op: u64,
        manifest: Manifest,
    },
    Failed(FetchError),
}

struct Artifact {
    len: u64,
    checksum: u64,
    received: u64,
    hasher: Xxh3Default,
    /// (offset asked, tick sent, resends)
    in_flight: Option<(u64, u64, u32)>,
    done: bool,
    refetches: u32,
}

impl core::fmt::Debug for Artifact {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Artifact")
            .field("len", &self.len)
            .field("received", &self.received)
            .field("in_flight", &self.in_flight)
            .field("done", &self.done)
            .finish()
    }
}

#[derive(Debug)]
enum State {
    /// Waiting for StateTransferTarget: (tick sent, resends, ticks to wait).
    Targeting(u64, u32, u64),
    Fetching {
        commit_op: u64,
        manifest: Manifest,
        artifacts: Vec<Artifact>,
    },
    Finished(Outcome),
}

/// Fetches one group's state from its peers.
#[derive(Debug)]
pub struct Fetcher {
    cluster: u128,
    replica: u8,
    group: u64,
    config: FetcherConfig,
    peers: Vec<u8>,
    peer: usize,
    rounds: u32,
    nonce: u128,
    now: u64,
    state: State,
    outbox: VecDeque<(u8, Frame)>,
    pub progress: Progress,
}

impl Fetcher {
    /// Starts a transfer of `group` from `peers` (in preference order). `nonce_seed`
    /// makes nonces distinct across transfers (the caller's PRNG or clock).
    pub fn start(
        cluster: u128,
        replica: u8,
        group: u64,
        peers: Vec<u8>,
        config: FetcherConfig,
        nonce_seed: u128,
        now: u64,
    ) -> Fetcher {
        let mut fetcher = Fetcher {
            cluster,
            replica,
            group,
            config,
            peers,
            peer: 0,
            rounds: 0,
            nonce: nonce_seed | 1,
            now,
            state: State::Targeting(now, 0, config.stall_ticks),
            outbox: VecDeque::new(),
            progress: Progress::default(),
        };
        if fetcher.peers.is_empty() {
            fetcher.state =
                State::Finished(Outcome::Failed(FetchError::PeersExhausted { rounds: 0 }));
        } else {
            fetcher.send_target_request();
        }
        fetcher
    }

    /// The next frame to send, with the peer it goes to.
    pub fn poll_send(&mut self) -> Option<(u8, Frame)> {
        self.outbox.pop_front()
    }

    /// Where the transfer stands.
    pub fn outcome(&self) -> Outcome {
        match &self.state {
            State::Finished(outcome) => outcome.clone(),
            _ => Outcome::InProgress,
        }
    }

    fn current_peer(&self) -> u8 {
        self.peers[self.peer % self.peers.len()]
    }

    fn send_target_request(&mut self) {
        let mut request = RequestStateTransferHeader::new();
        request.frame.cluster = self.cluster;
        request.frame.replica = self.replica;
        request.nonce = self.nonce;
        request.group = self.group;
        self.outbox
            .push_back((self.current_peer(), Frame::build(&request, &[])));
    }

    fn send_chunk_request(&mut self, index: usize, offset: u64) {
        let mut request = RequestStateChunkHeader::new();
        request.frame.cluster = self.cluster;
        request.frame.replica = self.replica;
        request.nonce = self.nonce;
        request.group = self.group;
        request.offset = offset;
        request.len = self.config.chunk_len;
        request.artifact = index as u32;
        self.outbox
            .push_back((self.current_peer(), Frame::build(&request, &[])));
    }

    /// Moves to the next peer with a fresh nonce (answers from the old one go stale).
    fn switch_peer(&mut self) {
        self.progress.peer_switches += 1;
        self.peer += 1;
        if self.peer.is_multiple_of(self.peers.len()) {
            self.rounds += 1;
            if self.rounds >= self.config.peer_rounds_max {
                self.state = State::Finished(Outcome::Failed(FetchError::PeersExhausted {
                    rounds: self.rounds,
                }));
                return;
            }
        }
        self.nonce = self.nonce.wrapping_add(2);
        self.state = State::Targeting(self.now, 0, self.config.stall_ticks);
        self.send_target_request();
    }

    /// Sends the next chunk request of every artifact that has none in flight, up to
    /// the artifacts-in-flight bound.
    fn pump(&mut self) {
        let State::Fetching { artifacts, .. } = &mut self.state else {
            return;
        };
        let mut in_flight = artifacts.iter().filter(|a| a.in_flight.is_some()).count();
        let mut requests = Vec::new();
        for (index, artifact) in artifacts.iter_mut().enumerate() {
            if in_flight >= self.config.artifacts_in_flight_max {
                break;
            }
            if !artifact.done && artifact.in_flight.is_none() {
                artifact.in_flight = Some((artifact.received, self.now, 0));
                requests.push((index, artifact.received));
                in_flight += 1;
            }
        }
        for (index, offset) in requests {
            self.send_chunk_request(index, offset);
        }
    }

    fn finish_if_complete(&mut self) {
        if let State::Fetching {
            commit_op,
            manifest,
            artifacts,
        } = &self.state
        {
            if artifacts.iter().all(|a| a.done) {
                self.state = State::Finished(Outcome::Complete {
                    commit_op: *commit_op,
                    manifest: manifest.clone(),
                });
            }
        }
    }

    /// Handles StateTransferTarget (and its body, the manifest).
    pub fn on_target(
        &mut self,
        target: &StateTransferTargetHeader,
        body: &[u8],
        sink: &mut dyn ArtifactSink,
    ) {
        if !matches!(self.state, State::Targeting(..))
            || target.nonce != self.nonce
            || target.group != self.group
        {
            self.progress.stale_frames += 1;
            return;
        }
        if target.available == 0 {
            if target.unavailable_transient != 0 {
                // Ask the same peer again shortly.
                let wait = self
                    .config
                    .transient_retry_ticks
                    .clamp(1, self.config.stall_ticks);
                self.state = State::Targeting(self.now, 0, wait);
            } else {
                self.switch_peer();
            }
            return;
        }
        let manifest = match Manifest::decode(body) {
            Ok(manifest) => manifest,
            // A manifest that does not decode is this peer's fault: try the next one.
            Err(_) => {
                self.switch_peer();
                return;
            }
        };
        let mut artifacts = Vec::with_capacity(manifest.entries.len());
        let mut reused = 0;
        for (index, entry) in manifest.entries.iter().enumerate() {
            let done = entry.len > 0 && sink.reuse(index as u32, entry);
            let mut received = 0;
            let mut hasher = Xxh3Default::new();
            if done {
                received = entry.len;
                reused += entry.len;
            } else {
                let prefix = match entry.len {
                    0 => None,
                    _ => sink.reuse_prefix(index as u32, entry),
                };
                match prefix {
                    Some((len, staged)) if len > 0 && len < entry.len => {
                        received = len;
                        hasher = staged;
                        reused += len;
                    }
                    _ => {
                        if let Err(e) = sink.begin(index as u32) {
                            self.state =
                                State::Finished(Outcome::Failed(FetchError::Sink(e.to_string())));
                            return;
                        }
                    }
                }
            }
            artifacts.push(Artifact {
                len: entry.len,
                checksum: entry.checksum,
                received,
                hasher,
                in_flight: None,
                done,
                refetches: 0,
            });
        }
        self.progress.commit_op = target.commit_op;
        self.progress.artifacts_total = artifacts.len() as u64;
        self.progress.artifacts_done = 0;
        self.progress.bytes_total = manifest.entries.iter().map(|e| e.len).sum();
        self.progress.bytes_done = reused;
        self.progress.bytes_reused += reused;
        // Zero-length artifacts are complete once their checksum matches the empty hash.
        for artifact in &mut artifacts {
            if artifact.len == 0 {
                artifact.done = artifact.hasher.digest() == artifact.checksum;
            }
        }
        self.progress.artifacts_done = artifacts.iter().filter(|a| a.done).count() as u64;
        self.state = State::Fetching {
            commit_op: target.commit_op,
            manifest,
            artifacts,
        };
        self.finish_if_complete();
        self.pump();
    }

    /// Handles StateChunk: appends it in order, verifies a finished artifact whole.
    pub fn on_chunk(&mut self, chunk: &StateChunkHeader, body: &[u8], sink: &mut dyn ArtifactSink) {
        let fresh = chunk.nonce == self.nonce && chunk.group == self.group;
        let State::Fetching {
            artifacts,
            manifest,
            ..
        } = &mut self.state
        else {
            self.progress.stale_frames += 1;
            return;
        };
        let index = chunk.artifact as usize;
        let expected = artifacts
            .get(index)
            .and_then(|a| a.in_flight)
            .map(|(offset, ..)| offset);
        if !fresh || expected != Some(chunk.offset) {
            self.progress.stale_frames += 1;
            return;
        }
        let artifact = &mut artifacts[index];
        artifact.in_flight = None;
        let overrun = artifact.received + body.len() as u64 > artifact.len;
        if body.is_empty() || overrun {
            // A peer that serves nothing, or more than the manifest says, is wrong for
            // this transfer: start the artifact over, counting it as a refetch.
            artifact.refetches += 1;
        } else {
            if let Err(e) = sink.append(index as u32, body) {
                self.state = State::Finished(Outcome::Failed(FetchError::Sink(e.to_string())));
                return;
            }
            artifact.hasher.update(body);
            artifact.received += body.len() as u64;
            self.progress.bytes_done += body.len() as u64;
            if artifact.received < artifact.len {
                self.pump();
                return;
            }
            if artifact.hasher.digest() == artifact.checksum {
                if let Err(e) = sink.finish(index as u32, manifest) {
                    self.state = State::Finished(Outcome::Failed(FetchError::Sink(e.to_string())));
                    return;
                }
                artifact.done = true;
                self.progress.artifacts_done += 1;
                self.finish_if_complete();
                self.pump();
                return;
            }
            artifact.refetches += 1;
        }
        // Refetch the artifact from its start.
        self.progress.refetches += 1;
        self.progress.bytes_done = self.progress.bytes_done.saturating_sub(artifact.received);
        artifact.received = 0;
        artifact.hasher = Xxh3Default::new();
        let give_up = artifact.refetches > self.config.refetches_max;
        if let Err(e) = sink.begin(index as u32) {
            self.state = State::Finished(Outcome::Failed(FetchError::Sink(e.to_string())));
            return;
        }
        if give_up {
            self.switch_peer();
        } else {
            self.pump();
        }
    }

    /// Advances time: resends stalled requests, moves off a peer that stays silent.
    pub fn tick(&mut self, now: u64) {
        self.now = now;
        let stall = self.config.stall_ticks;
        match &mut self.state {
            State::Targeting(sent, resends, wait) => {
                if now.saturating_sub(*sent) >= *wait {
                    if *wait >= stall {
                        self.progress.stalls += 1;
                    }
                    if *resends >= self.config.retries_max {
                        self.switch_peer();
                    } else {
                        *sent = now;
                        *resends += 1;
                        *wait = stall;
                        self.send_target_request();
                    }
                }
            }
            State::Fetching { artifacts, .. } => {
                let mut resend = Vec::new();
                let mut exhausted = false;
                for (index, artifact) in artifacts.iter_mut().enumerate() {
                    if let Some((offset, sent, resends)) = artifact.in_flight.as_mut() {
                        if now.saturating_sub(*sent) >= stall {
                            self.progress.stalls += 1;
                            if *resends >= self.config.retries_max {
                                exhausted = true;
                            } else {
                                *sent = now;
                                *resends += 1;
                                resend.push((index, *offset));
                            }
                        }
                    }
                }
                if exhausted {
                    // The transfer restarts from the next peer's offer; artifacts staged
                    // so far are begun again when its manifest arrives.
                    self.switch_peer();
                    return;
                }
                for (index, offset) in resend {
                    self.send_chunk_request(index, offset);
                }
            }
            State::Finished(_) => {}
        }
    }
}
