//! A job of rank processes for the tests: started with the launch environment a launcher
//! would set (a free port, a job token and id, one rayon thread each), and killed, reaped and
//! its shared-memory segments removed when dropped, even when an assertion failed.

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use weft_collectives::shm::{job_segment_prefix, remove_job_segments, SHM_DIR};

/// The ranks of one job.
pub struct RankJob {
    pub ranks: Vec<Child>,
    pub job_id: String,
}

impl RankJob {
    /// Starts `world` ranks of `program` with `args`, each with its stderr piped.
    pub fn start(program: &str, args: &[&str], world: usize, job_id: &str) -> RankJob {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let ranks = (0..world)
            .map(|rank| {
                Command::new(program)
                    .args(args)
                    .envs([
                        ("RANK", rank.to_string()),
                        ("LOCAL_RANK", rank.to_string()),
                        ("WORLD_SIZE", world.to_string()),
                        ("LOCAL_WORLD_SIZE", world.to_string()),
                        ("MASTER_ADDR", "127.0.0.1".into()),
                        ("MASTER_PORT", port.to_string()),
                        ("WEFT_JOB_TOKEN", format!("test-job-{job_id}")),
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
        RankJob {
            ranks,
            job_id: job_id.into(),
        }
    }

    /// Waits for every rank to succeed within `limit`; panics with the failing rank's stderr.
    pub fn finish(mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        for i in 0..self.ranks.len() {
            let status = loop {
                if let Some(status) = self.ranks[i].try_wait().unwrap() {
                    break status;
                }
                assert!(Instant::now() < deadline, "the job ran past {limit:?}");
                std::thread::sleep(Duration::from_millis(20));
            };
            assert!(
                status.success(),
                "rank {i}: {}",
                read_stderr(&mut self.ranks[i])
            );
        }
    }

    /// The job's shared-memory segments still in place.
    pub fn segments_left(&self) -> Vec<String> {
        let prefix = job_segment_prefix(&self.job_id);
        std::fs::read_dir(SHM_DIR)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|name| name.starts_with(&prefix))
            .collect()
    }

    /// Kills rank `victim` of a two-rank job and waits (at most 30 s) for the other rank to
    /// exit; returns its stderr after checking that it failed, that it names the dead rank, and
    /// that no rank process and no segment of the job is left.
    pub fn kill_and_check(&mut self, victim: usize) -> String {
        let pid = self.ranks[victim].id();
        let survivor = usize::from(victim == 0);
        self.ranks[victim].kill().unwrap();
        let killed_at = Instant::now();
        let status = loop {
            if let Some(status) = self.ranks[survivor].try_wait().unwrap() {
                break status;
            }
            assert!(
                killed_at.elapsed() < Duration::from_secs(30),
                "rank {survivor} still runs 30 s after rank {victim} died"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(!status.success());
        let message = read_stderr(&mut self.ranks[survivor]);
        let named = format!("rank {victim} (pid {pid}) died");
        assert!(
            message.contains(&named),
            "rank {survivor} did not name rank {victim}:\n{message}"
        );
        self.ranks[victim].wait().unwrap();
        for child in &self.ranks {
            let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), None)
                == Err(nix::errno::Errno::ESRCH);
            assert!(gone, "rank process {} is still alive", child.id());
        }
        assert_eq!(self.segments_left(), Vec::<String>::new());
        message
    }
}

impl Drop for RankJob {
    fn drop(&mut self) {
        for child in &mut self.ranks {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = remove_job_segments(&self.job_id);
    }
}

/// The child's stderr so far (taken: a second call reads nothing).
pub fn read_stderr(child: &mut Child) -> String {
    let mut text = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut text);
    }
    text
}

/// The per-step losses of the run folder `run`.
pub fn step_losses(run: &Path) -> Vec<f64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .expect("the run wrote metrics")
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
        .filter(|l| l.get("step").is_some())
        .map(|l| l["loss"].as_f64().expect("a loss"))
        .collect()
}
