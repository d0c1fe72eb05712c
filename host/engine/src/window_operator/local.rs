//! The first phase of a two-phase window (`two_phase: true`; Flink SQL's local-global
//! aggregation): at the end of each upstream subtask's chain, before the exchange, every
//! batch leaving the chain is folded into one partial accumulator per (key, pane) with one
//! `add` crossing, and only those partials cross to the window ([`WindowConfig::partial_input`]),
//! which merges them. Where a batch holds many records of one key (q7's one global key, a hot
//! key), a batch of records becomes a record or two: the exchange, the window's thread and its
//! grouping see almost nothing.
//!
//! It keeps nothing between batches, so it has no state to snapshot: a barrier or a watermark
//! follows the partials of the batches before it, as it would have followed their records, and
//! the window judges lateness per pane, as it does for records (every record of a pane joins
//! the same windows). The window needs `drop_late` and no allowed lateness ([`eddy_plan`]
//! checks): a late partial is an accumulator, not records, and a late record could not
//! re-fire a window once per record.
//!
//! [`WindowConfig::partial_input`]: super::WindowConfig::partial_input

use std::borrow::Cow;

use eddy_core::RecordBatch;
use eddy_plan::KeyBy;
use eddy_plan::window::{Window, WindowKind};

use super::{AggregateFn, BatchKey, Groups, Updates, pane_start};
use crate::operator::OperatorError;
use crate::router::extract_key;

/// The first phase of a two-phase window step (see the module docs).
#[derive(Debug)]
pub struct LocalWindowAggregate<A: AggregateFn> {
    /// The window step, for errors.
    step: String,
    kind: WindowKind,
    key_by: KeyBy,
    pub(super) aggregate: A,
    /// The aggregate's empty accumulator, asked for once.
    empty: Option<Vec<u8>>,
}

impl<A: AggregateFn> LocalWindowAggregate<A> {
    /// The first phase of window step `step` (tumbling or sliding) over `aggregate` (opened),
    /// keying records as the step's `key_by` does.
    pub fn new(step: impl Into<String>, kind: WindowKind, key_by: KeyBy, aggregate: A) -> Self {
        debug_assert!(pane_start(kind, 0).is_some(), "a two-phase window has panes, not sessions: {kind:?}");
        Self { step: step.into(), kind, key_by, aggregate, empty: None }
    }

    fn bad_record(&self, problem: String) -> OperatorError {
        OperatorError::BadRecord { operator: format!("{} (first phase)", self.step), problem }
    }

    /// Linear memory the aggregate's Wasm instance holds now.
    pub fn memory_bytes(&mut self) -> u64 {
        self.aggregate.memory_bytes()
    }

    /// `batch` folded into one partial accumulator per (key, pane) its records fall in, in one
    /// `add`: each a record with the key `key_by` selects, the pane's start as its timestamp
    /// and the accumulator as its value. A timestamp with no pane (within one pane of
    /// `i64::MIN`) keeps its own: the window then finds no pane for the partial either, so it
    /// is late there, as the record would be.
    pub fn fold(&mut self, batch: &RecordBatch) -> Result<RecordBatch, OperatorError> {
        match self.key_by {
            KeyBy::Key => self.fold_keyed(batch),
            // The aggregate sees each record with the key the window would give it.
            // (A batch near the size limit is keyed and folded in parts.)
            KeyBy::Value | KeyBy::Field(_) => {
                let mut out = RecordBatch::default();
                let mut keyed = RecordBatch::with_capacity(batch.len(), batch.byte_len());
                for (i, r) in batch.iter().enumerate() {
                    let key = extract_key(&self.key_by, &r)
                        .map_err(|p| self.bad_record(format!("key_by, record {i}: {p}")))?;
                    if keyed.try_push(Some(&key), r.value, r.timestamp).is_err() {
                        let partials = self.fold_keyed(&keyed)?;
                        self.append(&mut out, partials)?;
                        keyed.clear();
                        keyed.try_push(Some(&key), r.value, r.timestamp).map_err(|e| self.bad_record(e.to_string()))?;
                    }
                }
                let partials = self.fold_keyed(&keyed)?;
                self.append(&mut out, partials)?;
                Ok(out)
            }
        }
    }

    /// Appends `partials` to `out`, or says that the accumulators outgrew a batch.
    fn append(&self, out: &mut RecordBatch, partials: RecordBatch) -> Result<(), OperatorError> {
        if out.is_empty() {
            *out = partials;
            return Ok(());
        }
        out.try_extend(&partials).map_err(|e| self.too_large(e))
    }

    fn too_large(&self, full: eddy_core::BatchFull) -> OperatorError {
        self.bad_record(format!(
            "the partial accumulators of one batch outgrow a batch ({full}); turn `two_phase` off for this step"
        ))
    }

    /// [`Self::fold`] for records that carry their key.
    fn fold_keyed(&mut self, batch: &RecordBatch) -> Result<RecordBatch, OperatorError> {
        let mut keys: Vec<Cow<'_, [u8]>> = Vec::with_capacity(batch.len());
        let mut panes = Vec::with_capacity(batch.len());
        for (i, r) in batch.iter().enumerate() {
            let key = extract_key(&KeyBy::Key, &r).map_err(|p| self.bad_record(format!("key_by, record {i}: {p}")))?;
            let Some(t) = r.timestamp else {
                return Err(self.bad_record(format!(
                    "record {i} of the batch has no event timestamp; a window needs event time: add `timestamp` \
                     (a JSON pointer such as `/ts`) to the source"
                )));
            };
            keys.push(key);
            panes.push(pane_start(self.kind, t).unwrap_or(t));
        }
        let mut groups = Groups::default();
        for (i, (key, &pane)) in keys.iter().zip(&panes).enumerate() {
            groups.add(key, pane, i as u32);
        }
        let empty = match &self.empty {
            Some(acc) => acc.clone(),
            None => self.empty.insert(self.aggregate.create_accumulator()?).clone(),
        };
        let mut updates = Updates::default();
        for BatchKey { key, panes } in &groups.keys {
            for pane in panes {
                let run = groups.run(std::slice::from_ref(pane), &mut updates);
                // The window stands for the pane: only its start is read back.
                updates.push(key, Window { start: pane.start, end: pane.start }, &empty, run, false);
            }
        }
        let mut out = RecordBatch::default();
        if updates.windows.is_empty() {
            return Ok(out);
        }
        let accs = self.aggregate.add(batch, &updates.as_updates())?;
        if accs.len() != updates.windows.len() {
            return Err(self.bad_record(format!(
                "the aggregate returned {} accumulators for {} panes",
                accs.len(),
                updates.windows.len()
            )));
        }
        for ((key, pane), acc) in updates.windows.iter().zip(accs.iter()) {
            out.try_push(Some(key), acc, Some(pane.start)).map_err(|e| self.too_large(e))?;
        }
        Ok(out)
    }
}
