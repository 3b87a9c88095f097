//! Environment overrides: `APPLIANCE_<PATH>` sets the key at PATH, segments joined by
//! `__` (`APPLIANCE_CLUSTER__AUTH__SHARED_SECRET`); a numeric segment indexes an array
//! (`APPLIANCE_CLUSTER__NODES__0__IP`). Values that read as TOML integers, floats or
//! booleans are typed; anything else is a string.

use super::ConfigError;

/// Prefix of every override variable.
pub const ENV_PREFIX: &str = "APPLIANCE_";

/// Variables under the prefix that are not config keys: the root user's name and
/// password `format` reads, and the password appliance-cli reads. A shell that sets them
/// for one tool must not stop the daemon from starting.
pub const NOT_CONFIG: [&str; 3] = [
    "APPLIANCE_ROOT_USERNAME",
    "APPLIANCE_ROOT_PASSWORD",
    "APPLIANCE_PASSWORD",
];

fn typed(raw: &str) -> toml::Value {
    let parsed: Result<toml::Table, _> = toml::from_str(&format!("v = {raw}"));
    match parsed.ok().and_then(|mut t| t.remove("v")) {
        Some(v @ (toml::Value::Integer(_) | toml::Value::Float(_) | toml::Value::Boolean(_))) => v,
        _ => toml::Value::String(raw.to_string()),
    }
}

/// Applies every `APPLIANCE_*` variable in `vars` to `root`.
pub fn apply_overrides(
    root: &mut toml::Value,
    vars: impl IntoIterator<Item = (String, String)>,
) -> Result<(), ConfigError> {
    let mut vars: Vec<(String, String)> = vars
        .into_iter()
        .filter(|(k, _)| k.starts_with(ENV_PREFIX) && !NOT_CONFIG.contains(&k.as_str()))
        .collect();
    // Sorted, so array entries are created in index order.
    vars.sort();
    for (name, raw) in vars {
        let path: Vec<String> = name[ENV_PREFIX.len()..]
            .split("__")
            .map(|segment| segment.to_ascii_lowercase())
            .collect();
        if path.iter().any(|s| s.is_empty()) {
            return Err(ConfigError::new(
                name,
                raw,
                "is not a config path: segments are joined by __",
            ));
        }
        set(root, &path, typed(&raw))
            .map_err(|rule| ConfigError::new(name.clone(), raw.clone(), rule))?;
    }
    Ok(())
}

fn set(node: &mut toml::Value, path: &[String], value: toml::Value) -> Result<(), String> {
    let Some((first, rest)) = path.split_first() else {
        *node = value;
        return Ok(());
    };
    match node {
        toml::Value::Table(table) => {
            let child = table.entry(first.clone()).or_insert_with(|| {
                if rest.first().is_some_and(|s| s.parse::<usize>().is_ok()) {
                    toml::Value::Array(Vec::new())
                } else {
                    toml::Value::Table(toml::Table::new())
                }
            });
            set(child, rest, value)
        }
        toml::Value::Array(items) => {
            let index: usize = first
                .parse()
                .map_err(|_| format!("\"{first}\" indexes an array and must be a number"))?;
            if index == items.len() {
                items.push(toml::Value::Table(toml::Table::new()));
            }
            let len = items.len();
            let item = items
                .get_mut(index)
                .ok_or_else(|| format!("index {index} is past the end of an array of {len}"))?;
            set(item, rest, value)
        }
        _ => Err(format!(
            "\"{first}\" goes below a key that holds a plain value"
        )),
    }
}
