//! State transfer (docs/protocol.md, "State transfer"): bulk catch-up for a replica too
//! far behind for journal repair. The ISM1 manifest codec, artifact sources and sinks,
//! the lockstep chunk server and fetcher (sans-IO), and atomic install of a staged
//! state. The daemon runs server and fetcher on its "statexfer" executor.

pub mod artifact;
pub mod fetcher;
pub mod install;
pub mod manifest;
pub mod offers;
pub mod server;

pub use artifact::{ArtifactSink, ArtifactSource, MemoryArtifacts, Offer, Unavailable};
pub use fetcher::{FetchError, Fetcher, FetcherConfig, Outcome, Progress};
pub use manifest::{ArtifactKind, Manifest, ManifestEntry, ManifestError};
pub use offers::{Content, Event as OfferEvent, Freeze, OfferPolicy, Offers, Ready};
pub use server::{Server, ServerStats};
