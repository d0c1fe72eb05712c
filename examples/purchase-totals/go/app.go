// Per-user purchase totals in Go: the twin of examples/purchase-totals (Rust). The host's
// tumbling window calls this aggregate per user and hour; amounts are integer cents, so merging
// in any order gives exactly the same total.
package main

import "eddy"

// Purchase is one input record.
type Purchase struct {
	UserID      string `json:"user_id"`
	AmountCents int64  `json:"amount_cents"`
}

// Totals are the running totals of one user in one window, and the window's result. Same
// name and fields as the Rust struct, so both read each other's accumulators.
type Totals struct {
	Purchases  uint64 `json:"purchases"`
	TotalCents int64  `json:"total_cents"`
}

type PurchaseTotals struct{}

func (PurchaseTotals) CreateAccumulator() Totals { return Totals{} }

func (PurchaseTotals) Add(acc Totals, r *eddy.Record) (Totals, error) {
	var p Purchase
	if err := r.Value(&p); err != nil {
		return acc, err
	}
	return Totals{acc.Purchases + 1, acc.TotalCents + p.AmountCents}, nil
}

func (PurchaseTotals) Merge(a, b Totals) (Totals, error) {
	return Totals{a.Purchases + b.Purchases, a.TotalCents + b.TotalCents}, nil
}

func (PurchaseTotals) Result(acc Totals) (any, error) { return acc, nil }

func init() {
	eddy.ExportAggregate(func() eddy.Aggregate[Totals] { return PurchaseTotals{} })
}
