//! A placed spec travels to the workers that run its parts: every shipped example, written
//! back out (YAML and JSON) and read again, is the same spec.

use std::path::Path;

use eddy_plan::PipelineSpec;

fn examples() -> Vec<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut specs = Vec::new();
    let mut dirs = vec![root];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("examples dir").filter_map(Result::ok) {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                specs.push(path);
            }
        }
    }
    specs.sort();
    specs
}

#[test]
fn every_example_spec_written_out_and_read_back_is_the_same_spec() {
    let specs = examples();
    assert!(specs.len() >= 10, "found only {specs:?}");
    for path in specs {
        let spec = PipelineSpec::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let yaml = serde_norway::to_string(&spec).expect("serializes");
        let again = PipelineSpec::from_yaml(&yaml).unwrap_or_else(|e| panic!("{}: {e}\n{yaml}", path.display()));
        assert_eq!(again, spec, "{} through YAML", path.display());
        let json = serde_json::to_string(&spec).expect("serializes");
        let again = PipelineSpec::from_yaml(&json).unwrap_or_else(|e| panic!("{}: {e}\n{json}", path.display()));
        assert_eq!(again, spec, "{} through JSON", path.display());
    }
}
