//! Multi-process tests: `weft-run` starting `weft-collectives-selftest` ranks. Every launch
//! is owned by a guard that stops the launcher, kills the ranks it reported and removes the
//! job's shared-memory segments, even when an assertion fails.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use weft_collectives::shm::{job_segment_prefix, remove_job_segments, SHM_DIR};
use weft_collectives::{TcpStore, TcpStoreServer};

const WEFT_RUN: &str = env!("CARGO_BIN_EXE_weft-run");
const SELFTEST: &str = env!("CARGO_BIN_EXE_weft-collectives-selftest");

/// A running `weft-run` and what it printed so far.
struct Launch {
    child: Child,
    job_id: String,
    stdout_lines: Receiver<String>,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    rank_pids: Vec<i32>,
}

fn collect(
    stream: impl Read + Send + 'static,
    sink: Arc<Mutex<String>>,
    lines: Option<std::sync::mpsc::Sender<String>>,
) {
    thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            sink.lock().unwrap().push_str(&format!("{line}\n"));
            if let Some(lines) = &lines {
                let _ = lines.send(line);
            }
        }
    });
}

impl Launch {
    fn start(nproc: usize, tag: &str, launcher_args: &[&str], program_args: &[&str]) -> Launch {
        let job_id = format!("{tag}{nproc}n{}", std::process::id());
        let mut child = Command::new(WEFT_RUN)
            .args(["--nproc-per-node", &nproc.to_string(), "--job-id", &job_id])
            .args(launcher_args)
            .arg("--")
            .arg(SELFTEST)
            .args(program_args)
            .env("WEFT_TIMEOUT", "60")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting weft-run");
        let (stdout, stderr) = (
            Arc::new(Mutex::new(String::new())),
            Arc::new(Mutex::new(String::new())),
        );
        let (sender, stdout_lines) = channel();
        collect(
            child.stdout.take().unwrap(),
            Arc::clone(&stdout),
            Some(sender),
        );
        collect(child.stderr.take().unwrap(), Arc::clone(&stderr), None);
        Launch {
            child,
            job_id,
            stdout_lines,
            stdout,
            stderr,
            rank_pids: Vec::new(),
        }
    }

    /// Waits for every rank's `ready rank=R pid=P` line and returns the pids by rank.
    fn wait_ready(&mut self, nproc: usize) -> Vec<i32> {
        let mut pids = vec![0; nproc];
        let deadline = Instant::now() + Duration::from_secs(30);
        while pids.contains(&0) {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.stdout_lines.recv_timeout(left).unwrap_or_else(|_| {
                panic!("ranks not ready; stderr:\n{}", self.stderr.lock().unwrap())
            });
            if let Some((rank, pid)) = parse_ready(&line) {
                pids[rank] = pid;
            }
        }
        self.rank_pids = pids.clone();
        pids
    }

    /// Waits for the launcher to exit; returns its status, stdout and stderr.
    fn finish(&mut self, timeout: Duration) -> (ExitStatus, String, String) {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "weft-run did not exit within {timeout:?}"
            );
            thread::sleep(Duration::from_millis(20));
        };
        // The relay threads finish once the launcher's pipes close.
        thread::sleep(Duration::from_millis(100));
        let stdout = self.stdout.lock().unwrap().clone();
        let stderr = self.stderr.lock().unwrap().clone();
        (status, stdout, stderr)
    }
}

impl Drop for Launch {
    /// After a failed assertion: stops the launcher (which stops its ranks), then kills
    /// any rank it reported, in case the launcher itself had to be killed.
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
            for &pid in &self.rank_pids {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        let _ = remove_job_segments(&self.job_id);
    }
}

fn parse_ready(line: &str) -> Option<(usize, i32)> {
    let rest = line.split("ready rank=").nth(1)?;
    let (rank, pid) = rest.split_once(" pid=")?;
    Some((rank.trim().parse().ok()?, pid.trim().parse().ok()?))
}

fn no_segments_left(job_id: &str) -> bool {
    let prefix = job_segment_prefix(job_id);
    std::fs::read_dir(SHM_DIR)
        .unwrap()
        .filter_map(Result::ok)
        .all(|entry| !entry.file_name().to_string_lossy().starts_with(&prefix))
}

fn process_gone(pid: i32) -> bool {
    kill(Pid::from_raw(pid), None) == Err(Errno::ESRCH)
}

/// Every collective (the self-test: f32 at lengths 0, 1, 1001 and 2 MiB + 3, every other dtype
/// at 777 elements, split) on 1, 2, 3, 4 and 8 processes.
#[test]
fn collectives_agree_across_processes() {
    for nproc in [1, 2, 3, 4, 8] {
        let mut launch = Launch::start(nproc, "coll", &[], &["collectives"]);
        let (status, stdout, stderr) = launch.finish(Duration::from_secs(60));
        assert!(
            status.success(),
            "nproc {nproc}: {status}\nstdout:\n{stdout}\nstderr:\n{stderr}"
        );
        for rank in 0..nproc {
            assert!(
                stdout.contains(&format!("[rank {rank}] selftest ok rank {rank}")),
                "{stdout}"
            );
        }
        assert!(no_segments_left(&launch.job_id));
    }
}

#[test]
fn killing_a_rank_mid_collective_fails_the_others_and_the_launcher() {
    for nproc in [2, 4] {
        kill_one_rank_mid_collective(nproc);
    }
}

fn kill_one_rank_mid_collective(nproc: usize) {
    let mut launch = Launch::start(nproc, "kill", &[], &["loop"]);
    let pids = launch.wait_ready(nproc);
    thread::sleep(Duration::from_millis(100));
    let killed_at = Instant::now();
    kill(Pid::from_raw(pids[1]), Signal::SIGKILL).unwrap();
    let (status, _, stderr) = launch.finish(Duration::from_secs(60));
    let took = killed_at.elapsed();
    // The job ends because the death is detected, well before any operation timeout.
    assert!(
        took < Duration::from_secs(30),
        "the job took {took:?} to stop\n{stderr}"
    );
    assert!(!status.success());
    let launcher_line = format!(
        "weft-run: rank 1 (pid {}) was killed by signal 9 (SIGKILL)",
        pids[1]
    );
    assert!(stderr.contains(&launcher_line), "{stderr}");
    for rank in (0..nproc).filter(|&r| r != 1) {
        let died = format!(
            "[rank {rank}] selftest error: rank {rank} all_reduce failed: rank 1 (pid {}) died",
            pids[1]
        );
        assert!(
            stderr.contains(&died),
            "rank {rank} did not name rank 1:\n{stderr}"
        );
    }
    assert!(no_segments_left(&launch.job_id));
    assert!(
        pids.iter().all(|&pid| process_gone(pid)),
        "a rank process is still alive"
    );
}

#[test]
fn a_rank_exiting_non_zero_stops_the_job_with_its_status() {
    let nproc = 3;
    let args = ["exit", "--rank", "1", "--code", "7"];
    let mut launch = Launch::start(
        nproc,
        "exit",
        &["--exit-grace-secs", "0.2", "--kill-grace-secs", "2"],
        &args,
    );
    let pids = launch.wait_ready(nproc);
    let (status, _, stderr) = launch.finish(Duration::from_secs(20));
    assert_eq!(status.code(), Some(7), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "weft-run: rank 1 (pid {}) exited with status 7",
            pids[1]
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("was killed by signal 15 (SIGTERM)"),
        "{stderr}"
    );
    assert!(
        pids.iter().all(|&pid| process_gone(pid)),
        "a rank process is still alive"
    );
}

#[test]
fn signals_to_the_launcher_are_forwarded_to_every_rank() {
    let nproc = 2;
    let mut launch = Launch::start(nproc, "sig", &[], &["exit", "--rank", "9", "--code", "1"]);
    let pids = launch.wait_ready(nproc);
    kill(Pid::from_raw(launch.child.id() as i32), Signal::SIGINT).unwrap();
    let (status, _, stderr) = launch.finish(Duration::from_secs(20));
    assert_eq!(status.code(), Some(128 + 2), "{stderr}");
    assert!(
        stderr.contains("stopped all ranks after receiving SIGINT"),
        "{stderr}"
    );
    assert!(
        pids.iter().all(|&pid| process_gone(pid)),
        "a rank process is still alive"
    );
}

#[test]
fn store_checks_tokens_and_times_out_across_processes() {
    let server = TcpStoreServer::bind("127.0.0.1:0", "right").unwrap();
    let addr = server.local_addr().to_string();
    let probe = |token: &str| {
        Command::new(SELFTEST)
            .args(["store-probe", "--addr", &addr, "--token", token])
            .output()
            .unwrap()
    };
    let rejected = probe("wrong");
    assert!(!rejected.status.success());
    assert!(String::from_utf8_lossy(&rejected.stderr).contains("invalid job token"));
    let accepted = probe("right");
    let stdout = String::from_utf8_lossy(&accepted.stdout);
    assert!(
        accepted.status.success(),
        "{}",
        String::from_utf8_lossy(&accepted.stderr)
    );
    assert!(stdout.contains("add=1"), "{stdout}");
    assert!(
        stdout.contains("wait failed: store wait timed out") && stdout.contains("never-set"),
        "{stdout}"
    );
    let local = TcpStore::connect(&addr, "right", Duration::from_secs(5)).unwrap();
    assert_eq!(local.add("probe", 1).unwrap(), 2);
}
