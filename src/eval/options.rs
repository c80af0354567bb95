//! What an evaluation runs: the configs under evaluation (labelled by
//! their files' stems) and the options of `hintstream eval`.

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::llm::cassette::CassetteMode;

/// One config under evaluation.
#[derive(Debug, Clone)]
pub struct EvalConfig {
    /// Its name in the report (the file's stem).
    pub label: String,
    pub file: Option<PathBuf>,
    pub config: Config,
}

#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// A `hintstream record` file of failed trajectories (or plain JSONL);
    /// without it no synthesis runs (the arm table alone).
    pub input: Option<PathBuf>,
    /// A `hintstream record` file of scored rollouts (or plain JSONL).
    pub scored: Option<PathBuf>,
    /// A `hintstream record` file of `rl.hints` (or JSONL): the arm table.
    pub hints: Option<PathBuf>,
    /// A `hintstream record` file of `rl.hints.outcomes` (or JSONL).
    pub outcomes: Option<PathBuf>,
    pub out: PathBuf,
    /// Default: `OUT/cassette.jsonl`.
    pub cassette: Option<PathBuf>,
    pub mode: CassetteMode,
    pub progress: bool,
}

impl EvalOptions {
    pub fn cassette_path(&self) -> PathBuf {
        self.cassette
            .clone()
            .unwrap_or_else(|| self.out.join("cassette.jsonl"))
    }
}

/// Labels from file stems, made unique.
pub fn labels(files: &[Option<PathBuf>]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let stem = f
            .as_deref()
            .and_then(Path::file_stem)
            .map_or_else(|| "default".to_string(), |s| s.to_string_lossy().into_owned());
        let label = if out.contains(&stem) {
            format!("{stem}-{}", i + 1)
        } else {
            stem
        };
        out.push(label);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_come_from_file_stems_and_stay_unique() {
        let files = vec![
            Some(PathBuf::from("a/sonnet.toml")),
            Some(PathBuf::from("b/sonnet.toml")),
            None,
        ];
        assert_eq!(labels(&files), ["sonnet", "sonnet-2", "default"]);
    }
}
