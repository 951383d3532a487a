//! `cargo xtask fuzz --seconds N`: runs each fuzz target of `fuzz/` (cargo-fuzz, libFuzzer, on
//! the nightly toolchain; release code with debug assertions on) for N seconds, from a corpus
//! seeded with valid inputs and with the inputs kept under `fuzz/regressions/<target>/`. Each
//! target hands its inputs to the check of the same name in `weft-fuzz-checks`, whose test
//! replays the kept inputs on stable. The first finding stops it with one line naming the
//! target; the input is copied into `fuzz/regressions/<target>/`, so that once the code is
//! fixed the CI suite replays it for good.

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
    let installed = Command::new("cargo")
        .args(["+nightly", "fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        bail!("cargo-fuzz on the nightly toolchain is missing: rustup toolchain install nightly && cargo install cargo-fuzz");
    }
    for (target, max_len) in TARGETS {
        if !args.targets.is_empty() && !args.targets.iter().any(|t| t == target) {
            continue;
        }
        let corpus = seed_corpus(&root, target)?;
        println!("fuzz {target} for {} s", args.seconds);
        let status = Command::new("cargo")
            .current_dir(&root)
            .args([
                "+nightly",
                "fuzz",
                "run",
                target,
                "--release",
                "--debug-assertions",
            ])
            .arg(&corpus)
            .arg("--")
            .arg(format!("-max_total_time={}", args.seconds))
            .arg(format!("-max_len={max_len}"))
            .status()
            .with_context(|| format!("fuzz target {target}: cargo fuzz did not start"))?;
        if !status.success() {
            let kept = keep_finding(&root, target)?;
            bail!(
                "fuzz target {target}: an input fails ({status}); kept as {} — fix the code, then the CI suite replays it (weft-fuzz-checks' regressions test)",
                kept.display()
            );
        }
    }
    Ok(())
}

/// Copies the newest input cargo-fuzz saved for `target` (fuzz/artifacts/<target>/) into
/// fuzz/regressions/<target>/; its new path.
fn keep_finding(root: &Path, target: &str) -> Result<PathBuf> {
    let artifacts = root.join("fuzz/artifacts").join(target);
    let newest = std::fs::read_dir(&artifacts)
        .with_context(|| format!("{}: no saved input to keep", artifacts.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max()
        .map(|(_, path)| path)
        .with_context(|| format!("{}: no saved input to keep", artifacts.display()))?;
    let kept = root
        .join("fuzz/regressions")
        .join(target)
        .join(newest.file_name().context("a file name")?);
    std::fs::create_dir_all(kept.parent().context("a folder")?)?;
    std::fs::copy(&newest, &kept)
        .with_context(|| format!("{}: cannot copy to {}", newest.display(), kept.display()))?;
    Ok(kept)
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
