//! A rank killed inside a pipeline step: `train-gpt --pp 2` on two processes, the last stage
//! killed (SIGKILL) while steps run. The first stage, waiting on the dead stage's gradients,
//! fails within 30 s with an error naming rank 1, exits non-zero, and leaves no process and
//! no shared-memory segment of the job behind. A guard kills the ranks and removes the job's
//! segments even when an assertion fails.

use std::path::Path;
use std::time::{Duration, Instant};

use weft_tests::rank_job::RankJob;

const TRAINER: &str = env!("CARGO_BIN_EXE_weft-gpt-rank");

fn start(out: &Path, job_id: &str) -> RankJob {
    let args = [
        "--pp",
        "2",
        "--micro-batches",
        "2",
        "--batch-size",
        "4",
        "--seq-len",
        "16",
        "--synthetic-tokens",
        "65536",
        "--val-tokens",
        "256",
        "--steps",
        "1000000",
        "--quiet",
        "--name",
        "pp",
        "--out",
        out.to_str().unwrap(),
    ];
    RankJob::start(TRAINER, &args, 2, job_id)
}

/// Step lines rank 0 has logged so far.
fn steps_logged(run: &Path) -> usize {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .map(|text| text.lines().filter(|l| l.contains("\"step\"")).count())
        .unwrap_or(0)
}

#[test]
fn a_stage_killed_mid_step_ends_the_job_naming_it() {
    let out = tempfile::tempdir().unwrap();
    let job_id = format!("ppkill{}", std::process::id());
    let mut job = start(out.path(), &job_id);
    let deadline = Instant::now() + Duration::from_secs(120);
    while steps_logged(&out.path().join("pp")) < 3 {
        assert!(Instant::now() < deadline, "the pipeline never ran 3 steps");
        for child in &mut job.ranks {
            assert!(child.try_wait().unwrap().is_none(), "a rank exited early");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let message = job.kill_and_check(1);
    assert!(!message.trim().contains('\n'), "one line:\n{message}");
}
