// Package export_eddy_dataflow_operator is the keyed-operator world's export, handed to the
// eddy SDK's Runner; its host is the world's imports.
package export_eddy_dataflow_operator

import (
	"eddy"
	"wit_component/eddy_dataflow_output"
	"wit_component/eddy_dataflow_state"
	"wit_component/eddy_dataflow_timers"
	"wit_component/eddy_dataflow_types"
	"wit_component/eddy_glue"

	witTypes "go.bytecodealliance.org/pkg/wit/types"
)

type host struct{ eddy_glue.Base }

func (host) DeclareState(name string, kind eddy.StateKind, prefetch bool) uint32 {
	return eddy_dataflow_state.Declare(name, uint8(kind), prefetch)
}

func (host) ValueGet(state, key uint32) ([]byte, bool) {
	v := eddy_glue.Returning(func() witTypes.Option[[]uint8] { return eddy_dataflow_state.ValueGet(state, key) })
	if v.IsNone() {
		return nil, false
	}
	return v.Some(), true
}

func (host) ValueSetMany(data, writes []byte) { eddy_dataflow_state.ValueSetMany(data, writes) }

func (host) ListGet(state, key uint32) [][]byte {
	return eddy_glue.Returning(func() [][]uint8 { return eddy_dataflow_state.ListGet(state, key) })
}

func (host) ListAppend(state, key uint32, item []byte) {
	eddy_dataflow_state.ListAppend(state, key, item)
}

func (host) ListReplace(state, key uint32, items [][]byte) {
	eddy_dataflow_state.ListReplace(state, key, items)
}

func (host) MapGet(state, key uint32, mapKey []byte) ([]byte, bool) {
	v := eddy_glue.Returning(func() witTypes.Option[[]uint8] { return eddy_dataflow_state.MapGet(state, key, mapKey) })
	if v.IsNone() {
		return nil, false
	}
	return v.Some(), true
}

func (host) MapPut(state, key uint32, mapKey, value []byte) {
	eddy_dataflow_state.MapPut(state, key, mapKey, value)
}

func (host) MapRemove(state, key uint32, mapKey []byte) {
	eddy_dataflow_state.MapRemove(state, key, mapKey)
}

func (host) MapEntries(state, key uint32) [][2][]byte {
	entries := eddy_glue.Returning(func() []witTypes.Tuple2[[]uint8, []uint8] {
		return eddy_dataflow_state.MapEntries(state, key)
	})
	out := make([][2][]byte, len(entries))
	for i, e := range entries {
		out[i] = [2][]byte{e.F0, e.F1}
	}
	return out
}

func (host) Clear(state, key uint32) { eddy_dataflow_state.Clear(state, key) }

func (host) RegisterTimer(key uint32, domain eddy.TimeDomain, timestamp int64) {
	eddy_dataflow_timers.RegisterTimer(key, uint8(domain), timestamp)
}

func (host) DeleteTimer(key uint32, domain eddy.TimeDomain, timestamp int64) {
	eddy_dataflow_timers.DeleteTimer(key, uint8(domain), timestamp)
}

func (host) Watermark() int64 { return eddy_dataflow_timers.CurrentWatermark() }

func (host) ProcessingTime() int64 { return eddy_dataflow_timers.CurrentProcessingTime() }

func (host) SideOutput(name string) uint32 { return eddy_dataflow_output.SideOutput(name) }

func (host) Emit(data, records []byte) {
	eddy_dataflow_output.Emit(eddy_dataflow_types.OutputBatch{Data: data, Records: records})
}

type result = witTypes.Result[witTypes.Unit, eddy_dataflow_types.OperatorError]

var runner = eddy.NewRunner(host{})

// answer ends an export call with the collector off (see eddy_glue.Leave).
func answer(err *eddy.OperatorError) result {
	eddy_glue.Leave()
	if err != nil {
		return witTypes.Err[witTypes.Unit](eddy_dataflow_types.OperatorError{Kind: uint8(err.Kind), Message: err.Message})
	}
	return witTypes.Ok[witTypes.Unit, eddy_dataflow_types.OperatorError](witTypes.Unit{})
}

func Open(config string) result {
	eddy_glue.Enter()
	return answer(runner.Open(config))
}

func Process(b eddy_dataflow_types.Batch) result {
	eddy_glue.Enter()
	return answer(runner.Process(b.Data, b.Records, b.PrefetchedStates, b.Prefetched))
}

func OnTimer(t eddy_dataflow_types.TimerBatch) result {
	eddy_glue.Enter()
	timers := make([]eddy.TimerRef, len(t.Timers))
	for i, r := range t.Timers {
		timers[i] = eddy.TimerRef{KeyOffset: r.Key.Offset, KeyLen: r.Key.Len, Timestamp: r.Timestamp, Domain: eddy.TimeDomain(r.Domain), Slot: r.Slot}
	}
	return answer(runner.OnTimer(t.Data, timers))
}

func Close() result {
	eddy_glue.Enter()
	return answer(runner.Close())
}
