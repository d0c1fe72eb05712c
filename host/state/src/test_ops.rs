//! Random write sequences for the backends' model tests (heap, bounded).

use proptest::prelude::*;

/// One write to a backend.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
    DeletePrefix(Vec<u8>),
}

/// Short keys over a tiny alphabet, so writes collide and prefixes overlap.
pub(crate) fn small_bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(0u8..4, 0..4)
}

pub(crate) fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (small_bytes(), small_bytes()).prop_map(|(k, v)| Op::Put(k, v)),
        small_bytes().prop_map(Op::Delete),
        small_bytes().prop_map(Op::DeletePrefix),
    ]
}
