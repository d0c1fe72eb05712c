// The glue (wit-*.js, the only modules that touch the WIT) and the export objects the SDK
// makes are type-checked against TypeScript types generated from wit/dataflow.wit by
// `jco types`, for both worlds: a change to the WIT that the SDK does not follow fails here,
// not in a component at run time. Needs the JavaScript toolchain (deploy/setup.sh languages).

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { homedir, tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const sdk = join(here, "..", "eddy");
const wit = join(here, "..", "..", "..", "wit");
const toolchain = process.env.EDDY_JS_TOOLCHAIN || join(homedir(), ".local", "share", "eddy", "js-toolchain");
const bin = (name) => join(toolchain, "node_modules", ".bin", name);

function run(tool, args) {
  try {
    execFileSync(bin(tool), args, { encoding: "utf8", stdio: "pipe" });
  } catch (e) {
    assert.fail(`${tool} ${args.join(" ")} failed:\n${e.stdout ?? ""}${e.stderr ?? ""}`);
  }
}

const worlds = [
  { world: "keyed-operator", glue: "wit-operator.js", check: 'import type * as Wit from "eddy:dataflow/operator@0.4.0";\nimport { exportOperator, Operator } from "SDK/index.js";\nexport const exported: typeof Wit = exportOperator(class extends Operator {});\n' },
  { world: "window-aggregate", glue: "wit-aggregate.js", check: 'import type * as Wit from "eddy:dataflow/aggregate@0.4.0";\nimport { exportAggregate, Aggregate } from "SDK/index.js";\nexport const exported: typeof Wit = exportAggregate(class extends Aggregate {});\n' },
];

for (const { world, glue, check } of worlds) {
  test(`the ${world} glue and export match the WIT's generated types`, () => {
    assert.ok(existsSync(bin("jco")), `no JavaScript toolchain at ${toolchain}: run deploy/setup.sh languages`);
    const dir = mkdtempSync(join(tmpdir(), "eddy-wit-types-"));
    try {
      const types = join(dir, "types");
      run("jco", ["types", wit, "--world-name", world, "-o", types, "-q"]);
      const checkFile = join(dir, "check.ts");
      writeFileSync(checkFile, check.replace("SDK", sdk));
      const config = join(dir, "tsconfig.json");
      writeFileSync(
        config,
        JSON.stringify({
          compilerOptions: {
            strict: true,
            // The glue's own parameters are the SDK's host interface, untyped JavaScript;
            // what is checked is every use of a WIT function and type.
            noImplicitAny: false,
            noEmit: true,
            allowJs: true,
            checkJs: false,
            target: "es2022",
            module: "esnext",
            moduleResolution: "bundler",
            lib: ["es2022"],
            types: [],
            paths: { "eddy:dataflow/*@0.4.0": [join(types, "interfaces", "eddy-dataflow-*.d.ts")] },
          },
          files: [join(sdk, glue), checkFile],
        }),
      );
      run("tsc", ["-p", config]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
}
