//! Splitting a shared-memory communicator: the ranks exchange colours and keys, the first
//! member of each new group creates the group's segment, the members exchange segment
//! names through the parent, open the segment, wait for each other, and the creator
//! unlinks the name once every member has mapped it.

use std::sync::Arc;

use crate::buffer::Buffer;
use crate::error::{CommError, Result};
use crate::shm::engine::ShmEngine;
use crate::shm::layout::{Layout, Region};
use crate::shm::segment::new_segment_name;
use crate::shm::ShmCommunicator;
use crate::split::group_of;

/// Room for a segment name in the name exchange.
const NAME_BYTES: usize = 128;

impl ShmEngine {
    pub(crate) fn split(&mut self, color: u32, key: i64) -> Result<ShmCommunicator> {
        let entries = self
            .all_gather(Buffer::I64(vec![i64::from(color), key]))?
            .into_vec::<i64>()?;
        let pairs: Vec<(u32, i64)> = entries.chunks(2).map(|c| (c[0] as u32, c[1])).collect();
        let group = group_of(&pairs, self.rank);
        let (leader, size) = (group.members[0], group.members.len());
        let created = (leader == self.rank).then(|| {
            let layout = Layout::from_config(size, &self.config);
            Region::create(&new_segment_name(&self.config.job_id), layout)
        });
        // Every rank joins the name exchange, even a leader that failed, so no one hangs.
        let mut name = vec![0u8; NAME_BYTES];
        if let Some(Ok(region)) = &created {
            let bytes = region.segment().name().as_bytes();
            name[..bytes.len().min(NAME_BYTES)]
                .copy_from_slice(&bytes[..bytes.len().min(NAME_BYTES)]);
        }
        let names = self.all_gather(Buffer::U8(name))?.into_vec::<u8>()?;
        let region = match created {
            Some(region) => region?,
            None => {
                let raw = &names[leader * NAME_BYTES..(leader + 1) * NAME_BYTES];
                let name: Vec<u8> = raw.iter().copied().take_while(|&b| b != 0).collect();
                let name = String::from_utf8(name).unwrap_or_default();
                if name.is_empty() {
                    return Err(CommError::PeerFailed {
                        rank: leader,
                        op: "split",
                        reason: "it could not create the new group's segment".to_string(),
                    });
                }
                Region::open(&name, size)?
            }
        };
        let child = ShmCommunicator::attach(Arc::new(region), group.rank, self.config.clone())?;
        child.wait_attached("split")?;
        if leader == self.rank {
            child.unlink_segment()?;
        }
        Ok(child)
    }
}
