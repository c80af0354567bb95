//! The documentation: the README is a front door of at most
//! [`README_MAX_LINES`] lines; every relative link of the README and of the
//! book in `docs/` (mdBook, `scripts/mdbook.sh build`) reaches a file, and
//! every `#anchor` a heading of it (mdbook build does not check links);
//! every chapter is in `docs/SUMMARY.md`; and the configuration reference
//! is what `hintstream config reference` prints.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use pulldown_cmark::{Event, Parser, Tag, TagEnd};

/// The README's most lines: what the project is, the two commands, what a
/// user sees, where to read next; the rest is the book's.
const README_MAX_LINES: usize = 250;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The README and the book's chapters.
fn documents() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    files.extend(markdown_in(&root().join("docs")));
    files
}

fn markdown_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.sort();
    files
}

/// The ids mdBook (and GitHub) give a document's headings: the heading's
/// text lowercased, letters, digits, `_` and `-` kept, spaces as `-`, the
/// rest dropped; a repeated id gets `-1`, `-2`, ...
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let mut heading: Option<String> = None;
    for event in Parser::new(markdown) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let text = heading.take().unwrap_or_default();
                let id: String = text
                    .trim()
                    .to_lowercase()
                    .chars()
                    .filter_map(|c| match c {
                        c if c.is_alphanumeric() || c == '_' || c == '-' => Some(c),
                        c if c.is_whitespace() => Some('-'),
                        _ => None,
                    })
                    .collect();
                let mut unique = id.clone();
                let mut n = 0;
                while !ids.insert(unique.clone()) {
                    n += 1;
                    unique = format!("{id}-{n}");
                }
            }
            _ => {}
        }
    }
    ids
}

/// The destinations of a document's links and images (code is not parsed
/// for links, as a renderer does not).
fn links(markdown: &str) -> Vec<String> {
    Parser::new(markdown)
        .filter_map(|event| match event {
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                Some(dest_url.to_string())
            }
            _ => None,
        })
        .collect()
}

/// What is wrong with the relative links of `files`: a target that does
/// not exist, or an anchor that no heading of its target has. Links with a
/// scheme (`https:`, `mailto:`) are not followed.
fn broken_links(files: &[PathBuf]) -> Vec<String> {
    let mut broken = Vec::new();
    for file in files {
        let text = read(file);
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = link
                .split_once('#')
                .map_or((link.as_str(), None), |(p, a)| (p, Some(a)));
            let target = match path {
                "" => file.clone(),
                p => file.parent().unwrap().join(p),
            };
            let name = file.strip_prefix(root()).unwrap_or(file).display().to_string();
            if !target.exists() {
                broken.push(format!("{name}: ({link}): {} does not exist", target.display()));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if target.extension().is_none_or(|e| e != "md") {
                broken.push(format!(
                    "{name}: ({link}): an anchor into a file that is not Markdown"
                ));
            } else if !anchors(&read(&target)).contains(anchor) {
                broken.push(format!(
                    "{name}: ({link}): no heading of {path:?} has the id {anchor:?}"
                ));
            }
        }
    }
    broken
}

#[test]
fn the_readme_is_a_front_door_of_at_most_250_lines() {
    let lines = read(&root().join("README.md")).lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, over {README_MAX_LINES}: move the detail into a chapter of docs/"
    );
}

#[test]
fn every_link_of_the_readme_and_the_book_reaches_its_file_and_heading() {
    let files = documents();
    assert!(files.len() > 10, "the README and the book: {files:?}");
    let broken = broken_links(&files);
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_check_finds_a_missing_file_and_a_missing_heading() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.md");
    std::fs::write(
        &good,
        "# A title\n\n## The `[llm]` section\n\nSee [here](#a-title).\n",
    )
    .unwrap();
    let bad = dir.path().join("bad.md");
    std::fs::write(
        &bad,
        "# Bad\n\n[gone](missing.md), [no such heading](good.md#nowhere), \
         [fine](good.md#the-llm-section), [web](https://example.com/x.md)\n\n\
         ```\n[in code](not-checked.md)\n```\n",
    )
    .unwrap();
    assert!(broken_links(std::slice::from_ref(&good)).is_empty());
    let broken = broken_links(&[bad]);
    assert_eq!(broken.len(), 2, "{broken:?}");
    assert!(
        broken[0].contains("missing.md") && broken[0].contains("does not exist"),
        "{broken:?}"
    );
    assert!(broken[1].contains("\"nowhere\""), "{broken:?}");
}

#[test]
fn repeated_headings_get_numbered_ids_as_mdbook_gives_them() {
    let ids = anchors("# Setup\n\n## Setup\n\n## Hints & the LLM: `hints`\n\n```\n# not a heading\n```\n");
    let expected: BTreeSet<String> = ["setup", "setup-1", "hints--the-llm-hints"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(ids, expected);
}

#[test]
fn every_chapter_of_docs_is_in_the_summary() {
    let summary = read(&root().join("docs/SUMMARY.md"));
    let listed: BTreeSet<String> = links(&summary).into_iter().collect();
    let missing: Vec<String> = markdown_in(&root().join("docs"))
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().to_string())
        .filter(|name| name != "SUMMARY.md" && !listed.contains(name))
        .collect();
    assert!(
        missing.is_empty(),
        "chapters that docs/SUMMARY.md does not list: {missing:?}"
    );
}

/// What `hintstream config reference` prints.
fn generated_reference() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_hintstream"))
        .args(["config", "reference"])
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn every_key_of_the_reference_is_documented_with_its_variable() {
    let reference = generated_reference();
    let undocumented: Vec<&str> = reference
        .split("\n### ")
        .filter(|entry| entry.contains(hintstream::config::UNDOCUMENTED))
        .map(|entry| entry.lines().next().unwrap_or_default())
        .collect();
    assert!(
        undocumented.is_empty(),
        "config keys without a doc comment (write one for users in src/config/): {undocumented:?}"
    );
    // A key of a section, a top-level key and a flattened stage key, each
    // with its default and variable.
    for (key, facts) in [
        (
            "`[llm] timeout_secs`",
            "number · default `30.0` · `HINTSTREAM_LLM__TIMEOUT_SECS`",
        ),
        (
            "`bootstrap_servers`",
            "string · default `\"127.0.0.1:9092\"` · `HINTSTREAM_BOOTSTRAP_SERVERS`",
        ),
        (
            "`[hints] group_id`",
            "string · default `\"hintstream-hints\"` · `HINTSTREAM_HINTS__GROUP_ID`",
        ),
        ("`[[hints.arms]] min_share`", "number · default `0.05`\n"),
    ] {
        let entry = format!("\n### {key}\n\n{facts}");
        assert!(reference.contains(&entry), "the reference lacks {entry:?}");
    }
}

#[test]
fn the_configuration_reference_is_what_the_code_generates() {
    let generated = generated_reference();
    let committed = read(&root().join("docs/configuration.md"));
    assert!(
        committed == generated,
        "docs/configuration.md differs from what the code generates (the config structs' doc comments \
         and defaults); regenerate it with `{}`",
        hintstream::config::REGENERATE
    );
}
