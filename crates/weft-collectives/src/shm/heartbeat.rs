//! A rank's heartbeat thread: bumps the rank's heartbeat counter in the segment at a fixed
//! interval, so that waiting peers can tell a frozen or dead process from a slow one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crate::error::{CommError, Result};
use crate::shm::layout::Region;

/// Owns the heartbeat thread; dropping it stops and joins the thread.
pub(crate) struct Heartbeat {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    pub(crate) fn start(region: Arc<Region>, rank: usize, interval: Duration) -> Result<Heartbeat> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let thread = thread::Builder::new()
            .name(format!("weft-heartbeat-{rank}"))
            .spawn(move || {
                while !thread_stop.load(Ordering::Acquire) {
                    region.heartbeat(rank).fetch_add(1, Ordering::Release);
                    thread::park_timeout(interval);
                }
            })
            .map_err(|e| CommError::io(format!("starting heartbeat thread of rank {rank}"), e))?;
        Ok(Heartbeat {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::layout::Layout;
    use crate::shm::segment::new_segment_name;

    #[test]
    fn heartbeat_advances_while_running_and_stops_on_drop() {
        let region =
            Arc::new(Region::create(&new_segment_name("beat"), Layout::new(2, 4096, 128)).unwrap());
        region.segment().unlink().unwrap();
        let beat = Heartbeat::start(Arc::clone(&region), 1, Duration::from_millis(1)).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while region.heartbeat(1).load(Ordering::Acquire) < 3 {
            assert!(
                std::time::Instant::now() < deadline,
                "heartbeat did not advance"
            );
            thread::sleep(Duration::from_millis(1));
        }
        drop(beat);
        let stopped = region.heartbeat(1).load(Ordering::Acquire);
        thread::sleep(Duration::from_millis(10));
        assert_eq!(region.heartbeat(1).load(Ordering::Acquire), stopped);
        assert_eq!(region.heartbeat(0).load(Ordering::Acquire), 0);
    }
}
