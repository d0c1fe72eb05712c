// Where the runners get their host from: the component's imports (wit-operator.js or
// wit-aggregate.js) or the in-memory host of `eddy/testing`. Kept apart so the SDK itself
// imports no WIT.

let provider = null;

export function installHost(p) {
  provider = p;
}

export function hostFor(world) {
  if (!provider || !provider[world]) {
    throw new Error("no Eddy host: build this with `eddy build`, or run it through eddy/testing");
  }
  return provider[world]();
}

/** A WIT s64 as a Number, whatever the engine hands over. */
export function timestamp(s64) {
  return provider && provider.timestamp ? provider.timestamp(s64) : Number(s64);
}
