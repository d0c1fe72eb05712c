// Failures an operator reports on purpose. They reach the host as the WIT's `operator-error`
// with their kind and message; anything else thrown is caught too and reported as `failed`
// with its name and message (and its stack in the host's log), never a trap.

/** Anything the operator chose to fail with (`error-kind.failed`). */
export class OperatorError extends Error {
  get kind() {
    return "failed";
  }
}

/** The step's configuration is unusable; retrying will not help. */
export class BadConfig extends OperatorError {
  get kind() {
    return "bad-config";
  }
}

/** A record could not be interpreted (wrong shape, bad encoding). */
export class BadRecord extends OperatorError {
  get kind() {
    return "bad-record";
  }
}

/** [kind, message] of anything thrown, as the host is told. */
export function describe(error) {
  if (error instanceof OperatorError) return [error.kind, error.message || error.constructor.name];
  if (error instanceof Error) return ["failed", `${error.name}: ${error.message}`];
  return ["failed", `thrown: ${String(error)}`];
}
