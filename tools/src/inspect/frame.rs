//! `appliance-inspect frame`: decode every frame in a byte stream and report each one
//! with its validity and every header field by its wire-tables name.

use replication::wire::decode::split_frames;
use replication::wire::header::{with_fields_of, FieldValue, HEADER_SIZE};
use replication::wire::{decode, Command, FrameBuf, Limits};
use serde_json::{json, Map, Value};

use super::to_hex;

/// One frame's report, as printed with `--json`.
pub fn report(frame: &[u8], limits: &Limits) -> Value {
    let buf = FrameBuf::from_bytes(frame);
    let bytes = buf.as_bytes();
    let verdict = decode(bytes, limits);
    let command = bytes.get(60).copied();
    let command_name = match command.map(Command::from_u8) {
        Some(Some(command)) => command.name().to_string(),
        Some(None) => format!("Unknown({})", command.unwrap_or_default()),
        None => "Truncated".to_string(),
    };
    let mut fields = Map::new();
    if let (Some(command), Some(head)) = (
        command.and_then(Command::from_u8),
        bytes
            .get(..HEADER_SIZE)
            .and_then(|h| <&[u8; HEADER_SIZE]>::try_from(h).ok()),
    ) {
        with_fields_of(command, head, |header| {
            let mut put = |name: &'static str, value: FieldValue| {
                let text = match value {
                    FieldValue::Int(n) => n.to_string(),
                    FieldValue::Bytes(b) => to_hex(&b),
                };
                fields.insert(name.to_string(), Value::String(text));
            };
            header.frame().visit_fields(&mut put);
            header.visit_fields(&mut put);
        });
    }
    json!({
        "command": command_name,
        "valid": verdict.is_ok(),
        "reason": verdict.as_ref().err().map(|e| e.to_string()),
        "reason_code": verdict.as_ref().err().map(|e| e.reason()),
        "body_len": bytes.len().saturating_sub(HEADER_SIZE),
        "fields": fields,
    })
}

/// Reports for every frame of a stream of concatenated frames.
pub fn reports(stream: &[u8], limits: &Limits) -> Vec<Value> {
    split_frames(stream)
        .into_iter()
        .map(|f| report(f, limits))
        .collect()
}

/// The human-readable form of one report.
pub fn render_text(report: &Value) -> String {
    let mut out = format!(
        "{} valid={} body_len={}",
        report["command"].as_str().unwrap_or("?"),
        report["valid"],
        report["body_len"]
    );
    if let Some(reason) = report["reason"].as_str() {
        out.push_str(&format!(" reason=\"{reason}\""));
    }
    if let Some(fields) = report["fields"].as_object() {
        for (name, value) in fields {
            out.push_str(&format!("\n  {name} = {}", value.as_str().unwrap_or("?")));
        }
    }
    out
}
