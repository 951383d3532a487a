//! `--config FILE`: a run's flags from a file, as torchtitan's and Megatron's users keep them.
//! The file is TOML, or JSON (a run folder's `config.json` is one: a finished run's flags, which
//! reproduce it); its keys are the long flag names (`batch-size = 64`, `model = "gpt-tiny"`;
//! `batch_size` is read the same), at the top level or inside a table named after the flag's
//! section of `--help` (`[optimizer]`, `[parallelism]`, …). Flags given on the command line win
//! over the file. An unknown key, a key in another section's table or a value the flag refuses
//! is a one-line error naming the file and the key.
//!
//! The file is read before clap parses anything: [`expand`] turns its entries into the flags they
//! stand for, so a value means exactly what the same flag means on the command line. With
//! `--resume PATH`, the resumed run's `config.json` gives the flags that neither the command
//! line nor the file gives ([`crate::resume_config`]).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{ArgAction, Command};
use serde_json::Value;

/// The flag naming the file.
pub const FLAG: &str = "config";

/// `argv` with `--config FILE` replaced by the flags the file sets that the command line does
/// not, for the subcommand of `command` that `argv` names (or `command` itself when it has
/// none). `argv` without `--config` comes back as it is.
pub fn expand(command: &Command, argv: Vec<OsString>) -> Result<Vec<OsString>> {
    let (at, target) = subcommand(command, &argv);
    let mut rest = argv.clone();
    let file = flag_value(&rest[at..], FLAG).map(|(i, p)| (at + i, p));
    if let Some((flag_at, _)) = &file {
        let removed = match rest[*flag_at].to_string_lossy().contains('=') {
            true => 1,
            false => 2,
        };
        rest.drain(*flag_at..*flag_at + removed);
    }
    let mut given: Vec<String> = rest[at..]
        .iter()
        .filter_map(|a| a.to_str())
        .filter_map(|a| a.strip_prefix("--"))
        .map(|a| a.split('=').next().unwrap_or(a).to_string())
        .collect();
    let mut flags = Vec::new();
    if let Some((_, path)) = &file {
        for (key, value) in entries(path, target)? {
            if !given.contains(&key) {
                flags.extend(as_flags(target, path, &key, &value)?);
                given.push(key);
            }
        }
    }
    // A resumed run takes its checkpoint's values for the flags given neither on the command
    // line nor in the file (flags it no longer has are passed over).
    if let Some((_, resume)) = flag_value(&rest[at..], "resume") {
        let (path, config) = crate::resume_config::config_of(&resume)?;
        let serde_json::Value::Object(saved) = config else {
            bail!(
                "--resume {}: {} is not a table of flags",
                resume.display(),
                path.display()
            );
        };
        for (key, value) in saved {
            let key = flag_name(&key);
            let known = target.get_arguments().any(|a| a.get_long() == Some(&key));
            if known && key != FLAG && !given.contains(&key) {
                flags.extend(as_flags(target, &path, &key, &value)?);
            }
        }
    }
    rest.splice(at..at, flags);
    Ok(rest)
}

/// Where the subcommand's own arguments start in `argv`, and the command that parses them.
fn subcommand<'a>(command: &'a Command, argv: &[OsString]) -> (usize, &'a Command) {
    for (i, arg) in argv.iter().enumerate().skip(1) {
        let Some(name) = arg.to_str() else { continue };
        if name.starts_with('-') {
            continue;
        }
        if let Some(sub) = command.find_subcommand(name) {
            return (i + 1, sub);
        }
        break;
    }
    (1.min(argv.len()), command)
}

/// The position of `--NAME` in `args` and the path it names.
fn flag_value(args: &[OsString], name: &str) -> Option<(usize, PathBuf)> {
    let long = format!("--{name}");
    args.iter().enumerate().find_map(|(i, a)| {
        let a = a.to_str()?;
        if a == long {
            return args.get(i + 1).map(|p| (i, PathBuf::from(p)));
        }
        a.strip_prefix(&format!("{long}="))
            .map(|p| (i, PathBuf::from(p)))
    })
}

/// The file's entries as (long flag name, value), checked against `command`'s flags and their
/// sections.
fn entries(path: &Path, command: &Command) -> Result<Vec<(String, Value)>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--config {}: cannot read", path.display()))?;
    let root: Value = match path.extension().and_then(|e| e.to_str()) {
        Some("json") => serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("--config {}: not JSON: {e}", path.display()))?,
        _ => {
            let table: toml::Table = toml::from_str(&text).map_err(|e| {
                let first = e.to_string().lines().next().unwrap_or_default().to_string();
                anyhow::anyhow!("--config {}: not TOML: {first}", path.display())
            })?;
            serde_json::to_value(table)?
        }
    };
    let Value::Object(root) = root else {
        bail!("--config {}: expected a table of flags", path.display());
    };
    let mut found = Vec::new();
    for (key, value) in root {
        let Value::Object(section) = value else {
            let flag = flag_name(&key);
            check_flag(path, command, &flag)?;
            found.push((flag, value));
            continue;
        };
        for (inner, value) in section {
            let flag = flag_name(&inner);
            check_flag(path, command, &flag)?;
            let heading = section_name(heading_of(command, &flag).as_deref());
            if heading != section_name(Some(&key)) {
                bail!(
                    "--config {}: [{key}] {inner}: --{flag} belongs to {}",
                    path.display(),
                    heading.map_or("the top level".to_string(), |h| format!("[{h}]"))
                );
            }
            found.push((flag, value));
        }
    }
    Ok(found)
}

/// A key as a long flag name (`batch_size` and `batch-size` alike).
fn flag_name(key: &str) -> String {
    key.replace('_', "-")
}

/// A section of `--help` as a table name: lower case, words joined by `-`.
fn section_name(heading: Option<&str>) -> Option<String> {
    heading.map(|h| {
        h.to_lowercase()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join("-")
    })
}

/// The `--help` section of `command`'s flag `flag`.
fn heading_of(command: &Command, flag: &str) -> Option<String> {
    command
        .get_arguments()
        .find(|a| a.get_long() == Some(flag))
        .and_then(|a| a.get_help_heading())
        .map(str::to_string)
}

/// Refuses a key that is no flag of `command` (or is `--config` itself).
fn check_flag(path: &Path, command: &Command, flag: &str) -> Result<()> {
    let known = flag != FLAG && command.get_arguments().any(|a| a.get_long() == Some(flag));
    if !known {
        bail!(
            "--config {}: unknown key '{flag}' (`{} --help` lists the flags)",
            path.display(),
            command.get_name()
        );
    }
    Ok(())
}

/// A scalar's text as a flag value.
fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.clone()),
        _ => None,
    }
}

/// The flags `key = value` stands for, checked by parsing them alone with `command`: nothing
/// for null (a flag left unset) or for false on a switch, `--key` for true on a switch,
/// `--key VALUE` otherwise (an array's items joined by commas).
fn as_flags(command: &Command, path: &Path, key: &str, value: &Value) -> Result<Vec<OsString>> {
    let arg = command
        .get_arguments()
        .find(|a| a.get_long() == Some(key))
        .expect("checked by check_flag");
    let switch = matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
    let flag = OsString::from(format!("--{key}"));
    let text = match value {
        Value::Null => return Ok(Vec::new()),
        Value::Bool(on) if switch => return Ok(if *on { vec![flag] } else { Vec::new() }),
        Value::Array(items) => items
            .iter()
            .map(scalar)
            .collect::<Option<Vec<_>>>()
            .map(|v| v.join(",")),
        value => scalar(value),
    };
    let Some(text) = text else {
        bail!(
            "--config {}: {key}: expected a value, not {value}",
            path.display()
        );
    };
    let flags = vec![flag, OsString::from(&text)];
    let probe = std::iter::once(OsString::from(command.get_name())).chain(flags.iter().cloned());
    if let Err(e) = command.clone().try_get_matches_from(probe) {
        let message = e.to_string();
        let first = message.lines().next().unwrap_or_default();
        bail!(
            "--config {}: {key} = {text}: {}",
            path.display(),
            first.trim_start_matches("error: ")
        );
    }
    Ok(flags)
}

#[cfg(test)]
mod tests;
