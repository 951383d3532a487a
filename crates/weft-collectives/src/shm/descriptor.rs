//! [`OpDesc`]: what a collective is (kind, element type, length, reduction, root), as each
//! rank publishes it in its slot header so that all ranks can check they run the same
//! collective with the same arguments.

use std::fmt;

use crate::element::DType;
use crate::reduce_op::ReduceOp;

/// The collectives of the shared-memory backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpKind {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    Reduce,
    Barrier,
}

impl OpKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            OpKind::AllReduce => "all_reduce",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::AllGather => "all_gather",
            OpKind::Broadcast => "broadcast",
            OpKind::Reduce => "reduce",
            OpKind::Barrier => "barrier",
        }
    }

    fn code(self) -> u64 {
        self as u64 + 1
    }
}

/// A collective with its arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OpDesc {
    pub(crate) kind: OpKind,
    pub(crate) dtype: DType,
    /// Elements in this rank's input buffer.
    pub(crate) count: usize,
    pub(crate) reduce: Option<ReduceOp>,
    pub(crate) root: Option<usize>,
}

impl OpDesc {
    pub(crate) fn new(kind: OpKind, dtype: DType, count: usize) -> OpDesc {
        OpDesc {
            kind,
            dtype,
            count,
            reduce: None,
            root: None,
        }
    }

    pub(crate) fn with_reduce(self, reduce: ReduceOp) -> OpDesc {
        OpDesc {
            reduce: Some(reduce),
            ..self
        }
    }

    pub(crate) fn with_root(self, root: usize) -> OpDesc {
        OpDesc {
            root: Some(root),
            ..self
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// The header words published for collective number `seq`.
    pub(crate) fn encode(&self, seq: u64) -> [u64; 6] {
        [
            self.kind.code(),
            self.dtype.code(),
            self.count as u64,
            self.reduce.map_or(0, ReduceOp::code),
            self.root.map_or(0, |r| r as u64 + 1),
            seq,
        ]
    }

    /// Describes published header words, for mismatch errors.
    pub(crate) fn describe_words(words: &[u64; 6]) -> String {
        let kind = [
            OpKind::AllReduce,
            OpKind::ReduceScatter,
            OpKind::AllGather,
            OpKind::Broadcast,
            OpKind::Reduce,
            OpKind::Barrier,
        ]
        .into_iter()
        .find(|k| k.code() == words[0]);
        let dtype = DType::from_code(words[1]);
        let reduce = ReduceOp::ALL.into_iter().find(|r| r.code() == words[3]);
        match (kind, dtype) {
            (Some(kind), Some(dtype)) => {
                let desc = OpDesc {
                    kind,
                    dtype,
                    count: words[2] as usize,
                    reduce,
                    root: words[4].checked_sub(1).map(|r| r as usize),
                };
                format!("collective #{} {desc}", words[5])
            }
            _ => format!("collective #{} with unknown header {words:?}", words[5]),
        }
    }
}

impl fmt::Display for OpDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.name())?;
        if let Some(reduce) = self.reduce {
            write!(f, "({reduce:?})")?;
        }
        if self.kind != OpKind::Barrier {
            write!(f, " of {} {} elements", self.count, self.dtype)?;
        }
        if let Some(root) = self.root {
            write!(f, " with root {root}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_round_trip_through_header_words() {
        let desc = OpDesc::new(OpKind::Reduce, DType::BF16, 10)
            .with_reduce(ReduceOp::Max)
            .with_root(2);
        let words = desc.encode(7);
        assert_eq!(
            OpDesc::describe_words(&words),
            "collective #7 reduce(Max) of 10 bf16 elements with root 2"
        );
        assert_ne!(
            words,
            OpDesc::new(OpKind::Reduce, DType::BF16, 11).encode(7)
        );
        assert_eq!(
            OpDesc::new(OpKind::Barrier, DType::U8, 0).to_string(),
            "barrier"
        );
        assert!(OpDesc::describe_words(&[99, 1, 0, 0, 0, 3]).contains("unknown"));
    }
}
