package eddy

// Values as the SDK writes and reads them: a struct is a row of its type's schema, anything
// else JSON; reading takes a row or JSON into whatever the caller gives. Keys and state values
// are always JSON, as in every Eddy SDK.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"
	"sync"
)

// Raw is a value already encoded (a row or JSON text), emitted or stored as it is: the way to
// forward a record's value without decoding it.
type Raw []byte

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// appendPlain writes the values JSON holds without an encoder (Raw, integers, plain ASCII
// strings) at the end of dst; false for any other value.
func appendPlain(dst []byte, v any) ([]byte, bool) {
	switch x := v.(type) {
	case Raw:
		return append(dst, x...), true
	case int64:
		return strconv.AppendInt(dst, x, 10), true
	case int:
		return strconv.AppendInt(dst, int64(x), 10), true
	case uint64:
		return strconv.AppendUint(dst, x, 10), true
	case string:
		if plainASCII(x) {
			return append(append(append(dst, '"'), x...), '"'), true
		}
	}
	return dst, false
}

// encodeJSON writes v as JSON without HTML escaping (as serde_json writes strings).
func encodeJSON(v any) ([]byte, error) {
	if out, ok := appendPlain(nil, v); ok {
		return out, nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}), nil
}

// parseInt64 reads a JSON integer that fits int64 (no fraction, exponent or leading zeros),
// without the string conversion strconv needs; false for anything else.
func parseInt64(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	digits := b
	if neg {
		digits = b[1:]
	}
	if len(digits) == 0 || len(digits) > 18 || (digits[0] == '0' && len(digits) > 1) {
		return 0, false
	}
	var n int64
	for _, d := range digits {
		if d < '0' || d > '9' {
			return 0, false
		}
		n = n*10 + int64(d-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// plainASCII: printable ASCII without quotes or backslashes, written as it is.
func plainASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7E || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// decodeJSON reads JSON text into target, with fast paths for the common scalar targets.
func decodeJSON(b []byte, target any) error {
	switch t := target.(type) {
	case *int64:
		if n, ok := parseInt64(b); ok {
			*t = n
			return nil
		}
	case *string:
		if len(b) >= 2 && b[0] == '"' && b[len(b)-1] == '"' && plainASCII(string(b[1:len(b)-1])) {
			*t = string(b[1 : len(b)-1])
			return nil
		}
	case *any:
		v, err := parseJSON(b)
		if err == nil {
			*t = v
		}
		return err
	}
	return json.Unmarshal(b, target)
}

// schemaCache declares the schemas of struct types once per instance and remembers the
// field names of the ids it reads.
type schemaCache struct {
	host  Base
	types map[reflect.Type]typeEntry
	names map[uint32][]string
}

// typeEntry is a struct type's row layout and its declared schema id.
type typeEntry struct {
	info *structInfo
	id   uint32
}

func newSchemaCache(host Base) *schemaCache {
	return &schemaCache{host: host, types: map[reflect.Type]typeEntry{}, names: map[uint32][]string{}}
}

// entry is t's layout and schema, declared at its first use.
func (c *schemaCache) entry(t reflect.Type) typeEntry {
	e, ok := c.types[t]
	if !ok {
		info := infoOf(t)
		e = typeEntry{info, c.host.DeclareSchema(info.name, info.fieldNames)}
		c.types[t] = e
		c.names[e.id] = info.fieldNames
	}
	return e
}

func (c *schemaCache) lookup(id uint32) []string {
	if names, ok := c.names[id]; ok {
		return names
	}
	_, names, ok := c.host.SchemaFields(id)
	if !ok {
		names = nil
	}
	c.names[id] = names
	return names
}

// structInfo is what a struct type's row is made of: its schema name (the type's name) and
// its exported fields by `json` name, in declaration order.
type structInfo struct {
	name       string
	fieldNames []string
	index      [][]int
	byName     map[string]int
}

var structInfos sync.Map // reflect.Type -> *structInfo

func infoOf(t reflect.Type) *structInfo {
	if v, ok := structInfos.Load(t); ok {
		return v.(*structInfo)
	}
	info := &structInfo{name: t.Name(), byName: map[string]int{}}
	for _, f := range reflect.VisibleFields(t) {
		if !f.IsExported() || f.Anonymous {
			continue
		}
		name := f.Name
		if tag, ok := f.Tag.Lookup("json"); ok {
			tagName, _, _ := strings.Cut(tag, ",")
			if tagName == "-" {
				continue
			}
			if tagName != "" {
				name = tagName
			}
		}
		info.byName[name] = len(info.fieldNames)
		info.fieldNames = append(info.fieldNames, name)
		info.index = append(info.index, f.Index)
	}
	structInfos.Store(t, info)
	return info
}

// encodeValue writes a record value: a named struct (or pointer to one) as a row, Raw as it
// is, anything else as JSON.
func encodeValue(v any, schemas *schemaCache) ([]byte, error) { return appendValue(nil, v, schemas) }

// appendValue is encodeValue at the end of dst.
func appendValue(dst []byte, v any, schemas *schemaCache) ([]byte, error) {
	if out, ok := appendPlain(dst, v); ok {
		return out, nil
	}
	rv := reflect.ValueOf(v)
	for rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv = rv.Elem()
	}
	// A named struct is a row of its type's schema; an anonymous one has no name to give.
	if rv.Kind() == reflect.Struct && rv.Type().Name() != "" {
		return appendStruct(dst, rv, schemas)
	}
	b, err := encodeJSON(v)
	return append(dst, b...), err
}

func appendStruct(dst []byte, rv reflect.Value, schemas *schemaCache) ([]byte, error) {
	e := schemas.entry(rv.Type())
	var scratch [16]rowField
	fields := scratch[:0]
	for i, index := range e.info.index {
		f, err := rowFieldOf(rv.FieldByIndex(index), schemas)
		if err != nil {
			return nil, fmt.Errorf("%s.%s: %w", e.info.name, e.info.fieldNames[i], err)
		}
		fields = append(fields, f)
	}
	return appendRow(dst, e.id, fields)
}

// rowFieldOf picks a field's kind from its Go type: bool, integers (u64, or i64 when
// negative), floats, strings, []byte and structs (nested rows) have their own kinds; nil
// pointers, interfaces, slices and maps are null; anything else is JSON text.
func rowFieldOf(v reflect.Value, schemas *schemaCache) (rowField, error) {
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return rowField{}, nil
		}
		v = v.Elem()
	}
	switch v.Kind() {
	case reflect.Bool:
		if v.Bool() {
			return rowField{kind: kindBool, slot: 1}, nil
		}
		return rowField{kind: kindBool}, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		// By sign, as eddy-wire writes any integer: the same value gives the same bytes in
		// every language, and every reader takes either kind for any integer field.
		if v.Int() >= 0 {
			return rowField{kind: kindU64, slot: uint64(v.Int())}, nil
		}
		return rowField{kind: kindI64, slot: uint64(v.Int())}, nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return rowField{kind: kindU64, slot: v.Uint()}, nil
	case reflect.Float32, reflect.Float64:
		return rowField{kind: kindF64, slot: math.Float64bits(v.Float())}, nil
	case reflect.String:
		if _, isNumber := v.Interface().(json.Number); isNumber {
			break
		}
		return rowField{kind: kindStr, part: []byte(v.String())}, nil
	case reflect.Slice:
		if v.IsNil() {
			return rowField{}, nil
		}
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return rowField{kind: kindBytes, part: v.Bytes()}, nil
		}
	case reflect.Map:
		if v.IsNil() {
			return rowField{}, nil
		}
	case reflect.Struct:
		part, err := appendStruct(nil, v, schemas)
		return rowField{kind: kindRow, part: part}, err
	}
	part, err := encodeJSON(v.Interface())
	return rowField{kind: kindJSON, part: part}, err
}

// decodeValue reads a record value (a row or JSON) into target, a non-nil pointer.
func decodeValue(b []byte, schemas schemaNames, target any) error {
	if !IsRow(b) {
		return decodeJSON(b, target)
	}
	rv := reflect.ValueOf(target)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("decode into a non-nil pointer, not %T", target)
	}
	return decodeRowInto(b, schemas, rv.Elem())
}

func decodeRowInto(b []byte, names schemaNames, dst reflect.Value) error {
	if dst.Kind() == reflect.Pointer {
		if dst.IsNil() {
			dst.Set(reflect.New(dst.Type().Elem()))
		}
		return decodeRowInto(b, names, dst.Elem())
	}
	if dst.Kind() != reflect.Struct {
		natural, err := readRow(b, names)
		if err != nil {
			return err
		}
		return assignNatural(dst, natural)
	}
	h, err := parseRow(b)
	if err != nil {
		return err
	}
	info := infoOf(dst.Type())
	var fieldNames []string
	if names != nil && h.schema != 0 {
		fieldNames = names(h.schema)
	}
	for i := 0; i < h.n; i++ {
		at := i
		if fieldNames != nil {
			if i >= len(fieldNames) {
				break
			}
			var ok bool
			if at, ok = info.byName[fieldNames[i]]; !ok {
				continue // a field this struct does not have
			}
		} else if i >= len(info.index) {
			break // no names: fields by position
		}
		f := dst.FieldByIndex(info.index[at])
		if err := setField(f, h, i, names); err != nil {
			return fmt.Errorf("field %s: %w", info.fieldNames[at], err)
		}
	}
	return nil
}

// setField stores field i of a row into f, converting between number kinds where the value
// fits and refusing where it does not.
func setField(f reflect.Value, h rowHeader, i int, names schemaNames) error {
	if h.null(i) {
		f.SetZero()
		return nil
	}
	kind := h.kind(i)
	switch f.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if kind == kindI64 || kind == kindU64 {
			n := int64(h.slot(i))
			if (kind == kindU64 && h.slot(i) > 1<<63-1) || f.OverflowInt(n) {
				return fmt.Errorf("%d does not fit in %s", h.slot(i), f.Type())
			}
			f.SetInt(n)
			return nil
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if kind == kindI64 || kind == kindU64 {
			n := h.slot(i)
			if (kind == kindI64 && int64(n) < 0) || f.OverflowUint(n) {
				return fmt.Errorf("%d does not fit in %s", int64(n), f.Type())
			}
			f.SetUint(n)
			return nil
		}
	case reflect.Float32, reflect.Float64:
		switch kind {
		case kindF64:
			f.SetFloat(math.Float64frombits(h.slot(i)))
			return nil
		case kindI64:
			f.SetFloat(float64(int64(h.slot(i))))
			return nil
		case kindU64:
			f.SetFloat(float64(h.slot(i)))
			return nil
		}
	case reflect.Bool:
		if kind == kindBool {
			f.SetBool(h.b[h.slots+8*i] != 0)
			return nil
		}
	case reflect.String:
		if kind == kindStr {
			p, err := h.part(i)
			f.SetString(string(p))
			return err
		}
	case reflect.Struct, reflect.Pointer:
		if kind == kindRow {
			p, err := h.part(i)
			if err != nil {
				return err
			}
			return decodeRowInto(p, names, f)
		}
	}
	if kind == kindJSON {
		p, err := h.part(i)
		if err != nil {
			return err
		}
		return json.Unmarshal(p, f.Addr().Interface())
	}
	natural, err := h.natural(i, names)
	if err != nil {
		return err
	}
	return assignNatural(f, natural)
}

// assignNatural stores a plain value into dst: directly when the types agree, else through
// its JSON text (so a row read into a map or an `any` takes the shape JSON would give it).
func assignNatural(dst reflect.Value, natural any) error {
	if natural != nil {
		if v := reflect.ValueOf(natural); v.Type().AssignableTo(dst.Type()) {
			dst.Set(v)
			return nil
		}
	}
	text, err := encodeJSON(natural)
	if err != nil {
		return err
	}
	return json.Unmarshal(text, dst.Addr().Interface())
}
