//! Scripted control of a simulated cluster for scenario tests: no random faults, and
//! crashes, restarts, partitions, corruption and reply loss where the test puts them.

use super::cluster::{Cluster, Faults, SimOptions, TRACE_LINES_MAX};
use super::network::NetworkFaults;
use crate::vsr::Replica;
use crate::wire::METADATA_GROUP;

impl Cluster {
    /// A cluster without random faults, for scripted scenarios.
    pub fn scripted(replica_count: u8, seed: u64, clients: u16) -> Cluster {
        Cluster::scripted_group(replica_count, seed, clients, METADATA_GROUP)
    }

    /// As `scripted`, for the consensus group `group` (a packed partition key for the
    /// partition plane).
    pub fn scripted_group(replica_count: u8, seed: u64, clients: u16, group: u64) -> Cluster {
        Cluster::scripted_scaled(replica_count, seed, clients, group, 1)
    }

    /// As `scripted_group`, with the replicas' timeouts multiplied by `time_scale`.
    pub fn scripted_scaled(
        replica_count: u8,
        seed: u64,
        clients: u16,
        group: u64,
        time_scale: u64,
    ) -> Cluster {
        let options = SimOptions {
            seed,
            replica_count,
            ticks: 0,
            liveness_ticks: 20_000,
            clients,
            group,
            faults: Faults::none(),
            trace: false,
            trace_lines: TRACE_LINES_MAX,
            checkpoint_restarts: false,
            wipe_percent: 0,
            formation: false,
            slow_per_10k: 0,
            latency_samples: false,
            time_scale,
            hibernate: false,
            idle_per_10k: 0,
            initial_view: 0,
            evict: false,
            superblock_lag_max: 0,
            defer_gaps: true,
        };
        let mut cluster = Cluster::new(options);
        cluster.faults_on = false;
        cluster
    }

    /// The replica `r`, if up.
    pub fn replica(&self, r: u8) -> Option<&Replica> {
        self.replicas[usize::from(r)].as_ref()
    }

    /// Runs `ticks` steps.
    pub fn run_ticks(&mut self, ticks: u64) -> Result<(), String> {
        for _ in 0..ticks {
            self.step()?;
        }
        Ok(())
    }

    /// Steps until `done` holds (true) or `ticks_max` pass (false).
    pub fn run_until(
        &mut self,
        ticks_max: u64,
        done: impl Fn(&Cluster) -> bool,
    ) -> Result<bool, String> {
        for _ in 0..ticks_max {
            if done(self) {
                return Ok(true);
            }
            self.step()?;
        }
        Ok(done(self))
    }

    /// Whether replica `r` sleeps (with `options.hibernate`).
    pub fn asleep(&self, r: u8) -> bool {
        self.sleeps[usize::from(r)].asleep()
    }

    /// Clients start new requests (true) or only finish outstanding ones (false).
    pub fn set_clients(&mut self, on: bool) {
        self.clients_on = on;
    }

    /// Replies clients received (checked against the history).
    pub fn replies(&self) -> u64 {
        self.checker.replies
    }

    /// Corrupts the durable journal entry of `op` on replica `r`.
    pub fn corrupt(&mut self, r: u8, op: u64) -> bool {
        self.storages[usize::from(r)].corrupt(op, &mut self.prng)
    }

    /// Restarts every crashed replica, heals the network, stops new client requests and
    /// runs until the cluster converges; Err if it does not within `ticks_max`.
    pub fn heal_and_converge(&mut self, ticks_max: u64) -> Result<u64, String> {
        self.network.heal();
        self.network.faults = NetworkFaults::none();
        self.drop_replies = false;
        for r in 0..self.options.replica_count {
            if self.replicas[usize::from(r)].is_none() {
                self.restart(r)?;
            }
        }
        self.sync_links();
        self.clients_on = false;
        let start = self.now;
        if self.run_until(ticks_max, |c| c.converged())? {
            Ok(self.now - start)
        } else {
            Err(format!("no convergence: {}", self.status_line()))
        }
    }
}
