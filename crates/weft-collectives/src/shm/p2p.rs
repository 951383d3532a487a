//! Point-to-point messages through per-pair mailboxes of two halves. The sender writes
//! piece `k` into half `k % 2` with a descriptor (piece bytes, message bytes, element type)
//! and bumps its sent counter; the receiver copies the piece out and bumps its acked
//! counter. A sender waits only to reuse a half, so a message of up to two halves is sent
//! without waiting for the receiver. `send_recv` interleaves an outgoing and an incoming
//! message, so two ranks can exchange messages of any size without deadlock. A receive
//! whose buffer does not match the message still consumes it, so the pair stays in step,
//! and then reports the mismatch.

use std::sync::atomic::Ordering;

use crate::element::DType;
use crate::error::{CommError, Result};
use crate::shm::engine::{copy_bytes, ShmEngine};
use crate::shm::sync::wait_until;

/// A message being sent.
pub(crate) struct Outgoing<'a> {
    pub(crate) data: &'a [u8],
    pub(crate) dtype: DType,
    pub(crate) peer: usize,
    offset: usize,
    pieces_left: usize,
}

impl<'a> Outgoing<'a> {
    pub(crate) fn new(data: &'a [u8], dtype: DType, peer: usize, half_bytes: usize) -> Self {
        let pieces_left = data.len().div_ceil(half_bytes).max(1);
        Outgoing {
            data,
            dtype,
            peer,
            offset: 0,
            pieces_left,
        }
    }
}

/// A message being received.
pub(crate) struct Incoming<'a> {
    pub(crate) data: &'a mut [u8],
    pub(crate) dtype: DType,
    pub(crate) peer: usize,
    offset: usize,
    done: bool,
    mismatch: Option<String>,
}

impl<'a> Incoming<'a> {
    pub(crate) fn new(data: &'a mut [u8], dtype: DType, peer: usize) -> Self {
        Incoming {
            data,
            dtype,
            peer,
            offset: 0,
            done: false,
            mismatch: None,
        }
    }
}

impl ShmEngine {
    fn can_send(&self, out: &Option<Outgoing<'_>>) -> bool {
        out.as_ref().is_some_and(|out| {
            let index = self.pieces_sent[out.peer];
            out.pieces_left > 0
                && (index < 2
                    || self
                        .region
                        .pieces_acked(self.rank, out.peer)
                        .load(Ordering::Acquire)
                        + 1
                        >= index)
        })
    }

    fn can_receive(&self, inc: &Option<Incoming<'_>>) -> bool {
        inc.as_ref().is_some_and(|inc| {
            !inc.done
                && self
                    .region
                    .pieces_sent(inc.peer, self.rank)
                    .load(Ordering::Acquire)
                    > self.pieces_received[inc.peer]
        })
    }

    /// Sends `out` and receives `inc` (either may be absent), interleaving their pieces.
    pub(crate) fn transfer(
        &mut self,
        op: &'static str,
        mut out: Option<Outgoing<'_>>,
        mut inc: Option<Incoming<'_>>,
    ) -> Result<()> {
        let peers = [out.as_ref().map(|o| o.peer), inc.as_ref().map(|i| i.peer)];
        let (first, second) = match peers {
            [Some(a), Some(b)] => (a, b),
            [Some(a), None] | [None, Some(a)] => (a, a),
            [None, None] => return Ok(()),
        };
        loop {
            let send_pending = out.as_ref().is_some_and(|o| o.pieces_left > 0);
            let recv_pending = inc.as_ref().is_some_and(|i| !i.done);
            if !send_pending && !recv_pending {
                break;
            }
            let mut progressed = false;
            if self.can_send(&out) {
                self.send_piece(out.as_mut().expect("checked by can_send"));
                progressed = true;
            }
            if self.can_receive(&inc) {
                self.receive_piece(inc.as_mut().expect("checked by can_receive"));
                progressed = true;
            }
            if !progressed {
                wait_until(
                    &self.context(op, false),
                    [first, second].into_iter(),
                    |_| self.can_send(&out) || self.can_receive(&inc),
                )?;
            }
        }
        match inc.and_then(|inc| {
            inc.mismatch
                .map(|found| (inc.peer, inc.dtype, inc.data.len(), found))
        }) {
            Some((peer, dtype, bytes, found)) => Err(CommError::MessageMismatch {
                op,
                peer,
                expected: format!("{} {dtype} elements", bytes / dtype.size_in_bytes()),
                found,
            }),
            None => Ok(()),
        }
    }

    fn send_piece(&mut self, out: &mut Outgoing<'_>) {
        let (me, half_bytes) = (self.rank, self.region.layout().p2p_slot_bytes);
        let index = self.pieces_sent[out.peer];
        let half = (index % 2) as usize;
        let len = half_bytes.min(out.data.len() - out.offset);
        // SAFETY: the receiver has consumed the half's previous piece; `len` fits in it.
        unsafe {
            copy_bytes(
                out.data.as_ptr().add(out.offset),
                self.region.mailbox(me, out.peer, half),
                len,
            )
        };
        let words = [len as u64, out.data.len() as u64, out.dtype.code()];
        for (field, word) in self
            .region
            .piece_descriptor(me, out.peer, half)
            .into_iter()
            .zip(words)
        {
            field.store(word, Ordering::Relaxed);
        }
        self.region
            .pieces_sent(me, out.peer)
            .store(index + 1, Ordering::Release);
        self.pieces_sent[out.peer] = index + 1;
        out.offset += len;
        out.pieces_left -= 1;
    }

    fn receive_piece(&mut self, inc: &mut Incoming<'_>) {
        let me = self.rank;
        let index = self.pieces_received[inc.peer];
        let half = (index % 2) as usize;
        let [len, total, code] = self
            .region
            .piece_descriptor(inc.peer, me, half)
            .map(|field| field.load(Ordering::Relaxed) as usize);
        if inc.offset == 0 && (total != inc.data.len() || code as u64 != inc.dtype.code()) {
            let sent = DType::from_code(code as u64);
            let elems = total / sent.map_or(1, DType::size_in_bytes);
            inc.mismatch = Some(format!(
                "{elems} {} elements",
                sent.map_or("unknown", DType::name)
            ));
        }
        let fits = inc.offset + len <= inc.data.len() && len <= self.region.layout().p2p_slot_bytes;
        if inc.mismatch.is_none() && !fits {
            inc.mismatch = Some(format!("a piece of {len} bytes at byte {}", inc.offset));
        }
        if inc.mismatch.is_none() {
            // SAFETY: the sender published this piece and will not touch the half again
            // until we ack it; the destination range was just checked.
            unsafe {
                copy_bytes(
                    self.region.mailbox(inc.peer, me, half),
                    inc.data.as_mut_ptr().add(inc.offset),
                    len,
                )
            };
        }
        self.region
            .pieces_acked(inc.peer, me)
            .store(index + 1, Ordering::Release);
        self.pieces_received[inc.peer] = index + 1;
        inc.offset += len;
        inc.done = inc.offset >= total || len == 0;
    }
}
