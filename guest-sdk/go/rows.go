package eddy

// Eddy rows: the binary records of wit/dataflow.wit (the Rust crate eddy-wire, module `row`,
// is the definition; docs/architecture.md says why), little-endian fixed-width fields:
//
//	u8 0xB7 | u8 version 1 | u16 field count n | u32 schema id
//	null bits: ceil(n / 64) u64 words
//	kinds: n bytes (1 bool, 2 i64, 3 u64, 4 f64, 5 str, 6 bytes, 7 row, 8 JSON), padded to 8
//	slots: n x 8 bytes (numbers in place; variable kinds as u32 offset | u32 length)
//	variable region

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
)

const (
	rowMagic   = 0xB7
	rowVersion = 1
	maxFields  = 0xFFFF
)

// Field kinds of a row.
const (
	kindBool  = 1
	kindI64   = 2
	kindU64   = 3
	kindF64   = 4
	kindStr   = 5
	kindBytes = 6
	kindRow   = 7
	kindJSON  = 8
)

var le = binary.LittleEndian

// IsRow tells a row from JSON by its first byte.
func IsRow(b []byte) bool { return len(b) > 0 && b[0] == rowMagic }

// SchemaID is the id Eddy gives schema (name, fields): FNV-1a (32 bits) over the UTF-8 bytes
// `name 0xFF field 0xFF ...`, 1 where that is 0 (`declare-schema` in the WIT).
func SchemaID(name string, fields []string) uint32 {
	h := uint32(0x811c9dc5)
	mix := func(s string) {
		for i := 0; i < len(s); i++ {
			h = (h ^ uint32(s[i])) * 0x01000193
		}
		h = (h ^ 0xFF) * 0x01000193
	}
	mix(name)
	for _, f := range fields {
		mix(f)
	}
	if h == 0 {
		return 1
	}
	return h
}

func rowLayout(n int) (kinds, slots, fixed int) {
	kinds = 8 + 8*((n+63)/64)
	slots = kinds + (n+7)/8*8
	return kinds, slots, slots + 8*n
}

// rowField is one field to write: its kind and either its 8-byte slot or its variable bytes.
type rowField struct {
	kind byte // 0: null
	slot uint64
	part []byte
}

// appendRow lays out fields as a row of schema id at the end of dst.
func appendRow(dst []byte, schema uint32, fields []rowField) ([]byte, error) {
	n := len(fields)
	if n > maxFields {
		return nil, fmt.Errorf("a row holds at most %d fields, not %d", maxFields, n)
	}
	kindsAt, slotsAt, fixed := rowLayout(n)
	start := len(dst)
	dst = append(dst, make([]byte, fixed)...)
	out := dst[start:]
	out[0], out[1] = rowMagic, rowVersion
	le.PutUint16(out[2:], uint16(n))
	le.PutUint32(out[4:], schema)
	for i, f := range fields {
		if f.kind == 0 {
			out[8+8*(i/64)+(i%64)/8] |= 1 << (i % 8)
			continue
		}
		out[kindsAt+i] = f.kind
		at := slotsAt + 8*i
		switch f.kind {
		case kindStr, kindBytes, kindRow, kindJSON:
			le.PutUint32(out[at:], uint32(len(dst)-start))
			le.PutUint32(out[at+4:], uint32(len(f.part)))
			dst = append(dst, f.part...)
			out = dst[start:]
		default:
			le.PutUint64(out[at:], f.slot)
		}
	}
	return dst, nil
}

// rowHeader is a checked row: its field count, schema and where its tables start.
type rowHeader struct {
	b            []byte
	n            int
	schema       uint32
	kinds, slots int
}

func parseRow(b []byte) (rowHeader, error) {
	if len(b) < 8 {
		return rowHeader{}, fmt.Errorf("not a row (shorter than a row header)")
	}
	if b[0] != rowMagic {
		return rowHeader{}, fmt.Errorf("not a row (first byte is not 0xB7)")
	}
	if b[1] != rowVersion {
		return rowHeader{}, fmt.Errorf("row layout version %d; this reader reads version %d", b[1], rowVersion)
	}
	n := int(le.Uint16(b[2:]))
	kinds, slots, end := rowLayout(n)
	if len(b) < end {
		return rowHeader{}, fmt.Errorf("row shorter than its header and slots")
	}
	return rowHeader{b, n, le.Uint32(b[4:]), kinds, slots}, nil
}

func (h rowHeader) null(i int) bool { return h.b[8+8*(i/64)+(i%64)/8]>>(i%8)&1 == 1 }

func (h rowHeader) kind(i int) byte { return h.b[h.kinds+i] }

func (h rowHeader) slot(i int) uint64 { return le.Uint64(h.b[h.slots+8*i:]) }

// part is the variable bytes of field i, checked to lie inside the row.
func (h rowHeader) part(i int) ([]byte, error) {
	at := h.slots + 8*i
	off, n := uint64(le.Uint32(h.b[at:])), uint64(le.Uint32(h.b[at+4:]))
	if off+n > uint64(len(h.b)) {
		return nil, fmt.Errorf("field %d points outside the row", i)
	}
	return h.b[off : off+n], nil
}

// natural is field i as a plain Go value: nil, bool, int64, uint64, float64, string, []byte,
// a nested row (map by field name, or []any when its schema is unknown) or what its JSON
// holds (json.Number for numbers, so no digit is lost).
func (h rowHeader) natural(i int, names schemaNames) (any, error) {
	if h.null(i) {
		return nil, nil
	}
	switch h.kind(i) {
	case kindBool:
		return h.b[h.slots+8*i] != 0, nil
	case kindI64:
		return int64(h.slot(i)), nil
	case kindU64:
		return h.slot(i), nil
	case kindF64:
		return math.Float64frombits(h.slot(i)), nil
	case kindStr, kindBytes, kindRow, kindJSON:
		p, err := h.part(i)
		if err != nil {
			return nil, err
		}
		switch h.kind(i) {
		case kindStr:
			return string(p), nil
		case kindBytes:
			return append([]byte(nil), p...), nil
		case kindRow:
			return readRow(p, names)
		default:
			return parseJSON(p)
		}
	default:
		return nil, fmt.Errorf("field %d has an unknown kind byte %d", i, h.kind(i))
	}
}

// schemaNames gives the field names of a schema id, or nil when it is unknown.
type schemaNames func(id uint32) []string

// readRow reads a row as a map by field name or, when its schema is unknown, a []any.
func readRow(b []byte, names schemaNames) (any, error) {
	h, err := parseRow(b)
	if err != nil {
		return nil, err
	}
	var fields []string
	if names != nil && h.schema != 0 {
		fields = names(h.schema)
	}
	if fields != nil && len(fields) == h.n {
		out := make(map[string]any, h.n)
		for i, name := range fields {
			if out[name], err = h.natural(i, names); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	out := make([]any, h.n)
	for i := range out {
		if out[i], err = h.natural(i, names); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// parseJSON decodes JSON text keeping numbers exact (json.Number).
func parseJSON(b []byte) (any, error) {
	var v any
	d := json.NewDecoder(bytesReader(b))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, fmt.Errorf("JSON text goes on after its value")
	}
	return v, nil
}
