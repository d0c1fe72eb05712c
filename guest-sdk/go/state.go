package eddy

// Keyed state handles, declared in Open and used in Process and OnTimer, where they act on
// the current record's or timer's key. Values are written as JSON and read as JSON or as rows
// (the Rust SDK writes a struct as a row), so a savepoint moves between languages. Map keys
// are JSON in every SDK. A value that cannot be written or a stored value that does not fit T
// fails the call.

import (
	"encoding/json"
	"reflect"
	"strconv"
	"unsafe"
)

// fastKind is how a state's values are read and written without encoding/json (and without
// boxing them into an interface, which allocates per value): integers and plain strings,
// the usual counts and ids. Chosen once per state from its type.
type fastKind uint8

const (
	slow fastKind = iota
	fastInt64
	fastString
)

func fastKindOf[T any]() fastKind {
	t := reflect.TypeFor[T]()
	// A type with its own JSON methods is written as they say.
	if t.Implements(reflect.TypeFor[json.Marshaler]()) || reflect.PointerTo(t).Implements(reflect.TypeFor[json.Unmarshaler]()) {
		return slow
	}
	switch t.Kind() {
	case reflect.Int64:
		return fastInt64
	case reflect.String:
		return fastString
	}
	return slow
}

// read decodes b into *p (a T of this kind); false if b is not the plain form this kind reads.
func (k fastKind) read(b []byte, p unsafe.Pointer) bool {
	switch k {
	case fastInt64:
		n, ok := parseInt64(b)
		if ok {
			*(*int64)(p) = n
		}
		return ok
	case fastString:
		if len(b) >= 2 && b[0] == '"' && b[len(b)-1] == '"' && plainASCII(unsafe.String(unsafe.SliceData(b[1:]), len(b)-2)) {
			*(*string)(p) = string(b[1 : len(b)-1])
			return true
		}
	}
	return false
}

// append writes *p (a T of this kind) as JSON at the end of dst; false if it has no plain form.
func (k fastKind) append(dst []byte, p unsafe.Pointer) ([]byte, bool) {
	switch k {
	case fastInt64:
		return strconv.AppendInt(dst, *(*int64)(p), 10), true
	case fastString:
		if s := *(*string)(p); plainASCII(s) {
			return append(append(append(dst, '"'), s...), '"'), true
		}
	}
	return dst, false
}

// StateOption tunes a state's declaration.
type StateOption func(*stateOptions)

type stateOptions struct{ prefetch bool }

// NoPrefetch declares a value state read now and then: its values are asked when read rather
// than sent along with every batch.
func NoPrefetch() StateOption { return func(o *stateOptions) { o.prefetch = false } }

func encodeState(name string, v any) []byte {
	b, err := encodeJSON(v)
	if err != nil {
		fail(Failed("state %s: %T cannot be written as JSON: %v", name, v, err))
	}
	return b
}

func decodeState[T any](c *call, name string, b []byte) T {
	var v T
	if err := decodeValue(b, c.schemas.lookup, &v); err != nil {
		fail(Failed("state %s holds %s, which does not fit %T: %v", name, b, v, err))
	}
	return v
}

// decodeMapKey reads a map key, which every SDK writes as JSON.
func decodeMapKey[K any](name string, b []byte) K {
	var k K
	if err := decodeJSON(b, &k); err != nil {
		fail(Failed("state %s holds map key %s, which does not fit %T: %v", name, b, k, err))
	}
	return k
}

// ValueState is one value of type T per key.
type ValueState[T any] struct {
	c    *call
	id   uint32
	name string
	fast fastKind
}

// NewValueState declares the value state `name`, prefetched unless NoPrefetch is given.
func NewValueState[T any](ctx *OpenContext, name string, options ...StateOption) *ValueState[T] {
	o := stateOptions{prefetch: true}
	for _, opt := range options {
		opt(&o)
	}
	return &ValueState[T]{ctx.c, ctx.c.host.DeclareState(name, KindValue, o.prefetch), name, fastKindOf[T]()}
}

// Get is the current key's value, and whether one was set.
func (s *ValueState[T]) Get() (T, bool) {
	var v T
	b, ok := s.c.current(s.id)
	if !ok {
		return v, false
	}
	if s.fast.read(b, unsafe.Pointer(&v)) {
		return v, true
	}
	return decodeState[T](s.c, s.name, b), true
}

// Set replaces the current key's value.
func (s *ValueState[T]) Set(v T) {
	c := s.c
	from := len(c.stateData)
	if out, ok := s.fast.append(c.stateData, unsafe.Pointer(&v)); ok {
		c.stateData = out
	} else {
		c.stateData = append(c.stateData, encodeState(s.name, v)...)
	}
	c.write(s.id, from, false)
}

// Clear removes the current key's value.
func (s *ValueState[T]) Clear() { s.c.write(s.id, len(s.c.stateData), true) }

// ListState is an ordered list of T per key.
type ListState[T any] struct {
	c    *call
	id   uint32
	name string
}

// NewListState declares the list state `name`.
func NewListState[T any](ctx *OpenContext, name string) *ListState[T] {
	return &ListState[T]{ctx.c, ctx.c.host.DeclareState(name, KindList, false), name}
}

// Get is every item of the current key, oldest first.
func (s *ListState[T]) Get() []T {
	raw := s.c.host.ListGet(s.id, s.c.keyHandle())
	out := make([]T, len(raw))
	for i, b := range raw {
		out[i] = decodeState[T](s.c, s.name, b)
	}
	return out
}

// Append adds one item for the current key (as cheap however long the list is).
func (s *ListState[T]) Append(item T) {
	s.c.host.ListAppend(s.id, s.c.keyHandle(), encodeState(s.name, item))
}

// Replace replaces every item of the current key.
func (s *ListState[T]) Replace(items []T) {
	raw := make([][]byte, len(items))
	for i, item := range items {
		raw[i] = encodeState(s.name, item)
	}
	s.c.host.ListReplace(s.id, s.c.keyHandle(), raw)
}

// Clear removes every item of the current key.
func (s *ListState[T]) Clear() { s.c.host.Clear(s.id, s.c.keyHandle()) }

// MapState is a map from K to V per key; both are stored as JSON.
type MapState[K, V any] struct {
	c    *call
	id   uint32
	name string
}

// NewMapState declares the map state `name`.
func NewMapState[K, V any](ctx *OpenContext, name string) *MapState[K, V] {
	return &MapState[K, V]{ctx.c, ctx.c.host.DeclareState(name, KindMap, false), name}
}

// Get is the value under mapKey for the current key, and whether there is one.
func (s *MapState[K, V]) Get(mapKey K) (V, bool) {
	b, ok := s.c.host.MapGet(s.id, s.c.keyHandle(), encodeState(s.name, mapKey))
	if !ok {
		var zero V
		return zero, false
	}
	return decodeState[V](s.c, s.name, b), true
}

// Put sets the value under mapKey for the current key.
func (s *MapState[K, V]) Put(mapKey K, value V) {
	s.c.host.MapPut(s.id, s.c.keyHandle(), encodeState(s.name, mapKey), encodeState(s.name, value))
}

// Remove deletes mapKey for the current key.
func (s *MapState[K, V]) Remove(mapKey K) {
	s.c.host.MapRemove(s.id, s.c.keyHandle(), encodeState(s.name, mapKey))
}

// Entry is one entry of a map state.
type Entry[K, V any] struct {
	Key   K
	Value V
}

// Entries is every entry of the current key, ordered by the map key's JSON bytes.
func (s *MapState[K, V]) Entries() []Entry[K, V] {
	raw := s.c.host.MapEntries(s.id, s.c.keyHandle())
	out := make([]Entry[K, V], len(raw))
	for i, kv := range raw {
		out[i] = Entry[K, V]{decodeMapKey[K](s.name, kv[0]), decodeState[V](s.c, s.name, kv[1])}
	}
	return out
}

// Clear removes every entry of the current key.
func (s *MapState[K, V]) Clear() { s.c.host.Clear(s.id, s.c.keyHandle()) }
