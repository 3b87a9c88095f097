//! appliance-workload: produce under faults, then check that no acknowledged message
//! was lost, duplicated or reordered and that the replicas agree (tools/src/workload).
//! Exit 0 when the check passes, 1 on a violation or a runtime failure, 2 on bad usage.

use std::process::ExitCode;

use clap::Parser;
use tools::workload::{run, Cli};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) if !error.use_stderr() => {
            let _ = error.print();
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            let _ = error.print();
            return ExitCode::from(2);
        }
    };
    match run(&cli) {
        Ok((report, ok)) => {
            println!("{report}");
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(message) => {
            eprintln!("appliance-workload: {message}");
            ExitCode::from(1)
        }
    }
}
