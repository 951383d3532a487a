//! Every input kept under `fuzz/regressions/<target>/` (inputs that once broke a target, and
//! the hand-made cases of the bugs fixed without one) replayed through its target's check: a
//! panic here is a regression. Runs on stable, in the CI suite.

use std::path::Path;

#[test]
fn every_kept_input_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions");
    let mut replayed = 0;
    for (target, check) in weft_fuzz_checks::TARGETS {
        let folder = root.join(target);
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md") {
                continue;
            }
            let data = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| check(&data));
            assert!(outcome.is_ok(), "{target}: {} fails again", path.display());
            replayed += 1;
        }
    }
    assert!(
        replayed >= 8,
        "only {replayed} kept inputs under {}",
        root.display()
    );
}

/// Each target accepts what it should: valid inputs pass their checks (a check that refused
/// everything would pass every regression trivially).
#[test]
fn valid_inputs_pass_and_reach_the_checks() {
    let progress = br#"{"step": 4}"#;
    weft_fuzz_checks::run_records(progress);
    let manifest = br#"{"format": "weft-sharded-v1", "optimizer": "sgd", "step": 1,
        "buffers": [], "master_weights": false, "flat_len": 9,
        "entries": [{"name": "layer.weight", "shape": [2, 3], "offset": 0},
                    {"name": "layer.bias", "shape": [3], "offset": 6}],
        "shards": [{"file": "s.safetensors", "start": 0, "end": 9}],
        "model_file": "m.safetensors"}"#;
    weft_fuzz_checks::checkpoint_manifest(manifest);
    let env = b"RANK=1\nWORLD_SIZE=2\nMASTER_ADDR=127.0.0.1\nMASTER_PORT=29500\nWEFT_JOB_TOKEN=t";
    weft_fuzz_checks::launch_env(env);
    weft_fuzz_checks::store_server(b"\x00\x00\x00\x05hello");
}
