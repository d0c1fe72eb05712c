package eddy

// StateKind is the WIT's state-kind, in its order.
type StateKind uint8

const (
	KindValue StateKind = iota
	KindList
	KindMap
)

// TimeDomain is the WIT's time-domain, in its order.
type TimeDomain uint8

const (
	// EventTime timers fire when the watermark passes them.
	EventTime TimeDomain = iota
	// ProcessingTime timers fire when the host's clock passes them.
	ProcessingTime
)

// Base is what every world imports: schemas and the log.
type Base interface {
	DeclareSchema(name string, fields []string) uint32
	SchemaFields(id uint32) (name string, fields []string, ok bool)
	Log(level Level, message string)
}

// Host is the keyed-operator world's imports, one method per WIT function. The component's
// glue implements it over the generated bindings, package eddytest in memory; operators never
// call it themselves.
type Host interface {
	Base
	DeclareState(name string, kind StateKind, prefetch bool) uint32
	ValueGet(state, key uint32) ([]byte, bool)
	ValueSetMany(data, writes []byte)
	ListGet(state, key uint32) [][]byte
	ListAppend(state, key uint32, item []byte)
	ListReplace(state, key uint32, items [][]byte)
	MapGet(state, key uint32, mapKey []byte) ([]byte, bool)
	MapPut(state, key uint32, mapKey, value []byte)
	MapRemove(state, key uint32, mapKey []byte)
	MapEntries(state, key uint32) [][2][]byte
	Clear(state, key uint32)
	RegisterTimer(key uint32, domain TimeDomain, timestamp int64)
	DeleteTimer(key uint32, domain TimeDomain, timestamp int64)
	Watermark() int64
	ProcessingTime() int64
	SideOutput(name string) uint32
	Emit(data, records []byte)
}

// TimerRef is one fired timer as the WIT hands it: its key's span in the batch's data.
type TimerRef struct {
	KeyOffset, KeyLen uint32
	Timestamp         int64
	Domain            TimeDomain
	Slot              uint32
}
