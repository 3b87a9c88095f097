//! appliance-inspect: offline decoding of frames (and, as they land, journals,
//! superblocks, segments and manifests). Exit 0 when everything inspected is valid, 1
//! when something is invalid or unreadable, 2 on bad usage.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use replication::wire::Limits;
use tools::inspect::{frame, from_hex, manifest, InspectError};

#[derive(Parser)]
#[command(
    name = "appliance-inspect",
    version,
    about = "Decode and verify appliance frames and files offline"
)]
struct Cli {
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Decode every frame in the input (concatenated frames are split by their size field).
    Frame {
        /// The frames as hex ("-" reads hex from standard input).
        #[arg(long, conflicts_with = "file", required_unless_present = "file")]
        hex: Option<String>,
        /// A file holding the raw frame bytes.
        #[arg(long)]
        file: Option<PathBuf>,
        /// message_bus.max_message_size to validate against.
        #[arg(long, default_value_t = replication::wire::decode::MAX_MESSAGE_SIZE_DEFAULT)]
        max_message_size: u32,
    },
    /// Decode and verify an ISM1 state-transfer manifest.
    Manifest {
        /// The manifest file.
        file: PathBuf,
    },
    /// Verify or dump the metadata journal of a data directory.
    Journal {
        #[arg(value_enum)]
        action: Action,
        /// The node's data directory.
        dir: PathBuf,
    },
    /// Show every superblock copy of a data directory and which one wins.
    Superblock {
        /// The node's data directory.
        dir: PathBuf,
    },
    /// Verify or dump a partition segment file.
    Segment {
        #[arg(value_enum)]
        action: Action,
        /// The segment file.
        file: PathBuf,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Action {
    /// Check every entry and report what recovery would do.
    Verify,
    /// The verify report plus every entry.
    Dump,
}

/// Prints a journal-crate report (pretty JSON as text, one line with --json) and returns
/// its verdict; a report that could not be made is a runtime failure.
fn report<T: serde::Serialize>(
    json: bool,
    made: journal::Result<T>,
    ok: impl Fn(&T) -> bool,
) -> Result<bool, InspectError> {
    let report = made.map_err(|e| InspectError::Runtime(e.to_string()))?;
    let verdict = ok(&report);
    let value = serde_json::to_value(&report).map_err(|e| InspectError::Runtime(e.to_string()))?;
    if json {
        println!("{value}");
    } else {
        println!(
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
    }
    Ok(verdict)
}

fn read(path: &std::path::Path) -> Result<Vec<u8>, InspectError> {
    std::fs::read(path)
        .map_err(|e| InspectError::Runtime(format!("reading {}: {e}", path.display())))
}

/// Prints a report as JSON or text and says whether it was valid.
fn print(
    json: bool,
    report: &serde_json::Value,
    text: impl Fn(&serde_json::Value) -> String,
) -> bool {
    if json {
        println!("{report}");
    } else {
        println!("{}", text(report));
    }
    // A frame is good when it is valid and any batch it carries is too.
    report["valid"] == true && report["batch"]["valid"] != false
}

fn run(cli: Cli) -> Result<bool, InspectError> {
    match cli.command {
        Cmd::Frame {
            hex,
            file,
            max_message_size,
        } => {
            let bytes = match (hex, file) {
                (Some(hex), _) => {
                    let text = if hex == "-" {
                        let mut text = String::new();
                        std::io::stdin()
                            .read_to_string(&mut text)
                            .map_err(|e| InspectError::Runtime(format!("reading stdin: {e}")))?;
                        text
                    } else {
                        hex
                    };
                    from_hex(&text).map_err(|e| InspectError::Usage(format!("--hex: {e}")))?
                }
                (None, Some(path)) => read(&path)?,
                (None, None) => return Err(InspectError::Usage("give --hex or --file".into())),
            };
            if bytes.is_empty() {
                return Err(InspectError::Usage("the input holds no bytes".into()));
            }
            let limits = Limits { max_message_size };
            let reports = frame::reports(&bytes, &limits);
            // Print every report, then say whether all were valid.
            let verdicts: Vec<bool> = reports
                .iter()
                .map(|report| print(cli.json, report, frame::render_text))
                .collect();
            Ok(verdicts.into_iter().all(|valid| valid))
        }
        Cmd::Journal {
            action: Action::Verify,
            dir,
        } => report(cli.json, journal::inspect::journal_verify(&dir), |r| r.ok),
        Cmd::Journal {
            action: Action::Dump,
            dir,
        } => report(cli.json, journal::inspect::journal_dump(&dir), |r| {
            r.report.ok
        }),
        Cmd::Superblock { dir } => report(cli.json, journal::inspect::superblock(&dir), |r| r.ok),
        Cmd::Segment {
            action: Action::Verify,
            file,
        } => report(cli.json, journal::inspect::segment_verify(&file), |r| r.ok),
        Cmd::Segment {
            action: Action::Dump,
            file,
        } => report(cli.json, journal::inspect::segment_dump(&file), |r| {
            r.report.ok
        }),
        Cmd::Manifest { file } => Ok(print(
            cli.json,
            &manifest::report(&read(&file)?),
            manifest::render_text,
        )),
    }
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
    match run(cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("appliance-inspect: {error}");
            ExitCode::from(error.exit_code() as u8)
        }
    }
}
