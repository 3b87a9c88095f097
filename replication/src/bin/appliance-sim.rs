//! appliance-sim: runs the deterministic simulator of `replication::sim` for one seed or
//! a sweep, and on failure prints the failing seed and a trace of its replay.
//!
//! Exit 0 when every seed passes, 1 when one fails, 2 on bad usage.

use std::process::ExitCode;

use clap::Parser;
use replication::sim::{
    partition_plane_group, run_many, run_seed, Failure, ManyOptions, SimOptions, Summary,
};

#[derive(Parser, Debug)]
#[command(name = "appliance-sim", about = "Deterministic VSR cluster simulator")]
struct Args {
    /// Run this one seed.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Run a sweep of seeds, A..B (B exclusive).
    #[arg(long, value_name = "A..B")]
    seeds: Option<String>,
    /// Replicas in the cluster: 3 or 5.
    #[arg(long, default_value_t = 3)]
    replicas: u8,
    /// Ticks of the fault phase.
    #[arg(long, default_value_t = 5_000)]
    ticks: u64,
    /// Bound on the liveness phase after faults stop.
    #[arg(long, default_value_t = 20_000)]
    liveness_ticks: u64,
    /// Run a partition plane group (stamped SendMessages batches) instead of metadata.
    #[arg(long)]
    partition: bool,
    /// No restarts that lose the disk (the fault mix of seeds before wipes existed).
    #[arg(long)]
    no_wipes: bool,
    /// No slow stretches (the fault mix of seeds before slow nodes existed; with
    /// --groups, no journal corruption either).
    #[arg(long)]
    no_slow: bool,
    /// No sleeping idle replicas (every replica ticks, as before hibernation existed;
    /// implied by --no-wipes and --no-slow).
    #[arg(long)]
    no_hibernate: bool,
    /// Superblock writes complete at once (seeds as they ran before a replica went on
    /// handling frames while its superblock write was in flight)
    #[arg(long)]
    no_superblock_lag: bool,
    /// Journal appends past the head are written (seeds as they ran before the journals
    /// deferred them as the appliance's do)
    #[arg(long)]
    no_defer_gaps: bool,
    /// The view every group starts in (by default drawn from the seed; 0 replays seeds
    /// as they ran before groups started in other views).
    #[arg(long)]
    initial_view: Option<u32>,
    /// Run many groups per node instead of one: the metadata group and N partition
    /// groups in one node's `Groups`, idle ones asleep, faults hitting whole nodes, and a
    /// failover check of the sleeping groups at the end.
    #[arg(long, value_name = "N")]
    groups: Option<u32>,
    /// Print a trace for passing runs too.
    #[arg(long)]
    trace: bool,
    /// Print the sweep's figures as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Lines of trace printed for a failure.
    #[arg(long, default_value_t = 400)]
    trace_lines: usize,
}

fn parse_range(text: &str) -> Option<(u64, u64)> {
    let (a, b) = text.split_once("..")?;
    let a: u64 = a.trim().parse().ok()?;
    let b: u64 = b.trim().parse().ok()?;
    (a < b).then_some((a, b))
}

fn options(args: &Args, seed: u64) -> SimOptions {
    let mut options = SimOptions::from_seed(seed, args.replicas, args.ticks);
    options.liveness_ticks = args.liveness_ticks;
    if args.no_wipes {
        options.wipe_percent = 0;
        options.formation = false;
    }
    if args.no_wipes || args.no_slow {
        options.slow_per_10k = 0;
    }
    if args.partition {
        options.group = partition_plane_group();
    }
    // Seeds replayed as they ran before slow nodes or hibernation existed.
    if args.no_hibernate || args.no_wipes || args.no_slow {
        options.hibernate = false;
    }
    // Seeds replayed as they ran before superblock writes took time.
    if args.no_superblock_lag || args.no_hibernate || args.no_wipes || args.no_slow {
        options.superblock_lag_max = 0;
    }
    if let Some(view) = args.initial_view {
        options.initial_view = view;
    }
    if args.no_defer_gaps {
        options.defer_gaps = false;
    }
    options
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.replicas != 3 && args.replicas != 5 {
        eprintln!(
            "appliance-sim: --replicas must be 3 or 5, got {}",
            args.replicas
        );
        return ExitCode::from(2);
    }
    let (from, to) = match seed_range(&args) {
        Ok(range) => range,
        Err(message) => {
            eprintln!("appliance-sim: {message}");
            return ExitCode::from(2);
        }
    };
    if let Some(partitions) = args.groups {
        return many(&args, partitions, from, to);
    }
    let started = std::time::Instant::now();
    let mut totals = Totals::default();
    for seed in from..to {
        match run_seed(options(&args, seed)) {
            Ok(summary) => {
                totals.add(&summary);
                if to - from == 1 || args.trace {
                    println!("seed {seed}: ok {summary:?}");
                }
            }
            Err(failure) => {
                let mut replay = options(&args, seed);
                replay.trace = true;
                replay.trace_lines = args.trace_lines;
                let flags = replay_flags(&args);
                let replayed = run_seed(replay);
                return failed(&args, seed, totals.passed, &failure, replayed, &flags);
            }
        }
    }
    print_totals(&args, (from, to), &totals, started.elapsed().as_secs_f64());
    ExitCode::SUCCESS
}

/// The seeds to run, from --seed or --seeds.
fn seed_range(args: &Args) -> Result<(u64, u64), String> {
    match (&args.seed, &args.seeds) {
        (Some(seed), None) => Ok((*seed, seed + 1)),
        (None, Some(range)) => {
            parse_range(range).ok_or(format!("--seeds must be A..B with A < B, got {range}"))
        }
        _ => Err("give --seed N or --seeds A..B".to_string()),
    }
}

/// What the passing seeds of a sweep added up to.
#[derive(Default)]
struct Totals {
    passed: u64,
    commits: u64,
    view_changes: u64,
    crashes: u64,
    checkpoint_restarts: u64,
    state_transfers: u64,
    anchors_released: u64,
    wipes: u64,
    slow_stretches: u64,
    slow_skips: u64,
    sleeps: u64,
    silent_wakes: u64,
    deferred_appends: u64,
}

impl Totals {
    fn add(&mut self, summary: &Summary) {
        self.passed += 1;
        self.commits += summary.commit;
        self.view_changes += summary.view_changes;
        self.crashes += summary.crashes;
        self.checkpoint_restarts += summary.checkpoint_restarts;
        self.state_transfers += summary.state_transfers;
        self.anchors_released += summary.anchors_released;
        self.wipes += summary.wipes;
        self.slow_stretches += summary.slow_stretches;
        self.slow_skips += summary.slow_skips;
        self.sleeps += summary.sleeps;
        self.silent_wakes += summary.silent_wakes;
        self.deferred_appends += summary.deferred_appends;
    }
}

/// The flags (after --ticks) that replay a seed of this sweep as it ran.
fn replay_flags(args: &Args) -> String {
    format!(
        "{}{}{}{}",
        if args.partition { " --partition" } else { "" },
        if args.no_defer_gaps {
            " --no-defer-gaps"
        } else {
            ""
        },
        fault_mix_flags(args),
        if args.no_hibernate && !args.no_wipes && !args.no_slow {
            " --no-hibernate"
        } else {
            ""
        }
    )
}

/// The sweep's line: JSON with --json, else a sentence.
fn print_totals(args: &Args, (from, to): (u64, u64), totals: &Totals, seconds: f64) {
    let Totals {
        passed,
        commits,
        view_changes,
        crashes,
        checkpoint_restarts,
        state_transfers,
        anchors_released,
        wipes,
        slow_stretches,
        slow_skips,
        sleeps,
        silent_wakes,
        deferred_appends,
    } = totals;
    if args.json {
        println!(
            "{{\"passed\": {passed}, \"failed_seed\": null, \"from\": {from}, \"to\": {to}, \
             \"replicas\": {}, \"ticks\": {}, \"partition\": {}, \"ops_committed\": {commits}, \
             \"view_changes\": {view_changes}, \"crashes\": {crashes}, \
             \"checkpoint_restarts\": {checkpoint_restarts}, \"state_transfers\": \
             {state_transfers}, \"anchors_released\": {anchors_released}, \"wipes\": {wipes}, \"slow_stretches\": {slow_stretches}, \
             \"slow_skips\": {slow_skips}, \"sleeps\": {sleeps}, \"silent_wakes\": \
             {silent_wakes}, \"deferred_appends\": {deferred_appends}, \"seconds\": {seconds:.1}}}",
            args.replicas,
            args.ticks,
            args.partition,
        );
        return;
    }
    println!(
        "appliance-sim: {passed} seeds passed ({}..{}, {} replicas, {} ticks): {commits} ops \
         committed, {view_changes} view changes, {crashes} crashes ({checkpoint_restarts} \
         restarts from a checkpoint, {state_transfers} state transfers, {anchors_released} \
         commit points released from memory, {wipes} lost disks), \
         {slow_stretches} slow stretches ({slow_skips} backups skipped as slow), {sleeps} \
         sleeps of idle replicas ({silent_wakes} woken by a silent primary), \
         {deferred_appends} journal appends past the head deferred, {seconds:.1}s",
        from, to, args.replicas, args.ticks,
    );
}

/// Reports a failing seed (after `passed` seeds passed): the failure, the trace of its
/// replay, the command that replays it (`flags` after --ticks) and, with --json, the
/// sweep's line. Exit 1.
fn failed<T>(
    args: &Args,
    seed: u64,
    passed: u64,
    failure: &Failure,
    replay: Result<T, Failure>,
    flags: &str,
) -> ExitCode {
    eprintln!("appliance-sim: {failure}");
    if let Err(traced) = replay {
        for line in &traced.trace {
            eprintln!("  {line}");
        }
        eprintln!("appliance-sim: {traced}");
    }
    eprintln!(
        "appliance-sim: FAILED seed {seed} (replay: appliance-sim --seed {seed} --replicas {} \
         --ticks {}{flags})",
        args.replicas, args.ticks
    );
    if args.json {
        println!(
            "{{\"passed\": {passed}, \"failed_seed\": {seed}, \"reason\": \"{}\"}}",
            failure.reason.replace('"', "'")
        );
    }
    ExitCode::from(1)
}

fn many_options(args: &Args, partitions: u32, seed: u64) -> ManyOptions {
    let mut options = ManyOptions::from_seed(seed, args.replicas, args.ticks);
    options.liveness_ticks = args.liveness_ticks;
    options.partitions = partitions;
    options.busy = options.busy.min(partitions);
    if args.no_wipes {
        options.wipe_percent = 0;
    }
    if args.no_wipes || args.no_slow {
        options = options.without_slow_nodes_or_corruption();
    }
    options
}

/// The flags that replay a seed with the fault mix this sweep ran (`--no-wipes` implies
/// `--no-slow`).
fn fault_mix_flags(args: &Args) -> &'static str {
    match (args.no_wipes, args.no_slow) {
        (true, _) => " --no-wipes",
        (false, true) => " --no-slow",
        (false, false) => "",
    }
}

/// A sweep of the many-group simulator.
fn many(args: &Args, partitions: u32, from: u64, to: u64) -> ExitCode {
    let started = std::time::Instant::now();
    let mut passed = 0u64;
    let (mut commits, mut crashes, mut sleeps, mut silent_wakes, mut view_changes) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let (mut failover_groups, mut failover_asleep, mut failover_ticks_max) = (0u64, 0u64, 0u64);
    let (mut slow_stretches, mut slow_skips, mut corruptions) = (0u64, 0u64, 0u64);
    let mut wipes = 0u64;
    for seed in from..to {
        match run_many(many_options(args, partitions, seed)) {
            Ok(summary) => {
                passed += 1;
                commits += summary.commits;
                crashes += summary.crashes;
                sleeps += summary.sleeps;
                silent_wakes += summary.silent_wakes;
                view_changes += summary.view_changes;
                failover_groups += summary.failover_groups;
                failover_asleep += summary.failover_asleep;
                failover_ticks_max = failover_ticks_max.max(summary.failover_ticks);
                slow_stretches += summary.slow_stretches;
                slow_skips += summary.slow_skips;
                corruptions += summary.corruptions;
                wipes += summary.wipes;
                if to - from == 1 || args.trace {
                    println!("seed {seed}: ok {summary:?}");
                }
            }
            Err(failure) => {
                let mut replay = many_options(args, partitions, seed);
                replay.trace = true;
                replay.trace_lines = args.trace_lines;
                let flags = format!(" --groups {partitions}{}", fault_mix_flags(args));
                return failed(args, seed, passed, &failure, run_many(replay), &flags);
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    if args.json {
        println!(
            "{{\"passed\": {passed}, \"failed_seed\": null, \"from\": {from}, \"to\": {to}, \
             \"replicas\": {}, \"ticks\": {}, \"groups\": {partitions}, \"ops_committed\": \
             {commits}, \"crashes\": {crashes}, \"view_changes\": {view_changes}, \"sleeps\": \
             {sleeps}, \"silent_wakes\": {silent_wakes}, \"failover_groups\": \
             {failover_groups}, \"failover_asleep\": {failover_asleep}, \
             \"failover_ticks_max\": {failover_ticks_max}, \"slow_stretches\": \
             {slow_stretches}, \"slow_skips\": {slow_skips}, \"corruptions\": {corruptions}, \
             \"wipes\": {wipes}, \"seconds\": {seconds:.1}}}",
            args.replicas, args.ticks
        );
        return ExitCode::SUCCESS;
    }
    println!(
        "appliance-sim: {passed} seeds passed ({from}..{to}, {} replicas, {} ticks, {partitions} \
         partition groups + metadata per node): {commits} ops committed, {crashes} node \
         crashes ({wipes} lost disks), {slow_stretches} slow stretches ({slow_skips} backups \
         skipped as slow), {corruptions} journal entries corrupted, {view_changes} view \
         changes, {sleeps} sleeps of idle groups ({silent_wakes} woken by a silent primary); \
         failover check: {failover_groups} groups led by the \
         crashed node ({failover_asleep} asleep), all elected within {failover_ticks_max} \
         ticks at most; {seconds:.1}s",
        args.replicas, args.ticks
    );
    ExitCode::SUCCESS
}
