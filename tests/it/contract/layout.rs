//! The house's rules, checked over the sources (a test over the files, not
//! `cargo modules`, so it needs nothing installed and runs in CI with the
//! rest):
//!
//! - the top-level modules of `src/` stand in layers, and a module imports
//!   only from its own layer or below, never up (every `crate::` path counts,
//!   `use` lines and inline paths alike);
//! - no circle between top-level modules;
//! - no function in `src/` is over [`MAX_FN_LINES`] lines, unless a
//!   `// long-fn:` comment right above it says why;
//! - the crate map in `src/lib.rs` and the book's layout chapter name every module
//!   and every top-level folder.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, low to high. A module may import from its own layer and the
/// ones below. Why this order: the wire contract and the pure kernels need
/// nothing; config reads settings into typed values the rest takes; batch is
/// Arrow over the contract, and the learning core reasons over hints and
/// outcomes; metrics, health and telemetry are what every running part
/// reports into; the Kafka plumbing reports into them; the stage skeleton
/// sits on the plumbing; the stages on the skeleton, with stage 1's model
/// side (llm) beside them, which only stage 1 and the eval use; the tools,
/// eval and the quick start drive stages; the CLI on top.
const LAYERS: &[&[&str]] = &[
    // allocator: the binary's allocators; it imports nothing of the crate.
    &["messages", "normalize", "jsonl", "allocator"],
    &["config"],
    &["batch", "learn"],
    &["metrics", "health", "telemetry", "lifecycle", "endpoint"],
    &["kafka"],
    &["stage"],
    &["hints", "llm", "advantages"],
    &["tools", "eval", "quickstart", "stages"],
    &["cli"],
];

/// The longest function `src/` may hold, in lines from its signature to its
/// closing brace. A longer one is split, or carries a `// long-fn:` comment
/// saying why (a kernel launch sequence that reads best in one piece).
const MAX_FN_LINES: usize = 100;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The top-level module a file of `src/` belongs to (`None` for lib.rs and
/// main.rs, which stand above every module).
fn module_of(file: &Path) -> Option<String> {
    let rel = file.strip_prefix(root().join("src")).unwrap();
    let first = rel
        .components()
        .next()?
        .as_os_str()
        .to_string_lossy()
        .into_owned();
    match first.as_str() {
        "lib.rs" | "main.rs" => None,
        name => Some(name.trim_end_matches(".rs").to_string()),
    }
}

/// The source with comments, string and char literals blanked out (kept
/// as spaces, newlines kept), so that braces and paths inside them count for
/// nothing.
pub(super) fn code_only(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&chars, i) {
            // A raw string: r"..", r#".."#, ...
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for &ch in &chars[i..j.min(chars.len())] {
                out.push(blank(ch));
            }
            i = j;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' && is_char_literal(&chars, i) {
            let end = char_literal_end(&chars, i);
            for _ in i..end {
                out.push(' ');
            }
            i = end;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// `'x'`, `'\n'`, `'\u{..}'` rather than a lifetime `'a`.
fn is_char_literal(chars: &[char], i: usize) -> bool {
    matches!(
        (chars.get(i + 1), chars.get(i + 2)),
        (Some('\\'), _) | (Some(_), Some('\''))
    )
}

fn char_literal_end(chars: &[char], i: usize) -> usize {
    let mut j = i + 1;
    if chars.get(j) == Some(&'\\') {
        j += 2;
    } else {
        j += 1;
    }
    while j < chars.len() && chars[j] != '\'' {
        j += 1;
    }
    j + 1
}

/// Every top-level module a file names through a `crate::` path: in `use`
/// lines, including `use crate::{a, b::c}` groups, and inline.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let bytes = code.as_bytes();
    let mut at = 0;
    while let Some(pos) = code[at..].find("crate::") {
        let start = at + pos;
        at = start + "crate::".len();
        if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
            continue; // `$crate::` or `hintstream_crate::`
        }
        let rest = &code[at..];
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a, b::{c, d}}`: the first segment of each top-level entry.
            let mut depth = 0;
            let mut entry_start = true;
            for (k, ch) in group.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => entry_start = true,
                    c if entry_start && (c.is_alphabetic() || c == '_') => {
                        let name: String = group[k..]
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        found.insert(name);
                        entry_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The top-level module graph: module -> modules it imports, with the files
/// that do it.
fn module_graph() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let mut graph: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for file in rust_files(&root().join("src")) {
        let Some(module) = module_of(&file) else { continue };
        let code = code_only(&std::fs::read_to_string(&file).unwrap());
        let entry = graph.entry(module.clone()).or_default();
        for target in crate_paths(&code) {
            if target != module && target != "self" && target != "super" {
                let rel = file.strip_prefix(root()).unwrap().display().to_string();
                entry.entry(target).or_default().insert(rel);
            }
        }
    }
    graph
}

#[test]
fn every_top_level_module_stands_in_a_layer() {
    let unplaced: Vec<String> = module_graph()
        .keys()
        .filter(|m| layer_of(m).is_none())
        .cloned()
        .collect();
    assert!(
        unplaced.is_empty(),
        "top-level modules in no layer: {unplaced:?}; add each to LAYERS in {} with the reason",
        file!()
    );
}

#[test]
fn no_import_runs_up_the_layers() {
    let mut upward = Vec::new();
    for (module, targets) in module_graph() {
        let Some(from) = layer_of(&module) else { continue };
        for (target, files) in targets {
            match layer_of(&target) {
                Some(to) if to > from => upward.push(format!("{module} -> {target} (in {})", join(&files))),
                None => upward.push(format!(
                    "{module} -> {target}: no such layer (in {})",
                    join(&files)
                )),
                _ => {}
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that run up the layers:\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_circle_between_top_level_modules() {
    let graph = module_graph();
    let mut circles = Vec::new();
    for start in graph.keys() {
        // Depth-first from `start`: a path back to it is a circle.
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((node, path)) = stack.pop() {
            for next in graph.get(&node).into_iter().flat_map(|t| t.keys()) {
                if next == start {
                    let mut circle = path.clone();
                    circle.push(start.clone());
                    circles.push(circle.join(" -> "));
                } else if seen.insert(next.clone()) {
                    let mut p = path.clone();
                    p.push(next.clone());
                    stack.push((next.clone(), p));
                }
            }
        }
    }
    assert!(
        circles.is_empty(),
        "circles between top-level modules:\n{}",
        circles.join("\n")
    );
}

fn join(files: &BTreeSet<String>) -> String {
    files.iter().cloned().collect::<Vec<_>>().join(", ")
}

/// Each `fn` of `code` with its first line (1-based) and its length in lines
/// (signature to closing brace); declarations without a body are skipped.
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else { continue };
        // Find the body's opening brace (or a `;`: no body) from here on.
        let mut depth = 0usize;
        let mut opened = false;
        let mut paren = 0i32;
        'outer: for (j, l) in lines.iter().enumerate().skip(i) {
            for ch in l.chars() {
                match ch {
                    '(' | '[' => paren += 1,
                    ')' | ']' => paren -= 1,
                    ';' if !opened && paren == 0 => break 'outer,
                    '{' => {
                        opened = true;
                        depth += 1;
                    }
                    '}' if opened => {
                        depth -= 1;
                        if depth == 0 {
                            out.push((name.clone(), i + 1, j - i + 1));
                            break 'outer;
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    out
}

fn fn_name(line: &str) -> Option<String> {
    let mut words = line.split_whitespace().peekable();
    while let Some(w) = words.next() {
        match w {
            "pub" | "async" | "unsafe" | "const" | "extern" | "default" => continue,
            w if w.starts_with("pub(") => continue,
            w if w.starts_with('"') => continue, // extern "C"
            "fn" => {
                let name: String = words
                    .next()?
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                return (!name.is_empty()).then_some(name);
            }
            _ => return None,
        }
    }
    None
}

#[test]
fn no_function_in_src_is_over_the_limit() {
    let mut long = Vec::new();
    for file in rust_files(&root().join("src")) {
        let source = std::fs::read_to_string(&file).unwrap();
        let original: Vec<&str> = source.lines().collect();
        for (name, line, length) in functions(&code_only(&source)) {
            // The comments and attributes right above the signature.
            let excused = original[..line - 1]
                .iter()
                .rev()
                .take_while(|l| {
                    let l = l.trim_start();
                    l.starts_with("//") || l.starts_with("#[")
                })
                .any(|l| l.trim_start().starts_with("// long-fn:"));
            if length > MAX_FN_LINES && !excused {
                let rel = file.strip_prefix(root()).unwrap().display();
                long.push(format!("{rel}:{line} {name}: {length} lines"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines (split them, or say why in a `// long-fn:` comment above):\n{}",
        long.join("\n")
    );
}

#[test]
fn the_function_counter_sees_bodies_and_skips_braces_in_literals() {
    let code = code_only(
        "fn a() {\n    let s = \"{{{\";\n    let c = '{';\n    // }\n}\ntrait T { fn decl(&self); }\npub async fn b<'x>(v: &'x [u8; 2]) -> u8 {\n    r#\"}\"#;\n    0\n}\n",
    );
    let found = functions(&code);
    assert_eq!(
        found,
        vec![("a".to_string(), 1, 5), ("b".to_string(), 7, 4)],
        "{code}"
    );
    assert_eq!(
        crate_paths(&code_only(
            "use crate::{a::B, c};\nfn f() { crate::d::e(); } // crate::z\n"
        )),
        ["a", "c", "d"].iter().map(|s| s.to_string()).collect()
    );
}

/// The modules `src/lib.rs` declares, from its `pub mod` lines.
fn declared_modules() -> BTreeSet<String> {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    lib.lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';').to_string())
        .collect()
}

#[test]
fn the_crate_map_names_every_module_and_no_other() {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    let in_map: BTreeSet<String> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//! - [`"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect();
    let mut in_tree: BTreeSet<String> = BTreeSet::new();
    for entry in std::fs::read_dir(root().join("src")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            in_tree.insert(name);
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if stem != "lib" && stem != "main" {
                in_tree.insert(stem.to_string());
            }
        }
    }
    assert_eq!(
        declared_modules(),
        in_tree,
        "src/lib.rs's `pub mod` lines against src/"
    );
    assert_eq!(
        in_map, in_tree,
        "the crate map (`//! - [`name`]` lines of src/lib.rs) against src/"
    );
}

#[test]
fn the_book_layout_names_every_module_and_top_level_folder() {
    let chapter = std::fs::read_to_string(root().join("docs/layout.md")).unwrap();
    let section = chapter
        .split("# Layout\n")
        .nth(1)
        .expect("docs/layout.md has a `# Layout` title");
    let block = section
        .split("```")
        .nth(1)
        .expect("the Layout section opens with a code block");
    let mut missing = Vec::new();
    for module in declared_modules() {
        let dir = format!("src/{module}/");
        let file = format!("src/{module}.rs");
        if !block.contains(&dir) && !block.contains(&file) {
            missing.push(if root().join(&dir).is_dir() { dir } else { file });
        }
    }
    let tracked = std::process::Command::new("git")
        .args(["ls-files"])
        .current_dir(root())
        .output()
        .expect("git ls-files");
    let folders: BTreeSet<String> = String::from_utf8_lossy(&tracked.stdout)
        .lines()
        .filter_map(|l| l.split_once('/').map(|(top, _)| top.to_string()))
        .filter(|top| !top.starts_with('.') && top != "src")
        .collect();
    for folder in folders {
        if !block.contains(&format!("{folder}/")) {
            missing.push(format!("{folder}/"));
        }
    }
    assert!(missing.is_empty(), "docs/layout.md lacks: {missing:?}");
    for stale in block.split_whitespace().filter(|w| w.starts_with("src/")) {
        let path = root().join(stale.trim_end_matches('/'));
        assert!(
            path.exists(),
            "docs/layout.md names {stale}, which does not exist"
        );
    }
}
