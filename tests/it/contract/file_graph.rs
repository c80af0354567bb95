//! The house's rules file by file: no import circle between the files of
//! `src/`, nor between the modules of the Python package, not even inside
//! one folder.
//!
//! An arrow A -> B is any use in A of an item that B defines: through a
//! `use` line, an inline path, a module alias (`use super::client;` then
//! `client::Partition`), and through a re-export (`pub use`) of a `mod.rs`,
//! which leads to the file that defines the item, not to the `mod.rs`. In
//! Python, every import counts, a function-level one too, and a name taken
//! from a package's `__init__.py` leads to the module it comes from.
//! Declaring a submodule (`mod x;`) is not an arrow.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::layout::code_only;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A module path from the crate root: `["kafka", "client"]`.
type ModPath = Vec<String>;

/// One Rust module of `src/`: the file that holds it, and for a module
/// written inline (`mod tests { .. }`) the byte range of its body.
#[derive(Debug, Clone)]
struct RustModule {
    file: PathBuf,
    /// The module's own re-exports: name -> the path it names, absolute.
    reexports: BTreeMap<String, ModPath>,
}

/// A file's code (comments and literals blanked), with the byte range of
/// each module it holds (the file's own, then its inline ones).
type FileCode = (String, Vec<(usize, usize, ModPath)>);

/// A `use` declaration: its byte offset, whether it re-exports, and its
/// tree flattened into (path, alias) pairs.
type UseDeclaration = (usize, bool, Vec<(Vec<String>, String)>);

/// The crate's modules, from the files under `src/` and the inline
/// modules inside them.
struct Crate {
    modules: BTreeMap<ModPath, RustModule>,
    files: BTreeMap<PathBuf, FileCode>,
}

fn files_with_extension(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == ext) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The module path of a file of `src/` (`src/kafka/mod.rs` -> `kafka`,
/// `src/lib.rs` and `src/main.rs` -> the root).
fn module_path_of(file: &Path) -> ModPath {
    let rel = file.strip_prefix(root().join("src")).unwrap();
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    match last.as_str() {
        "mod.rs" | "lib.rs" | "main.rs" => {}
        name => parts.push(name.trim_end_matches(".rs").to_string()),
    }
    parts
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The inline modules of `code` (`mod name {`), each with its name, the
/// byte range of its body and its nesting (outermost first).
fn inline_modules(code: &str) -> Vec<(Vec<String>, usize, usize)> {
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    // (name, body start, brace depth at which it opened)
    let mut open: Vec<(String, usize, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i] as char;
        if c == '{' {
            depth += 1;
        } else if c == '}' {
            if let Some((_, start, d)) = open.last() {
                if *d == depth {
                    let names: Vec<String> = open.iter().map(|(n, _, _)| n.clone()).collect();
                    out.push((names, *start, i));
                    open.pop();
                }
            }
            depth = depth.saturating_sub(1);
        } else if code[i..].starts_with("mod ") && (i == 0 || !is_ident(bytes[i - 1] as char)) {
            let rest = &code[i + 4..];
            let name: String = rest.trim_start().chars().take_while(|c| is_ident(*c)).collect();
            let after = rest.trim_start()[name.len()..].trim_start();
            if !name.is_empty() && after.starts_with('{') {
                let brace = i + 4 + (rest.len() - after.len());
                open.push((name, brace + 1, depth + 1));
                depth += 1;
                i = brace + 1;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// `code` with the bodies of its `#[cfg(test)]` modules blanked (newlines
/// kept, so offsets and lines stay).
fn without_test_modules(code: &str) -> String {
    let mut out = code.to_string();
    let mut at = 0;
    while let Some(pos) = code[at..].find("#[cfg(test)]") {
        let start = at + pos;
        at = start + 1;
        let after = code[start + "#[cfg(test)]".len()..].trim_start();
        let Some(rest) = after.strip_prefix("mod ") else {
            continue;
        };
        let Some(open) = rest.find(['{', ';']) else {
            continue;
        };
        if rest.as_bytes()[open] != b'{' {
            continue;
        }
        let body_start = code.len() - rest.len() + open;
        let mut depth = 0;
        let mut end = code.len();
        for (i, c) in code[body_start..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = body_start + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        let blanked: String = code[start..end]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        out.replace_range(start..end, &blanked);
        at = end;
    }
    out
}

/// The `use` declarations of `code`: each with its byte offset, whether it
/// is a re-export (`pub`, `pub(crate)`, `pub(super)`), and its trees
/// flattened into (path, alias) pairs; a glob gives the alias `*`.
fn use_declarations(code: &str) -> Vec<UseDeclaration> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut at = 0;
    while let Some(pos) = code[at..].find("use ") {
        let start = at + pos;
        at = start + 4;
        if start > 0 && is_ident(bytes[start - 1] as char) {
            continue;
        }
        // What precedes on its line: nothing, or a visibility.
        let line_start = code[..start].rfind(['\n', ';', '{', '}']).map_or(0, |p| p + 1);
        let before = code[line_start..start].trim();
        let public = before.starts_with("pub");
        if !(before.is_empty() || public) {
            continue;
        }
        let Some(end) = code[at..].find(';') else { break };
        let tree: String = code[at..at + end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let mut flat = Vec::new();
        flatten_use(&tree, Vec::new(), &mut flat);
        out.push((start, public, flat));
        at += end;
    }
    out
}

/// `a::{b, c::{d as e, *}}` into its leaves with the prefix they hang on.
fn flatten_use(tree: &str, prefix: Vec<String>, out: &mut Vec<(Vec<String>, String)>) {
    let tree = tree.trim().trim_start_matches("::");
    if tree.is_empty() {
        return;
    }
    if let Some(brace) = tree.find('{') {
        let head: Vec<String> = tree[..brace]
            .split("::")
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        let mut base = prefix.clone();
        base.extend(head);
        let inner = &tree[brace + 1..tree.rfind('}').unwrap_or(tree.len())];
        let mut depth = 0;
        let mut part = String::new();
        for ch in inner.chars() {
            match ch {
                '{' => {
                    depth += 1;
                    part.push(ch);
                }
                '}' => {
                    depth -= 1;
                    part.push(ch);
                }
                ',' if depth == 0 => {
                    flatten_use(&part, base.clone(), out);
                    part.clear();
                }
                _ => part.push(ch),
            }
        }
        flatten_use(&part, base, out);
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p.trim(), Some(a.trim().to_string())),
        None => (tree, None),
    };
    let mut full = prefix;
    full.extend(path.split("::").map(|s| s.trim().to_string()));
    let last = full.last().cloned().unwrap_or_default();
    let alias = alias.unwrap_or(if last == "self" {
        full.get(full.len().saturating_sub(2))
            .cloned()
            .unwrap_or_default()
    } else {
        last
    });
    if full.last().is_some_and(|l| l == "self") {
        full.pop();
    }
    out.push((full, alias));
}

impl Crate {
    fn read() -> Crate {
        let mut modules = BTreeMap::new();
        let mut files = BTreeMap::new();
        for file in files_with_extension(&root().join("src"), "rs") {
            if file.file_name().is_some_and(|f| f == "tests.rs") {
                continue; // a file of unit tests (`#[cfg(test)] mod tests;`)
            }
            let code = code_only(&std::fs::read_to_string(&file).unwrap());
            let base = module_path_of(&file);
            let mut spans = vec![(0, code.len(), base.clone())];
            // Unit tests are not part of the house: a test module's imports
            // draw no arrow (its code is blanked).
            let code = without_test_modules(&code);
            for (names, start, end) in inline_modules(&code) {
                let mut path = base.clone();
                path.extend(names);
                spans.push((start, end, path));
            }
            for (_, _, path) in &spans {
                modules.insert(
                    path.clone(),
                    RustModule {
                        file: file.clone(),
                        reexports: BTreeMap::new(),
                    },
                );
            }
            files.insert(file, (code, spans));
        }
        let mut krate = Crate { modules, files };
        // Re-exports, now that every module is known.
        let mut found = Vec::new();
        for (file, (code, _)) in &krate.files {
            for (offset, public, leaves) in use_declarations(code) {
                if !public {
                    continue;
                }
                let here = krate.module_at(file, offset);
                for (path, alias) in leaves {
                    if let Some(abs) = krate.absolute(&here, &path) {
                        found.push((here.clone(), alias, abs));
                    }
                }
            }
        }
        for (module, alias, abs) in found {
            if let Some(m) = krate.modules.get_mut(&module) {
                m.reexports.insert(alias, abs);
            }
        }
        krate
    }

    /// The module that the byte `offset` of `file` lies in (the innermost).
    fn module_at(&self, file: &Path, offset: usize) -> ModPath {
        let (_, spans) = &self.files[file];
        spans
            .iter()
            .filter(|(s, e, _)| *s <= offset && offset <= *e)
            .max_by_key(|(_, _, p)| p.len())
            .map(|(_, _, p)| p.clone())
            .unwrap()
    }

    /// `path` as written in module `here`, made absolute; `None` for paths
    /// into other crates.
    fn absolute(&self, here: &ModPath, path: &[String]) -> Option<ModPath> {
        let first = path.first()?;
        let (mut base, rest): (ModPath, &[String]) = match first.as_str() {
            "crate" | "hintstream" => (Vec::new(), &path[1..]),
            "self" => (here.clone(), &path[1..]),
            "super" => {
                let mut base = here.clone();
                let mut k = 0;
                while path.get(k).is_some_and(|s| s == "super") {
                    base.pop();
                    k += 1;
                }
                (base, &path[k..])
            }
            _ => {
                // A child module of `here` named without `self::`.
                let mut child = here.clone();
                child.push(first.clone());
                if self.modules.contains_key(&child) {
                    (here.clone(), path)
                } else {
                    return None;
                }
            }
        };
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The file that defines the item an absolute path names, following
    /// re-exports; `None` when it leaves the crate or names a module.
    fn defining_file(&self, path: &ModPath, hops: usize) -> Option<PathBuf> {
        if hops > 16 {
            return None;
        }
        let mut module: ModPath = Vec::new();
        for (k, segment) in path.iter().enumerate() {
            let mut child = module.clone();
            child.push(segment.clone());
            if self.modules.contains_key(&child) {
                module = child;
                continue;
            }
            let m = self.modules.get(&module)?;
            if let Some(target) = m.reexports.get(segment) {
                let mut next = target.clone();
                next.extend(path[k + 1..].iter().cloned());
                return self.defining_file(&next, hops + 1);
            }
            return Some(m.file.clone());
        }
        // The path names a module, not an item: no arrow by itself (the
        // items taken through it are followed where they are used).
        None
    }

    /// Every file each file of `src/` takes an item from.
    fn arrows(&self) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
        let mut arrows: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
        for (file, (code, _)) in &self.files {
            let mut targets = BTreeSet::new();
            // Module aliases brought in by `use`, by the module they are in.
            let mut aliases: Vec<(ModPath, String, ModPath)> = Vec::new();
            for (offset, _, leaves) in use_declarations(code) {
                let here = self.module_at(file, offset);
                for (path, alias) in leaves {
                    let Some(abs) = self.absolute(&here, &path) else {
                        continue;
                    };
                    if alias == "*" {
                        let mut module = abs.clone();
                        module.pop();
                        if let Some(m) = self.modules.get(&module) {
                            targets.insert(m.file.clone());
                        }
                        continue;
                    }
                    if let Some(target) = self.defining_file(&abs, 0) {
                        targets.insert(target);
                    }
                    if self.modules.contains_key(&abs) {
                        aliases.push((here.clone(), alias, abs));
                    }
                }
            }
            for (start, path) in inline_paths(code) {
                let here = self.module_at(file, start);
                let abs = match self.absolute(&here, &path) {
                    Some(abs) => Some(abs),
                    None => aliases
                        .iter()
                        .filter(|(m, alias, _)| here.starts_with(m) && *alias == path[0])
                        .map(|(_, _, target)| {
                            let mut abs = target.clone();
                            abs.extend(path[1..].iter().cloned());
                            abs
                        })
                        .next(),
                };
                if let Some(target) = abs.and_then(|a| self.defining_file(&a, 0)) {
                    targets.insert(target);
                }
            }
            targets.remove(file);
            arrows.insert(file.clone(), targets);
        }
        arrows
    }
}

/// Every path of two or more segments in `code` outside `use` lines, with
/// its byte offset: `crate::a::B`, `super::x`, `client::Partition`.
fn inline_paths(code: &str) -> Vec<(usize, Vec<String>)> {
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i] as char;
        if (c.is_alphabetic() || c == '_')
            && (i == 0 || !(is_ident(bytes[i - 1] as char) || bytes[i - 1] == b':'))
        {
            let start = i;
            let mut segments = Vec::new();
            let mut j = i;
            loop {
                let seg_start = j;
                while j < bytes.len() && is_ident(bytes[j] as char) {
                    j += 1;
                }
                segments.push(code[seg_start..j].to_string());
                if code[j..].starts_with("::")
                    && code[j + 2..].starts_with(|c: char| c.is_alphabetic() || c == '_')
                {
                    j += 2;
                } else {
                    break;
                }
            }
            if segments.len() >= 2 {
                out.push((start, segments));
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// The circles of a graph (its strongly connected components of two or
/// more nodes), each as its nodes.
fn circles<N: Ord + Clone>(graph: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    // Kosaraju: finishing order on the graph, then components on its reverse.
    let nodes: Vec<N> = graph.keys().cloned().collect();
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    for n in &nodes {
        if seen.contains(n) {
            continue;
        }
        let mut stack = vec![(n.clone(), false)];
        while let Some((node, done)) = stack.pop() {
            if done {
                order.push(node);
                continue;
            }
            if !seen.insert(node.clone()) {
                continue;
            }
            stack.push((node.clone(), true));
            for next in graph.get(&node).into_iter().flatten() {
                if !seen.contains(next) {
                    stack.push((next.clone(), false));
                }
            }
        }
    }
    let mut reverse: BTreeMap<N, BTreeSet<N>> = BTreeMap::new();
    for (from, tos) in graph {
        for to in tos {
            reverse.entry(to.clone()).or_default().insert(from.clone());
        }
    }
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for n in order.into_iter().rev() {
        if assigned.contains(&n) {
            continue;
        }
        let mut component = Vec::new();
        let mut stack = vec![n.clone()];
        assigned.insert(n);
        while let Some(node) = stack.pop() {
            component.push(node.clone());
            for prev in reverse.get(&node).into_iter().flatten() {
                if assigned.insert(prev.clone()) {
                    stack.push(prev.clone());
                }
            }
        }
        if component.len() > 1 {
            component.sort();
            out.push(component);
        }
    }
    out
}

fn describe(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>, circle: &[PathBuf]) -> String {
    let rel = |p: &PathBuf| p.strip_prefix(root()).unwrap().display().to_string();
    let mut lines = vec![circle.iter().map(rel).collect::<Vec<_>>().join(", ")];
    for from in circle {
        for to in graph[from].iter().filter(|t| circle.contains(t)) {
            lines.push(format!("    {} -> {}", rel(from), rel(to)));
        }
    }
    lines.join("\n")
}

#[test]
fn no_circle_between_the_files_of_src() {
    let graph = Crate::read().arrows();
    let found = circles(&graph);
    assert!(
        found.is_empty(),
        "import circles between files of src/ (move the shared item to where it belongs):\n{}",
        found
            .iter()
            .map(|c| describe(&graph, c))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The Python package's modules: dotted name -> file.
fn python_modules(package_dir: &Path) -> BTreeMap<String, PathBuf> {
    let package = package_dir.file_name().unwrap().to_string_lossy().into_owned();
    files_with_extension(package_dir, "py")
        .into_iter()
        .map(|file| {
            let rel = file.strip_prefix(package_dir).unwrap().with_extension("");
            let mut name = package.clone();
            for part in rel.components() {
                let part = part.as_os_str().to_string_lossy();
                if part != "__init__" {
                    name.push('.');
                    name.push_str(&part);
                }
            }
            (name, file)
        })
        .collect()
}

/// `source` with the text of its triple-quoted strings (docstrings, whose
/// examples may show imports) blanked, line breaks kept.
fn without_docstrings(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    loop {
        let next = ["\"\"\"", "'''"]
            .iter()
            .filter_map(|q| rest.find(q).map(|at| (at, *q)))
            .min();
        let Some((at, quote)) = next else {
            out.push_str(rest);
            return out;
        };
        out.push_str(&rest[..at]);
        let body = &rest[at + 3..];
        let end = body.find(quote).map_or(body.len(), |e| e + 3);
        out.extend(body[..end.min(body.len())].chars().filter(|c| *c == '\n'));
        rest = &body[end.min(body.len())..];
    }
}

/// Every import of a Python source, at any depth: (module, names taken).
fn python_imports(source: &str, this: &str, is_package: bool) -> Vec<(String, Vec<String>)> {
    let source = without_docstrings(source);
    let mut out = Vec::new();
    let package: Vec<&str> = this.split('.').collect();
    let base_len = if is_package {
        package.len()
    } else {
        package.len() - 1
    };
    let mut logical = String::new();
    let mut in_parens = false;
    for raw in source.lines() {
        let line = raw.split('#').next().unwrap_or("");
        if in_parens {
            logical.push(' ');
            logical.push_str(line.trim());
            if line.contains(')') {
                in_parens = false;
            } else {
                continue;
            }
        } else {
            logical = line.trim().to_string();
            if (logical.starts_with("from ") || logical.starts_with("import "))
                && logical.contains('(')
                && !logical.contains(')')
            {
                in_parens = true;
                continue;
            }
        }
        let stmt = logical.replace(['(', ')', '\\'], " ");
        if let Some(rest) = stmt.strip_prefix("from ") {
            let Some((module, names)) = rest.split_once(" import ") else {
                continue;
            };
            let module = module.trim();
            let dots = module.chars().take_while(|c| *c == '.').count();
            let absolute = if dots > 0 {
                let keep = base_len + 1 - dots;
                let mut parts: Vec<&str> = package[..keep].to_vec();
                let tail = &module[dots..];
                if !tail.is_empty() {
                    parts.extend(tail.split('.'));
                }
                parts.join(".")
            } else {
                module.to_string()
            };
            let names = names
                .split(',')
                .map(|n| n.split_whitespace().next().unwrap_or("").to_string())
                .filter(|n| !n.is_empty())
                .collect();
            out.push((absolute, names));
        } else if let Some(rest) = stmt.strip_prefix("import ") {
            for module in rest.split(',') {
                if let Some(name) = module.split_whitespace().next() {
                    out.push((name.to_string(), Vec::new()));
                }
            }
        }
    }
    out
}

/// The Python package's arrows: a name taken from a package's
/// `__init__.py` that it imports from a submodule leads to that submodule.
fn python_arrows(package_dir: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let modules = python_modules(package_dir);
    let mut imports = BTreeMap::new();
    for (name, file) in &modules {
        let is_package = file.file_name().is_some_and(|f| f == "__init__.py");
        let source = std::fs::read_to_string(file).unwrap();
        imports.insert(name.clone(), python_imports(&source, name, is_package));
    }
    // name in a package's namespace -> the submodule it came from
    let origin = |package: &str, taken: &str| -> Option<String> {
        let sub = format!("{package}.{taken}");
        if modules.contains_key(&sub) {
            return Some(sub);
        }
        imports.get(package)?.iter().find_map(|(module, names)| {
            (names.iter().any(|n| n == taken) && modules.contains_key(module)).then(|| module.clone())
        })
    };
    let mut arrows: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for (name, file) in &modules {
        let mut targets = BTreeSet::new();
        for (module, names) in &imports[name] {
            let Some(target) = modules.get(module) else {
                continue;
            };
            let is_package = target.file_name().is_some_and(|f| f == "__init__.py");
            if is_package && !names.is_empty() {
                for taken in names {
                    if let Some(from) = origin(module, taken) {
                        targets.insert(modules[&from].clone());
                    }
                }
            } else {
                targets.insert(target.clone());
            }
        }
        targets.remove(file);
        arrows.insert(file.clone(), targets);
    }
    arrows
}

#[test]
fn no_circle_between_the_modules_of_the_python_package() {
    let graph = python_arrows(&root().join("python/src/hintstream"));
    let found = circles(&graph);
    assert!(
        found.is_empty(),
        "import circles in the Python package:\n{}",
        found
            .iter()
            .map(|c| describe(&graph, c))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn the_file_graph_sees_reexports_aliases_globs_and_function_level_imports() {
    // Rust: the pieces of the resolver on small sources.
    let mut flat = Vec::new();
    flatten_use(
        "super::{client::{self, Partition as P}, message::*}",
        Vec::new(),
        &mut flat,
    );
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        flat,
        vec![
            (s(&["super", "client"]), "client".to_string()),
            (s(&["super", "client", "Partition"]), "P".to_string()),
            (s(&["super", "message", "*"]), "*".to_string()),
        ]
    );
    let code = "mod a { fn f() {} }\n#[cfg(test)]\nmod tests {\n    mod inner { }\n}\n";
    let found: Vec<Vec<String>> = inline_modules(code).into_iter().map(|(n, _, _)| n).collect();
    assert_eq!(found, vec![s(&["a"]), s(&["tests", "inner"]), s(&["tests"])]);
    let untested = without_test_modules(code);
    assert_eq!(untested.len(), code.len());
    assert!(
        untested.contains("mod a") && !untested.contains("inner"),
        "{untested}"
    );
    assert_eq!(
        inline_paths("let x = client::Partition::new(crate::a::B);"),
        vec![
            (8, s(&["client", "Partition", "new"])),
            (31, s(&["crate", "a", "B"]))
        ]
    );
    // The crate as it is: a re-export leads past kafka/mod.rs to the defining file.
    let krate = Crate::read();
    let via_mod = krate.defining_file(&s(&["kafka", "TopicTail"]), 0).unwrap();
    assert!(via_mod.ends_with("src/kafka/tail.rs"), "{via_mod:?}");
    // Python: a function-level relative import counts.
    let found = python_imports(
        "def f():\n    from .client import (\n        A,\n        B,\n    )\n",
        "pkg.mod",
        false,
    );
    assert_eq!(found, vec![("pkg.client".to_string(), s(&["A", "B"]))]);
    let documented = python_imports(
        "\"\"\"Use it so:\n\n    from pkg.other import x\n\"\"\"\nimport pkg.real\n",
        "pkg.mod",
        false,
    );
    assert_eq!(
        documented,
        vec![("pkg.real".to_string(), Vec::new())],
        "docstrings are not imports"
    );
    let mut graph = BTreeMap::new();
    graph.insert(1, BTreeSet::from([2]));
    graph.insert(2, BTreeSet::from([3]));
    graph.insert(3, BTreeSet::from([1]));
    graph.insert(4, BTreeSet::from([1]));
    assert_eq!(circles(&graph), vec![vec![1, 2, 3]]);
}
