package eddy

// Keyed operators: the interface users implement, what it is handed, and the runner behind
// the `eddy:dataflow/operator` export. A call takes a whole batch: records are read from the
// packed tables, and a record's key and value are decoded only when the operator asks.
// Value-state writes are buffered and handed to the host in one `value-set-many` at the end of
// the call, and output in one `emit`, so a call costs a handful of crossings however many
// records it holds. A failed call's buffered writes and output are dropped.

import (
	"encoding/json"
	"fmt"
	"math"
	"runtime/debug"
	"strconv"
)

const absent = 0xFFFFFFFF

const outputFlushBytes = 1 << 20

const noKey = "keyed state and timers need the current record's key: there is none in Open or " +
	"Close, nor for a record without a key (add key_by before this step)"

// Operator is a stream operator. The host makes one per subtask (through the factory given
// to ExportOperator), calls Open once, then Process for every record in order. An operator
// that also implements TimerHandler gets its timers, one that implements Closer is closed at
// the end of a bounded input.
type Operator interface {
	Open(ctx *OpenContext) error
	Process(r *Record, ctx *Context) error
}

// TimerHandler is an operator that handles the timers it registers.
type TimerHandler interface {
	OnTimer(t *Timer, ctx *Context) error
}

// Closer is an operator with work to do at the end of a bounded input.
type Closer interface {
	Close(ctx *Context) error
}

// Config is the step's `config` from the pipeline, as JSON text.
type Config struct{ raw string }

// Raw is the JSON text ("" when the step has none).
func (c Config) Raw() string { return c.raw }

// Decode reads the configuration into v (a struct with json tags, a map...); an empty
// configuration leaves v as it is. What does not fit is a BadConfig error.
func (c Config) Decode(v any) error {
	if len(c.raw) == 0 {
		return nil
	}
	if err := decodeJSON([]byte(c.raw), v); err != nil {
		return BadConfig("config %s does not fit %T: %v", strconv.Quote(c.raw), v, err)
	}
	return nil
}

// Record is one input record, valid during the call that received it.
type Record struct {
	c              *call
	ko, kl, vo, vl uint32
	ts             int64
	hasTS          bool
	row            rowHeader // parsed at the first Field, when the value is a row
	hasRow         bool
}

// Timestamp is the record's event time in ms since the Unix epoch, if it has one.
func (r *Record) Timestamp() (int64, bool) { return r.ts, r.hasTS }

// HasKey tells whether the record is keyed (it is after a key_by).
func (r *Record) HasKey() bool { return r.kl != absent }

// KeyBytes is the key's JSON text, nil for a record without a key.
func (r *Record) KeyBytes() []byte {
	if r.kl == absent {
		return nil
	}
	return r.c.data[r.ko : r.ko+r.kl]
}

// Key decodes the key (JSON) into v; a missing or undecodable key is a BadRecord error.
func (r *Record) Key(v any) error {
	if r.kl == absent {
		return BadRecord("record has no key (is the stream keyed?)")
	}
	if err := decodeJSON(r.KeyBytes(), v); err != nil {
		return BadRecord("key %s does not fit %T: %v", r.KeyBytes(), v, err)
	}
	return nil
}

// ValueBytes is the value as it came: a row or JSON text.
func (r *Record) ValueBytes() []byte { return r.c.data[r.vo : r.vo+r.vl] }

// Value decodes the value (a row or JSON) into v: a struct pointer (fields by json name), a
// map, a scalar or an `any`. What does not fit is a BadRecord error.
func (r *Record) Value(v any) error {
	if err := decodeValue(r.ValueBytes(), r.c.schemas.lookup, v); err != nil {
		return BadRecord("value does not fit %T: %v", v, err)
	}
	return nil
}

// Field is top-level field name of the value (nil, false if it has none). From a row only
// that field is read: the way to filter on one field. Numbers come as int64, uint64 or
// float64 from a row and as json.Number from JSON.
func (r *Record) Field(name string) (any, bool) {
	b := r.ValueBytes()
	if IsRow(b) {
		i := r.slotOf(name)
		if i < 0 {
			return nil, false
		}
		v, err := r.row.natural(i, r.c.schemas.lookup)
		return v, err == nil && v != nil
	}
	parsed, err := parseJSON(b)
	object, isObject := parsed.(map[string]any)
	if err != nil || !isObject {
		return nil, false
	}
	v, ok := object[name]
	return v, ok && v != nil
}

// slotOf is the slot of field name in the record's row (parsed once), or -1.
func (r *Record) slotOf(name string) int {
	if !r.hasRow {
		h, err := parseRow(r.ValueBytes())
		if err != nil {
			return -1
		}
		r.row, r.hasRow = h, true
	}
	i := r.c.slotOf(r.row.schema, name)
	if i >= r.row.n {
		return -1
	}
	return i
}

// FieldInt is Field as an integer: false when it is missing or not an integer that fits.
func (r *Record) FieldInt(name string) (int64, bool) {
	if IsRow(r.ValueBytes()) {
		// Straight from the slot: no value is boxed.
		i := r.slotOf(name)
		if i < 0 || r.row.null(i) {
			return 0, false
		}
		switch r.row.kind(i) {
		case kindI64:
			return int64(r.row.slot(i)), true
		case kindU64:
			return int64(r.row.slot(i)), r.row.slot(i) <= math.MaxInt64
		}
	}
	v, ok := r.Field(name)
	if !ok {
		return 0, false
	}
	switch x := v.(type) {
	case int64:
		return x, true
	case uint64:
		return int64(x), x <= math.MaxInt64
	case json.Number:
		n, err := x.Int64()
		return n, err == nil
	}
	return 0, false
}

// FieldString is Field as a string: false when it is missing or not a string.
func (r *Record) FieldString(name string) (string, bool) {
	if IsRow(r.ValueBytes()) {
		i := r.slotOf(name)
		if i < 0 || r.row.null(i) || r.row.kind(i) != kindStr {
			return "", false
		}
		p, err := r.row.part(i)
		return string(p), err == nil
	}
	v, ok := r.Field(name)
	s, isString := v.(string)
	return s, ok && isString
}

// Timer is a timer that fired, for the current key.
type Timer struct {
	c         *call
	ko, kl    uint32
	Timestamp int64
	Domain    TimeDomain
}

// KeyBytes is the key the timer was registered for, as JSON text.
func (t *Timer) KeyBytes() []byte { return t.c.data[t.ko : t.ko+t.kl] }

// Key decodes the timer's key into v.
func (t *Timer) Key(v any) error {
	if err := decodeJSON(t.KeyBytes(), v); err != nil {
		return BadRecord("timer key %s does not fit %T: %v", t.KeyBytes(), v, err)
	}
	return nil
}

// SideOutput is a named side output, declared in Open.
type SideOutput struct {
	id   uint32
	Name string
}

// OpenContext is handed to Open: it declares states and side outputs.
type OpenContext struct {
	c *call
	// Config is the step's configuration.
	Config Config
}

// SideOutput declares the side output `name` (for example `late-data` or `alerts`).
func (o *OpenContext) SideOutput(name string) SideOutput {
	return SideOutput{o.c.host.SideOutput(name), name}
}

// Context is handed to Process, OnTimer and Close: output, timers and time.
type Context struct {
	c     *call
	ts    int64
	hasTS bool
}

// Timestamp of the record or timer being handled; emitted records inherit it.
func (x *Context) Timestamp() (int64, bool) { return x.ts, x.hasTS }

// Emit sends a keyed record to the main output. A named struct is written as a row, anything
// else as JSON; the key is JSON.
func (x *Context) Emit(key, value any) { x.c.push(0, key, true, value, x.ts, x.hasTS) }

// EmitValue sends a record without a key to the main output.
func (x *Context) EmitValue(value any) { x.c.push(0, nil, false, value, x.ts, x.hasTS) }

// EmitTo sends a keyed record to a side output.
func (x *Context) EmitTo(to SideOutput, key, value any) {
	x.c.push(to.id, key, true, value, x.ts, x.hasTS)
}

// RegisterTimer sets a timer for the current key; one (key, domain, timestamp) fires once
// however often it is registered.
func (x *Context) RegisterTimer(domain TimeDomain, timestamp int64) {
	x.c.host.RegisterTimer(x.c.keyHandle(), domain, timestamp)
}

// DeleteTimer removes a timer of the current key.
func (x *Context) DeleteTimer(domain TimeDomain, timestamp int64) {
	x.c.host.DeleteTimer(x.c.keyHandle(), domain, timestamp)
}

// Watermark is the operator's event-time watermark (ms); math.MinInt64 before the first.
func (x *Context) Watermark() int64 { return x.c.host.Watermark() }

// ProcessingTime is the host's processing time (ms since the Unix epoch): the guest's only
// clock unless the pipeline grants WASI clocks.
func (x *Context) ProcessingTime() int64 { return x.c.host.ProcessingTime() }

// fail aborts the call with err: the runner recovers it and reports err.
func fail(err error) { panic(failure{err}) }

type failure struct{ err error }

// call is what the call in progress brought in and has buffered.
type call struct {
	host    Host
	schemas *schemaCache
	handle  int64 // the current key handle, -1 when there is no key
	slot    uint32
	row     int // the current record's row in `prefetched`, -1 in timers
	data    []byte
	// prefetchCol[state id]: the state's column in `prefetched` + 1, or 0.
	prefetchCol   []int
	prefetchWidth int
	prefetched    []byte
	// Value-state writes in order, one per (state, key slot).
	writes []valueWrite
	// written[state][slot]: the index + 1 of the call's write to that state for that key
	// slot, or 0. Slices, not a map: a map operation per record cost more than the rest.
	written                                 [][]int32
	outData, outRows, stateData, stateTable []byte
	slotSchema                              uint32
	slotNames                               []string
}

// slotOf is the slot of field name in rows of schema, or -1. The names of the last schema
// asked are kept: a record's fields are looked up by a short scan, not a hash per field.
func (c *call) slotOf(schema uint32, name string) int {
	if schema != c.slotSchema || c.slotNames == nil {
		c.slotSchema, c.slotNames = schema, c.schemas.lookup(schema)
		if c.slotNames == nil {
			c.slotNames = []string{}
		}
	}
	for i, n := range c.slotNames {
		if n == name {
			return i
		}
	}
	return -1
}

type valueWrite struct {
	state, slot uint32
	// The value's bytes in the call's state arena; cleared: the write is a clear.
	off, n  uint32
	cleared bool
}

func newCall(host Host) *call {
	return &call{host: host, schemas: newSchemaCache(host), handle: -1}
}

func (c *call) begin(data []byte, prefetchedStates []uint32, prefetched []byte) {
	c.data = data
	clear(c.prefetchCol)
	for i, id := range prefetchedStates {
		for int(id) >= len(c.prefetchCol) {
			c.prefetchCol = append(c.prefetchCol, 0)
		}
		c.prefetchCol[id] = i + 1
	}
	c.prefetchWidth = len(prefetchedStates)
	c.prefetched = prefetched
	c.discard()
	c.handle, c.row = -1, -1
}

func (c *call) keyHandle() uint32 {
	if c.handle < 0 {
		fail(Failed(noKey))
	}
	return uint32(c.handle)
}

// write records the current key's value of state: the bytes appended to the state arena
// since it was `from` long, or a clear when cleared. Values are written straight into the
// arena the host is handed at the end of the call, so a write allocates nothing.
func (c *call) write(state uint32, from int, cleared bool) {
	c.keyHandle()
	for int(state) >= len(c.written) {
		c.written = append(c.written, nil)
	}
	slots := c.written[state]
	if int(c.slot) >= len(slots) {
		grown := make([]int32, max(1024, 2*int(c.slot)+1))
		copy(grown, slots)
		c.written[state], slots = grown, grown
	}
	w := valueWrite{state, c.slot, uint32(from), uint32(len(c.stateData) - from), cleared}
	if i := slots[c.slot]; i != 0 {
		c.writes[i-1] = w
		return
	}
	c.writes = append(c.writes, w)
	slots[c.slot] = int32(len(c.writes))
}

// current is this call's value of state for the current key: its write, else the prefetched
// cell, else the host's.
func (c *call) current(state uint32) ([]byte, bool) {
	c.keyHandle()
	if int(state) < len(c.written) && int(c.slot) < len(c.written[state]) {
		if i := c.written[state][c.slot]; i != 0 {
			w := c.writes[i-1]
			return c.stateData[w.off : w.off+w.n], !w.cleared
		}
	}
	if int(state) < len(c.prefetchCol) && c.prefetchCol[state] > 0 && c.row >= 0 && len(c.prefetched) > 0 {
		at := 8 * (c.row*c.prefetchWidth + c.prefetchCol[state] - 1)
		off, n := le.Uint32(c.prefetched[at:]), le.Uint32(c.prefetched[at+4:])
		if n == absent {
			return nil, false
		}
		return c.data[off : off+n], true
	}
	return c.host.ValueGet(state, uint32(c.handle))
}

func (c *call) flushState() {
	if len(c.writes) == 0 {
		return
	}
	table := c.stateTable[:0]
	for _, w := range c.writes {
		table = le.AppendUint32(le.AppendUint32(table, w.state), w.slot)
		if w.cleared {
			table = le.AppendUint32(le.AppendUint32(table, 0), absent)
		} else {
			table = le.AppendUint32(le.AppendUint32(table, w.off), w.n)
		}
	}
	c.host.ValueSetMany(c.stateData, table)
	c.stateTable = table
	c.clearWrites()
}

func (c *call) clearWrites() {
	for _, w := range c.writes {
		c.written[w.state][w.slot] = 0
	}
	c.writes = c.writes[:0]
	c.stateData = c.stateData[:0]
}

func (c *call) flushOutput() {
	if len(c.outRows) > 0 {
		c.host.Emit(c.outData, c.outRows)
		c.outData, c.outRows = c.outData[:0], c.outRows[:0]
	}
}

func (c *call) discard() {
	c.clearWrites()
	c.outData, c.outRows = c.outData[:0], c.outRows[:0]
}

func (c *call) push(output uint32, key any, keyed bool, value any, ts int64, hasTS bool) {
	ko, kl := uint32(len(c.outData)), uint32(absent)
	if keyed {
		out, ok := appendPlain(c.outData, key)
		if !ok {
			k, err := encodeJSON(key)
			if err != nil {
				fail(Failed("key %T cannot be written as JSON: %v", key, err))
			}
			out = append(c.outData, k...)
		}
		kl = uint32(len(out)) - ko
		c.outData = out
	}
	vo := uint32(len(c.outData))
	out, err := appendValue(c.outData, value, c.schemas)
	if err != nil {
		c.outData = c.outData[:vo]
		fail(Failed("value %T cannot be written: %v", value, err))
	}
	c.outData = out
	var flags uint32
	if hasTS {
		flags = 1
	}
	r := c.outRows
	r = le.AppendUint32(le.AppendUint32(le.AppendUint32(le.AppendUint32(r, ko), kl), vo), uint32(len(c.outData))-vo)
	r = le.AppendUint32(le.AppendUint32(le.AppendUint64(r, uint64(ts)), flags), output)
	c.outRows = r
	if len(c.outData) >= outputFlushBytes {
		c.flushOutput()
	}
}

// guard runs body, turning a returned error or a panic into the error the host receives, with
// the stack of a panic the operator did not choose in the log.
func guard(host Base, body func() error) (result *OperatorError) {
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		if f, ok := p.(failure); ok {
			result = describe(f.err)
			return
		}
		host.Log(LevelError, fmt.Sprintf("panic: %v\n%s", p, lastBytes(debug.Stack(), 3500)))
		result = &OperatorError{KindFailed, fmt.Sprintf("panic: %v", p)}
	}()
	if err := body(); err != nil {
		return describe(err)
	}
	return nil
}

func lastBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

var exportedOperator func() Operator

// ExportOperator makes the component's operator: call it from an init function of package
// main with a function that makes one instance.
func ExportOperator(factory func() Operator) { exportedOperator = factory }

// Runner drives one operator instance through the WIT's life cycle over host (the
// component's imports, or package eddytest's in-memory host). Every method returns nil or the
// operator error the host receives. It is the SDK's side of the generated bindings; operators
// do not use it.
type Runner struct {
	host Host
	c    *call
	ctx  Context
	op   Operator
}

// NewRunner makes the runner of the exported operator (ExportOperator) over host.
func NewRunner(host Host) *Runner {
	logHost = host
	c := newCall(host)
	return &Runner{host: host, c: c, ctx: Context{c: c}}
}

func (r *Runner) guarded(body func() error) *OperatorError {
	err := guard(r.host, body)
	r.c.handle = -1
	if err != nil {
		r.c.discard()
		return err
	}
	// State first: by the time the host sees the output, the state it reflects is stored.
	r.c.flushState()
	r.c.flushOutput()
	return nil
}

func (r *Runner) operator() Operator {
	if r.op == nil {
		fail(Failed("operator called before a successful open"))
	}
	return r.op
}

// Open makes the operator and opens it with the step's configuration.
func (r *Runner) Open(config string) *OperatorError {
	return r.guarded(func() error {
		if exportedOperator == nil {
			return Failed("no operator exported: call eddy.ExportOperator from an init function")
		}
		r.c.begin(nil, nil, nil)
		op := exportedOperator()
		if err := op.Open(&OpenContext{c: r.c, Config: Config{config}}); err != nil {
			return err
		}
		r.op = op
		return nil
	})
}

// Process hands the operator a batch (the WIT's `batch`, its tables packed).
func (r *Runner) Process(data, records []byte, prefetchedStates []uint32, prefetched []byte) *OperatorError {
	return r.guarded(func() error {
		op := r.operator()
		c := r.c
		c.begin(data, prefetchedStates, prefetched)
		var rec Record
		for i := 0; 32*i+32 <= len(records); i++ {
			t := records[32*i:]
			rec = Record{c: c, ko: le.Uint32(t), kl: le.Uint32(t[4:]), vo: le.Uint32(t[8:]), vl: le.Uint32(t[12:])}
			rec.ts, rec.hasTS = int64(le.Uint64(t[16:])), le.Uint32(t[24:])&1 == 1
			c.handle = int64(i)
			if rec.kl == absent {
				c.handle = -1
			}
			c.slot, c.row = le.Uint32(t[28:]), i
			r.ctx.ts, r.ctx.hasTS = rec.ts, rec.hasTS
			if err := op.Process(&rec, &r.ctx); err != nil {
				return err
			}
		}
		return nil
	})
}

// OnTimer hands the operator the timers that fired.
func (r *Runner) OnTimer(data []byte, timers []TimerRef) *OperatorError {
	return r.guarded(func() error {
		op := r.operator()
		c := r.c
		c.begin(data, nil, nil)
		handler, ok := op.(TimerHandler)
		if !ok {
			return nil
		}
		for i, t := range timers {
			c.handle, c.slot, c.row = int64(i), t.Slot, -1
			r.ctx.ts, r.ctx.hasTS = t.Timestamp, true
			if err := handler.OnTimer(&Timer{c, t.KeyOffset, t.KeyLen, t.Timestamp, t.Domain}, &r.ctx); err != nil {
				return err
			}
		}
		return nil
	})
}

// Close closes the operator at the end of a bounded input.
func (r *Runner) Close() *OperatorError {
	return r.guarded(func() error {
		op := r.operator()
		r.c.begin(nil, nil, nil)
		r.ctx.ts, r.ctx.hasTS = 0, false
		if closer, ok := op.(Closer); ok {
			return closer.Close(&r.ctx)
		}
		return nil
	})
}
