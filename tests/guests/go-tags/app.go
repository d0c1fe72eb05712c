// The Go twin of tests/guests/tags: list state `tags`, map state `counts`, same output.
package main

import "eddy"

type Seen struct {
	Tags     []string `json:"tags"`
	Count    uint64   `json:"count"`
	Distinct int      `json:"distinct"`
}

type Tags struct {
	tags   *eddy.ListState[string]
	counts *eddy.MapState[string, uint64]
}

func (t *Tags) Open(ctx *eddy.OpenContext) error {
	t.tags = eddy.NewListState[string](ctx, "tags")
	t.counts = eddy.NewMapState[string, uint64](ctx, "counts")
	return nil
}

func (t *Tags) Process(r *eddy.Record, ctx *eddy.Context) error {
	var in struct {
		Tag string `json:"tag"`
	}
	if err := r.Value(&in); err != nil {
		return err
	}
	t.tags.Append(in.Tag)
	count, _ := t.counts.Get(in.Tag)
	count++
	t.counts.Put(in.Tag, count)
	ctx.Emit(eddy.Raw(r.KeyBytes()), Seen{t.tags.Get(), count, len(t.counts.Entries())})
	return nil
}

func init() { eddy.ExportOperator(func() eddy.Operator { return &Tags{} }) }
