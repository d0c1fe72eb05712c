"""Failures an operator reports on purpose. They reach the host as the WIT's
`operator-error` with their kind and message; any other exception is caught too and reported
as `failed` with its type and message (and its traceback in the host's log), never a trap."""


class OperatorError(Exception):
    """Anything else the operator chose to fail with (`error-kind.failed`)."""

    kind = "failed"


class BadConfig(OperatorError):
    """The step's configuration is unusable; retrying will not help."""

    kind = "bad-config"


class BadRecord(OperatorError):
    """A record could not be interpreted (wrong shape, bad encoding)."""

    kind = "bad-record"


KINDS = ("bad-config", "bad-record", "failed")


def describe(error):
    """(kind, message) of any exception, as the host is told."""
    if isinstance(error, OperatorError):
        return error.kind, str(error) or type(error).__name__
    return "failed", f"{type(error).__name__}: {error}"
