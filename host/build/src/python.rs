//! Python projects: `app.py` and whatever modules beside it, built by componentize-py together
//! with the Eddy SDK, which is embedded here so that an installed `eddy` builds anywhere.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{BuildError, BuildOptions, io, project_name, run_tool};

/// The SDK package `eddy`, file by file.
pub(crate) const SDK: &[(&str, &str)] = &[
    ("__init__.py", include_str!("../../../guest-sdk/python/eddy/__init__.py")),
    ("_wit.py", include_str!("../../../guest-sdk/python/eddy/_wit.py")),
    ("aggregate.py", include_str!("../../../guest-sdk/python/eddy/aggregate.py")),
    ("codec.py", include_str!("../../../guest-sdk/python/eddy/codec.py")),
    ("errors.py", include_str!("../../../guest-sdk/python/eddy/errors.py")),
    ("log.py", include_str!("../../../guest-sdk/python/eddy/log.py")),
    ("operator.py", include_str!("../../../guest-sdk/python/eddy/operator.py")),
    ("output.py", include_str!("../../../guest-sdk/python/eddy/output.py")),
    ("records.py", include_str!("../../../guest-sdk/python/eddy/records.py")),
    ("rows.py", include_str!("../../../guest-sdk/python/eddy/rows.py")),
    ("state.py", include_str!("../../../guest-sdk/python/eddy/state.py")),
    ("testing.py", include_str!("../../../guest-sdk/python/eddy/testing.py")),
];

const INSTALL: &str = "run deploy/setup.sh, or `pip install componentize-py==0.25.1`";

/// The world `app` targets: an aggregate's if it exports one.
fn world(app: &Path) -> Result<&'static str, BuildError> {
    crate::world_of(
        app,
        "export_operator(",
        "export_aggregate(",
        "end it with `Operator = eddy.export_operator(YourOperator)` or `Aggregate = eddy.export_aggregate(YourAggregate)`",
    )
}

pub(crate) fn build(dir: &Path, options: &BuildOptions) -> Result<PathBuf, BuildError> {
    let app = dir.join("app.py");
    if !app.is_file() {
        return Err(BuildError::Project { path: dir.to_path_buf(), what: "a Python operator needs app.py".into() });
    }
    let world = world(&app)?;
    let out = options.out.clone().unwrap_or_else(|| dir.join("build").join(format!("{}.wasm", project_name(dir))));
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    let stem = out.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let (wit, sdk) = crate::stage_sdk(&parent.join(format!(".{stem}.eddy-sdk")), SDK)?;
    let mut cmd = Command::new("componentize-py");
    cmd.arg("-d").arg(&wit).args(["-w", world, "componentize", "-p"]).arg(dir).arg("-p").arg(&sdk);
    cmd.args(["app", "-o"]).arg(&out);
    run_tool(cmd, "componentize-py", INSTALL, dir)?;
    Ok(out)
}
