package eddy

// Harness runs the exported operator in plain Go (`go test`, no Wasm) over an in-memory host
// that keeps state, timers, watermark and processing time as the real one does.

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// Input is a record handed to Harness.Process.
type Input struct {
	Key          any // nil with Keyed false: a record without a key
	Keyed        bool
	Value        any
	Timestamp    int64
	HasTimestamp bool
}

// Keyed is an input record with a key.
func Keyed(key, value any) Input { return Input{Key: key, Keyed: true, Value: value} }

// KeyedAt is an input record with a key and an event time (ms).
func KeyedAt(key, value any, ts int64) Input {
	return Input{Key: key, Keyed: true, Value: value, Timestamp: ts, HasTimestamp: true}
}

// Unkeyed is an input record without a key.
func Unkeyed(value any) Input { return Input{Value: value} }

// Output is a record the operator emitted.
type Output struct {
	KeyJSON      []byte // nil: no key
	ValueBytes   []byte // a row or JSON
	Timestamp    int64
	HasTimestamp bool
	Side         string // "" for the main output
	names        schemaNames
}

// Key decodes the key into v.
func (o Output) Key(v any) error { return decodeJSON(o.KeyJSON, v) }

// Value decodes the value (row or JSON) into v.
func (o Output) Value(v any) error { return decodeValue(o.ValueBytes, o.names, v) }

// String is `key => value` with the value as JSON (a row rendered as an object), the way
// Eddy's print sink shows it.
func (o Output) String() string {
	var v any
	if err := o.Value(&v); err != nil {
		return fmt.Sprintf("%s => <%v>", o.KeyJSON, err)
	}
	text, _ := encodeJSON(v)
	if o.KeyJSON == nil {
		return string(text)
	}
	return fmt.Sprintf("%s => %s", o.KeyJSON, text)
}

type timerKey struct {
	key    string
	domain TimeDomain
	ts     int64
}

type state struct {
	name     string
	kind     StateKind
	prefetch bool
	values   map[string][]byte
	lists    map[string][][]byte
	maps     map[string]map[string][]byte
}

// memoryHost is the Host the harness hands the runner.
type memoryHost struct {
	states    []*state
	byName    map[string]uint32
	timers    map[timerKey]bool
	watermark int64
	now       int64
	sides     []string
	schemas   map[uint32][2][]string
	handles   []string // the keys behind the current call's handles
	out       []Output
	logs      []string
}

func (h *memoryHost) DeclareSchema(name string, fields []string) uint32 {
	id := SchemaID(name, fields)
	h.schemas[id] = [2][]string{{name}, fields}
	return id
}

func (h *memoryHost) SchemaFields(id uint32) (string, []string, bool) {
	s, ok := h.schemas[id]
	if !ok {
		return "", nil, false
	}
	return s[0][0], s[1], true
}

func (h *memoryHost) names(id uint32) []string {
	_, fields, _ := h.SchemaFields(id)
	return fields
}

func (h *memoryHost) Log(level Level, message string) {
	h.logs = append(h.logs, fmt.Sprintf("%d %s", level, message))
}

func (h *memoryHost) DeclareState(name string, kind StateKind, prefetch bool) uint32 {
	if id, ok := h.byName[name]; ok {
		if h.states[id].kind != kind {
			panic(fmt.Sprintf("state %s declared again with another kind", name))
		}
		return id
	}
	id := uint32(len(h.states))
	h.states = append(h.states, &state{name: name, kind: kind, prefetch: prefetch && kind == KindValue,
		values: map[string][]byte{}, lists: map[string][][]byte{}, maps: map[string]map[string][]byte{}})
	h.byName[name] = id
	return id
}

func (h *memoryHost) key(handle uint32) string {
	if int(handle) >= len(h.handles) {
		panic(fmt.Sprintf("key handle %d is not in the current call", handle))
	}
	return h.handles[handle]
}

func (h *memoryHost) ValueGet(s, key uint32) ([]byte, bool) {
	v, ok := h.states[s].values[h.key(key)]
	return v, ok
}

func (h *memoryHost) ValueSetMany(data, writes []byte) {
	for at := 0; at+16 <= len(writes); at += 16 {
		s, key, off, n := le.Uint32(writes[at:]), le.Uint32(writes[at+4:]), le.Uint32(writes[at+8:]), le.Uint32(writes[at+12:])
		// The handle is a key slot: the first record of the batch with that key.
		if n == absent {
			delete(h.states[s].values, h.key(key))
		} else {
			h.states[s].values[h.key(key)] = append([]byte(nil), data[off:off+n]...)
		}
	}
}

func (h *memoryHost) ListGet(s, key uint32) [][]byte { return h.states[s].lists[h.key(key)] }

func (h *memoryHost) ListAppend(s, key uint32, item []byte) {
	k := h.key(key)
	h.states[s].lists[k] = append(h.states[s].lists[k], append([]byte(nil), item...))
}

func (h *memoryHost) ListReplace(s, key uint32, items [][]byte) {
	h.states[s].lists[h.key(key)] = items
}

func (h *memoryHost) MapGet(s, key uint32, mapKey []byte) ([]byte, bool) {
	v, ok := h.states[s].maps[h.key(key)][string(mapKey)]
	return v, ok
}

func (h *memoryHost) MapPut(s, key uint32, mapKey, value []byte) {
	k := h.key(key)
	if h.states[s].maps[k] == nil {
		h.states[s].maps[k] = map[string][]byte{}
	}
	h.states[s].maps[k][string(mapKey)] = append([]byte(nil), value...)
}

func (h *memoryHost) MapRemove(s, key uint32, mapKey []byte) {
	delete(h.states[s].maps[h.key(key)], string(mapKey))
}

func (h *memoryHost) MapEntries(s, key uint32) [][2][]byte {
	m := h.states[s].maps[h.key(key)]
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([][2][]byte, len(keys))
	for i, k := range keys {
		out[i] = [2][]byte{[]byte(k), m[k]}
	}
	return out
}

func (h *memoryHost) Clear(s, key uint32) {
	k := h.key(key)
	st := h.states[s]
	delete(st.values, k)
	delete(st.lists, k)
	delete(st.maps, k)
}

func (h *memoryHost) RegisterTimer(key uint32, domain TimeDomain, ts int64) {
	h.timers[timerKey{h.key(key), domain, ts}] = true
}

func (h *memoryHost) DeleteTimer(key uint32, domain TimeDomain, ts int64) {
	delete(h.timers, timerKey{h.key(key), domain, ts})
}

func (h *memoryHost) Watermark() int64 { return h.watermark }

func (h *memoryHost) ProcessingTime() int64 { return h.now }

func (h *memoryHost) SideOutput(name string) uint32 {
	for i, s := range h.sides {
		if s == name {
			return uint32(i + 1)
		}
	}
	h.sides = append(h.sides, name)
	return uint32(len(h.sides))
}

func (h *memoryHost) Emit(data, records []byte) {
	for at := 0; at+32 <= len(records); at += 32 {
		r := records[at:]
		ko, kl, vo, vl := le.Uint32(r), le.Uint32(r[4:]), le.Uint32(r[8:]), le.Uint32(r[12:])
		o := Output{ValueBytes: append([]byte(nil), data[vo:vo+vl]...), names: h.names}
		if kl != absent {
			o.KeyJSON = append([]byte(nil), data[ko:ko+kl]...)
		}
		o.Timestamp, o.HasTimestamp = int64(le.Uint64(r[16:])), le.Uint32(r[24:])&1 == 1
		if side := le.Uint32(r[28:]); side > 0 && int(side) <= len(h.sides) {
			o.Side = h.sides[side-1]
		}
		h.out = append(h.out, o)
	}
}

// Harness runs the operator exported with ExportOperator.
type Harness struct {
	host   *memoryHost
	runner *Runner
}

func asError(err *OperatorError) error {
	if err == nil {
		return nil
	}
	return err
}

// NewHarness makes and opens the exported operator with config (JSON text, "" for none).
func NewHarness(config string) (*Harness, error) {
	h := &memoryHost{byName: map[string]uint32{}, timers: map[timerKey]bool{}, watermark: math.MinInt64,
		schemas: map[uint32][2][]string{}}
	harness := &Harness{host: h, runner: NewRunner(h)}
	return harness, asError(harness.runner.Open(config))
}

func (t *Harness) take() []Output {
	out := t.host.out
	t.host.out = nil
	return out
}

// Process hands the operator one batch of records and returns what it emitted.
func (t *Harness) Process(records ...Input) ([]Output, error) {
	h := t.host
	var data, table []byte
	h.handles = h.handles[:0]
	first := map[string]int{}
	schemas := newSchemaCache(h)
	for i, r := range records {
		ko, kl := uint32(len(data)), uint32(absent)
		slot := uint32(i)
		key := ""
		if r.Keyed {
			k, err := encodeJSON(r.Key)
			if err != nil {
				return nil, fmt.Errorf("record %d: key: %w", i, err)
			}
			key = string(k)
			data, kl = append(data, k...), uint32(len(k))
			if j, ok := first[key]; ok {
				slot = uint32(j)
			} else {
				first[key] = i
			}
		}
		// A handle stands for its record's key; writes name the key slot, which is a handle too.
		h.handles = append(h.handles, key)
		v, err := encodeValue(r.Value, schemas)
		if err != nil {
			return nil, fmt.Errorf("record %d: value: %w", i, err)
		}
		vo := uint32(len(data))
		data = append(data, v...)
		var flags uint32
		if r.HasTimestamp {
			flags = 1
		}
		table = le.AppendUint32(le.AppendUint32(le.AppendUint32(le.AppendUint32(table, ko), kl), vo), uint32(len(v)))
		table = le.AppendUint32(le.AppendUint32(le.AppendUint64(table, uint64(r.Timestamp)), flags), slot)
	}
	// Prefetched value states, ascending by id, as the host sends them.
	var ids []uint32
	for id, s := range h.states {
		if s.prefetch {
			ids = append(ids, uint32(id))
		}
	}
	var cells []byte
	if len(ids) > 0 {
		for i, r := range records {
			for _, id := range ids {
				v, ok := h.states[id].values[h.handles[i]]
				if !r.Keyed || !ok {
					cells = le.AppendUint32(le.AppendUint32(cells, 0), absent)
					continue
				}
				cells = le.AppendUint32(le.AppendUint32(cells, uint32(len(data))), uint32(len(v)))
				data = append(data, v...)
			}
		}
	}
	err := t.runner.Process(data, table, ids, cells)
	return t.take(), asError(err)
}

func (t *Harness) fire(domain TimeDomain, until int64) ([]Output, error) {
	h := t.host
	var out []Output
	for {
		var due []timerKey
		for k := range h.timers {
			if k.domain == domain && k.ts <= until {
				due = append(due, k)
			}
		}
		if len(due) == 0 {
			return out, nil
		}
		sort.Slice(due, func(i, j int) bool {
			if due[i].ts != due[j].ts {
				return due[i].ts < due[j].ts
			}
			return strings.Compare(due[i].key, due[j].key) < 0
		})
		var data []byte
		refs := make([]TimerRef, len(due))
		h.handles = h.handles[:0]
		first := map[string]uint32{}
		for i, k := range due {
			delete(h.timers, k)
			slot, ok := first[k.key]
			if !ok {
				slot = uint32(i)
				first[k.key] = slot
			}
			refs[i] = TimerRef{uint32(len(data)), uint32(len(k.key)), k.ts, domain, slot}
			data = append(data, k.key...)
			h.handles = append(h.handles, k.key)
		}
		err := t.runner.OnTimer(data, refs)
		out = append(out, t.take()...)
		if err != nil {
			return out, err
		}
	}
}

// AdvanceWatermark moves the watermark and fires the event-time timers it passes.
func (t *Harness) AdvanceWatermark(watermark int64) ([]Output, error) {
	t.host.watermark = watermark
	return t.fire(EventTime, watermark)
}

// AdvanceProcessingTime moves the host's clock and fires the processing-time timers due.
func (t *Harness) AdvanceProcessingTime(now int64) ([]Output, error) {
	t.host.now = now
	return t.fire(ProcessingTime, now)
}

// Close closes the operator (the end of a bounded input).
func (t *Harness) Close() ([]Output, error) {
	err := t.runner.Close()
	return t.take(), asError(err)
}

// Value is the JSON text value state `name` holds for key, if any.
func (t *Harness) Value(name string, key any) ([]byte, bool) {
	id, ok := t.host.byName[name]
	if !ok {
		return nil, false
	}
	k, err := encodeJSON(key)
	if err != nil {
		return nil, false
	}
	v, ok := t.host.states[id].values[string(k)]
	return v, ok
}

// Timers are the timers waiting to fire, as (domain, timestamp, key JSON), in time order.
func (t *Harness) Timers() []string {
	var out []string
	for k := range t.host.timers {
		out = append(out, fmt.Sprintf("%d %d %s", k.domain, k.ts, k.key))
	}
	sort.Strings(out)
	return out
}

// Logs are the lines the operator logged, as "level message".
func (t *Harness) Logs() []string { return t.host.logs }
