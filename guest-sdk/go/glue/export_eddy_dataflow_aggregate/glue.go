// Package export_eddy_dataflow_aggregate is the window-aggregate world's export, handed to
// the eddy SDK's AggregateRunner.
package export_eddy_dataflow_aggregate

import (
	"eddy"
	"wit_component/eddy_dataflow_aggregate"
	"wit_component/eddy_dataflow_types"
	"wit_component/eddy_glue"

	witTypes "go.bytecodealliance.org/pkg/wit/types"
)

type operatorError = eddy_dataflow_types.OperatorError

var runner = eddy.NewAggregateRunner(eddy_glue.Base{})

func wit(err *eddy.OperatorError) operatorError {
	return operatorError{Kind: uint8(err.Kind), Message: err.Message}
}

// answer ends an export call with the collector off (see eddy_glue.Leave).
func answer[T any](value T, err *eddy.OperatorError) witTypes.Result[T, operatorError] {
	eddy_glue.Leave()
	if err != nil {
		return witTypes.Err[T](wit(err))
	}
	return witTypes.Ok[T, operatorError](value)
}

func packed(p eddy.Packed) eddy_dataflow_aggregate.PackedItems {
	return eddy_dataflow_aggregate.PackedItems{Data: p.Data, Spans: p.Spans}
}

func Open(config string) witTypes.Result[witTypes.Unit, operatorError] {
	eddy_glue.Enter()
	return answer(witTypes.Unit{}, runner.Open(config))
}

func CreateAccumulator() witTypes.Result[[]uint8, operatorError] {
	eddy_glue.Enter()
	return answer(runner.CreateAccumulator())
}

func Add(b eddy_dataflow_types.Batch, u eddy_dataflow_aggregate.AccumulatorUpdates) witTypes.Result[eddy_dataflow_aggregate.PackedItems, operatorError] {
	eddy_glue.Enter()
	out, err := runner.Add(b.Data, b.Records, u.Accumulators, u.Updates, u.Records)
	return answer(packed(out), err)
}

func Merge(a, b []uint8) witTypes.Result[[]uint8, operatorError] {
	eddy_glue.Enter()
	return answer(runner.Merge(a, b))
}

func GetResults(accumulators eddy_dataflow_aggregate.PackedItems) witTypes.Result[eddy_dataflow_aggregate.PackedItems, operatorError] {
	eddy_glue.Enter()
	out, err := runner.Results(eddy.Packed{Data: accumulators.Data, Spans: accumulators.Spans})
	return answer(packed(out), err)
}
