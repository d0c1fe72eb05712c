"""Word count, step 1, in Python: the twin of examples/wordcount/split. Each input value is a
line of text; emits one record per word, keyed by the lower-cased word, with value 1."""

import re

import eddy

# Rust's `char::is_alphanumeric` is Unicode's Alphabetic or Numeric; `\w` minus `_` is close
# to it, and the examples' text holds nothing where the two differ.
WORD = re.compile(r"[^\W_]+")


class Split(eddy.Operator):
    def process(self, record, ctx):
        for word in WORD.findall(record.value):
            ctx.emit(word.lower(), 1)


Operator = eddy.export_operator(Split)
