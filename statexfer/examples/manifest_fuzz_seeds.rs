//! Writes the seed corpus of the manifest fuzz target: an empty manifest, a typical one
//! and one with longer (forward-compatible) entries.
//! Usage: cargo run -p statexfer --example manifest_fuzz_seeds -- statexfer/fuzz/corpus/manifest_decode

use statexfer::{ArtifactKind, Manifest, ManifestEntry};

fn main() -> std::io::Result<()> {
    let out = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "statexfer/fuzz/corpus/manifest_decode".into());
    let out = std::path::Path::new(&out);
    std::fs::create_dir_all(out)?;
    let entry = |kind, frontier, len| ManifestEntry {
        kind,
        frontier,
        len,
        checksum: len ^ 0x5a5a,
    };
    let typical = Manifest {
        entries: vec![
            entry(ArtifactKind::MetadataSnapshot, 900, 8192),
            entry(ArtifactKind::ClientTable, 900, 1024),
            entry(ArtifactKind::SegmentLog, 0, 1 << 26),
            entry(ArtifactKind::SegmentLog, 65_536, 4096),
            entry(ArtifactKind::ConsumerOffsets, 900, 96),
        ],
    };
    std::fs::write(out.join("empty"), Manifest::default().encode())?;
    std::fs::write(out.join("typical"), typical.encode())?;
    // The same entries at entry_len 32: a newer writer's manifest.
    let short = typical.encode();
    let mut long = short[..9].to_vec();
    long[8] = 32;
    for chunk in short[9..short.len() - 8].chunks(25) {
        long.extend_from_slice(chunk);
        long.extend_from_slice(&[0; 7]);
    }
    let trailer = xxhash_rust::xxh3::xxh3_64(&long);
    long.extend_from_slice(&trailer.to_le_bytes());
    std::fs::write(out.join("longer_entries"), long)?;
    println!("wrote 3 manifest seeds under {}", out.display());
    Ok(())
}
