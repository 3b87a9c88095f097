//! The `appliance` command line (README.md): exit codes, `format`, the
//! generated root password, and systemd readiness (READY=1, STOPPING=1).

mod common;

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

fn run(args: &[&str], env_password: bool) -> (i32, String) {
    let mut command = Command::new(binary());
    command.args(args).stdin(Stdio::null());
    command.env_remove("APPLIANCE_ROOT_PASSWORD");
    if env_password {
        command.env("APPLIANCE_ROOT_PASSWORD", ROOT_PASSWORD);
    }
    let output = command.output().expect("run appliance");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

#[test]
fn bad_usage_and_bad_config_exit_2_with_one_line() {
    let (code, stderr) = run(&["--no-such-flag"], false);
    assert_eq!(code, 2, "{stderr}");
    let (code, stderr) = run(&["--config", "/nonexistent/appliance.toml"], false);
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("appliance.toml"), "{stderr}");
    let (code, stderr) = run(&["format"], false);
    assert_eq!(code, 2, "{stderr}");
}

#[test]
fn format_creates_a_directory_once_and_prints_a_generated_password() {
    let files = ClusterFiles::new(1);
    let config = files.config(0).display().to_string();
    let (code, stderr) = run(&["format", "--config", &config, "--replica-id", "0"], false);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("generated root password"), "{stderr}");
    assert!(files.data_dir(0).join("superblock").exists());
    let (code, stderr) = run(&["format", "--config", &config, "--replica-id", "0"], true);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("not empty"), "{stderr}");
    let (code, stderr) = run(&["format", "--config", &config, "--replica-id", "7"], true);
    assert_eq!(code, 2, "{stderr}");
}

#[test]
fn readiness_and_stopping_are_notified_and_sigterm_exits_0() {
    let files = ClusterFiles::new(1);
    let socket_path = files.dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).expect("bind notify socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let log = std::fs::File::create(files.log(0)).expect("log");
    let child = Command::new(binary())
        .arg("--config")
        .arg(files.config(0))
        .env("APPLIANCE_ROOT_PASSWORD", ROOT_PASSWORD)
        .env("NOTIFY_SOCKET", &socket_path)
        .stdin(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn");
    let mut daemon = Daemon {
        child: Some(child),
        replica: 0,
        log: files.log(0),
    };
    let mut buf = [0u8; 64];
    let n = socket.recv(&mut buf).expect("READY=1 within 30 s");
    assert_eq!(&buf[..n], b"READY=1");
    // Ready means listening: the client port answers.
    let mut client = Client::connect(files.client_addr(0), 0x42).expect("connect");
    assert_eq!(
        client.login("root", ROOT_PASSWORD).expect("login").status(),
        Status::Ok
    );
    assert_eq!(daemon.terminate(Duration::from_secs(20)), Some(0));
    let n = socket.recv(&mut buf).expect("STOPPING=1");
    assert_eq!(&buf[..n], b"STOPPING=1");
}
