//! appliance-cli: create streams and topics, produce and consume messages against any
//! node of a cluster. Exit 0 on success, 1 on a runtime failure (after printing what
//! was done), 2 on bad usage with one line on stderr naming the problem.

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::Parser;
use tools::cli::{run, Cli, CliError};

/// Clap's error as one line: its first paragraph (the problem and, for missing
/// arguments, their names) joined, without the "error: " prefix.
fn usage_line(error: &clap::Error) -> String {
    if error.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        return "a command is required (see --help)".into();
    }
    let rendered = error.to_string();
    let line = rendered
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ");
    match line.strip_prefix("error: ") {
        Some(rest) => rest.to_owned(),
        None if line.is_empty() => "bad usage (see --help)".into(),
        None => line,
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) if !error.use_stderr() => {
            let _ = error.print();
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            eprintln!("appliance-cli: {}", usage_line(&error));
            return ExitCode::from(2);
        }
    };
    match run(&cli) {
        Ok(report) => {
            report.print(cli.global.json);
            ExitCode::SUCCESS
        }
        Err(error) => {
            let code = error.exit_code();
            match error {
                CliError::Usage(message) => eprintln!("appliance-cli: {message}"),
                CliError::Runtime { message, report } => {
                    if let Some(report) = report {
                        report.print(cli.global.json);
                    }
                    eprintln!("appliance-cli: {message}");
                }
            }
            ExitCode::from(code)
        }
    }
}
