//! The config loader fed arbitrary TOML text and override variables. It may refuse
//! anything, with an error naming a key, but never panic; what it accepts validates.
#![no_main]

use appliance::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    // The first line, if it looks like NAME=VALUE, is also tried as an override.
    let mut vars = Vec::new();
    if let Some((name, value)) = text.lines().next().and_then(|l| l.split_once('=')) {
        vars.push((format!("APPLIANCE_{}", name.trim().to_ascii_uppercase()), value.trim().to_string()));
    }
    match Config::from_toml(&text, "fuzz.toml", vars) {
        Ok(config) => assert!(config.validate().is_ok()),
        Err(error) => assert!(!error.to_string().is_empty()),
    }
});
