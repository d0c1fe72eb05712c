package eddy

// The operator and aggregate runners on the in-memory harness: what the host sees of state,
// timers, output and failures.

import (
	"slices"
	"strings"
	"testing"
)

type counter struct {
	count *ValueState[int64]
	seen  *ListState[string]
	by    *MapState[string, int]
	late  SideOutput
}

func (c *counter) Open(ctx *OpenContext) error {
	var config struct {
		Fail string `json:"fail"`
	}
	if err := ctx.Config.Decode(&config); err != nil {
		return err
	}
	c.count = NewValueState[int64](ctx, "count")
	c.seen = NewListState[string](ctx, "seen")
	c.by = NewMapState[string, int](ctx, "by")
	c.late = ctx.SideOutput("late")
	return nil
}

func (c *counter) Process(r *Record, ctx *Context) error {
	var v struct {
		Word string `json:"word"`
		Add  int64  `json:"add"`
	}
	if err := r.Value(&v); err != nil {
		return err
	}
	n, _ := c.count.Get()
	c.count.Set(n + v.Add)
	switch v.Word {
	case "boom":
		return BadRecord("cannot count %q", v.Word)
	case "panic":
		var m map[string]int
		m["x"] = 1
	case "late":
		ctx.EmitTo(c.late, Raw(r.KeyBytes()), v.Word)
		return nil
	}
	c.seen.Append(v.Word)
	k, _ := c.by.Get(v.Word)
	c.by.Put(v.Word, k+1)
	if ts, ok := r.Timestamp(); ok {
		ctx.RegisterTimer(EventTime, ts+10)
	}
	ctx.Emit(Raw(r.KeyBytes()), n+v.Add)
	return nil
}

func (c *counter) OnTimer(t *Timer, ctx *Context) error {
	var key string
	if err := t.Key(&key); err != nil {
		return err
	}
	n, _ := c.count.Get()
	ctx.Emit(key, map[string]any{"fired": t.Timestamp, "count": n, "seen": c.seen.Get(), "entries": len(c.by.Entries())})
	c.count.Clear()
	return nil
}

func strs(out []Output) []string {
	var s []string
	for _, o := range out {
		line := o.String()
		if o.Side != "" {
			line = o.Side + ": " + line
		}
		s = append(s, line)
	}
	return s
}

func word(w string, add int64) map[string]any { return map[string]any{"word": w, "add": add} }

func newCounter(t *testing.T, config string) *Harness {
	t.Helper()
	exportedOperator = func() Operator { return &counter{} }
	h, err := NewHarness(config)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestValueStateSeesTheCallsOwnWritesAndPrefetchedValues(t *testing.T) {
	h := newCounter(t, "")
	out, err := h.Process(Keyed("a", word("x", 1)), Keyed("b", word("y", 5)), Keyed("a", word("x", 2)))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strs(out), []string{`"a" => 1`, `"b" => 5`, `"a" => 3`}; !slices.Equal(got, want) {
		t.Fatalf("got %q want %q", got, want)
	}
	// The next batch reads the stored values (prefetched with the batch).
	out, _ = h.Process(Keyed("a", word("x", 10)))
	if got := strs(out); !slices.Equal(got, []string{`"a" => 13`}) {
		t.Fatalf("got %q", got)
	}
	if v, ok := h.Value("count", "a"); !ok || string(v) != "13" {
		t.Fatalf("stored %s %v", v, ok)
	}
}

func TestAFailedCallLeavesNoWritesAndNoOutput(t *testing.T) {
	h := newCounter(t, "")
	if _, err := h.Process(Keyed("a", word("x", 1))); err != nil {
		t.Fatal(err)
	}
	out, err := h.Process(Keyed("a", word("x", 1)), Keyed("a", word("boom", 100)))
	if err == nil || err.Error() != `bad-record: cannot count "boom"` || len(out) != 0 {
		t.Fatalf("got %v, %q", err, strs(out))
	}
	if v, _ := h.Value("count", "a"); string(v) != "1" {
		t.Fatalf("the failed batch's write stayed: %s", v)
	}
	out, err = h.Process(Keyed("a", word("panic", 1)))
	if err == nil || !strings.HasPrefix(err.Error(), "failed: panic: assignment to entry in nil map") {
		t.Fatalf("got %v", err)
	}
	if logs := h.Logs(); len(logs) == 0 || !strings.Contains(logs[len(logs)-1], "operator_test.go") {
		t.Fatalf("no stack in the log: %q", logs)
	}
	if _, err := h.Process(Keyed("a", "not an object")); err == nil || !strings.HasPrefix(err.Error(), "bad-record: value does not fit") {
		t.Fatalf("got %v", err)
	}
}

func TestTimersFireAtTheWatermarkWithTheirKeysState(t *testing.T) {
	h := newCounter(t, "")
	if _, err := h.Process(KeyedAt("a", word("x", 1), 100), KeyedAt("b", word("y", 2), 105), KeyedAt("a", word("z", 1), 95)); err != nil {
		t.Fatal(err)
	}
	if got := h.Timers(); !slices.Equal(got, []string{`0 105 "a"`, `0 110 "a"`, `0 115 "b"`}) {
		t.Fatalf("timers %q", got)
	}
	out, err := h.AdvanceWatermark(110)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`"a" => {"count":2,"entries":2,"fired":105,"seen":["x","z"]}`,
		`"a" => {"count":0,"entries":2,"fired":110,"seen":["x","z"]}`,
	}
	if got := strs(out); !slices.Equal(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	if out[0].Timestamp != 105 || !out[0].HasTimestamp {
		t.Fatalf("a timer's output carries its time: %+v", out[0])
	}
	if got := h.Timers(); !slices.Equal(got, []string{`0 115 "b"`}) {
		t.Fatalf("timers %q", got)
	}
}

func TestSideOutputsAndConfig(t *testing.T) {
	h := newCounter(t, `{"fail": "no"}`)
	out, _ := h.Process(Keyed("a", word("late", 1)))
	if got := strs(out); !slices.Equal(got, []string{`late: "a" => "late"`}) {
		t.Fatalf("got %q", got)
	}
	exportedOperator = func() Operator { return &counter{} }
	if _, err := NewHarness(`{"fail": 3}`); err == nil || !strings.HasPrefix(err.Error(), "bad-config: config") {
		t.Fatalf("got %v", err)
	}
}

func TestStateNeedsAKey(t *testing.T) {
	h := newCounter(t, "")
	_, err := h.Process(Unkeyed(word("x", 1)))
	if err == nil || !strings.Contains(err.Error(), "add key_by before this step") {
		t.Fatalf("got %v", err)
	}
}

type sum struct{}

func (sum) CreateAccumulator() totals { return totals{} }

func (sum) Add(acc totals, r *Record) (totals, error) {
	n, ok := r.FieldInt("amount_cents")
	if !ok {
		return acc, BadRecord("no amount_cents")
	}
	return totals{acc.Purchases + 1, acc.TotalCents + n}, nil
}

func (sum) Merge(a, b totals) (totals, error) {
	return totals{a.Purchases + b.Purchases, a.TotalCents + b.TotalCents}, nil
}

func (sum) Result(acc totals) (any, error) { return acc, nil }

func TestAnAggregateFoldsMergesAndEmitsRows(t *testing.T) {
	host := &memoryHost{schemas: map[uint32][2][]string{}}
	infoOf(reflectTypeOf[totals]()).name = "Totals"
	ExportAggregate(func() Aggregate[totals] { return sum{} })
	r := NewAggregateRunner(host)
	if err := r.Open(""); err != nil {
		t.Fatal(err)
	}
	empty, err := r.CreateAccumulator()
	if err != nil {
		t.Fatal(err)
	}
	// Two records of one (key, window), one of another, as the host packs them.
	var data, records []byte
	for _, v := range []string{`{"amount_cents": 5}`, `{"amount_cents": 7}`, `{"amount_cents": -2}`} {
		vo := uint32(len(data))
		data = append(data, v...)
		records = le.AppendUint32(le.AppendUint32(le.AppendUint32(le.AppendUint32(records, 0), absent), vo), uint32(len(v)))
		records = append(records, make([]byte, 16)...)
	}
	accs := append(append([]byte{}, empty...), empty...)
	var updates []byte
	updates = le.AppendUint32(le.AppendUint32(le.AppendUint32(le.AppendUint32(updates, 0), uint32(len(empty))), 0), 2)
	updates = le.AppendUint32(le.AppendUint32(le.AppendUint32(le.AppendUint32(updates, uint32(len(empty))), uint32(len(empty))), 2), 1)
	out, oerr := r.Add(data, records, accs, updates, []uint32{0, 1, 2})
	if oerr != nil {
		t.Fatal(oerr)
	}
	items, _ := out.items()
	merged, oerr := r.Merge(items[0], items[1])
	if oerr != nil {
		t.Fatal(oerr)
	}
	var got totals
	if err := decodeValue(merged, host.names, &got); err != nil || got != (totals{3, 10}) {
		t.Fatalf("merged %+v %v", got, err)
	}
	results, oerr := r.Results(Packed{merged, le.AppendUint32(le.AppendUint32(nil, 0), uint32(len(merged)))})
	if oerr != nil {
		t.Fatal(oerr)
	}
	res, _ := results.items()
	if !IsRow(res[0]) {
		t.Fatalf("a struct result is a row: %q", res[0])
	}
	bad := le.AppendUint32(le.AppendUint32(le.AppendUint32(le.AppendUint32(nil, 0), 1000), 0), 1)
	if _, oerr := r.Add(data, records, accs, bad, []uint32{0}); oerr == nil || oerr.Message != "update 0 points outside its tables" {
		t.Fatalf("got %v", oerr)
	}
}
