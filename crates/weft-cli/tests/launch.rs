//! The `weft` binary as launchers start it: through `weft run` and as torchrun starts ranks
//! (its variables set by hand), with no `--name`: the ranks agree on one run folder named
//! from the launcher's job id. Each job is a gpt-tiny step on a small synthetic set, bounded by
//! a deadline; its processes are killed and its shared-memory segments removed whatever
//! happens.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const WEFT: &str = env!("CARGO_BIN_EXE_weft");
const DEADLINE: Duration = Duration::from_secs(120);

/// One gpt-tiny step on a small data set, written under `out`.
fn train_gpt(out: &Path) -> Vec<String> {
    let flags = "train-gpt --steps 1 --batch-size 4 --synthetic-tokens 8192 --val-tokens 1024 \
                 --quiet --out";
    flags
        .split_whitespace()
        .map(String::from)
        .chain([out.to_str().unwrap().to_string()])
        .collect()
}

/// Processes killed and the job's segments removed when dropped.
struct Job {
    children: Vec<Child>,
    job_id: String,
}

impl Job {
    /// Waits for every process, each within the deadline; their outputs.
    fn wait(mut self) -> Vec<Output> {
        let start = Instant::now();
        let mut outputs = Vec::new();
        for child in std::mem::take(&mut self.children) {
            let mut child = child;
            while child.try_wait().unwrap().is_none() {
                if start.elapsed() > DEADLINE {
                    let _ = child.kill();
                    panic!("the job {} did not end within {DEADLINE:?}", self.job_id);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            outputs.push(child.wait_with_output().unwrap());
        }
        outputs
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = weft_collectives::shm::remove_job_segments(&self.job_id);
    }
}

fn spawn(command: &mut Command) -> Child {
    command
        .env("WEFT_TIMEOUT", "60")
        .env("RAYON_NUM_THREADS", "1")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting weft")
}

fn assert_succeeded(outputs: &[Output]) {
    for output in outputs {
        assert!(
            output.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

fn run_folders(out: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn weft_run_ranks_share_one_run_folder_named_from_the_job_id() {
    let dir = tempfile::tempdir().unwrap();
    let job_id = format!("cli{}", std::process::id());
    let job = Job {
        children: vec![spawn(
            Command::new(WEFT)
                .args([
                    "run",
                    "--nproc-per-node",
                    "2",
                    "--job-id",
                    &job_id,
                    "--",
                    WEFT,
                ])
                .args(train_gpt(dir.path())),
        )],
        job_id: job_id.clone(),
    };
    assert_succeeded(&job.wait());
    assert_eq!(
        run_folders(dir.path()),
        [format!("gpt-tiny-synthetic-{job_id}")]
    );
}

#[test]
fn torchrun_ranks_without_a_name_share_one_run_folder() {
    let dir = tempfile::tempdir().unwrap();
    // torchrun's store takes MASTER_PORT; weft's then listens on the port after it.
    let port = loop {
        let first = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = first.local_addr().unwrap().port();
        if port < u16::MAX && TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            break port;
        }
    };
    let run_id = format!("tr{}", std::process::id());
    let children = (0..2)
        .map(|rank| {
            spawn(
                Command::new(WEFT)
                    .args(train_gpt(dir.path()))
                    .env("RANK", rank.to_string())
                    .env("LOCAL_RANK", rank.to_string())
                    .env("WORLD_SIZE", "2")
                    .env("LOCAL_WORLD_SIZE", "2")
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", port.to_string())
                    .env("TORCHELASTIC_RUN_ID", &run_id)
                    .env_remove("WEFT_JOB_ID")
                    .env_remove("WEFT_JOB_TOKEN"),
            )
        })
        .collect();
    let job = Job {
        children,
        job_id: format!("port{}", port + 1),
    };
    assert_succeeded(&job.wait());
    assert_eq!(
        run_folders(dir.path()),
        [format!("gpt-tiny-synthetic-{run_id}")]
    );
}

#[test]
fn a_gpu_on_a_cpu_only_build_is_one_line() {
    if cfg!(feature = "cuda") {
        return;
    }
    let output = Command::new(WEFT)
        .args(["train-gpt", "--device", "cuda"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--device cuda") && stderr.contains("--features cuda"));
}
