// A hostile operator in JavaScript, the sandbox probes of tests/guests/hostile for this
// language. `config.mode` picks the misbehaviour, which starts at the first record:
//
// - `probe`: tries the environment, files, clocks, randomness and network, and emits what it saw;
// - `allocate`: allocates without bound; `loop`: spins forever; `recurse`: recurses without bound;
// - `throw`: throws an error the SDK does not know (not an OperatorError).

import { BadConfig, Operator, exportOperator } from "eddy";

function attempt(action) {
  try {
    return action();
  } catch (e) {
    return `refused: ${e && e.message ? e.message : String(e)}`;
  }
}

function probe() {
  return {
    env: attempt(() => (typeof process === "undefined" ? [] : Object.keys(process.env))),
    fetch: typeof globalThis.fetch,
    require: typeof globalThis.require,
    clock_ms: attempt(() => Date.now()),
    random: attempt(() => [Math.random(), Math.random()]),
  };
}

function recurse(depth) {
  return recurse(depth + 1) + 1;
}

class Hostile extends Operator {
  open(_ctx, config) {
    this.mode = config.mode;
  }

  process(_record, ctx) {
    if (this.mode === "probe") {
      ctx.emitValue(probe());
    } else if (this.mode === "allocate") {
      const hoard = [];
      for (;;) hoard.push(new Uint8Array(1 << 20).fill(1));
    } else if (this.mode === "loop") {
      for (;;);
    } else if (this.mode === "recurse") {
      recurse(0);
    } else if (this.mode === "throw") {
      throw new RangeError("no such thing");
    } else {
      throw new BadConfig(`no mode ${this.mode}`);
    }
  }
}

export const operator = exportOperator(Hostile);
