//! Upload validation: is it a component, and does it implement an Eddy world completely?
//! Checks run before and after compilation so each failure gets its own clear message.

use wasmtime::Engine;
use wasmtime::component::Component;
use wasmtime::component::types::ComponentItem;

use crate::LoadError;

/// The export of the keyed-operator world.
pub const OPERATOR_EXPORT: &str = "eddy:dataflow/operator@0.4.0";
/// The export of the window-aggregate world.
pub const AGGREGATE_EXPORT: &str = "eddy:dataflow/aggregate@0.4.0";

const OPERATOR_FUNCTIONS: &[&str] = &["open", "process", "on-timer", "close"];
const AGGREGATE_FUNCTIONS: &[&str] = &["open", "create-accumulator", "add", "merge", "get-results"];

/// Which Eddy world a component implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum World {
    /// `keyed-operator`: open / process / on-timer / close.
    KeyedOperator,
    /// `window-aggregate`: create-accumulator / batched add / merge / batched get-results.
    WindowAggregate,
}

/// Rejects what is not a component by its 8-byte header, before spending time compiling.
pub(crate) fn check_header(bytes: &[u8]) -> Result<(), LoadError> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(LoadError::NotWasm);
    }
    match [bytes[4], bytes[5], bytes[6], bytes[7]] {
        [1, 0, 0, 0] => Err(LoadError::CoreModule),
        // Component binaries: version 0x0d, layer 1.
        [0x0d, 0, 1, 0] => Ok(()),
        [a, b, c, d] => {
            Err(LoadError::Invalid(format!("unknown wasm binary version/layer {a:#04x} {b:#04x} {c:#04x} {d:#04x}")))
        }
    }
}

/// Finds the Eddy world a compiled component implements, or says precisely what is missing.
/// The import a guest reads its batch through as JSON (the Python and JavaScript SDKs).
const JSON_BATCH_IMPORT: &str = "eddy:dataflow/json-batch@0.4.0";

/// Whether the component imports `json-batch`: the host then keeps a copy of each batch's
/// bytes for it to read during the call.
pub(crate) fn reads_json_batch(engine: &Engine, component: &Component) -> bool {
    component.component_type().imports(engine).any(|(name, _)| name == JSON_BATCH_IMPORT)
}

pub(crate) fn world_of(engine: &Engine, component: &Component) -> Result<World, LoadError> {
    let ty = component.component_type();
    for (export, world, functions) in [
        (OPERATOR_EXPORT, World::KeyedOperator, OPERATOR_FUNCTIONS),
        (AGGREGATE_EXPORT, World::WindowAggregate, AGGREGATE_FUNCTIONS),
    ] {
        let Some(item) = ty.get_export(engine, export) else {
            continue;
        };
        let ComponentItem::ComponentInstance(instance) = item.ty else {
            return Err(LoadError::MissingExports {
                interface: export.into(),
                missing: "all (it is not an instance)".into(),
            });
        };
        let missing: Vec<&str> = functions
            .iter()
            .copied()
            .filter(|f| !matches!(instance.get_export(engine, f).map(|e| e.ty), Some(ComponentItem::ComponentFunc(_))))
            .collect();
        if !missing.is_empty() {
            return Err(LoadError::MissingExports { interface: export.into(), missing: missing.join(", ") });
        }
        return Ok(world);
    }
    let exports: Vec<&str> = ty.exports(engine).map(|(name, _)| name).collect();
    Err(LoadError::WrongWorld { exports: exports.join(", ") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_classified() {
        assert!(matches!(check_header(b"hello world"), Err(LoadError::NotWasm)));
        assert!(matches!(check_header(b"\0asm"), Err(LoadError::NotWasm)));
        assert!(matches!(check_header(b"\0asm\x01\0\0\0"), Err(LoadError::CoreModule)));
        assert!(check_header(b"\0asm\x0d\0\x01\0").is_ok());
        assert!(matches!(check_header(b"\0asm\x02\0\0\0"), Err(LoadError::Invalid(_))));
    }
}
