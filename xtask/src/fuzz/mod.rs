//! `cargo xtask fuzz --seconds N`: runs each fuzz target of `fuzz/` (cargo-fuzz, libFuzzer;
//! release code with debug assertions on) for N seconds, from a corpus seeded with valid inputs
//! and with the inputs kept under `fuzz/regressions/<target>/`. cargo-fuzz needs nightly
//! compiler flags: the nightly toolchain when rustup has one, else the stable one with
//! `RUSTC_BOOTSTRAP=1` (which accepts them). Each target hands its inputs to the check of the
//! same name in `weft-fuzz-checks`, whose test replays the kept inputs on stable. The first
//! finding stops it with one line naming the target; the input, minimised by `cargo fuzz tmin`,
//! is copied into `fuzz/regressions/<target>/`, so that once the code is fixed the CI suite
//! replays it for good.

mod seeds;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The fuzz targets (fuzz/fuzz_targets/<name>.rs) and the longest input each is given.
const TARGETS: [(&str, usize); 8] = [
    ("cifar_records", 16384),
    ("safetensors_load", 4096),
    ("checkpoint_manifest", 4096),
    ("store_protocol", 4096),
    ("store_server", 4096),
    ("run_records", 4096),
    ("launch_env", 2048),
    ("image_decode", 65536),
];

#[derive(clap::Args, Debug)]
pub struct FuzzArgs {
    /// Seconds each target runs
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Only these targets (comma-separated; default all)
    #[arg(long, value_delimiter = ',')]
    pub targets: Vec<String>,
}

pub fn run(args: &FuzzArgs) -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("xtask has a parent folder")?
        .to_path_buf();
    for name in &args.targets {
        if !TARGETS.iter().any(|(t, _)| t == name) {
            let all: Vec<&str> = TARGETS.iter().map(|t| t.0).collect();
            bail!(
                "--targets: no fuzz target {name:?} (targets: {})",
                all.join(", ")
            );
        }
    }
    let toolchain = Toolchain::find()?;
    for (target, max_len) in TARGETS {
        if !args.targets.is_empty() && !args.targets.iter().any(|t| t == target) {
            continue;
        }
        let corpus = seed_corpus(&root, target)?;
        println!("fuzz {target} for {} s", args.seconds);
        let status = toolchain
            .cargo_fuzz(&root, &["run", target, "--release", "--debug-assertions"])
            .arg(&corpus)
            .arg("--")
            .arg(format!("-max_total_time={}", args.seconds))
            .arg(format!("-max_len={max_len}"))
            .status()
            .with_context(|| format!("fuzz target {target}: cargo fuzz did not start"))?;
        if !status.success() {
            let kept = keep_finding(&root, target, &toolchain)?;
            bail!(
                "fuzz target {target}: an input fails ({status}); kept as {} — fix the code, then the CI suite replays it (weft-fuzz-checks' regressions test)",
                kept.display()
            );
        }
    }
    Ok(())
}

/// How cargo-fuzz gets its nightly flags: the nightly toolchain, or stable told to accept them.
enum Toolchain {
    Nightly,
    StableBootstrap,
}

impl Toolchain {
    /// Nightly when rustup has it, else stable with `RUSTC_BOOTSTRAP=1`; cargo-fuzz must be
    /// installed either way.
    fn find() -> Result<Self> {
        let works = |args: &[&str]| {
            Command::new("cargo")
                .args(args)
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if works(&["+nightly", "fuzz", "--version"]) {
            return Ok(Self::Nightly);
        }
        if works(&["fuzz", "--version"]) {
            return Ok(Self::StableBootstrap);
        }
        bail!("cargo-fuzz is missing: cargo install cargo-fuzz (it runs on nightly, or on stable with RUSTC_BOOTSTRAP=1)")
    }

    /// `cargo [+nightly] fuzz ARGS` in `root`.
    fn cargo_fuzz(&self, root: &Path, args: &[&str]) -> Command {
        let mut command = Command::new("cargo");
        command.current_dir(root);
        match self {
            Self::Nightly => command.arg("+nightly"),
            Self::StableBootstrap => command.env("RUSTC_BOOTSTRAP", "1"),
        };
        command.arg("fuzz").args(args);
        command
    }
}

/// Minimises the newest input cargo-fuzz saved for `target` (fuzz/artifacts/<target>/) with
/// `cargo fuzz tmin` and copies the result (the original if minimising fails) into
/// fuzz/regressions/<target>/; its new path.
fn keep_finding(root: &Path, target: &str, toolchain: &Toolchain) -> Result<PathBuf> {
    let artifacts = root.join("fuzz/artifacts").join(target);
    let (_, newest) = newest_file(&artifacts, |_| true)
        .with_context(|| format!("{}: no saved input to keep", artifacts.display()))?;
    // libFuzzer writes the minimised input beside it as `minimized-from-<hash>`.
    let started = std::time::SystemTime::now();
    let args = ["tmin", target, "--release", "--debug-assertions"];
    let tmin = toolchain.cargo_fuzz(root, &args).arg(&newest).status();
    let minimised = newest_file(&artifacts, |name| name.starts_with("minimized-from-"))
        .filter(|(modified, _)| *modified >= started);
    let newest = match (tmin, minimised) {
        (Ok(status), Some((_, path))) if status.success() => path,
        _ => newest,
    };
    let kept = root
        .join("fuzz/regressions")
        .join(target)
        .join(newest.file_name().context("a file name")?);
    std::fs::create_dir_all(kept.parent().context("a folder")?)?;
    std::fs::copy(&newest, &kept)
        .with_context(|| format!("{}: cannot copy to {}", newest.display(), kept.display()))?;
    Ok(kept)
}

/// The most recently modified file of `dir` whose name passes `wanted`, with its time.
fn newest_file(
    dir: &Path,
    wanted: impl Fn(&str) -> bool,
) -> Option<(std::time::SystemTime, PathBuf)> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| wanted(&e.file_name().to_string_lossy()))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max()
}

/// `fuzz/corpus/<target>`, with the seed inputs and the kept regression inputs written into it.
fn seed_corpus(root: &Path, target: &str) -> Result<PathBuf> {
    let corpus = root.join("fuzz").join("corpus").join(target);
    std::fs::create_dir_all(&corpus)
        .with_context(|| format!("{}: cannot create", corpus.display()))?;
    for (i, seed) in seeds::seeds(target)?.iter().enumerate() {
        let path = corpus.join(format!("seed-{i}"));
        std::fs::write(&path, seed).with_context(|| format!("{}: cannot write", path.display()))?;
    }
    if let Ok(kept) = std::fs::read_dir(root.join("fuzz/regressions").join(target)) {
        for entry in kept.filter_map(|e| e.ok()) {
            let to = corpus.join(entry.file_name());
            std::fs::copy(entry.path(), &to)
                .with_context(|| format!("{}: cannot write", to.display()))?;
        }
    }
    Ok(corpus)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// The seeds are what the targets accept: a CIFAR seed reads, a safetensors seed loads
    /// (into the target's model), a manifest seed parses.
    #[test]
    fn every_target_has_seeds_its_format_accepts() {
        for (target, max_len) in TARGETS {
            let seeds = seeds::seeds(target).unwrap();
            assert!(!seeds.is_empty(), "{target}");
            assert!(seeds.iter().all(|s| s.len() <= max_len), "{target}");
        }
        let cifar = &seeds::seeds("cifar_records").unwrap()[1];
        let data = weft_data::Cifar10::from_bytes(Path::new("seed"), cifar.clone()).unwrap();
        assert_eq!(weft_data::Dataset::len(&data), 2);
        for seed in seeds::seeds("checkpoint_manifest").unwrap() {
            let text = String::from_utf8(seed).unwrap();
            weft_parallel::zero::manifest::Manifest::parse(&text, Path::new("m.json")).unwrap();
        }
        let tensors = &seeds::seeds("safetensors_load").unwrap()[0];
        let loaded = candle_core::safetensors::load_buffer(tensors, &candle_core::Device::Cpu);
        assert_eq!(loaded.unwrap().len(), 3);
    }

    #[test]
    fn an_unknown_target_is_one_line_naming_the_flag() {
        let args = FuzzArgs {
            seconds: 1,
            targets: vec!["nope".into()],
        };
        let err = run(&args).unwrap_err().to_string();
        assert!(
            err.starts_with("--targets: no fuzz target \"nope\" (targets: cifar_records"),
            "{err}"
        );
    }
}
