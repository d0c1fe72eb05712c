//! The `output` import, linked by hand (as `log` is, see `guest_log`) so that an emitted batch
//! leaves guest memory in one `memcpy` per list.
//!
//! The generated binding lifts `list<u8>` into a `Vec<u8>` through wasmtime's per-element path,
//! which compiles to a 16-byte SSE loop; every `emit` carries a whole call's records (tens to
//! hundreds of KiB), and that loop was 4-7% of a stateless step's CPU (`perf` on Nexmark q7).
//! Here the lists are lifted as [`WasmList`]s (same bounds checks, same hostcall fuel) and
//! copied as slices; what `emit` does with them stays in `output::Host` (`keyed`).

use wasmtime::StoreContextMut;
use wasmtime::component::{ComponentType, Lift, Linker, WasmList};

use crate::bindings::{output, types};
use crate::keyed::OperatorHost;

/// `types.output-batch` as it lies in guest memory.
#[derive(ComponentType, Lift)]
#[component(record)]
struct GuestOutputBatch {
    data: WasmList<u8>,
    records: WasmList<u8>,
}

/// Links `output.side-output` and `output.emit` to [`OperatorHost`]'s `output::Host`.
pub(crate) fn add_to_linker(linker: &mut Linker<OperatorHost>) -> wasmtime::Result<()> {
    let mut output = linker.instance("eddy:dataflow/output@0.4.0")?;
    output.func_wrap("side-output", |mut store: StoreContextMut<'_, OperatorHost>, (name,): (String,)| {
        Ok((output::Host::side_output(store.data_mut(), name)?,))
    })?;
    output.func_wrap("emit", |mut store: StoreContextMut<'_, OperatorHost>, (batch,): (GuestOutputBatch,)| {
        let data = batch.data.as_le_slice(&store).to_vec();
        let records = batch.records.as_le_slice(&store).to_vec();
        output::Host::emit(store.data_mut(), types::OutputBatch { data, records })
    })
}
