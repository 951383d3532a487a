//! A rank killed mid-training, then the job resumed: `train-resnet` under ZeRO-1 on two
//! processes saves a checkpoint every 2 steps; rank 1 is SIGKILLed once the step-4 checkpoint
//! is complete. Rank 0 ends non-zero within 30 s naming rank 1, and no process or shared-memory
//! segment of the job is left. `--resume` on the run folder then goes on from the newest
//! complete checkpoint to step 12 and logs the losses of an uninterrupted 12-step run, bit for
//! bit (a constant learning rate, so the killed run's open-ended `--steps` changes nothing).
//! The same holds when rank 1, or rank 0 (which completes each checkpoint), is killed while it
//! writes one: the checkpoint being written is never taken for a whole one, and the ones before
//! it stay loadable.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use weft_tests::rank_job::{step_losses, RankJob};

const TRAINER: &str = env!("CARGO_BIN_EXE_weft-train-rank");

fn start(out: &Path, job_id: &str, extra: &[&str]) -> RankJob {
    let mut args = vec![
        "--model",
        "resnet20",
        "--image-size",
        "32",
        "--synthetic-train",
        "1024",
        "--synthetic-val",
        "64",
        "--batch-size",
        "64",
        "--lr-schedule",
        "constant",
        "--zero",
        "1",
        "--workers",
        "0",
        "--quiet",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    RankJob::start(TRAINER, &args, 2, job_id)
}

#[test]
fn a_killed_job_resumes_to_the_uninterrupted_losses() {
    let out = tempfile::tempdir().unwrap();
    let (pid, limit) = (std::process::id(), Duration::from_secs(120));
    let straight = ["--steps", "12", "--name", "straight"];
    start(out.path(), &format!("straight{pid}"), &straight).finish(limit);

    let endless = [
        "--steps",
        "1000000",
        "--save-every",
        "2",
        "--name",
        "killed",
    ];
    let mut job = start(out.path(), &format!("killed{pid}"), &endless);
    let complete = out
        .path()
        .join("killed/checkpoints/step-00000004/progress.json");
    let deadline = Instant::now() + limit;
    while !complete.exists() {
        assert!(
            Instant::now() < deadline,
            "no step-4 checkpoint within {limit:?}"
        );
        for child in &mut job.ranks {
            assert!(child.try_wait().unwrap().is_none(), "a rank exited early");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    job.kill_and_check(1);
    drop(job);

    let run = out.path().join("killed");
    let resume = ["--resume", run.to_str().unwrap(), "--steps", "12"];
    start(out.path(), &format!("resumed{pid}"), &resume).finish(limit);
    let expected = step_losses(&out.path().join("straight"));
    assert_eq!(expected.len(), 12);
    assert_eq!(step_losses(&run), expected);
}

/// The checkpoint folder being written (`step-N.partial`) under `run`, if any.
fn being_written(run: &Path) -> Option<PathBuf> {
    std::fs::read_dir(run.join("checkpoints"))
        .ok()?
        .filter_map(|e| Some(e.ok()?.path()))
        .find(|p| p.extension().is_some_and(|e| e == "partial"))
}

/// Rank `victim` dies as soon as a checkpoint is seen half-written (past the first, so that an
/// earlier complete one exists): rank 1 writing its shard, or rank 0, which also writes the
/// manifest, renames the folder and writes the record; the resumed run logs the uninterrupted
/// losses either way.
fn killed_mid_save(victim: usize) {
    let out = tempfile::tempdir().unwrap();
    let (pid, limit) = (std::process::id(), Duration::from_secs(120));
    let straight = ["--steps", "10", "--name", "straight"];
    start(out.path(), &format!("wstraight{victim}-{pid}"), &straight).finish(limit);

    let endless = [
        "--steps",
        "1000000",
        "--save-every",
        "1",
        "--name",
        "killed",
    ];
    let mut job = start(out.path(), &format!("wkilled{victim}-{pid}"), &endless);
    let run = out.path().join("killed");
    let first = run.join("checkpoints/step-00000001/progress.json");
    let deadline = Instant::now() + limit;
    let partial = loop {
        assert!(
            Instant::now() < deadline,
            "no half-written checkpoint seen within {limit:?}"
        );
        for child in &mut job.ranks {
            assert!(child.try_wait().unwrap().is_none(), "a rank exited early");
        }
        if let Some(partial) = being_written(&run).filter(|_| first.exists()) {
            break partial;
        }
        std::thread::sleep(Duration::from_micros(200));
    };
    job.kill_and_check(victim);
    drop(job);

    // The resumed run starts from the newest whole checkpoint: the one caught half-written if
    // rank 0 could still finish it with every shard and its record, else the one before (a
    // folder renamed into place without its record is skipped, named in a warning).
    let name = partial.file_stem().unwrap().to_str().unwrap().to_string();
    let resume = ["--resume", run.to_str().unwrap(), "--steps", "10"];
    start(out.path(), &format!("wresumed{victim}-{pid}"), &resume).finish(limit);
    let expected = step_losses(&out.path().join("straight"));
    assert_eq!(expected.len(), 10);
    assert_eq!(step_losses(&run), expected, "resumed past {name}");
}

#[test]
fn a_writer_killed_mid_save_leaves_the_earlier_checkpoints_to_resume_from() {
    killed_mid_save(1);
}

#[test]
fn rank_0_killed_mid_save_leaves_the_earlier_checkpoints_to_resume_from() {
    killed_mid_save(0);
}
