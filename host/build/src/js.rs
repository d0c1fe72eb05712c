//! JavaScript and TypeScript projects: `app.js` or `app.ts` and whatever modules beside it.
//! esbuild bundles the project with the Eddy SDK (embedded here, so an installed `eddy` builds
//! anywhere) into one module and strips TypeScript's types (which tsc checks first), then a
//! JavaScript engine is made into a component around it: QuickJS through jco by default, or
//! SpiderMonkey through componentize-js. `docs/architecture.md` says why QuickJS.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{BuildError, BuildOptions, JsEngine, Lang, io, project_name, run_tool};

/// The SDK module by module, as the bundle imports it.
pub(crate) const SDK: &[(&str, &str)] = &[
    ("aggregate.js", include_str!("../../../guest-sdk/js/eddy/aggregate.js")),
    ("bytes.js", include_str!("../../../guest-sdk/js/eddy/bytes.js")),
    ("codec.js", include_str!("../../../guest-sdk/js/eddy/codec.js")),
    ("errors.js", include_str!("../../../guest-sdk/js/eddy/errors.js")),
    ("host.js", include_str!("../../../guest-sdk/js/eddy/host.js")),
    ("index.d.ts", include_str!("../../../guest-sdk/js/eddy/index.d.ts")),
    ("index.js", include_str!("../../../guest-sdk/js/eddy/index.js")),
    ("json.js", include_str!("../../../guest-sdk/js/eddy/json.js")),
    ("log.js", include_str!("../../../guest-sdk/js/eddy/log.js")),
    ("operator.js", include_str!("../../../guest-sdk/js/eddy/operator.js")),
    ("output.js", include_str!("../../../guest-sdk/js/eddy/output.js")),
    ("records.js", include_str!("../../../guest-sdk/js/eddy/records.js")),
    ("rows.js", include_str!("../../../guest-sdk/js/eddy/rows.js")),
    ("state.js", include_str!("../../../guest-sdk/js/eddy/state.js")),
    ("testing.d.ts", include_str!("../../../guest-sdk/js/eddy/testing.d.ts")),
    ("testing.js", include_str!("../../../guest-sdk/js/eddy/testing.js")),
    ("utf8.js", include_str!("../../../guest-sdk/js/eddy/utf8.js")),
    ("wit-aggregate.js", include_str!("../../../guest-sdk/js/eddy/wit-aggregate.js")),
    ("wit-common.js", include_str!("../../../guest-sdk/js/eddy/wit-common.js")),
    ("wit-operator.js", include_str!("../../../guest-sdk/js/eddy/wit-operator.js")),
];

const INSTALL: &str = "run `deploy/setup.sh languages`, or set EDDY_JS_TOOLCHAIN to a directory where \
                       deploy/js-toolchain/package.json was installed with `npm ci`";

/// The directory holding the toolchain's `node_modules`: `$EDDY_JS_TOOLCHAIN`, else where
/// `deploy/setup.sh languages` puts it.
pub fn toolchain() -> PathBuf {
    if let Some(dir) = std::env::var_os("EDDY_JS_TOOLCHAIN").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let data = std::env::var_os("XDG_DATA_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    data.join("eddy").join("js-toolchain")
}

fn tool(name: &'static str) -> Result<PathBuf, BuildError> {
    let path = toolchain().join("node_modules").join(".bin").join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(BuildError::MissingTool { tool: name, why: format!("{} is missing", path.display()), install: INSTALL })
    }
}

/// The world `app` targets: an aggregate's if it exports one.
fn world(app: &Path) -> Result<&'static str, BuildError> {
    crate::world_of(
        app,
        "exportOperator(",
        "exportAggregate(",
        "end it with `export const operator = exportOperator(YourOperator);` or `export const aggregate = exportAggregate(YourAggregate);`",
    )
}

fn string(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// A tsconfig for checking the project against the SDK's types, nothing emitted.
/// A TypeScript project's compiler settings: strict, nothing emitted (esbuild strips the
/// types), `eddy` resolved to the SDK's declarations and the WIT's interfaces to the types
/// `jco types` generated from it, so the export can be checked against the WIT itself.
fn tsconfig(files: &[&Path], sdk: &Path, wit_types: &Path) -> String {
    serde_json::json!({
        "compilerOptions": {
            "strict": true,
            "noEmit": true,
            "allowImportingTsExtensions": true,
            "target": "es2022",
            "module": "esnext",
            "moduleResolution": "bundler",
            "lib": ["es2022"],
            "types": [],
            "paths": {
                "eddy": [string(&sdk.join("index.d.ts"))],
                "eddy/testing": [string(&sdk.join("testing.d.ts"))],
                "eddy:dataflow/*@0.4.0": [string(&wit_types.join("interfaces").join("eddy-dataflow-*.d.ts"))],
            },
        },
        "files": files.iter().map(|f| string(f)).collect::<Vec<_>>(),
    })
    .to_string()
}

/// A module that holds the project's export to the type generated from the WIT for it: a
/// missing or misnamed export, or an SDK that drifted from the WIT, fails the build here.
fn export_check(app: &Path, world: &str) -> String {
    let (interface, name) =
        if world == "window-aggregate" { ("aggregate", "aggregate") } else { ("operator", "operator") };
    format!(
        "import type * as Wit from \"eddy:dataflow/{interface}@0.4.0\";\nimport {{ {name} }} from {};\nexport const exported: typeof Wit = {name};\n",
        serde_json::Value::String(string(app))
    )
}

pub(crate) fn build(dir: &Path, lang: Lang, options: &BuildOptions) -> Result<PathBuf, BuildError> {
    let file = if lang == Lang::TypeScript { "app.ts" } else { "app.js" };
    let app = dir.join(file);
    if !app.is_file() {
        return Err(BuildError::Project { path: dir.to_path_buf(), what: format!("a {lang} operator needs {file}") });
    }
    let app = app.canonicalize().map_err(io(&app))?;
    let world = world(&app)?;
    let out = options.out.clone().unwrap_or_else(|| dir.join("build").join(format!("{}.wasm", project_name(dir))));
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    let parent = parent.canonicalize().map_err(io(parent))?;
    let out = parent.join(out.file_name().unwrap_or_default());
    let stem = out.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let staging = parent.join(format!(".{stem}.eddy-sdk"));
    let (wit, sdk) = crate::stage_sdk(&staging, SDK)?;
    let sdk = sdk.join("eddy");

    if lang == Lang::TypeScript {
        let wit_types = staging.join("wit-types");
        let mut types = Command::new(tool("jco")?);
        types.arg("types").arg(&wit).args(["--world-name", world, "-q", "-o"]).arg(&wit_types);
        types.stdout(std::process::Stdio::null());
        run_tool(types, "jco types", INSTALL, dir)?;
        let check = staging.join("export-check.ts");
        std::fs::write(&check, export_check(&app, world)).map_err(io(&check))?;
        let config = staging.join("tsconfig.json");
        std::fs::write(&config, tsconfig(&[&app, &check], &sdk, &wit_types)).map_err(io(&config))?;
        let mut tsc = Command::new(tool("tsc")?);
        tsc.arg("-p").arg(&config);
        run_tool(tsc, "tsc", INSTALL, dir)?;
    }

    // The world's bindings come first, so the host is installed before the operator's module runs.
    let binding = if world == "window-aggregate" { "wit-aggregate.js" } else { "wit-operator.js" };
    let entry = staging.join("entry.js");
    let entry_text = format!(
        "import {};\nexport * from {};\n",
        serde_json::Value::String(string(&sdk.join(binding))),
        serde_json::Value::String(string(&app))
    );
    std::fs::write(&entry, entry_text).map_err(io(&entry))?;
    let bundle = staging.join("bundle.js");
    let mut esbuild = Command::new(tool("esbuild")?);
    esbuild
        .arg(&entry)
        .args(["--bundle", "--format=esm", "--platform=neutral", "--log-level=warning", "--external:eddy:dataflow/*"])
        .arg(format!("--alias:eddy={}", sdk.display()))
        .arg(format!("--outfile={}", bundle.display()));
    run_tool(esbuild, "esbuild", INSTALL, dir)?;

    let mut make = match options.js_engine {
        JsEngine::QuickJs => {
            let mut jco = Command::new(tool("jco")?);
            jco.arg("componentize").arg(&bundle).arg("--wit").arg(&wit).args(["--world-name", world]);
            jco.args(["--backend", "qjs", "--backend-qjs-stub-wasi", "--backend-qjs-disable-async", "-o"]).arg(&out);
            (jco, "jco")
        }
        JsEngine::SpiderMonkey => {
            let mut c = Command::new(tool("componentize-js")?);
            c.arg(&bundle).arg("--wit").arg(&wit).args(["--world-name", world]);
            c.args(["-d", "stdio", "random", "clocks", "http", "fetch-event", "-o"]).arg(&out);
            (c, "componentize-js")
        }
    };
    // jco prints a line on success; the CLI prints the component's path itself.
    make.0.stdout(std::process::Stdio::null());
    run_tool(make.0, make.1, INSTALL, dir)?;
    Ok(out)
}
