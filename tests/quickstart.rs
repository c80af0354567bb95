//! The README's first command: `hintstream quickstart` runs the whole
//! pipeline on the bundled sample step against the embedded broker and prints
//! a hint per failed group, the step's metrics and the metrics endpoints.

mod common;

use std::process::Command;

fn quickstart(args: &[&str]) -> std::process::Output {
    common::without_llm_env(&mut Command::new(env!("CARGO_BIN_EXE_hintstream")))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("quickstart")
        .args(args)
        .env_remove("HINTSTREAM_BOOTSTRAP_SERVERS")
        .output()
        .unwrap()
}

fn assert_ran_to_the_end(out: &std::process::Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("no API key set"),
        "says plainly that hints are static: {stdout}"
    );
    assert_eq!(
        stdout.matches("  [static_fallback] ").count(),
        20,
        "one hint per failed group: {stdout}"
    );
    for needle in [
        "hint/signal_rescued",
        "hint/hint_success_rate",
        "advantage/extreme_count",
        "/metrics",
        "240 rows",
        "stopped cleanly",
    ] {
        assert!(
            stdout.contains(needle),
            "quick start output lacks {needle}:\n{stdout}"
        );
    }
    // The scored step carries the categories of the hints just produced:
    // static ones here, so no LLM category is counted.
    assert!(stdout.contains("hint/category_static_fallback_count"), "{stdout}");
    assert!(
        !stdout.contains("hint/category_llm_synthesized"),
        "the metrics count categories the hints did not have:\n{stdout}"
    );
}

#[test]
fn quickstart_runs_to_the_end_on_the_embedded_broker() {
    let out = quickstart(&[]);
    assert_ran_to_the_end(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("embedded Kafka-protocol broker"));
}

#[test]
fn quickstart_runs_against_tansu_with_bootstrap_servers() {
    let broker = common::start_tansu();
    let out = quickstart(&["--bootstrap-servers", &broker.bootstrap]);
    assert_ran_to_the_end(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("broker: {}", broker.bootstrap)));
}
