"""The Python twin of tests/guests/tags: list state `tags`, map state `counts`, value state
`first`, same output."""

import eddy


class Tags(eddy.Operator):
    def open(self, ctx, config):
        self.tags = ctx.list_state("tags")
        self.counts = ctx.map_state("counts")
        # Read from the host one by one, not prefetched: the SDK itself reads the rows the Rust
        # operator wrote (the TypeScript twin reads them prefetched, rendered by the host).
        self.first = ctx.value_state("first", prefetch=False)

    def process(self, record, ctx):
        tag = record.value["tag"]
        self.tags.append(tag)
        count = self.counts.get(tag, 0) + 1
        self.counts.put(tag, count)
        first = self.first.get() or {"tag": tag, "records": 0}
        first["records"] += 1
        self.first.set(first)
        ctx.emit(
            record.key,
            {
                "tags": self.tags.get(),
                "count": count,
                "distinct": len(self.counts.items()),
                "first": first["tag"],
                "records": first["records"],
            },
        )


Operator = eddy.export_operator(Tags)
