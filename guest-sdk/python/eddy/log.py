"""Logging to the host's log, which attaches job, task, subtask and operator. Lines are cut
to 4 KiB and rate-limited by the host (dropped lines are counted), never a failure."""

_sink = None


def _bind(host):
    global _sink
    _sink = host


def _write(level, message):
    if _sink is not None:
        _sink.log(level, str(message))


def trace(message):
    _write(0, message)


def debug(message):
    _write(1, message)


def info(message):
    _write(2, message)


def warn(message):
    _write(3, message)


def error(message):
    _write(4, message)
