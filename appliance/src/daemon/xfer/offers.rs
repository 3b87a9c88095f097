//! The server's side of a transfer: a group frozen at its commit point is hashed into an
//! offer (paced, incrementally by inode), handed to new transfers for a while, and read
//! from by each transfer the offer's nonce was given until it finishes or idles out.

use std::collections::HashMap;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use replication::wire::{RequestStateChunkHeader, RequestStateTransferHeader};
use statexfer::{ArtifactSource, Manifest, ManifestEntry, Offer, Unavailable};
use xxhash_rust::xxh3::Xxh3Default;

use super::*;

/// An offer the server hands out: the manifest and where each artifact's bytes are.
pub(super) struct ReadyOffer {
    pub(super) offer: Offer,
    pub(super) contents: Vec<Content>,
    pub(super) links: Option<PathBuf>,
    pub(super) created: Instant,
}

impl Drop for ReadyOffer {
    fn drop(&mut self) {
        if let Some(links) = &self.links {
            let _ = std::fs::remove_dir_all(links);
        }
    }
}

/// Reads from one offer (the one a transfer's nonce was given), or refuses.
pub(super) struct OfferSource<'a> {
    pub(super) offer: Result<&'a ReadyOffer, Unavailable>,
}

impl ArtifactSource for OfferSource<'_> {
    fn offer(&mut self, _group: u64) -> Result<Offer, Unavailable> {
        self.offer.map(|o| o.offer.clone())
    }

    fn read(&mut self, _group: u64, index: u32, offset: u64, buf: &mut [u8]) -> Option<usize> {
        let offer = self.offer.ok()?;
        let content = offer.contents.get(index as usize)?;
        let len = content.len();
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

/// A transfer being served: its offer, and when it last asked for something.
pub(super) struct Serving {
    pub(super) offer: Rc<ReadyOffer>,
    pub(super) last: Instant,
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

/// A frozen group whose artifacts are being hashed (paced, a few MiB per tick).
pub(super) struct Hashing {
    pub(super) frozen: Frozen,
    pub(super) entries: Vec<ManifestEntry>,
    /// When the replica executor's answer arrived (about when the group was frozen).
    pub(super) frozen_at: Instant,
}

impl Xfer {
    pub(super) fn on_request_transfer(&mut self, peer: u8, request: &RequestStateTransferHeader) {
        let group = request.group;
        let fresh = self
            .offers
            .get(&group)
            .filter(|o| o.created.elapsed() < OFFER_FRESH)
            .cloned();
        let answer = match fresh {
            Some(offer) => {
                let frame = self
                    .server
                    .on_request_transfer(request, &mut OfferSource { offer: Ok(&offer) });
                self.serving.insert(
                    (peer, request.nonce),
                    Serving {
                        offer,
                        last: Instant::now(),
                    },
                );
                frame
            }
            None => {
                let refusal = self
                    .refused
                    .get(&group)
                    .filter(|(at, _)| at.elapsed() < OFFER_FRESH)
                    .map(|(_, transient)| *transient);
                let unavailable = match refusal {
                    Some(false) => Unavailable::Permanent,
                    _ => {
                        if let std::collections::hash_map::Entry::Vacant(entry) =
                            self.freezing.entry(group)
                        {
                            entry.insert(Instant::now());
                            self.send(FromXfer::Freeze { group });
                        }
                        Unavailable::Transient
                    }
                };
                self.server.on_request_transfer(
                    request,
                    &mut OfferSource {
                        offer: Err(unavailable),
                    },
                )
            }
        };
        self.send(FromXfer::Send {
            to: peer,
            frame: answer,
        });
    }

    pub(super) fn on_request_chunk(&mut self, peer: u8, request: &RequestStateChunkHeader) {
        let Some(serving) = self.serving.get_mut(&(peer, request.nonce)) else {
            self.server.stats.chunks_refused += 1;
            return;
        };
        serving.last = Instant::now();
        let offer = serving.offer.clone();
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
        self.freezing.insert(frozen.group, Instant::now());
        self.refused.remove(&frozen.group);
        let job = Hashing {
            entries: Vec::with_capacity(frozen.artifacts.len()),
            frozen,
            frozen_at: Instant::now(),
        };
        // A freeze that replaces a stale one has little left to hash: ahead of a group
        // hashed for the first time (whose progress so far the cache keeps), or it would
        // wait out that whole read and be stale again.
        if self
            .refreezes
            .get(&job.frozen.group)
            .is_some_and(|n| *n > 0)
        {
            self.hashing.push_front(job);
        } else {
            self.hashing.push_back(job);
        }
        self.hash_step();
    }

    /// Hashes frozen artifacts for up to this tick's read budget (all of them when
    /// state transfer is not rate-limited): the read of a whole partition must not
    /// saturate the disk the cluster's fsyncs wait on.
    pub(super) fn hash_step(&mut self) {
        let mut budget = match self.settings.rate_max {
            0 => u64::MAX,
            rate => (rate as f64 * TICK.as_secs_f64()) as u64 + 1,
        };
        while budget > 0 {
            let Some(job) = self.hashing.front_mut() else {
                return;
            };
            let group = job.frozen.group;
            let index = job.entries.len();
            let Some((kind, frontier, content)) = job.frozen.artifacts.get(index) else {
                if let Some(job) = self.hashing.pop_front() {
                    self.finish_offer(job);
                }
                continue;
            };
            let checksum = match content {
                Content::Bytes(bytes) => Some(xxhash_rust::xxh3::xxh3_64(bytes)),
                Content::File { path, len } => {
                    match self.hashes.borrow_mut().advance(path, *len, budget) {
                        Ok((checksum, read)) => {
                            budget = budget.saturating_sub(read.max(1));
                            checksum
                        }
                        Err(error) => {
                            tracing::warn!(group, path = %path.display(), %error,
                            "state transfer: a frozen artifact cannot be read");
                            if let Some(job) = self.hashing.pop_front() {
                                if let Some(links) = &job.frozen.links {
                                    let _ = std::fs::remove_dir_all(links);
                                }
                            }
                            self.freezing.remove(&group);
                            self.refused.insert(group, (Instant::now(), true));
                            continue;
                        }
                    }
                }
            };
            if let Some(checksum) = checksum {
                let entry = ManifestEntry {
                    kind: *kind,
                    frontier: *frontier,
                    len: content.len(),
                    checksum,
                };
                job.entries.push(entry);
            }
        }
    }

    pub(super) fn finish_offer(&mut self, job: Hashing) {
        let Hashing {
            frozen,
            entries,
            frozen_at,
        } = job;
        // Hashing a large group from the disk at the paced rate takes seconds (longer
        // when it queued behind another group's), while the cluster keeps committing: a
        // fetcher installing that old a state would find the ops above it gone from its
        // peers' repair windows and need a second transfer. So a stale freeze is
        // replaced by a fresh one, whose hashing resumes where this one ended (only
        // what grew since is read); a second stale one is offered as it is.
        let refreezes = self.refreezes.entry(frozen.group).or_default();
        if frozen_at.elapsed() > OFFER_FRESH && *refreezes < REFREEZES_MAX {
            *refreezes += 1;
            tracing::debug!(
                group = frozen.group,
                commit_op = frozen.commit_op,
                seconds = frozen_at.elapsed().as_secs_f64(),
                "state transfer: freeze hashed too late to offer; freezing again"
            );
            if let Some(links) = &frozen.links {
                let _ = std::fs::remove_dir_all(links);
            }
            self.totals.refreezes += 1;
            self.freezing.insert(frozen.group, Instant::now());
            self.send(FromXfer::Freeze {
                group: frozen.group,
            });
            return;
        }
        self.refreezes.remove(&frozen.group);
        self.freezing.remove(&frozen.group);
        let contents: Vec<Content> = frozen.artifacts.into_iter().map(|(_, _, c)| c).collect();
        let offer = ReadyOffer {
            offer: Offer {
                commit_op: frozen.commit_op,
                commit_max: frozen.commit_max,
                manifest: Manifest { entries },
            },
            contents,
            links: frozen.links,
            created: Instant::now(),
        };
        tracing::info!(
            group = frozen.group,
            commit_op = frozen.commit_op,
            artifacts = offer.contents.len(),
            bytes = offer.contents.iter().map(Content::len).sum::<u64>(),
            "state transfer: offer frozen"
        );
        self.offers.insert(frozen.group, Rc::new(offer));
    }
}
