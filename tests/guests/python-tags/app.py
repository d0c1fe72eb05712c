"""The Python twin of tests/guests/tags: list state `tags`, map state `counts`, same output."""

import eddy


class Tags(eddy.Operator):
    def open(self, ctx, config):
        self.tags = ctx.list_state("tags")
        self.counts = ctx.map_state("counts")

    def process(self, record, ctx):
        tag = record.value["tag"]
        self.tags.append(tag)
        count = self.counts.get(tag, 0) + 1
        self.counts.put(tag, count)
        ctx.emit(record.key, {"tags": self.tags.get(), "count": count, "distinct": len(self.counts.items())})


Operator = eddy.export_operator(Tags)
