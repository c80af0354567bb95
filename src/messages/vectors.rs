//! The vector files both test suites read (`schemas/vectors/*.json`): what
//! the Rust crate and the Python client both implement (keys, Python
//! literals, chunk headers and reassembly, hint outcomes, a partition's
//! fetch, a blank id), held to one set of cases. Test builds only.

/// `schemas/vectors/{name}`, parsed.
pub(crate) fn shared(name: &str) -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("schemas/vectors")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
