// Word count, step 1, in Go: the twin of examples/wordcount/split. Each input value is a line
// of text; emits one record per word, keyed by the lower-cased word, with value 1.
package main

import (
	"strings"
	"unicode"

	"eddy"
)

type Split struct{}

func (Split) Open(*eddy.OpenContext) error { return nil }

// isWordRune is Rust's char::is_alphanumeric: Unicode's Alphabetic or Numeric.
func isWordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.Is(unicode.Other_Alphabetic, r)
}

func (Split) Process(r *eddy.Record, ctx *eddy.Context) error {
	var line string
	if err := r.Value(&line); err != nil {
		return err
	}
	for _, word := range strings.FieldsFunc(line, func(c rune) bool { return !isWordRune(c) }) {
		ctx.Emit(strings.ToLower(word), 1)
	}
	return nil
}

func init() { eddy.ExportOperator(func() eddy.Operator { return Split{} }) }
