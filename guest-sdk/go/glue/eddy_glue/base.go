// Package eddy_glue implements what both worlds import (schemas and the log) over the
// generated bindings, for the eddy SDK's runners, and keeps Go's garbage collector where the
// component model lets it run.
package eddy_glue

import (
	"runtime/debug"

	"eddy"
	"wit_component/eddy_dataflow_log"
	"wit_component/eddy_dataflow_schemas"

	witTypes "go.bytecodealliance.org/pkg/wit/types"
)

// Go's collector reads the wall clock, a WASI import, and the component model forbids imports
// while the host allocates in the guest (cabi_realloc, for the arguments of an export and the
// lists an import returns) or cleans up after a call (post-return): a collection starting in
// an allocation there traps ("cannot leave component instance"). So it runs only while Go code
// does: off between export calls and during imports that return lists, on in export bodies.
func init() { debug.SetGCPercent(-1) }

// Enter starts an export call: the collector may run.
func Enter() { debug.SetGCPercent(100) }

// Leave ends an export call, or starts an import that returns a list: no collection until the
// next Enter.
func Leave() { debug.SetGCPercent(-1) }

// Returning runs an import that returns a list with the collector off.
func Returning[T any](call func() T) T {
	Leave()
	defer Enter()
	return call()
}

// Base is the schemas and log imports as the SDK's eddy.Base.
type Base struct{}

func (Base) DeclareSchema(name string, fields []string) uint32 {
	return eddy_dataflow_schemas.DeclareSchema(name, fields)
}

func (Base) SchemaFields(id uint32) (string, []string, bool) {
	found := Returning(func() witTypes.Option[witTypes.Tuple2[string, []string]] {
		return eddy_dataflow_schemas.SchemaFields(id)
	})
	if found.IsNone() {
		return "", nil, false
	}
	return found.Some().F0, found.Some().F1, true
}

func (Base) Log(level eddy.Level, message string) {
	eddy_dataflow_log.Log(uint8(level), message)
}
