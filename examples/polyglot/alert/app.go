// Step 4 of the polyglot pipeline, in Go: a keyed alert on the per-second totals the Rust
// window emits. A window whose total reaches the threshold is an alert, numbered per user
// (value state); the others pass unseen.
package main

import "eddy"

// Window is what the host's window step emits: its start and the aggregate's result.
type Window struct {
	Start  int64 `json:"start"`
	Result struct {
		TotalCents int64 `json:"total_cents"`
	} `json:"result"`
}

type Alert struct {
	UserID     string `json:"user_id"`
	Start      int64  `json:"start"`
	TotalCents int64  `json:"total_cents"`
	Nth        uint64 `json:"nth"`
}

type Spend struct {
	threshold int64
	alerts    *eddy.ValueState[uint64]
}

func (s *Spend) Open(ctx *eddy.OpenContext) error {
	config := struct {
		ThresholdCents int64 `json:"threshold_cents"`
	}{20_000}
	if err := ctx.Config.Decode(&config); err != nil {
		return err
	}
	s.threshold = config.ThresholdCents
	s.alerts = eddy.NewValueState[uint64](ctx, "alerts")
	return nil
}

func (s *Spend) Process(r *eddy.Record, ctx *eddy.Context) error {
	var user string
	if err := r.Key(&user); err != nil {
		return err
	}
	var w Window
	if err := r.Value(&w); err != nil {
		return err
	}
	if w.Result.TotalCents < s.threshold {
		return nil
	}
	nth, _ := s.alerts.Get()
	nth++
	s.alerts.Set(nth)
	ctx.Emit(user, Alert{user, w.Start, w.Result.TotalCents, nth})
	return nil
}

func init() { eddy.ExportOperator(func() eddy.Operator { return &Spend{} }) }
