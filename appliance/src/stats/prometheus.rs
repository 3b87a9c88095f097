//! `GET /metrics`: the snapshot in the Prometheus text exposition format (0.0.4), named
//! by its conventions: `appliance_` prefix, base units in names, `_total` counters.

use std::fmt::Write;

use super::{Latency, Snapshot};

/// Escapes a label value (backslash, double quote, newline).
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Out {
    text: String,
}

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{k}=\"{}\"", escape(v));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    fn latency(&mut self, name: &str, help: &str, latency: &Latency) {
        let seconds = |us: u64| us as f64 / 1e6;
        self.family(name, "summary", help);
        for (quantile, value) in [
            ("0.5", latency.p50),
            ("0.99", latency.p99),
            ("0.999", latency.p999),
        ] {
            self.sample(name, &[("quantile", quantile)], seconds(value));
        }
        // The histogram keeps percentiles, not a sum: p50 x count stands in for it.
        self.sample(
            &format!("{name}_sum"),
            &[],
            seconds(latency.p50) * latency.count as f64,
        );
        self.sample(&format!("{name}_count"), &[], latency.count);
        self.one(
            &format!("{name}_max"),
            "gauge",
            &format!("{help} (maximum)"),
            seconds(latency.max),
        );
    }
}

/// A per-group gauge: name, help, and how to read it.
type GroupSeries = (&'static str, &'static str, fn(&super::GroupStats) -> u64);
/// A per-peer series: name, type, help, and how to read it.
type PeerSeries = (
    &'static str,
    &'static str,
    &'static str,
    fn(&super::PeerStats) -> u64,
);

/// Renders a snapshot.
pub fn render(s: &Snapshot) -> String {
    let mut out = Out {
        text: String::with_capacity(4096),
    };
    node(&mut out, s);
    storage(&mut out, s);
    groups(&mut out, s);
    peers(&mut out, s);
    rejected_and_repair(&mut out, s);
    state_transfer(&mut out, s);
    latencies(&mut out, s);
    out.text
}

/// The node: identity, uptime, client connections and TLS, sessions, logins.
fn node(out: &mut Out, s: &Snapshot) {
    let replica = s.replica_id.to_string();
    out.family("appliance_info", "gauge", "Node identity; always 1.");
    out.sample(
        "appliance_info",
        &[("replica_id", &replica), ("cluster", &s.cluster)],
        1,
    );
    out.one(
        "appliance_uptime_seconds",
        "gauge",
        "Seconds since the node started.",
        s.uptime_s,
    );
    out.one(
        "appliance_client_connections",
        "gauge",
        "Open client connections.",
        s.client_connections,
    );
    out.family(
        "appliance_tls_reload_failures_total",
        "counter",
        "SIGHUP reloads of a port's certificate that failed (the previous one stays).",
    );
    for (port, tls) in [("client", &s.client_tls), ("replica", &s.replica_tls)] {
        out.sample(
            "appliance_tls_reload_failures_total",
            &[("port", port)],
            tls.reload_failures,
        );
    }
    out.family(
        "appliance_tls_loaded_timestamp_seconds",
        "gauge",
        "When a port's certificate in use was loaded (0: TLS off on that port).",
    );
    for (port, tls) in [("client", &s.client_tls), ("replica", &s.replica_tls)] {
        out.sample(
            "appliance_tls_loaded_timestamp_seconds",
            &[("port", port)],
            tls.loaded_unix_ms / 1000,
        );
    }
    out.one(
        "appliance_sessions",
        "gauge",
        "Sessions in the client table.",
        s.sessions,
    );
    out.one(
        "appliance_login_password_checks_total",
        "counter",
        "Password logins checked (Argon2id).",
        s.logins.password_checks,
    );
    out.one(
        "appliance_login_reused_total",
        "counter",
        "Password logins let in without a check: the same credentials checked out lately.",
        s.logins.reused,
    );
}

/// What the node stores and its disk.
fn storage(out: &mut Out, s: &Snapshot) {
    out.one(
        "appliance_storage_segments",
        "gauge",
        "Segment files of the partition logs.",
        s.storage.segments,
    );
    out.one(
        "appliance_storage_index_bytes",
        "gauge",
        "Memory of the partition logs' sparse indexes.",
        s.storage.index_bytes,
    );
    out.one(
        "appliance_storage_prepare_index_bytes",
        "gauge",
        "Memory of the partition groups' prepare-record indexes.",
        s.storage.prepare_index_bytes,
    );
    out.one(
        "appliance_storage_repair_window_bytes",
        "gauge",
        "Memory of the committed prepares kept to serve repair.",
        s.storage.repair_window_bytes,
    );
    out.one(
        "appliance_storage_commit_prepares_released_total",
        "counter",
        "Commit-point prepares partitions gave up over limits.repair_memory_max.",
        s.storage.commit_prepares_released,
    );
    for (name, kind, help, value) in [
        (
            "appliance_storage_free_bytes",
            "gauge",
            "Free bytes of the data directory's file system.",
            s.storage.free_bytes,
        ),
        (
            "appliance_storage_total_bytes",
            "gauge",
            "Size of the data directory's file system.",
            s.storage.total_bytes,
        ),
        (
            "appliance_storage_used_bytes",
            "gauge",
            "Bytes of the node's data (segments and the metadata journal).",
            s.storage.used_bytes,
        ),
        (
            "appliance_storage_min_free_bytes",
            "gauge",
            "storage.min_free_bytes: below it new writes are refused.",
            s.storage.min_free_bytes,
        ),
        (
            "appliance_storage_max_used_bytes",
            "gauge",
            "storage.max_used_bytes: above it new writes are refused (0: no limit).",
            s.storage.max_used_bytes,
        ),
        (
            "appliance_storage_full",
            "gauge",
            "1 while new writes are refused for storage.",
            u64::from(s.storage.full),
        ),
        (
            "appliance_storage_no_space_errors_total",
            "counter",
            "Writes that met a full disk.",
            s.storage.no_space_errors,
        ),
        (
            "appliance_storage_writes_refused_total",
            "counter",
            "Requests refused with StorageFull.",
            s.storage.writes_refused,
        ),
        (
            "appliance_storage_stopped_groups",
            "gauge",
            "Partition groups stopped by a full disk until space returns.",
            s.storage.stopped_groups,
        ),
    ] {
        out.one(name, kind, help, value);
    }
}

/// The consensus groups: counts by status, and each listed group's series.
fn groups(out: &mut Out, s: &Snapshot) {
    group_summary(out, s);
    group_series(out, s);
}

/// The node's groups counted: by status, without quorum, led here, needing attention,
/// asleep, listed.
fn group_summary(out: &mut Out, s: &Snapshot) {
    let summary = &s.group_summary;
    out.family(
        "appliance_groups",
        "gauge",
        "Consensus groups on the node by status (every group, listed or not).",
    );
    for (status, count) in [
        ("normal", summary.normal),
        ("view_change", summary.view_change),
        ("recovering", summary.recovering),
        ("state_transfer", summary.state_transfer),
    ] {
        out.sample("appliance_groups", &[("status", status)], count);
    }
    for (name, kind, help, value) in [
        (
            "appliance_groups_without_quorum",
            "gauge",
            "Groups that cannot reach a replication quorum.",
            summary.without_quorum,
        ),
        (
            "appliance_groups_primary",
            "gauge",
            "Groups this node is primary of.",
            summary.primary,
        ),
        (
            "appliance_groups_needing_attention",
            "gauge",
            "Groups without quorum, not normal, skipping a slow peer, with a view change in the last 15 minutes or a commit lag above 1000 ops.",
            summary.needing_attention,
        ),
        (
            "appliance_groups_asleep",
            "gauge",
            "Idle groups the node does not tick until traffic or a silent primary wakes them.",
            summary.asleep,
        ),
        (
            "appliance_group_sleeps_total",
            "counter",
            "Times an idle group fell asleep.",
            summary.sleeps,
        ),
        (
            "appliance_group_silent_primary_wakes_total",
            "counter",
            "Times a sleeping group woke because the node of its primary went silent.",
            summary.silent_wakes,
        ),
        (
            "appliance_groups_listed",
            "gauge",
            "Groups with appliance_group_* series in this scrape (limits.stats_groups_max; ?groups=all for every group).",
            summary.listed,
        ),
        (
            "appliance_group_view_changes_total",
            "counter",
            "View changes seen, summed over the node's groups.",
            summary.view_changes,
        ),
    ] {
        out.one(name, kind, help, value);
    }
}

/// One series per listed group: view, log view, op, commit, lag, primary, quorum and
/// status.
fn group_series(out: &mut Out, s: &Snapshot) {
    let group_gauges: [GroupSeries; 7] = [
        ("appliance_group_view", "Current view of the group.", |g| {
            u64::from(g.view)
        }),
        (
            "appliance_group_log_view",
            "View in which the group's log was last normal.",
            |g| u64::from(g.log_view),
        ),
        (
            "appliance_group_op",
            "Highest op in the group's log.",
            |g| g.op,
        ),
        (
            "appliance_group_commit",
            "Highest committed op of the group.",
            |g| g.commit,
        ),
        (
            "appliance_group_commit_lag",
            "Ops this node's commit is behind its highest op or the highest commit it knows of.",
            |g| g.commit_lag(),
        ),
        (
            "appliance_group_primary",
            "Replica id of the group's primary.",
            |g| u64::from(g.primary),
        ),
        (
            "appliance_group_quorum",
            "1 when a replication quorum is reachable.",
            |g| u64::from(g.quorum),
        ),
    ];
    for (name, help, value) in group_gauges {
        out.family(name, "gauge", help);
        for g in &s.groups {
            out.sample(name, &[("group", &g.group), ("name", &g.name)], value(g));
        }
    }
    out.family(
        "appliance_group_status",
        "gauge",
        "1 for the group's current status.",
    );
    for g in &s.groups {
        out.sample(
            "appliance_group_status",
            &[
                ("group", &g.group),
                ("name", &g.name),
                ("status", g.status.name()),
            ],
            1,
        );
    }
}

/// Each peer replica's link.
fn peers(out: &mut Out, s: &Snapshot) {
    let peer_series: [PeerSeries; 8] = [
        (
            "appliance_peer_connected",
            "gauge",
            "1 when the replica-plane link is up.",
            |p| u64::from(p.connected),
        ),
        (
            "appliance_peer_queue_depth",
            "gauge",
            "Frames queued for the peer.",
            |p| p.queue_depth,
        ),
        (
            "appliance_peer_dropped_frames_total",
            "counter",
            "Frames dropped on a full send queue.",
            |p| p.dropped,
        ),
        (
            "appliance_peer_sent_bytes_total",
            "counter",
            "Bytes sent to the peer.",
            |p| p.bytes_sent,
        ),
        (
            "appliance_peer_received_bytes_total",
            "counter",
            "Bytes received from the peer.",
            |p| p.bytes_received,
        ),
        (
            "appliance_peer_skipped_slow",
            "gauge",
            "1 when a group this node leads skips the peer in its chain as slow.",
            |p| u64::from(p.skipped_slow),
        ),
        (
            "appliance_peer_skipped_slow_groups",
            "gauge",
            "Groups this node leads that skip the peer as slow.",
            |p| p.skipped_slow_groups,
        ),
        (
            "appliance_peer_slow_skips_total",
            "counter",
            "Times the groups this node leads skipped the peer as slow.",
            |p| p.slow_skips,
        ),
    ];
    for (name, kind, help, value) in peer_series {
        out.family(name, kind, help);
        for p in &s.peers {
            out.sample(name, &[("replica", &p.replica.to_string())], value(p));
        }
    }
}

/// Frames and requests rejected, and repair.
fn rejected_and_repair(out: &mut Out, s: &Snapshot) {
    out.family(
        "appliance_rejected_frames_total",
        "counter",
        "Frames and requests rejected, by reason.",
    );
    for (reason, count) in &s.rejected {
        out.sample(
            "appliance_rejected_frames_total",
            &[("reason", reason)],
            count,
        );
    }

    out.one(
        "appliance_repair_requests_total",
        "counter",
        "RequestPrepares sent.",
        s.repair.requests_sent,
    );
    out.one(
        "appliance_repair_prepares_received_total",
        "counter",
        "Prepares received by repair.",
        s.repair.prepares_received,
    );
    out.one(
        "appliance_repair_prepares_served_total",
        "counter",
        "Prepares served to peers' repair.",
        s.repair.prepares_served,
    );
    out.one(
        "appliance_repair_ranges_evicted_total",
        "counter",
        "Repairs answered with RangeEvicted.",
        s.repair.ranges_evicted,
    );
}

/// State transfers fetched and served.
fn state_transfer(out: &mut Out, s: &Snapshot) {
    let st = &s.state_transfer;
    out.one(
        "appliance_state_transfer_active",
        "gauge",
        "1 while this node fetches state.",
        u64::from(st.active),
    );
    out.one(
        "appliance_state_transfer_artifacts",
        "gauge",
        "Artifacts in the current transfer.",
        st.artifacts_total,
    );
    out.one(
        "appliance_state_transfer_artifacts_done",
        "gauge",
        "Artifacts fetched and verified.",
        st.artifacts_done,
    );
    out.one(
        "appliance_state_transfer_bytes",
        "gauge",
        "Bytes in the current transfer.",
        st.bytes_total,
    );
    out.one(
        "appliance_state_transfer_bytes_done",
        "gauge",
        "Bytes fetched so far.",
        st.bytes_done,
    );
    out.one(
        "appliance_state_transfer_rate_bytes_per_second",
        "gauge",
        "Current fetch rate.",
        st.rate_bytes_per_s,
    );
    out.one(
        "appliance_state_transfer_served_chunks_total",
        "counter",
        "Chunks served to peers.",
        st.chunks_served,
    );
    out.one(
        "appliance_state_transfer_served_bytes_total",
        "counter",
        "Bytes served to peers.",
        st.bytes_served,
    );
    for (name, help, value) in [
        (
            "appliance_state_transfer_started_total",
            "State transfers this node began fetching.",
            st.transfers_started,
        ),
        (
            "appliance_state_transfer_completed_total",
            "State transfers staged, verified and handed over for install.",
            st.transfers_completed,
        ),
        (
            "appliance_state_transfer_failed_total",
            "State transfers that failed (peers exhausted or staging failed).",
            st.transfers_failed,
        ),
        (
            "appliance_state_transfer_refetches_total",
            "Artifacts refetched after a length or checksum mismatch.",
            st.refetches,
        ),
        (
            "appliance_state_transfer_reused_bytes_total",
            "Bytes staged from matching local segments instead of fetched.",
            st.bytes_reused,
        ),
    ] {
        out.one(name, "counter", help, value);
    }
}

/// The latency summaries.
fn latencies(out: &mut Out, s: &Snapshot) {
    out.latency(
        "appliance_request_latency_seconds",
        "Client request to reply.",
        &s.latency_us.request,
    );
    out.latency(
        "appliance_prepare_commit_latency_seconds",
        "Prepare to commit on the primary.",
        &s.latency_us.prepare_commit,
    );
    out.latency(
        "appliance_journal_fsync_latency_seconds",
        "Journal write to durable.",
        &s.latency_us.journal_fsync,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sample_follows_a_help_and_type_and_counters_end_in_total() {
        let text = render(&crate::stats::tests::sample());
        let mut declared = std::collections::HashMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split(' ');
                let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
                declared.insert(name.to_string(), kind.to_string());
                if kind == "counter" {
                    assert!(name.ends_with("_total"), "{name}");
                }
                assert!(name.starts_with("appliance_"), "{name}");
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                let family = ["_sum", "_count"]
                    .iter()
                    .fold(name, |n, s| n.strip_suffix(s).unwrap_or(n));
                assert!(
                    declared.contains_key(name) || declared.contains_key(family),
                    "undeclared {name}"
                );
                let value = line.rsplit(' ').next().unwrap();
                assert!(value.parse::<f64>().is_ok(), "bad value in {line}");
            }
        }
        assert!(text.contains(
            "appliance_group_commit{group=\"9223372036854775808\",name=\"metadata\"} 118"
        ));
        assert!(text.contains("appliance_peer_connected{replica=\"2\"} 0"));
        assert!(text.contains("appliance_peer_skipped_slow{replica=\"0\"} 1"));
        assert!(text.contains("appliance_peer_skipped_slow_groups{replica=\"0\"} 3"));
        assert!(text.contains("appliance_peer_slow_skips_total{replica=\"2\"} 0"));
        assert!(text.contains("appliance_storage_index_bytes 4096"));
        assert!(text.contains("appliance_storage_total_bytes 8589934592"));
        assert!(text.contains("appliance_storage_max_used_bytes 0"));
        assert!(text.contains("appliance_tls_reload_failures_total{port=\"client\"} 2"));
        assert!(
            text.contains("appliance_tls_loaded_timestamp_seconds{port=\"client\"} 1700000000\n")
        );
        assert!(text.contains("appliance_tls_loaded_timestamp_seconds{port=\"replica\"} 0\n"));
        assert!(text.contains("appliance_rejected_frames_total{reason=\"frame_seal_mismatch\"} 3"));
        assert!(text.contains("appliance_request_latency_seconds{quantile=\"0.99\"}"));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
