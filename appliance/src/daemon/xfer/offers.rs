//! The server's side of a transfer, as the statexfer thread performs it: the offers'
//! lifecycle (`statexfer::Offers`: freshness, refreezes, pacing, release) decides; this
//! file reads and hashes the frozen files, answers the frames and asks the replica
//! executor for freezes.

use std::collections::HashMap;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use replication::wire::{RequestStateChunkHeader, RequestStateTransferHeader};
use statexfer::{ArtifactSource, Offer, OfferEvent, OfferPolicy, Ready, Unavailable};
use xxhash_rust::xxh3::Xxh3Default;

use super::*;

/// The directory of hard links a frozen partition's offer reads its segments through,
/// removed when the offer is released or its freeze abandoned.
pub struct Links(pub Option<PathBuf>);

impl Drop for Links {
    fn drop(&mut self) {
        if let Some(links) = &self.0 {
            let _ = std::fs::remove_dir_all(links);
        }
    }
}

/// The lifecycle's bounds: offers fresh for `OFFER_FRESH`, hashing paced to the
/// transfer rate limit per tick (unpaced without one).
pub(super) fn offer_policy(settings: &XferSettings) -> OfferPolicy {
    OfferPolicy {
        fresh: OFFER_FRESH,
        refreezes_max: REFREEZES_MAX,
        idle_max: TRANSFER_IDLE_MAX,
        hash_per_step: match settings.rate_max {
            0 => u64::MAX,
            rate => (rate as f64 * TICK.as_secs_f64()) as u64 + 1,
        },
    }
}

/// Reads from one offer (the one a transfer's nonce was given), or refuses.
pub(super) struct OfferSource<'a> {
    pub(super) offer: Result<&'a Ready<Content, Links>, Unavailable>,
}

impl ArtifactSource for OfferSource<'_> {
    fn offer(&mut self, _group: u64) -> Result<Offer, Unavailable> {
        self.offer.map(|o| o.offer.clone())
    }

    fn read(&mut self, _group: u64, index: u32, offset: u64, buf: &mut [u8]) -> Option<usize> {
        let offer = self.offer.ok()?;
        let content = offer.contents.get(index as usize)?;
        let len = statexfer::Content::len(content);
        let start = offset.min(len);
        let n = (buf.len() as u64).min(len - start) as usize;
        match content {
            Content::Bytes(bytes) => {
                buf[..n].copy_from_slice(&bytes[start as usize..start as usize + n]);
                Some(n)
            }
            Content::File { path, .. } => {
                let file = open_without_readahead(path).ok()?;
                file.read_exact_at(&mut buf[..n], start).ok()?;
                Some(n)
            }
        }
    }
}

/// Incremental checksums of frozen file prefixes, by (device, inode): a segment that
/// grew since the last freeze is hashed from where it was left.
#[derive(Default)]
pub(super) struct Hashes {
    pub(super) by_file: HashMap<(u64, u64), (u64, Xxh3Default)>,
    /// The read buffer, reused (a fresh megabyte per call costs page faults).
    pub(super) buffer: Vec<u8>,
}

pub(super) const HASHES_MAX: usize = 1 << 16;

impl Hashes {
    /// Hashes up to `budget` more bytes of the first `len` bytes of `path` (from where
    /// an earlier call, or an earlier offer of the same file, left off): the checksum
    /// once all `len` bytes are hashed, and the bytes read.
    pub(super) fn advance(
        &mut self,
        path: &Path,
        len: u64,
        budget: u64,
    ) -> std::io::Result<(Option<u64>, u64)> {
        let file = open_without_readahead(path)?;
        let meta = file.metadata()?;
        let key = (meta.dev(), meta.ino());
        let (mut done, mut hasher) = match self.by_file.get(&key) {
            Some((cached, hasher)) if *cached <= len => (*cached, hasher.clone()),
            _ => (0, Xxh3Default::new()),
        };
        let stop = len.min(done.saturating_add(budget));
        let mut read = 0;
        if self.buffer.len() < COPY_BUFFER {
            self.buffer.resize(COPY_BUFFER, 0);
        }
        let buffer = &mut self.buffer;
        while done < stop {
            let n = ((stop - done) as usize).min(buffer.len());
            file.read_exact_at(&mut buffer[..n], done)?;
            hasher.update(&buffer[..n]);
            done += n as u64;
            read += n as u64;
        }
        let digest = (done == len).then(|| hasher.digest());
        if self.by_file.len() >= HASHES_MAX {
            self.by_file.clear();
        }
        self.by_file.insert(key, (done, hasher));
        Ok((digest, read))
    }
}

impl Xfer {
    pub(super) fn on_request_transfer(&mut self, peer: u8, request: &RequestStateTransferHeader) {
        let offer = self
            .offers
            .on_request(peer, request.nonce, request.group, Instant::now());
        let frame = self.server.on_request_transfer(
            request,
            &mut OfferSource {
                offer: offer.as_deref().map_err(|e| *e),
            },
        );
        self.send(FromXfer::Send { to: peer, frame });
        self.on_offer_events();
    }

    pub(super) fn on_request_chunk(&mut self, peer: u8, request: &RequestStateChunkHeader) {
        let Some(offer) = self.offers.on_chunk(peer, request.nonce, Instant::now()) else {
            self.server.stats.chunks_refused += 1;
            return;
        };
        if let Some(frame) = self
            .server
            .on_request_chunk(request, &mut OfferSource { offer: Ok(&offer) })
        {
            self.send(FromXfer::Send { to: peer, frame });
        }
    }

    /// Queues a frozen group for hashing into a manifest; the next RequestStateTransfer
    /// after that gets it.
    pub(super) fn on_frozen(&mut self, frozen: Frozen) {
        self.offers.on_frozen(frozen, Instant::now());
        self.hash_step();
    }

    /// Hashes frozen artifacts for up to this tick's read budget (all of them when
    /// state transfer is not rate-limited): the read of a whole partition must not
    /// saturate the disk the cluster's fsyncs wait on.
    pub(super) fn hash_step(&mut self) {
        let hashes = self.hashes.clone();
        self.offers
            .step(Instant::now(), |content, budget| match content {
                Content::Bytes(bytes) => {
                    Ok((Some(xxhash_rust::xxh3::xxh3_64(bytes)), bytes.len() as u64))
                }
                Content::File { path, len } => {
                    let hashed = hashes.borrow_mut().advance(path, *len, budget);
                    if let Err(error) = &hashed {
                        tracing::warn!(path = %path.display(), %error,
                            "state transfer: a frozen artifact cannot be read");
                    }
                    hashed
                }
            });
        self.on_offer_events();
    }

    /// Performs and logs what the offers' lifecycle decided.
    fn on_offer_events(&mut self) {
        for event in self.offers.take_events() {
            match event {
                OfferEvent::Freeze { group } => self.send(FromXfer::Freeze { group }),
                OfferEvent::Refrozen {
                    group,
                    commit_op,
                    waited,
                } => {
                    self.totals.refreezes += 1;
                    tracing::debug!(
                        group,
                        commit_op,
                        seconds = waited.as_secs_f64(),
                        "state transfer: freeze hashed too late to offer; freezing again"
                    );
                }
                OfferEvent::Offered {
                    group,
                    commit_op,
                    artifacts,
                    bytes,
                } => tracing::info!(
                    group,
                    commit_op,
                    artifacts,
                    bytes,
                    "state transfer: offer frozen"
                ),
                OfferEvent::Unreadable { group } => {
                    tracing::warn!(group, "state transfer: freeze abandoned, asked again later")
                }
            }
        }
    }
}
