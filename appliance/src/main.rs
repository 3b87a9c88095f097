//! The appliance daemon. Not built yet: until the consensus core, journal and message
//! bus land, this binary says so and exits 1 instead of pretending to serve.

fn main() -> std::process::ExitCode {
    eprintln!(
        "appliance: the daemon is not built yet in this version; only the wire format and \
         appliance-inspect exist (see README.md)"
    );
    std::process::ExitCode::from(1)
}
