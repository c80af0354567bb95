//! The image, checked without a Docker engine: the runtime stage installs
//! exactly the packages that provide what the binary links (`ldd`, then
//! `dpkg -S` on this Debian machine) beyond debian:bookworm-slim's own; it
//! runs as an unprivileged user; the build context holds what the Dockerfile
//! copies and nothing else; dependencies stay cached across source changes;
//! and `quickstart` run with the image's environment, entrypoint and working
//! directory uses its embedded broker.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The packages of debian:bookworm-slim: Debian's minbase (the Essential and
/// Priority: required packages, and apt with what it depends on). Consulted
/// only for the packages that provide a library the binary links.
const BOOKWORM_SLIM: &[&str] = &[
    "adduser",
    "apt",
    "base-files",
    "base-passwd",
    "bash",
    "bsdutils",
    "coreutils",
    "dash",
    "debconf",
    "debian-archive-keyring",
    "debianutils",
    "diffutils",
    "dpkg",
    "findutils",
    "gcc-12-base",
    "gpgv",
    "grep",
    "gzip",
    "hostname",
    "init-system-helpers",
    "libacl1",
    "libapt-pkg6.0",
    "libattr1",
    "libaudit-common",
    "libaudit1",
    "libblkid1",
    "libbz2-1.0",
    "libc-bin",
    "libc6",
    "libcap-ng0",
    "libcap2",
    "libcrypt1",
    "libdb5.3",
    "libdebconfclient0",
    "libffi8",
    "libgcc-s1",
    "libgcrypt20",
    "libgmp10",
    "libgnutls30",
    "libgpg-error0",
    "libhogweed6",
    "libidn2-0",
    "liblz4-1",
    "liblzma5",
    "libmd0",
    "libmount1",
    "libnettle8",
    "libp11-kit0",
    "libpam-modules",
    "libpam-modules-bin",
    "libpam-runtime",
    "libpam0g",
    "libpcre2-8-0",
    "libseccomp2",
    "libselinux1",
    "libsemanage-common",
    "libsemanage2",
    "libsepol2",
    "libsmartcols1",
    "libstdc++6",
    "libsystemd0",
    "libtasn1-6",
    "libtinfo6",
    "libudev1",
    "libunistring2",
    "libuuid1",
    "libxxhash0",
    "libzstd1",
    "login",
    "mawk",
    "mount",
    "ncurses-base",
    "ncurses-bin",
    "passwd",
    "perl-base",
    "sed",
    "sysvinit-utils",
    "tar",
    "tzdata",
    "usr-is-merged",
    "util-linux",
    "util-linux-extra",
    "zlib1g",
];

/// Installed in the runtime stage though no library needs it: the CA
/// bundle, for TLS to brokers (librdkafka) and model APIs (reqwest's native
/// roots).
const RUNTIME_DATA_PACKAGES: &[&str] = &["ca-certificates"];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// One stage of the Dockerfile: its instructions as (KEYWORD, arguments),
/// continuation lines joined and comments dropped.
struct Stage {
    instructions: Vec<(String, String)>,
}

impl Stage {
    fn all<'a>(&'a self, keyword: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.instructions
            .iter()
            .filter(move |(k, _)| k == keyword)
            .map(|(_, args)| args.as_str())
    }

    fn last<'a>(&'a self, keyword: &'a str) -> Option<&'a str> {
        self.all(keyword).last()
    }
}

fn dockerfile_stages() -> Vec<Stage> {
    let text = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let mut logical = vec![];
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                logical.push(std::mem::take(&mut current));
            }
        }
    }
    let mut stages: Vec<Stage> = vec![];
    for line in logical {
        let (keyword, args) = line.split_once(char::is_whitespace).unwrap_or((&line, ""));
        let keyword = keyword.to_ascii_uppercase();
        if keyword == "FROM" {
            stages.push(Stage { instructions: vec![] });
        }
        stages
            .last_mut()
            .expect("the Dockerfile starts with FROM")
            .instructions
            .push((keyword, args.trim().to_string()));
    }
    stages
}

fn runtime_stage() -> Stage {
    dockerfile_stages().pop().unwrap()
}

/// The packages a stage's `apt-get install` lines name.
fn apt_installed(stage: &Stage) -> BTreeSet<String> {
    stage
        .all("RUN")
        .flat_map(|run| run.split("&&"))
        .filter_map(|command| command.split_once("apt-get install").map(|(_, rest)| rest))
        .flat_map(|rest| rest.split_whitespace())
        .filter(|word| !word.starts_with('-'))
        .map(str::to_string)
        .collect()
}

/// The Debian package that owns `path`, trying the path as given, its
/// canonical form and its /usr-merged twin (/lib/x ↔ /usr/lib/x).
fn owning_package(path: &str) -> Option<String> {
    let mut candidates = vec![path.to_string()];
    if let Ok(canonical) = std::fs::canonicalize(path) {
        candidates.push(canonical.to_string_lossy().into_owned());
    }
    candidates.push(match path.strip_prefix("/usr") {
        Some(rest) => rest.to_string(),
        None => format!("/usr{path}"),
    });
    candidates.into_iter().find_map(|candidate| {
        let out = Command::new("dpkg").args(["-S", &candidate]).output().ok()?;
        if !out.status.success() {
            return None;
        }
        let text = String::from_utf8_lossy(&out.stdout);
        // "libssl3:amd64: /usr/lib/x86_64-linux-gnu/libssl.so.3"
        let owner = text.lines().next()?.split(": ").next()?;
        Some(owner.split(':').next()?.to_string())
    })
}

#[test]
fn runtime_image_installs_exactly_what_the_binary_links_beyond_the_base() {
    // The test build has no `cuda` feature, the image's has: cudarc loads
    // libcuda with dlopen when asked, so the feature adds nothing to ldd.
    let binary = env!("CARGO_BIN_EXE_hintstream");
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .expect("ldd (libc-bin) runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut linked = vec![];
    for line in text.lines() {
        // "libssl.so.3 => /lib/x86_64-linux-gnu/libssl.so.3 (0x...)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x...)"; the vDSO has no file.
        let line = line.trim();
        assert!(!line.contains("not found"), "unresolved library: {line}");
        let path = match line.split_once(" => ") {
            Some((_, rest)) => rest.split_whitespace().next().unwrap_or_default(),
            None => line.split_whitespace().next().unwrap_or_default(),
        };
        if path.starts_with('/') {
            linked.push(path.to_string());
        }
    }
    assert!(linked.len() >= 3, "ldd found too little:\n{text}");

    let mut needed = BTreeSet::new();
    let mut provenance = vec![];
    for path in &linked {
        let package = owning_package(path).unwrap_or_else(|| panic!("no Debian package owns {path}"));
        provenance.push(format!("{path} ({package})"));
        if !BOOKWORM_SLIM.contains(&package.as_str()) {
            needed.insert(package);
        }
    }
    assert!(
        needed.contains("libssl3"),
        "librdkafka links OpenSSL dynamically: {provenance:?}"
    );
    let mut expected = needed.clone();
    expected.extend(RUNTIME_DATA_PACKAGES.iter().map(|s| s.to_string()));
    assert_eq!(
        apt_installed(&runtime_stage()),
        expected,
        "the runtime stage installs exactly what the binary links beyond bookworm-slim, \
         plus {RUNTIME_DATA_PACKAGES:?}; linked: {provenance:#?}"
    );
}

#[test]
fn image_runs_as_an_unprivileged_user() {
    let runtime = runtime_stage();
    let user = runtime.last("USER").expect("the runtime stage sets USER");
    let uid = user.split(':').next().unwrap();
    assert!(
        uid.parse::<u32>().is_ok_and(|n| n >= 1000),
        "USER {user}: a numeric, unprivileged uid (runAsNonRoot can check it)"
    );
    assert!(
        runtime.all("RUN").any(|r| r.contains(&format!("--uid {uid}"))),
        "the runtime stage creates the user {uid}"
    );
}

#[test]
fn dependencies_stay_compiled_across_source_changes() {
    let text = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    assert!(
        text.starts_with("# syntax=docker/dockerfile:1"),
        "BuildKit syntax, for RUN --mount"
    );
    let stages = dockerfile_stages();
    let builder = &stages[0];
    let workdir = builder.last("WORKDIR").unwrap();
    let build = builder
        .all("RUN")
        .find(|r| r.contains("cargo build"))
        .expect("the builder runs cargo build");
    for cache in [
        format!("type=cache,target={workdir}/target"),
        "type=cache,target=/usr/local/cargo/registry".to_string(),
    ] {
        assert!(build.contains(&cache), "cargo build has --mount={cache}: {build}");
    }
}

/// `.dockerignore` semantics (moby/patternmatcher): a path is left out when
/// the last pattern matching it or one of its parent folders is not a `!`
/// exception.
fn in_build_context(path: &str, patterns: &[(bool, String)]) -> bool {
    let segments: Vec<&str> = path.split('/').collect();
    let mut included = true;
    for (exception, pattern) in patterns {
        let pattern: Vec<&str> = pattern.split('/').collect();
        if (1..=segments.len()).any(|n| glob(&pattern, &segments[..n])) {
            included = *exception;
        }
    }
    included
}

/// Matches path segments against pattern segments: `**` spans any number of
/// segments, `*` and `?` stay within one.
fn glob(pattern: &[&str], path: &[&str]) -> bool {
    match (pattern.first(), path.first()) {
        (None, None) => true,
        (Some(&"**"), _) => glob(&pattern[1..], path) || (!path.is_empty() && glob(pattern, &path[1..])),
        (Some(p), Some(s)) => segment_matches(p.as_bytes(), s.as_bytes()) && glob(&pattern[1..], &path[1..]),
        _ => false,
    }
}

fn segment_matches(pattern: &[u8], text: &[u8]) -> bool {
    match (pattern.first(), text.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            segment_matches(&pattern[1..], text) || (!text.is_empty() && segment_matches(pattern, &text[1..]))
        }
        (Some(b'?'), Some(_)) => segment_matches(&pattern[1..], &text[1..]),
        (Some(p), Some(t)) => p == t && segment_matches(&pattern[1..], &text[1..]),
        _ => false,
    }
}

/// The sources of the stage's `COPY` lines that read the build context (not
/// `--from` another stage), with their destinations.
fn context_copies(stage: &Stage) -> Vec<(Vec<String>, String)> {
    stage
        .all("COPY")
        .filter(|args| !args.contains("--from="))
        .map(|args| {
            let mut words: Vec<String> = args
                .split_whitespace()
                .filter(|w| !w.starts_with("--"))
                .map(|w| w.trim_end_matches('/').to_string())
                .collect();
            let dest = words.pop().unwrap();
            (words, dest)
        })
        .collect()
}

#[test]
fn build_context_holds_what_the_dockerfile_copies_and_nothing_else() {
    let ignore = std::fs::read_to_string(root().join(".dockerignore")).expect("a .dockerignore");
    let patterns: Vec<(bool, String)> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match l.strip_prefix('!') {
            Some(p) => (true, p.trim_start_matches('/').to_string()),
            None => (false, l.trim_start_matches('/').to_string()),
        })
        .collect();
    let out = Command::new("git")
        .current_dir(root())
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .output()
        .unwrap();
    let files: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert!(files.len() > 50, "git ls-files listed {} files", files.len());
    let sources: Vec<String> = dockerfile_stages()
        .iter()
        .flat_map(context_copies)
        .flat_map(|(sources, _)| sources)
        .map(|s| s.trim_start_matches("./").to_string())
        .collect();
    let copied = |file: &str| {
        sources
            .iter()
            .any(|s| file == s || file.starts_with(&format!("{s}/")))
    };
    for file in &files {
        assert_eq!(
            in_build_context(file, &patterns),
            copied(file),
            "{file}: in the build context exactly when a COPY reads it"
        );
    }
    for source in &sources {
        assert!(
            files
                .iter()
                .any(|f| f == source || f.starts_with(&format!("{source}/"))),
            "COPY {source}: nothing of the repository is there"
        );
    }
    for kept_out in ["target/release/hintstream", ".git/HEAD", "fuzz/corpus/x", ".env"] {
        assert!(
            !in_build_context(kept_out, &patterns),
            "{kept_out} is in the context"
        );
    }
}

fn copy_into(source: &Path, dest: &Path) {
    if source.is_dir() {
        std::fs::create_dir_all(dest).unwrap();
        for entry in std::fs::read_dir(source).unwrap() {
            let entry = entry.unwrap();
            copy_into(&entry.path(), &dest.join(entry.file_name()));
        }
    } else {
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(source, dest).unwrap();
    }
}

#[test]
fn quickstart_with_the_image_environment_uses_its_embedded_broker() {
    let runtime = runtime_stage();
    // The image's filesystem, as far as the binary reads it, under a folder.
    let image = tempfile::tempdir().unwrap();
    let at = |absolute: &str| -> PathBuf { image.path().join(absolute.trim_start_matches('/')) };
    for (sources, dest) in context_copies(&runtime) {
        for source in sources {
            copy_into(&root().join(&source), &at(&dest));
        }
    }
    let mut entrypoint: Vec<String> =
        serde_json::from_str(runtime.last("ENTRYPOINT").expect("an ENTRYPOINT")).unwrap();
    assert_eq!(entrypoint[0], "hintstream");
    entrypoint[0] = env!("CARGO_BIN_EXE_hintstream").to_string();
    for arg in entrypoint.iter_mut().skip(1) {
        if arg.starts_with('/') && at(arg).exists() {
            *arg = at(arg).to_string_lossy().into_owned();
        }
    }
    let workdir = at(runtime.last("WORKDIR").expect("a WORKDIR"));
    let mut command = Command::new(&entrypoint[0]);
    command
        .args(&entrypoint[1..])
        .arg("quickstart")
        .current_dir(&workdir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin");
    for env in runtime.all("ENV") {
        let (key, value) = env
            .split_once('=')
            .or_else(|| env.split_once(' '))
            .unwrap_or_else(|| panic!("ENV {env}"));
        command.env(key.trim(), value.trim().trim_matches('"'));
    }
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("broker: embedded Kafka-protocol broker"),
        "quickstart in the image dials no broker of its own: {stdout}"
    );
    assert!(stdout.contains("stopped cleanly"), "{stdout}");
}
