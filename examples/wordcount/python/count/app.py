"""Word count, step 2, in Python: the twin of examples/wordcount/count. Keyed by word; keeps a
running count per word in value state and emits (word, count) after every record."""

import eddy


class Count(eddy.Operator):
    def open(self, ctx, config):
        self.count = ctx.value_state("count")

    def process(self, record, ctx):
        count = self.count.get(0) + record.value
        self.count.set(count)
        ctx.emit(record.key, count)


Operator = eddy.export_operator(Count)
