//! Starting rank processes and relaying their output. Each rank runs in its own process
//! group (so it and anything it starts can be signalled together) and gets SIGKILL if the
//! launcher dies. Every line it writes to stdout or stderr is copied to the launcher's with
//! a `[rank R] ` prefix.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::{self, JoinHandle};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use super::args::Plan;

/// A started rank.
pub struct Rank {
    pub rank: usize,
    pub pid: i32,
    child: Child,
    pub status: Option<ExitStatus>,
    relays: Vec<JoinHandle<()>>,
}

impl Rank {
    /// Starts local rank `local_rank` of `plan`.
    pub fn spawn(plan: &Plan, local_rank: usize) -> Result<Rank, String> {
        let rank = plan.first_rank + local_rank;
        let launcher = std::process::id() as libc::pid_t;
        let mut command = Command::new(&plan.program);
        command
            .args(&plan.program_args)
            .envs(plan.rank_env(local_rank))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        // SAFETY: prctl, getppid and _exit are async-signal-safe.
        unsafe {
            command.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != launcher {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start {:?} for rank {rank}: {e}", plan.program))?;
        let stdout = child.stdout.take().map(|out| relay(rank, out, false));
        let stderr = child.stderr.take().map(|err| relay(rank, err, true));
        Ok(Rank {
            rank,
            pid: child.id() as i32,
            child,
            status: None,
            relays: stdout.into_iter().chain(stderr).collect(),
        })
    }

    /// Records the exit status if the process has exited; true once it has.
    pub fn poll(&mut self) -> bool {
        if self.status.is_none() {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.status = Some(status);
            }
        }
        self.status.is_some()
    }

    /// Sends `signal` to the rank's process group (the rank and what it started).
    pub fn signal_group(&self, signal: Signal) {
        // The group may already be gone.
        let _ = killpg(Pid::from_raw(self.pid), signal);
    }

    /// Whether the output relays have seen the end of both streams.
    pub fn relays_done(&self) -> bool {
        self.relays.iter().all(JoinHandle::is_finished)
    }
}

/// Describes how a process ended, e.g. `exited with status 3` or `was killed by SIGKILL`.
pub fn describe(status: &ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => {
            let name = Signal::try_from(signal).map_or("an unknown signal", Signal::as_str);
            format!("was killed by signal {signal} ({name})")
        }
        _ => "ended in an unknown way".to_string(),
    }
}

fn relay(rank: usize, stream: impl Read + Send + 'static, to_stderr: bool) -> JoinHandle<()> {
    thread::spawn(move || {
        let prefix = format!("[rank {rank}] ");
        let mut reader = BufReader::new(stream);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if line.last() != Some(&b'\n') {
                        line.push(b'\n');
                    }
                    // One write per line under the lock keeps lines from interleaving.
                    let _ = if to_stderr {
                        write_line(&mut std::io::stderr().lock(), &prefix, &line)
                    } else {
                        write_line(&mut std::io::stdout().lock(), &prefix, &line)
                    };
                }
            }
        }
    })
}

/// Writes `line` after `prefix`, unless the line starts with the prefix already (the trainers'
/// log lines carry their rank).
fn write_line(out: &mut impl Write, prefix: &str, line: &[u8]) -> std::io::Result<()> {
    let mut framed = Vec::with_capacity(prefix.len() + line.len());
    if !line.starts_with(prefix.as_bytes()) {
        framed.extend_from_slice(prefix.as_bytes());
    }
    framed.extend_from_slice(line);
    out.write_all(&framed)?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::write_line;

    #[test]
    fn a_line_gets_the_rank_prefix_once() {
        let mut out = Vec::new();
        write_line(&mut out, "[rank 1] ", b"hello\n").unwrap();
        write_line(&mut out, "[rank 1] ", b"[rank 1] epoch 0\n").unwrap();
        write_line(&mut out, "[rank 1] ", b"[rank 0] not mine\n").unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "[rank 1] hello\n[rank 1] epoch 0\n[rank 1] [rank 0] not mine\n"
        );
    }
}
