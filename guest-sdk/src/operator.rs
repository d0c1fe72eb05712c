//! The [`Operator`] trait and the glue that runs it behind the `eddy:dataflow/operator` export.

use std::cell::RefCell;
use std::rc::Rc;
use std::thread::LocalKey;

use eddy_wire::{Row, Table};
use serde::de::DeserializeOwned;

use crate::bindings::types::{Batch, OperatorError, TimerBatch};
use crate::context::{self, Context, Current, OpenContext};
use crate::record::{Record, Timer};
use crate::{Error, Result};

/// A stream operator. Implement it and export it with [`export_operator!`](crate::export_operator).
///
/// The host creates one instance per subtask, calls [`open`](Operator::open) once, then
/// [`process`](Operator::process) for every record in order, [`on_timer`](Operator::on_timer)
/// for every timer that fires, and [`close`](Operator::close) at the end of a bounded input.
/// State handles declared in `open` always act on the key of the record or timer being handled.
pub trait Operator: Sized + 'static {
    /// The step's `config` from the pipeline, decoded from JSON (`()` for none).
    type Config: DeserializeOwned;

    /// Builds the operator; declare state and side outputs through `ctx` here.
    fn open(config: Self::Config, ctx: &mut OpenContext) -> Result<Self>;

    /// Handles one record.
    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<()>;

    /// Handles one timer of the current key. The default ignores timers.
    fn on_timer(&mut self, timer: &Timer<'_>, ctx: &mut Context) -> Result<()> {
        let _ = (timer, ctx);
        Ok(())
    }

    /// Called at the end of a bounded input. The default does nothing.
    fn close(&mut self, ctx: &mut Context) -> Result<()> {
        let _ = ctx;
        Ok(())
    }
}

/// Where the macro keeps the subtask's operator: a guest instance runs one operator, on one thread.
pub type Slot<T> = LocalKey<RefCell<Option<T>>>;

pub(crate) fn decode_config<C: DeserializeOwned>(config: &str) -> Result<C> {
    let text = if config.trim().is_empty() { "null" } else { config };
    serde_json::from_str(text).map_err(|e| Error::bad_config(format!("config {config:?}: {e}")))
}

fn with_operator<T: Operator>(
    slot: &'static Slot<T>,
    f: impl FnOnce(&mut T) -> Result<()>,
) -> Result<(), OperatorError> {
    let result = slot.with_borrow_mut(|op| match op {
        Some(op) => f(op),
        None => Err(Error::failed("operator called before a successful open")),
    });
    context::set_current(None);
    match result {
        Ok(()) => {
            // State first: by the time the host sees the output, the state it reflects is stored.
            context::flush_state();
            context::flush_output();
            Ok(())
        }
        Err(e) => {
            context::discard_state();
            context::discard_output();
            Err(e.into_wit())
        }
    }
}

/// Routes panic messages to the host's log (error level), which reports them with the trap.
pub(crate) fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| crate::log::error(&format!("panic: {info}"))));
}

#[doc(hidden)]
pub fn open<T: Operator>(slot: &'static Slot<T>, config: String) -> Result<(), OperatorError> {
    install_panic_hook();
    let op = decode_config(&config).and_then(|c| T::open(c, &mut OpenContext::new())).map_err(Error::into_wit)?;
    slot.set(Some(op));
    Ok(())
}

/// The rows of a batch's packed record table; a malformed table is the host's bug.
pub(crate) fn rows(records: &[u8]) -> Result<Table<'_, Row>> {
    Table::new(records).map_err(|e| Error::failed(format!("the host sent a malformed batch: {e}")))
}

#[doc(hidden)]
pub fn process<T: Operator>(slot: &'static Slot<T>, batch: Batch) -> Result<(), OperatorError> {
    let Batch { data, records, prefetched_states, prefetched } = batch;
    let rows = rows(&records).map_err(Error::into_wit)?;
    let data = Rc::new(data);
    context::begin_scope(data.clone(), prefetched_states, prefetched, rows.len());
    with_operator(slot, |op| {
        for (i, row) in rows.iter().enumerate() {
            let record = Record::from_row(&data, &row)?;
            context::set_current(row.key.map(|_| Current { handle: i as u32, slot: row.tag, row: Some(i) }));
            op.process(&record, &mut Context::new(record.timestamp()))?;
        }
        Ok(())
    })
}

#[doc(hidden)]
pub fn on_timer<T: Operator>(slot: &'static Slot<T>, timers: TimerBatch) -> Result<(), OperatorError> {
    let TimerBatch { data, timers } = timers;
    let data = Rc::new(data);
    context::begin_scope(data.clone(), Vec::new(), Vec::new(), timers.len());
    with_operator(slot, |op| {
        for (i, t) in timers.iter().enumerate() {
            let timer = Timer::from_wit(&data, t)?;
            context::set_current(Some(Current { handle: i as u32, slot: t.slot, row: None }));
            op.on_timer(&timer, &mut Context::new(Some(timer.timestamp())))?;
        }
        Ok(())
    })
}

#[doc(hidden)]
pub fn close<T: Operator>(slot: &'static Slot<T>) -> Result<(), OperatorError> {
    context::begin_scope(Rc::default(), Vec::new(), Vec::new(), 0);
    with_operator(slot, |op| op.close(&mut Context::new(None)))
}

/// Exports a type implementing [`Operator`] as this component's operator.
///
/// ```ignore
/// eddy_sdk::export_operator!(WordCounter);
/// ```
#[macro_export]
macro_rules! export_operator {
    ($op:ty) => {
        const _: () = {
            ::std::thread_local! {
                static __EDDY_OPERATOR: ::core::cell::RefCell<::core::option::Option<$op>> =
                    const { ::core::cell::RefCell::new(::core::option::Option::None) };
            }
            struct __EddyOperatorExport;
            impl $crate::__private::OperatorGuest for __EddyOperatorExport {
                fn open(config: ::std::string::String) -> ::core::result::Result<(), $crate::__private::OperatorError> {
                    $crate::__private::operator::open::<$op>(&__EDDY_OPERATOR, config)
                }
                fn process(records: $crate::__private::Batch) -> ::core::result::Result<(), $crate::__private::OperatorError> {
                    $crate::__private::operator::process::<$op>(&__EDDY_OPERATOR, records)
                }
                fn on_timer(timers: $crate::__private::TimerBatch) -> ::core::result::Result<(), $crate::__private::OperatorError> {
                    $crate::__private::operator::on_timer::<$op>(&__EDDY_OPERATOR, timers)
                }
                fn close() -> ::core::result::Result<(), $crate::__private::OperatorError> {
                    $crate::__private::operator::close::<$op>(&__EDDY_OPERATOR)
                }
            }
            $crate::__private::operator_world::__export_keyed_operator!(__EddyOperatorExport with_types_in $crate::__private::operator_world);
        };
    };
}
