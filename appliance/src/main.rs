//! `appliance`: the daemon. See README.md.

use std::path::PathBuf;
use std::process::ExitCode;

use appliance::config::Config;
use appliance::daemon::{self, DaemonError, RootPassword};
use clap::{Parser, Subcommand};

/// The replicated message-log appliance daemon.
#[derive(Parser, Debug)]
#[command(name = "appliance", version, about)]
struct Cli {
    /// TOML configuration; without it, a single-node cluster on 127.0.0.1 with data in
    /// ./appliance-data (root password: $APPLIANCE_ROOT_PASSWORD or "appliance-root").
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// This node's replica id (overrides the config's replica_id).
    #[arg(long, global = true)]
    replica_id: Option<u8>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create an empty data directory (refuses a non-empty one) with the root user:
    /// password from $APPLIANCE_ROOT_PASSWORD, else generated and printed once.
    Format,
    /// Create the data directory of a member whose data was lost (a replaced disk): it
    /// rejoins the cluster without voting until it caught up (refuses a non-empty one).
    Recover,
}

fn fail(error: DaemonError) -> ExitCode {
    eprintln!("appliance: {error}");
    ExitCode::from(error.exit_code())
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let code = if error.use_stderr() { 2 } else { 0 };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    let config = match Config::load(cli.config.as_deref()) {
        Ok(config) => config,
        Err(error) => return fail(DaemonError::Config(error.to_string())),
    };
    daemon::system::init_logging(&config.log.level);
    let replica_id = cli.replica_id.or(config.replica_id);
    let result = match cli.command {
        Some(command @ (Command::Format | Command::Recover)) => {
            let name = match command {
                Command::Format => "format",
                Command::Recover => "recover",
            };
            let (Some(_), Some(replica_id)) = (&cli.config, replica_id) else {
                return fail(DaemonError::Config(format!(
                    "usage: appliance {name} --config FILE --replica-id N"
                )));
            };
            match command {
                Command::Format => {
                    daemon::format(&config, replica_id, RootPassword::EnvOrGenerated)
                }
                Command::Recover => {
                    daemon::recover(&config, replica_id, RootPassword::EnvOrGenerated)
                }
            }
        }
        None => {
            let (replica_id, policy) = match (&cli.config, replica_id) {
                (None, id) => (id.unwrap_or(0), RootPassword::EnvOrDevDefault),
                (Some(_), Some(id)) => (id, RootPassword::EnvOrGenerated),
                (Some(_), None) if config.replica_count() == 1 => (
                    config.cluster.nodes[0].replica_id,
                    RootPassword::EnvOrGenerated,
                ),
                (Some(_), None) => {
                    return fail(DaemonError::Config(
                        "--replica-id (or replica_id in the config) is required with several \
                         nodes"
                            .into(),
                    ))
                }
            };
            daemon::run(config, replica_id, policy)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(error),
    }
}
