//! Artifacts as the server reads them and the fetcher writes them. The daemon backs
//! these with files (sealed segments shared, the open segment and snapshots frozen for
//! the transfer); tests back them with memory.

use crate::manifest::Manifest;

/// One consistent state a server offers: its commit op and artifacts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offer {
    /// The commit op the artifacts were frozen at.
    pub commit_op: u64,
    /// The highest commit the server knows of (partition arm).
    pub commit_max: u64,
    pub manifest: Manifest,
}

/// Why a server cannot offer a state now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// Not now (e.g. a checkpoint is being taken); ask again.
    Transient,
    /// This node holds no state for the group.
    Permanent,
}

/// What a state-transfer server reads from.
pub trait ArtifactSource {
    /// The state offered for `group`, frozen until `release` (or a newer offer).
    fn offer(&mut self, group: u64) -> Result<Offer, Unavailable>;
    /// Reads bytes of artifact `index` at `offset` into `buf`; returns bytes read
    /// (0 at the end). `None`: no such artifact in the current offer.
    fn read(&mut self, group: u64, index: u32, offset: u64, buf: &mut [u8]) -> Option<usize>;
}

/// What a fetcher writes to (a staging area that `install` later makes live).
pub trait ArtifactSink {
    /// Starts (or restarts) artifact `index` empty.
    fn begin(&mut self, index: u32) -> std::io::Result<()>;
    /// Appends the next chunk of artifact `index` (chunks arrive in order).
    fn append(&mut self, index: u32, bytes: &[u8]) -> std::io::Result<()>;
    /// Artifact `index` of `manifest` is complete and verified by its checksum (no more
    /// appends until a `begin`). An error fails the transfer.
    fn finish(&mut self, index: u32, manifest: &crate::Manifest) -> std::io::Result<()> {
        let _ = (index, manifest);
        Ok(())
    }
    /// Offers to stage artifact `index` from bytes this node already holds (a sealed
    /// segment it shares with the server, say). True only when the staged bytes match
    /// `entry` by length and checksum; the fetcher then skips fetching it.
    fn reuse(&mut self, index: u32, entry: &crate::ManifestEntry) -> bool {
        let _ = (index, entry);
        false
    }
    /// Offered when `reuse` declined: stages the first bytes of artifact `index` from
    /// bytes this node already holds (the part of the server's open segment it has,
    /// say), as `begin` and `append` would. Returns how many it staged (more than 0,
    /// fewer than `entry.len`) and their running checksum; the fetcher fetches the rest
    /// and verifies the artifact whole, starting it over empty on a mismatch. `None`:
    /// nothing staged, the artifact is fetched from its start.
    fn reuse_prefix(
        &mut self,
        index: u32,
        entry: &crate::ManifestEntry,
    ) -> Option<(u64, xxhash_rust::xxh3::Xxh3Default)> {
        let _ = (index, entry);
        None
    }
}

/// An in-memory source and sink, for tests and the simulator.
#[derive(Clone, Debug, Default)]
pub struct MemoryArtifacts {
    pub offer: Option<Offer>,
    pub artifacts: Vec<Vec<u8>>,
    pub transient: bool,
}

impl MemoryArtifacts {
    /// A source offering `artifacts` at `commit_op`, with a matching manifest.
    pub fn offering(
        commit_op: u64,
        artifacts: Vec<(crate::ArtifactKind, u64, Vec<u8>)>,
    ) -> MemoryArtifacts {
        let entries = artifacts
            .iter()
            .map(|(kind, frontier, bytes)| crate::ManifestEntry {
                kind: *kind,
                frontier: *frontier,
                len: bytes.len() as u64,
                checksum: xxhash_rust::xxh3::xxh3_64(bytes),
            })
            .collect();
        MemoryArtifacts {
            offer: Some(Offer {
                commit_op,
                commit_max: commit_op,
                manifest: Manifest { entries },
            }),
            artifacts: artifacts.into_iter().map(|(_, _, bytes)| bytes).collect(),
            transient: false,
        }
    }
}

impl ArtifactSource for MemoryArtifacts {
    fn offer(&mut self, _group: u64) -> Result<Offer, Unavailable> {
        if self.transient {
            return Err(Unavailable::Transient);
        }
        self.offer.clone().ok_or(Unavailable::Permanent)
    }

    fn read(&mut self, _group: u64, index: u32, offset: u64, buf: &mut [u8]) -> Option<usize> {
        let artifact = self.artifacts.get(index as usize)?;
        let start = usize::try_from(offset).ok()?.min(artifact.len());
        let n = buf.len().min(artifact.len() - start);
        buf[..n].copy_from_slice(&artifact[start..start + n]);
        Some(n)
    }
}

impl ArtifactSink for MemoryArtifacts {
    fn begin(&mut self, index: u32) -> std::io::Result<()> {
        let index = index as usize;
        if self.artifacts.len() <= index {
            self.artifacts.resize(index + 1, Vec::new());
        }
        self.artifacts[index].clear();
        Ok(())
    }

    fn append(&mut self, index: u32, bytes: &[u8]) -> std::io::Result<()> {
        self.artifacts
            .get_mut(index as usize)
            .ok_or_else(|| std::io::Error::other("append before begin"))?
            .extend_from_slice(bytes);
        Ok(())
    }
}
