//! The binary's surface: help, effective config with secrets redacted, and
//! exit code 2 with a helpful message for bad configuration.

use std::process::Command;

fn hintstream() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hintstream"));
    cmd.current_dir(std::env::temp_dir());
    cmd.env_remove("HINTSTREAM_BOOTSTRAP_SERVERS");
    cmd
}

#[test]
fn config_layers_file_env_and_flags_and_redacts_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("h.toml");
    std::fs::write(
        &file,
        "[kafka]\n\"sasl.password\" = \"s3cret-value\"\n\"security.protocol\" = \"sasl_ssl\"\n[hints]\nmax_in_flight = 12\n",
    )
    .unwrap();
    let out = hintstream()
        .args(["config", "--config"])
        .arg(&file)
        .args(["--bootstrap-servers", "flag-host:9092"])
        .env("HINTSTREAM_HINTS__GROUP_ID", "env-group")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let config: toml::Value = toml::from_str(&text).unwrap();
    assert_eq!(config["bootstrap_servers"].as_str(), Some("flag-host:9092"));
    assert_eq!(config["hints"]["group_id"].as_str(), Some("env-group"));
    assert_eq!(config["hints"]["max_in_flight"].as_integer(), Some(12));
    assert_eq!(config["kafka"]["security.protocol"].as_str(), Some("sasl_ssl"));
    assert!(!text.contains("s3cret-value"));
}

#[test]
fn bad_config_exits_2_saying_what_to_fix() {
    let out = hintstream()
        .args(["config"])
        .env("HINTSTREAM_HINTS__MAX_IN_FLIGHT", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("hints.max_in_flight"), "{err}");

    let out = hintstream()
        .args(["config", "--config", "/nonexistent.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));

    let out = hintstream().args(["no-such-command"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));

    // Chunks larger than the producer takes: says which setting to raise.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("h.toml");
    std::fs::write(
        &file,
        "[kafka]\n\"message.max.bytes\" = \"500000\"\n[advantages]\nmax_message_bytes = 600000\n",
    )
    .unwrap();
    let out = hintstream()
        .args(["advantages", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("advantages.max_message_bytes = 600000")
            && err.contains("raise kafka.\"message.max.bytes\""),
        "{err}"
    );
    let out = hintstream()
        .args(["config"])
        .env("HINTSTREAM_ADVANTAGES__MAX_MESSAGE_BYTES", "1000")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 65536"));
}

#[test]
fn a_dollar_budget_with_an_unpriced_reachable_model_exits_2_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "[llm]\nbudget_usd_per_hour = 0.5\n[[hints.arms]]\nname = \"cheap\"\nmodels = [\"my-local-model\"]\n",
            "my-local-model",
        ),
        (
            "[llm]\nbudget_usd_per_hour = 0.5\nallowed_models = [\"gpt-4o-mini\", \"unpriced-allowed\"]\n",
            "unpriced-allowed",
        ),
    ];
    for (i, (toml, model)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("h{i}.toml"));
        std::fs::write(&file, toml).unwrap();
        let out = hintstream()
            .args(["hints", "--config"])
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(model) && err.contains(&format!("llm.prices.\"{model}\"")),
            "names the model and the key to set: {err}"
        );
    }
    // Priced, the same arm passes the check (`config` validates and prints).
    let file = dir.path().join("priced.toml");
    std::fs::write(
        &file,
        "[llm]\nbudget_usd_per_hour = 0.5\n[llm.prices.my-local-model]\ninput_per_mtok = 0.1\noutput_per_mtok = 0.2\n[[hints.arms]]\nname = \"cheap\"\nmodels = [\"my-local-model\"]\n",
    )
    .unwrap();
    let out = hintstream()
        .args(["config", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_worker_thread_count_the_runtime_cannot_use_exits_2_naming_it() {
    for bad in ["0", "four", "-1", ""] {
        let out = hintstream()
            .arg("config")
            .env("TOKIO_WORKER_THREADS", bad)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
        assert!(
            err.contains("TOKIO_WORKER_THREADS must be a whole number above 0"),
            "{bad:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{bad:?}: {err}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let out = hintstream()
            .arg("config")
            .env("TOKIO_WORKER_THREADS", std::ffi::OsStr::from_bytes(b"\xff"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "not unicode: {err}");
        assert!(err.contains("TOKIO_WORKER_THREADS must be"), "not unicode: {err}");
    }
    let out = hintstream()
        .arg("config")
        .env("TOKIO_WORKER_THREADS", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn help_explains_layering_and_exit_codes() {
    let out = hintstream().arg("--help").output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "HINTSTREAM_<SECTION>__<KEY>",
        "TOKIO_WORKER_THREADS",
        "Exit codes",
        "record",
        "replay",
        "topics",
    ] {
        assert!(text.contains(needle), "--help lacks {needle}:\n{text}");
    }
}

#[test]
fn example_config_file_loads_and_equals_the_defaults() {
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("hintstream.example.toml");
    let from_file = hintstream()
        .arg("config")
        .arg("--config")
        .arg(&example)
        .output()
        .unwrap();
    assert!(
        from_file.status.success(),
        "{}",
        String::from_utf8_lossy(&from_file.stderr)
    );
    let defaults = hintstream().arg("config").output().unwrap();
    assert_eq!(
        String::from_utf8(from_file.stdout).unwrap(),
        String::from_utf8(defaults.stdout).unwrap()
    );
}

#[test]
fn only_eval_takes_several_configs() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.toml"), dir.path().join("b.toml"));
    std::fs::write(&a, "[llm]\nconcurrency = 3\n").unwrap();
    std::fs::write(&b, "[llm]\nconcurrency = 0\n").unwrap();
    let out = hintstream()
        .args(["config", "--config"])
        .arg(&a)
        .arg("--config")
        .arg(&a)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("only `eval`"));
    // eval layers each file on its own: the bad one is named.
    let out = hintstream()
        .args(["eval", "--input", "missing.jsonl", "--out"])
        .arg(dir.path().join("out"))
        .arg("--config")
        .arg(&a)
        .arg("--config")
        .arg(&b)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("concurrency"), "{stderr}");
    let help = hintstream().args(["eval", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--playback") && help.contains("cassette"), "{help}");
}
