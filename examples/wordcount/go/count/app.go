// Word count, step 2, in Go: the twin of examples/wordcount/count. Keyed by word; keeps a
// running count per word in value state and emits (word, count) after every record.
package main

import "eddy"

type Count struct {
	count *eddy.ValueState[int64]
}

func (c *Count) Open(ctx *eddy.OpenContext) error {
	c.count = eddy.NewValueState[int64](ctx, "count")
	return nil
}

func (c *Count) Process(r *eddy.Record, ctx *eddy.Context) error {
	var n int64
	if err := r.Value(&n); err != nil {
		return err
	}
	total, _ := c.count.Get()
	total += n
	c.count.Set(total)
	ctx.Emit(eddy.Raw(r.KeyBytes()), total)
	return nil
}

func init() { eddy.ExportOperator(func() eddy.Operator { return &Count{} }) }
