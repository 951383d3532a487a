//! A rank killed inside a pipeline step: `train-gpt --pp 2` on two processes, the last stage
//! killed (SIGKILL) while steps run. The first stage, waiting on the dead stage's gradients,
//! fails within 30 s with an error naming rank 1, exits non-zero, and leaves no process and
//! no shared-memory segment of the job behind. A guard kills the ranks and removes the job's
//! segments even when an assertion fails.

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use weft_collectives::shm::{job_segment_prefix, remove_job_segments, SHM_DIR};

const TRAINER: &str = env!("CARGO_BIN_EXE_weft-gpt-rank");

/// The job's rank processes; killed, reaped and their segments removed on drop.
struct Job {
    ranks: Vec<Child>,
    job_id: String,
}

impl Drop for Job {
    fn drop(&mut self) {
        for child in &mut self.ranks {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = remove_job_segments(&self.job_id);
    }
}

fn start(out: &Path, job_id: &str) -> Job {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let flags = [
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
    ];
    let ranks = (0..2)
        .map(|rank| {
            Command::new(TRAINER)
                .args(flags)
                .args(["--out", out.to_str().unwrap()])
                .envs([
                    ("RANK", rank.to_string()),
                    ("LOCAL_RANK", rank.to_string()),
                    ("WORLD_SIZE", "2".into()),
                    ("LOCAL_WORLD_SIZE", "2".into()),
                    ("MASTER_ADDR", "127.0.0.1".into()),
                    ("MASTER_PORT", port.to_string()),
                    ("WEFT_JOB_TOKEN", "pipeline-failure-test".into()),
                    ("WEFT_JOB_ID", job_id.into()),
                    ("WEFT_TIMEOUT", "60".into()),
                    ("RAYON_NUM_THREADS", "1".into()),
                    ("RUST_BACKTRACE", "0".into()),
                    ("RUST_LIB_BACKTRACE", "0".into()),
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    Job {
        ranks,
        job_id: job_id.into(),
    }
}

/// Step lines rank 0 has logged so far.
fn steps_logged(run: &Path) -> usize {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .map(|text| text.lines().filter(|l| l.contains("\"step\"")).count())
        .unwrap_or(0)
}

fn segments_left(job_id: &str) -> Vec<String> {
    let prefix = job_segment_prefix(job_id);
    std::fs::read_dir(SHM_DIR)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with(&prefix))
        .collect()
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
    let victim = job.ranks[1].id() as i32;
    job.ranks[1].kill().unwrap();
    let killed_at = Instant::now();
    let status = loop {
        if let Some(status) = job.ranks[0].try_wait().unwrap() {
            break status;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(30),
            "stage 0 still runs 30 s after stage 1 died"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    let mut stderr = String::new();
    job.ranks[0]
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let named = format!("rank 1 (pid {victim}) died");
    assert!(
        stderr.contains(&named),
        "stage 0 did not name rank 1:\n{stderr}"
    );
    assert!(!stderr.trim().contains('\n'), "one line:\n{stderr}");
    job.ranks[1].wait().unwrap();
    for child in &job.ranks {
        let gone = kill(Pid::from_raw(child.id() as i32), None) == Err(Errno::ESRCH);
        assert!(gone, "rank process {} is still alive", child.id());
    }
    assert_eq!(segments_left(&job_id), Vec::<String>::new());
}
