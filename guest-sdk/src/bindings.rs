//! Generated bindings for the two worlds of `wit/dataflow.wit`. Private to the SDK: users see
//! the typed API in the rest of the crate.

#![allow(missing_docs, missing_debug_implementations, clippy::all, rust_2018_idioms)]

pub mod operator_world {
    wit_bindgen::generate!({
        world: "keyed-operator",
        path: "../wit",
        pub_export_macro: true,
        export_macro_name: "__export_keyed_operator",
        default_bindings_module: "eddy_sdk::__private::operator_world",
    });
}

pub mod aggregate_world {
    wit_bindgen::generate!({
        world: "window-aggregate",
        path: "../wit",
        pub_export_macro: true,
        export_macro_name: "__export_window_aggregate",
        default_bindings_module: "eddy_sdk::__private::aggregate_world",
        with: {
            "eddy:dataflow/types@0.4.0": crate::bindings::operator_world::eddy::dataflow::types,
            "eddy:dataflow/log@0.4.0": crate::bindings::operator_world::eddy::dataflow::log,
            "eddy:dataflow/schemas@0.4.0": crate::bindings::operator_world::eddy::dataflow::schemas,
        },
    });
}

pub use operator_world::eddy::dataflow::{log, output, state, timers, types};
