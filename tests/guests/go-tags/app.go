// The Go twin of tests/guests/tags: list state `tags`, map state `counts`, value state `first`,
// same output.
package main

import "eddy"

type Seen struct {
	Tags     []string `json:"tags"`
	Count    uint64   `json:"count"`
	Distinct int      `json:"distinct"`
	First    string   `json:"first"`
	Records  uint64   `json:"records"`
}

// First is a user's first tag and how many records it sent.
type First struct {
	Tag     string `json:"tag"`
	Records uint64 `json:"records"`
}

type Tags struct {
	tags   *eddy.ListState[string]
	counts *eddy.MapState[string, uint64]
	first  *eddy.ValueState[First]
}

func (t *Tags) Open(ctx *eddy.OpenContext) error {
	t.tags = eddy.NewListState[string](ctx, "tags")
	t.counts = eddy.NewMapState[string, uint64](ctx, "counts")
	t.first = eddy.NewValueState[First](ctx, "first")
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
	first, ok := t.first.Get()
	if !ok {
		first = First{Tag: in.Tag}
	}
	first.Records++
	t.first.Set(first)
	ctx.Emit(eddy.Raw(r.KeyBytes()), Seen{t.tags.Get(), count, len(t.counts.Entries()), first.Tag, first.Records})
	return nil
}

func init() { eddy.ExportOperator(func() eddy.Operator { return &Tags{} }) }
