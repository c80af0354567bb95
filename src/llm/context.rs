//! The system context: `llm.system_context_file` (appended to the system
//! prompt of every call) and `llm.system_context_dir` (`<dir>/<env_class>.md`,
//! appended after it for a trajectory of that `env_class`), read once at
//! start-up within size bounds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::config::LlmConfig;

/// The largest context file read (bytes): 256 KiB, some 64,000 tokens,
/// well under a model's context window. A larger file is a start-up error.
pub const MAX_CONTEXT_FILE_BYTES: u64 = 256 << 10;
/// The most files read from `llm.system_context_dir`.
pub const MAX_CONTEXT_DIR_FILES: usize = 1_000;
/// The extension of a file of `llm.system_context_dir`: `<env_class>.md`.
/// Other files in the directory are ignored.
pub const CONTEXT_DIR_EXTENSION: &str = "md";

/// A context file or directory that cannot be used: the stage does not
/// start (exit 2).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{setting} {path}: {reason}")]
pub struct ContextError {
    /// `llm.system_context_file` or `llm.system_context_dir`.
    pub setting: &'static str,
    pub path: PathBuf,
    pub reason: String,
}

/// The context texts, as read at start-up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SystemContext {
    /// `llm.system_context_file`'s text, for every call.
    pub common: Option<String>,
    /// `llm.system_context_dir`'s texts, by `env_class` (the file stem).
    pub by_env_class: BTreeMap<String, String>,
}

impl SystemContext {
    /// Reads the files `config` names; an empty setting reads nothing.
    pub fn load(config: &LlmConfig) -> Result<Self, ContextError> {
        let mut context = SystemContext::default();
        if !config.system_context_file.is_empty() {
            let path = Path::new(&config.system_context_file);
            context.common = Some(read_text("llm.system_context_file", path)?);
        }
        if !config.system_context_dir.is_empty() {
            context.by_env_class = read_dir(Path::new(&config.system_context_dir))?;
        }
        Ok(context)
    }

    /// Whether any context was configured.
    pub fn is_empty(&self) -> bool {
        self.common.is_none() && self.by_env_class.is_empty()
    }

    /// The text for a trajectory of `env_class`, when its directory has one.
    pub fn for_env_class(&self, env_class: Option<&str>) -> Option<&str> {
        env_class
            .and_then(|c| self.by_env_class.get(c))
            .map(String::as_str)
    }

    /// [`SystemContext::describe`] with a digest of the texts, which tells
    /// two contexts of one size apart (the eval report's `system_context`).
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        if self.is_empty() {
            return "none".into();
        }
        let mut hasher = Sha256::new();
        for text in self.common.iter().chain(self.by_env_class.values()) {
            hasher.update(text.len().to_le_bytes());
            hasher.update(text.as_bytes());
        }
        for class in self.by_env_class.keys() {
            hasher.update(class.as_bytes());
        }
        let hex = hex::encode(&hasher.finalize()[..6]);
        format!("{} (sha256 {hex})", self.describe())
    }

    /// A one-line description for the eval report and the start-up log:
    /// the bytes of each part, no text.
    pub fn describe(&self) -> String {
        if self.is_empty() {
            return "none".into();
        }
        let mut parts = Vec::new();
        if let Some(common) = &self.common {
            parts.push(format!("file: {} bytes", common.len()));
        }
        if !self.by_env_class.is_empty() {
            let classes: Vec<_> = self
                .by_env_class
                .iter()
                .map(|(class, text)| format!("{class} ({} bytes)", text.len()))
                .collect();
            parts.push(format!("env classes: {}", classes.join(", ")));
        }
        parts.join("; ")
    }
}

fn fail(setting: &'static str, path: &Path, reason: impl Into<String>) -> ContextError {
    ContextError {
        setting,
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// A context file's text: UTF-8, not empty, at most
/// [`MAX_CONTEXT_FILE_BYTES`]; its trailing whitespace trimmed.
fn read_text(setting: &'static str, path: &Path) -> Result<String, ContextError> {
    let meta = std::fs::metadata(path).map_err(|e| fail(setting, path, format!("cannot read it: {e}")))?;
    if !meta.is_file() {
        return Err(fail(setting, path, "is not a file"));
    }
    if meta.len() > MAX_CONTEXT_FILE_BYTES {
        return Err(fail(
            setting,
            path,
            format!(
                "is {} bytes, over the {MAX_CONTEXT_FILE_BYTES}-byte limit",
                meta.len()
            ),
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| fail(setting, path, format!("cannot read it: {e}")))?;
    // Read again in case the file grew between the two calls.
    if bytes.len() as u64 > MAX_CONTEXT_FILE_BYTES {
        return Err(fail(setting, path, "grew over the size limit while read"));
    }
    let text = String::from_utf8(bytes).map_err(|e| fail(setting, path, format!("is not UTF-8: {e}")))?;
    let text = text.trim_end().to_string();
    if text.trim().is_empty() {
        return Err(fail(setting, path, "is empty"));
    }
    Ok(text)
}

/// Every `<env_class>.md` of `dir`, by `env_class`.
fn read_dir(dir: &Path) -> Result<BTreeMap<String, String>, ContextError> {
    const SETTING: &str = "llm.system_context_dir";
    let entries = std::fs::read_dir(dir).map_err(|e| fail(SETTING, dir, format!("cannot list it: {e}")))?;
    let mut texts = BTreeMap::new();
    for entry in entries {
        let path = entry
            .map_err(|e| fail(SETTING, dir, format!("cannot list it: {e}")))?
            .path();
        if path.extension().and_then(|e| e.to_str()) != Some(CONTEXT_DIR_EXTENSION) || !path.is_file() {
            continue;
        }
        let Some(class) = path
            .file_stem()
            .and_then(|s| s.to_str())
            .filter(|s| !s.is_empty())
        else {
            return Err(fail(SETTING, &path, "its name is not a UTF-8 env_class"));
        };
        if texts.len() == MAX_CONTEXT_DIR_FILES {
            return Err(fail(
                SETTING,
                dir,
                format!("holds more than {MAX_CONTEXT_DIR_FILES} .{CONTEXT_DIR_EXTENSION} files"),
            ));
        }
        texts.insert(class.to_string(), read_text(SETTING, &path)?);
    }
    if texts.is_empty() {
        return Err(fail(
            SETTING,
            dir,
            format!("holds no <env_class>.{CONTEXT_DIR_EXTENSION} file"),
        ));
    }
    Ok(texts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(file: &Path, dir: &Path) -> LlmConfig {
        LlmConfig {
            system_context_file: file.display().to_string(),
            system_context_dir: dir.display().to_string(),
            ..LlmConfig::default()
        }
    }

    #[test]
    fn reads_the_file_and_one_text_per_env_class() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("tools.md");
        std::fs::write(&file, "Tool docs.\n\n").unwrap();
        let dir = tmp.path().join("classes");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("sql.md"), "SQL rules.").unwrap();
        std::fs::write(dir.join("notes.txt"), "ignored").unwrap();
        let context = SystemContext::load(&config(&file, &dir)).unwrap();
        assert_eq!(context.common.as_deref(), Some("Tool docs."));
        assert_eq!(context.for_env_class(Some("sql")), Some("SQL rules."));
        assert_eq!(context.for_env_class(Some("notes")), None);
        assert_eq!(context.for_env_class(None), None);
        assert!(
            context.describe().contains("sql (10 bytes)"),
            "{}",
            context.describe()
        );
    }

    #[test]
    fn no_setting_reads_nothing() {
        let context = SystemContext::load(&LlmConfig::default()).unwrap();
        assert!(context.is_empty());
        assert_eq!(context.describe(), "none");
    }

    #[test]
    fn a_missing_empty_oversized_or_binary_file_is_a_start_up_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let empty = tmp.path().join("empty.md");
        std::fs::write(&empty, " \n").unwrap();
        let big = tmp.path().join("big.md");
        std::fs::write(&big, "x".repeat(MAX_CONTEXT_FILE_BYTES as usize + 1)).unwrap();
        let binary = tmp.path().join("binary.md");
        std::fs::write(&binary, [0xff, 0xfe, 0x00]).unwrap();
        let missing = tmp.path().join("missing.md");
        for (path, why) in [
            (&empty, "is empty"),
            (&big, "over the"),
            (&binary, "not UTF-8"),
            (&missing, "cannot read"),
        ] {
            let config = LlmConfig {
                system_context_file: path.display().to_string(),
                ..LlmConfig::default()
            };
            let e = SystemContext::load(&config).unwrap_err();
            let shown = e.to_string();
            assert!(shown.contains("llm.system_context_file"), "{shown}");
            assert!(
                shown.contains(&path.display().to_string()) && shown.contains(why),
                "{shown}"
            );
        }
    }

    #[test]
    fn a_directory_without_env_class_files_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("readme.txt"), "no").unwrap();
        let config = LlmConfig {
            system_context_dir: tmp.path().display().to_string(),
            ..LlmConfig::default()
        };
        let e = SystemContext::load(&config).unwrap_err();
        assert!(e.to_string().contains("no <env_class>.md"), "{e}");
    }
}
