// Nexmark q1 in Go, the twin of examples/nexmark/q1: every bid with its price converted from
// dollars to euros (price * 908 / 1000, rounded down), unkeyed, with the bid's event time.
// Reads only the fields it needs from each event's row.
package main

import "eddy"

type EuroBid struct {
	Auction  int64 `json:"auction"`
	Bidder   int64 `json:"bidder"`
	Price    int64 `json:"price"`
	DateTime int64 `json:"date_time"`
}

type CurrencyConversion struct{}

func (CurrencyConversion) Open(*eddy.OpenContext) error { return nil }

func (CurrencyConversion) Process(r *eddy.Record, ctx *eddy.Context) error {
	if kind, _ := r.FieldString("type"); kind != "bid" {
		return nil
	}
	auction, _ := r.FieldInt("auction")
	bidder, _ := r.FieldInt("bidder")
	price, _ := r.FieldInt("price")
	at, _ := r.FieldInt("date_time")
	ctx.EmitValue(EuroBid{auction, bidder, price * 908 / 1000, at})
	return nil
}

func init() { eddy.ExportOperator(func() eddy.Operator { return CurrencyConversion{} }) }
