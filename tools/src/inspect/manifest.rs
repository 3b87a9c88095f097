//! `appliance-inspect manifest FILE`: decode and verify an ISM1 state manifest.

use serde_json::{json, Value};
use statexfer::Manifest;

/// The report for a manifest's bytes: valid or not, and its entries.
pub fn report(bytes: &[u8]) -> Value {
    match Manifest::decode(bytes) {
        Ok(manifest) => json!({
            "valid": true,
            "count": manifest.entries.len(),
            "total_len": manifest.entries.iter().map(|e| e.len).sum::<u64>().to_string(),
            "entries": manifest.entries.iter().enumerate().map(|(index, e)| json!({
                "index": index,
                "kind": e.kind.name(),
                "frontier": e.frontier.to_string(),
                "len": e.len.to_string(),
                "checksum": format!("{:016x}", e.checksum),
            })).collect::<Vec<_>>(),
        }),
        Err(error) => json!({ "valid": false, "reason": error.to_string() }),
    }
}

/// The human-readable form.
pub fn render_text(report: &Value) -> String {
    if report["valid"] != true {
        return format!(
            "invalid manifest: {}",
            report["reason"].as_str().unwrap_or("?")
        );
    }
    let mut out = format!(
        "ISM1 manifest, {} artifacts, {} bytes",
        report["count"],
        report["total_len"].as_str().unwrap_or("?")
    );
    for entry in report["entries"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\n  [{}] {} frontier={} len={} checksum={}",
            entry["index"],
            entry["kind"].as_str().unwrap_or("?"),
            entry["frontier"].as_str().unwrap_or("?"),
            entry["len"].as_str().unwrap_or("?"),
            entry["checksum"].as_str().unwrap_or("?"),
        ));
    }
    out
}
