//! `appliance-inspect frame`: decode every frame in a byte stream and report each one
//! with its validity and every header field by its name in docs/protocol.md.

use replication::wire::decode::{decode_frame, split_frames};
use replication::wire::header::{with_fields_of, FieldValue, HEADER_SIZE};
use replication::wire::{batch, Command, FrameBuf, Limits, Message, Operation};
use serde_json::{json, Map, Value};

use super::to_hex;

/// One frame's report, as printed with `--json`: the frame verdict (`valid`, `reason`),
/// and apart from it, for a prepare carrying a message batch, the batch's (`batch`:
/// null when the frame carries none).
pub fn report(frame: &[u8], limits: &Limits) -> Value {
    let buf = FrameBuf::from_bytes(frame);
    let bytes = buf.as_bytes();
    let verdict = decode_frame(bytes, limits);
    let batch_verdict = match &verdict {
        Ok(Message::Prepare(h, body) | Message::RepairPrepare(h, body))
            if h.operation == Operation::SendMessages as u8 =>
        {
            let checked = batch::verify(body);
            json!({
                "valid": checked.is_ok(),
                "reason": checked.as_ref().err().map(|e| e.to_string()),
            })
        }
        _ => Value::Null,
    };
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
        // A request routed inside a server (RoutedRequestHeader) names its target group
        // in the last 8 bytes of the request's reserved area.
        if command == Command::Request {
            let group = u64::from_le_bytes(head[248..256].try_into().unwrap_or([0; 8]));
            if group != 0 {
                fields.insert("group".to_string(), Value::String(group.to_string()));
            }
        }
    }
    json!({
        "command": command_name,
        "valid": verdict.is_ok(),
        "reason": verdict.as_ref().err().map(|e| e.to_string()),
        "reason_code": verdict.as_ref().err().map(|e| e.reason()),
        "body_len": bytes.len().saturating_sub(HEADER_SIZE),
        "batch": batch_verdict,
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
    if let Some(valid) = report["batch"]["valid"].as_bool() {
        out.push_str(&format!(" batch_valid={valid}"));
        if let Some(reason) = report["batch"]["reason"].as_str() {
            out.push_str(&format!(" batch_reason=\"{reason}\""));
        }
    }
    if let Some(fields) = report["fields"].as_object() {
        for (name, value) in fields {
            out.push_str(&format!("\n  {name} = {}", value.as_str().unwrap_or("?")));
        }
    }
    out
}
