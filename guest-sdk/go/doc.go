// Package eddy is the Go SDK for Eddy operators: keyed stream operators and window aggregates
// compiled to WebAssembly components against Eddy's WIT contract (wit/dataflow.wit), which
// this package hides. An operator is a type with Open and Process (OnTimer and Close are
// optional), exported from package main:
//
//	type Count struct{ count *eddy.ValueState[int64] }
//
//	func (c *Count) Open(ctx *eddy.OpenContext) error {
//		c.count = eddy.NewValueState[int64](ctx, "count")
//		return nil
//	}
//
//	func (c *Count) Process(r *eddy.Record, ctx *eddy.Context) error {
//		var word string
//		if err := r.Key(&word); err != nil {
//			return err
//		}
//		n, _ := c.count.Get()
//		c.count.Set(n + 1)
//		ctx.Emit(word, n+1)
//		return nil
//	}
//
//	func init() { eddy.ExportOperator(func() eddy.Operator { return &Count{} }) }
//
// `eddy build` compiles the project (Go's own wasip1 port, then a component) and
// `eddy test` runs its `go test` natively against package eddytest's in-memory host.
//
// Values are rows or JSON, as in every Eddy SDK: a named struct is written as a row whose
// schema is the struct's type name and its fields' `json` names (in declaration order),
// anything else as JSON; reading takes either into a struct, a map or any. State values are
// written as JSON and read as either (the Rust SDK writes a struct state value as a row); map
// keys are JSON.
//
// Errors: a returned error fails the call with its message (BadRecord and BadConfig choose
// the WIT's error kind); a panic is recovered and fails the call the same way, its stack going
// to the log. A failed call's state writes and output are dropped.
package eddy
