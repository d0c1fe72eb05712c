// Fraud detection in Go: the twin of examples/fraud-detector (Rust), Flink's FraudDetector.
// Keyed by account, an alert when a small transaction (< $1.00) is followed by a large one
// (> $500.00) within a minute of processing time. A flag in value state remembers the small
// transaction; a processing-time timer clears it, and its time is kept in state so it can be
// deleted.
package main

import "eddy"

const (
	smallAmountCents = 100
	largeAmountCents = 50_000
	oneMinuteMs      = 60_000
)

type Transaction struct {
	AccountID   uint64 `json:"account_id"`
	AmountCents int64  `json:"amount_cents"`
}

type Alert struct {
	AccountID   uint64 `json:"account_id"`
	AmountCents int64  `json:"amount_cents"`
}

type FraudDetector struct {
	flag  *eddy.ValueState[bool]
	timer *eddy.ValueState[int64]
}

func (f *FraudDetector) Open(ctx *eddy.OpenContext) error {
	f.flag = eddy.NewValueState[bool](ctx, "flag")
	f.timer = eddy.NewValueState[int64](ctx, "timer", eddy.NoPrefetch())
	return nil
}

func (f *FraudDetector) cleanUp(ctx *eddy.Context) {
	if at, ok := f.timer.Get(); ok {
		ctx.DeleteTimer(eddy.ProcessingTime, at)
	}
	f.timer.Clear()
	f.flag.Clear()
}

func (f *FraudDetector) Process(r *eddy.Record, ctx *eddy.Context) error {
	var tx Transaction
	if err := r.Value(&tx); err != nil {
		return err
	}
	if flagged, _ := f.flag.Get(); flagged {
		if tx.AmountCents > largeAmountCents {
			ctx.Emit(tx.AccountID, Alert{tx.AccountID, tx.AmountCents})
		}
		f.cleanUp(ctx)
	}
	if tx.AmountCents < smallAmountCents {
		f.flag.Set(true)
		at := ctx.ProcessingTime() + oneMinuteMs
		ctx.RegisterTimer(eddy.ProcessingTime, at)
		f.timer.Set(at)
	}
	return nil
}

func (f *FraudDetector) OnTimer(*eddy.Timer, *eddy.Context) error {
	f.timer.Clear()
	f.flag.Clear()
	return nil
}

func init() { eddy.ExportOperator(func() eddy.Operator { return &FraudDetector{} }) }
