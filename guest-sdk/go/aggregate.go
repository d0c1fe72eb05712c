package eddy

// Window aggregates: the interface users implement and the runner behind the
// `eddy:dataflow/aggregate` export. The host's window operators keep the accumulators (as
// bytes, in keyed state) and call the aggregate once per batch for every (key, window) the
// batch touches. An accumulator that is a struct is stored as a row (readable by every SDK:
// a Go `Totals` struct and a Rust `Totals` struct with the same fields share a savepoint),
// anything else as JSON.

// Aggregate is an aggregate function with accumulator type A, for the host's tumbling,
// sliding and session windows. An aggregate that also implements AggregateOpener gets the
// step's configuration first.
type Aggregate[A any] interface {
	// CreateAccumulator is a new, empty accumulator; the same every time.
	CreateAccumulator() A
	// Add folds one record into acc and returns the result (acc itself may be changed).
	Add(acc A, r *Record) (A, error)
	// Merge combines two accumulators (session windows merge them).
	Merge(a, b A) (A, error)
	// Result is what a window emits: a struct (a row) or anything JSON holds.
	Result(acc A) (any, error)
}

// AggregateOpener is an aggregate with a configuration.
type AggregateOpener interface {
	Open(config Config) error
}

// erasedAggregate is an Aggregate over encoded accumulators.
type erasedAggregate interface {
	open(config Config) error
	create() ([]byte, error)
	add(acc []byte, records func(yield func(*Record) error) error) ([]byte, error)
	merge(a, b []byte) ([]byte, error)
	result(acc []byte) ([]byte, error)
}

type typedAggregate[A any] struct {
	agg     Aggregate[A]
	schemas *schemaCache
}

func (t *typedAggregate[A]) decode(b []byte) (A, error) {
	var acc A
	if err := decodeValue(b, t.schemas.lookup, &acc); err != nil {
		return acc, Failed("accumulator does not fit %T: %v", acc, err)
	}
	return acc, nil
}

func (t *typedAggregate[A]) encode(acc A) ([]byte, error) {
	b, err := encodeValue(acc, t.schemas)
	if err != nil {
		return nil, Failed("accumulator %T cannot be written: %v", acc, err)
	}
	return b, nil
}

func (t *typedAggregate[A]) open(config Config) error {
	if opener, ok := t.agg.(AggregateOpener); ok {
		return opener.Open(config)
	}
	return nil
}

func (t *typedAggregate[A]) create() ([]byte, error) { return t.encode(t.agg.CreateAccumulator()) }

func (t *typedAggregate[A]) add(b []byte, records func(yield func(*Record) error) error) ([]byte, error) {
	acc, err := t.decode(b)
	if err != nil {
		return nil, err
	}
	if err := records(func(r *Record) error {
		acc, err = t.agg.Add(acc, r)
		return err
	}); err != nil {
		return nil, err
	}
	return t.encode(acc)
}

func (t *typedAggregate[A]) merge(a, b []byte) ([]byte, error) {
	x, err := t.decode(a)
	if err != nil {
		return nil, err
	}
	y, err := t.decode(b)
	if err != nil {
		return nil, err
	}
	merged, err := t.agg.Merge(x, y)
	if err != nil {
		return nil, err
	}
	return t.encode(merged)
}

func (t *typedAggregate[A]) result(b []byte) ([]byte, error) {
	acc, err := t.decode(b)
	if err != nil {
		return nil, err
	}
	out, err := t.agg.Result(acc)
	if err != nil {
		return nil, err
	}
	v, err := encodeValue(out, t.schemas)
	if err != nil {
		return nil, Failed("result %T cannot be written: %v", out, err)
	}
	return v, nil
}

var exportedAggregate func(*schemaCache) erasedAggregate

// ExportAggregate makes the component's aggregate: call it from an init function of package
// main with a function that makes one instance.
func ExportAggregate[A any](factory func() Aggregate[A]) {
	exportedAggregate = func(s *schemaCache) erasedAggregate { return &typedAggregate[A]{factory(), s} }
}

// Packed is the WIT's packed-items: byte strings back to back in Data, an 8-byte (offset,
// length) span each in Spans.
type Packed struct{ Data, Spans []byte }

func (p *Packed) push(b []byte) {
	p.Spans = le.AppendUint32(le.AppendUint32(p.Spans, uint32(len(p.Data))), uint32(len(b)))
	p.Data = append(p.Data, b...)
}

// Items are the byte strings, checked to lie inside Data.
func (p Packed) items() ([][]byte, error) {
	out := make([][]byte, 0, len(p.Spans)/8)
	for at := 0; at+8 <= len(p.Spans); at += 8 {
		off, n := uint64(le.Uint32(p.Spans[at:])), uint64(le.Uint32(p.Spans[at+4:]))
		if off+n > uint64(len(p.Data)) {
			return nil, Failed("packed item %d points outside its data", at/8)
		}
		out = append(out, p.Data[off:off+n])
	}
	return out, nil
}

// AggregateRunner drives the exported aggregate through the WIT's `aggregate` interface over
// host (the component's imports or package eddytest's). Operators do not use it.
type AggregateRunner struct {
	host Base
	c    *call
	agg  erasedAggregate
}

// NewAggregateRunner makes the runner of the exported aggregate (ExportAggregate).
func NewAggregateRunner(host Base) *AggregateRunner {
	logHost = host
	return &AggregateRunner{host: host, c: &call{schemas: newSchemaCache(host), handle: -1}}
}

func (r *AggregateRunner) aggregate() erasedAggregate {
	if r.agg == nil {
		fail(Failed("aggregate called before a successful open"))
	}
	return r.agg
}

// Open makes the aggregate and hands it the step's configuration.
func (r *AggregateRunner) Open(config string) *OperatorError {
	return guard(r.host, func() error {
		if exportedAggregate == nil {
			return Failed("no aggregate exported: call eddy.ExportAggregate from an init function")
		}
		agg := exportedAggregate(r.c.schemas)
		if err := agg.open(Config{config}); err != nil {
			return err
		}
		r.agg = agg
		return nil
	})
}

// CreateAccumulator is the encoded empty accumulator.
func (r *AggregateRunner) CreateAccumulator() (out []byte, err *OperatorError) {
	err = guard(r.host, func() (e error) {
		out, e = r.aggregate().create()
		return e
	})
	return out, err
}

// Add folds a batch into the accumulators its updates name (the WIT's accumulator-updates).
func (r *AggregateRunner) Add(data, records, accumulators, updates []byte, indices []uint32) (out Packed, err *OperatorError) {
	err = guard(r.host, func() error {
		agg := r.aggregate()
		r.c.data = data
		n := uint32(len(records) / 32)
		for at := 0; at+16 <= len(updates); at += 16 {
			u := updates[at:]
			off, length, first, count := le.Uint32(u), le.Uint32(u[4:]), le.Uint32(u[8:]), le.Uint32(u[12:])
			if uint64(off)+uint64(length) > uint64(len(accumulators)) || uint64(first)+uint64(count) > uint64(len(indices)) {
				return Failed("update %d points outside its tables", at/16)
			}
			acc, e := agg.add(accumulators[off:off+length], func(yield func(*Record) error) error {
				for _, i := range indices[first : first+count] {
					if i >= n {
						return Failed("update %d names record %d of %d", at/16, i, n)
					}
					t := records[32*i:]
					rec := Record{c: r.c, ko: le.Uint32(t), kl: le.Uint32(t[4:]), vo: le.Uint32(t[8:]), vl: le.Uint32(t[12:])}
					rec.ts, rec.hasTS = int64(le.Uint64(t[16:])), le.Uint32(t[24:])&1 == 1
					if e := yield(&rec); e != nil {
						return e
					}
				}
				return nil
			})
			if e != nil {
				return e
			}
			out.push(acc)
		}
		return nil
	})
	return out, err
}

// Merge combines two encoded accumulators.
func (r *AggregateRunner) Merge(a, b []byte) (out []byte, err *OperatorError) {
	err = guard(r.host, func() (e error) {
		out, e = r.aggregate().merge(a, b)
		return e
	})
	return out, err
}

// Results are the values the windows of the given accumulators emit, in order.
func (r *AggregateRunner) Results(accumulators Packed) (out Packed, err *OperatorError) {
	err = guard(r.host, func() error {
		agg := r.aggregate()
		items, e := accumulators.items()
		if e != nil {
			return e
		}
		for _, acc := range items {
			v, e := agg.result(acc)
			if e != nil {
				return e
			}
			out.push(v)
		}
		return nil
	})
	return out, err
}
