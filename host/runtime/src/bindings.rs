//! Host bindings generated from `wit/dataflow.wit`. Every import is trappable: the host stops
//! a guest that breaks a limit by returning an error from the import.

pub(crate) mod operator_world {
    wasmtime::component::bindgen!({
        world: "keyed-operator",
        path: "../../wit",
        imports: { default: trappable },
        // Export parameters borrow, so a call lowers a batch's bytes from where they are.
        ownership: Borrowing { duplicate_if_necessary: true },
    });
}

pub(crate) mod aggregate_world {
    wasmtime::component::bindgen!({
        world: "window-aggregate",
        path: "../../wit",
        imports: { default: trappable },
        ownership: Borrowing { duplicate_if_necessary: true },
        with: {
            "eddy:dataflow/types": super::operator_world::eddy::dataflow::types,
            "eddy:dataflow/log": super::operator_world::eddy::dataflow::log,
            "eddy:dataflow/schemas": super::operator_world::eddy::dataflow::schemas,
        },
    });
}

pub(crate) use operator_world::eddy::dataflow::{json_batch, log, output, schemas, state, timers, types};
