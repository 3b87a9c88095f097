//! State transfer (replica-plane.md, "State transfer"): bulk catch-up for a replica too
//! far behind for journal repair. So far: the ISM1 manifest codec and the artifact
//! kinds. The chunk server, fetcher and install are still to come (see README.md).

pub mod manifest;

pub use manifest::{ArtifactKind, Manifest, ManifestEntry, ManifestError};
