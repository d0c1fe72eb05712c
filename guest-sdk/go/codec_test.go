package eddy

// The Go codec against the shared table Rust's eddy-wire and serde_json wrote
// (guest-sdk/testdata/codec-table.json): every row reads as Eddy renders it, structs of the
// natural Go types are written byte for byte as Rust writes its structs, and keys and state
// values are written as serde_json writes them.

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"reflect"
	"strconv"
	"testing"
)

type table struct {
	JSON []string `json:"json"`
	Rows []struct {
		Hex     string          `json:"hex"`
		Meaning json.RawMessage `json:"meaning"`
		Name    string          `json:"name"`
		Natural bool            `json:"natural"`
	} `json:"rows"`
	Schemas map[string][2]json.RawMessage `json:"schemas"`
}

func loadTable(t *testing.T) (table, *memoryHost) {
	t.Helper()
	raw, err := os.ReadFile("../testdata/codec-table.json")
	if err != nil {
		t.Fatal(err)
	}
	var tab table
	if err := json.Unmarshal(raw, &tab); err != nil {
		t.Fatal(err)
	}
	host := &memoryHost{schemas: map[uint32][2][]string{}}
	for id, s := range tab.Schemas {
		var name string
		var fields []string
		if json.Unmarshal(s[0], &name) != nil || json.Unmarshal(s[1], &fields) != nil {
			t.Fatalf("schema %s", id)
		}
		n, _ := strconv.ParseUint(id, 10, 32)
		if got := host.DeclareSchema(name, fields); got != uint32(n) {
			t.Fatalf("schema id of %s: %d, the table says %s", name, got, id)
		}
	}
	return tab, host
}

// rendered is a value as Eddy's sinks render it: bytes as lists of numbers, through JSON,
// numbers compared as numbers.
func rendered(t *testing.T, v any) any {
	t.Helper()
	var plain func(any) any
	plain = func(v any) any {
		switch x := v.(type) {
		case []byte:
			out := make([]any, len(x))
			for i, b := range x {
				out[i] = int(b)
			}
			return out
		case map[string]any:
			out := map[string]any{}
			for k, e := range x {
				out[k] = plain(e)
			}
			return out
		case []any:
			out := make([]any, len(x))
			for i, e := range x {
				out[i] = plain(e)
			}
			return out
		}
		return v
	}
	text, err := encodeJSON(plain(v))
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(text, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestEveryRowReadsAsEddyRendersIt(t *testing.T) {
	tab, host := loadTable(t)
	for _, c := range tab.Rows {
		b, _ := hex.DecodeString(c.Hex)
		var got any
		if err := decodeValue(b, host.names, &got); err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		var want any
		_ = json.Unmarshal(c.Meaning, &want)
		if g := rendered(t, got); !reflect.DeepEqual(g, want) {
			t.Errorf("%s: read %v, the table says %v", c.Name, g, want)
		}
	}
}

type purchase struct {
	UserID      string `json:"user_id"`
	AmountCents int64  `json:"amount_cents"`
}

type alert struct {
	AccountID   uint64 `json:"account_id"`
	AmountCents int64  `json:"amount_cents"`
}

type totals struct {
	Purchases  uint64 `json:"purchases"`
	TotalCents int64  `json:"total_cents"`
}

type inner struct {
	ID    uint64  `json:"id"`
	Label *string `json:"label"`
}

type everything struct {
	Small   int64    `json:"small"`
	Big     uint64   `json:"big"`
	Ratio   float64  `json:"ratio"`
	Flag    bool     `json:"flag"`
	Text    string   `json:"text"`
	Missing *int64   `json:"missing"`
	Raw     []byte   `json:"raw"`
	Inner   inner    `json:"inner"`
	List    []uint64 `json:"list"`
}

func TestStructsAreWrittenAsRustWritesThem(t *testing.T) {
	tab, host := loadTable(t)
	// Go type names are the schema names; the test's types are lower-case, so name them.
	schemaOf := map[string]any{
		"purchase":         purchase{},
		"negative integer": alert{},
		"accumulator":      totals{},
		"every kind 1":     everything{},
		"every kind 2":     everything{},
	}
	names := map[reflect.Type]string{
		reflect.TypeOf(purchase{}): "Purchase", reflect.TypeOf(alert{}): "Alert", reflect.TypeOf(totals{}): "Totals",
		reflect.TypeOf(everything{}): "Everything", reflect.TypeOf(inner{}): "Inner",
	}
	for typ, name := range names {
		infoOf(typ).name = name
	}
	natural := 0
	for _, c := range tab.Rows {
		proto, ok := schemaOf[c.Name]
		if !c.Natural || !ok {
			continue
		}
		natural++
		b, _ := hex.DecodeString(c.Hex)
		target := reflect.New(reflect.TypeOf(proto))
		if err := decodeValue(b, host.names, target.Interface()); err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		out, err := encodeValue(target.Elem().Interface(), newSchemaCache(host))
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		if got := hex.EncodeToString(out); got != c.Hex {
			t.Errorf("%s:\n wrote %s\n table %s", c.Name, got, c.Hex)
		}
	}
	if natural < 4 {
		t.Fatalf("only %d natural rows checked", natural)
	}
}

func TestKeysAndStateAreWrittenAsSerdeJSONWritesThem(t *testing.T) {
	tab, _ := loadTable(t)
	for _, text := range tab.JSON {
		var v any
		if err := decodeJSON([]byte(text), &v); err != nil {
			t.Fatalf("%s: %v", text, err)
		}
		if _, isObject := v.(map[string]any); isObject {
			continue // Go maps have no order: objects are written from structs, below
		}
		got, err := encodeJSON(v)
		if err != nil || string(got) != text {
			t.Errorf("wrote %s, serde_json writes %s (%v)", got, text, err)
		}
	}
	type last struct {
		User string   `json:"user"`
		Last int64    `json:"last"`
		Tags []string `json:"tags"`
	}
	got, _ := encodeJSON(last{"bob", -3, []string{"a"}})
	if want := `{"user":"bob","last":-3,"tags":["a"]}`; string(got) != want {
		t.Errorf("wrote %s, want %s", got, want)
	}
	for v, want := range map[any]string{int64(-9223372036854775808): "-9223372036854775808", uint64(18446744073709551615): "18446744073709551615", "Été <&>": `"Été <&>"`} {
		if got, _ := encodeJSON(v); string(got) != want {
			t.Errorf("wrote %s, want %s", got, want)
		}
	}
}

func TestWhatDoesNotFitIsRefusedByName(t *testing.T) {
	host := &memoryHost{schemas: map[uint32][2][]string{}}
	negative, _ := encodeValue(alert{7, -1}, newSchemaCache(host))
	var wrong struct {
		AccountID   uint64 `json:"account_id"`
		AmountCents uint64 `json:"amount_cents"`
	}
	err := decodeValue(negative, host.names, &wrong)
	if err == nil || err.Error() != "field amount_cents: -1 does not fit in uint64" {
		t.Errorf("got %v", err)
	}
	if _, err := parseRow([]byte{0xB7, 2, 0, 0, 0, 0, 0, 0}); err == nil || err.Error() != "row layout version 2; this reader reads version 1" {
		t.Errorf("got %v", err)
	}
	if _, err := parseRow([]byte{0xB7, 1, 3, 0}); err == nil {
		t.Error("a short row read")
	}
	if _, err := encodeJSON(func() {}); err == nil {
		t.Error("a func written as JSON")
	}
}

func reflectTypeOf[T any]() reflect.Type { return reflect.TypeOf((*T)(nil)).Elem() }

func TestOnlyNamedStructsAreRows(t *testing.T) {
	host := &memoryHost{schemas: map[uint32][2][]string{}}
	anonymous, err := encodeValue(struct {
		B int    `json:"b"`
		A string `json:"a"`
	}{1, "x"}, newSchemaCache(host))
	if err != nil || string(anonymous) != `{"b":1,"a":"x"}` {
		t.Fatalf("an anonymous struct is JSON in field order: %s %v", anonymous, err)
	}
	named, _ := encodeValue(&totals{1, -2}, newSchemaCache(host))
	if !IsRow(named) {
		t.Fatalf("a pointer to a named struct is a row: %q", named)
	}
}
