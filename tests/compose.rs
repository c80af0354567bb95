//! The docker-compose stack: the file validates with `docker-compose config`
//! (no Docker engine needed), has the services and profiles the README
//! promises, and every metric the Grafana dashboard queries exists.

use std::process::Command;

use prometheus_client::registry::Registry;

fn root() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn compose_file_validates_with_every_profile() {
    let out = Command::new("docker-compose")
        .current_dir(root())
        .args(["--profile", "gpu", "--profile", "ollama", "config"])
        .output()
        .unwrap_or_else(|e| panic!("docker-compose is not installed ({e}); run scripts/setup.sh"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for service in [
        "kafka:",
        "topic-init:",
        "hints:",
        "advantages:",
        "advantages-gpu:",
        "prometheus:",
        "grafana:",
        "ollama:",
    ] {
        assert!(text.contains(&format!("  {service}")), "compose lacks {service}");
    }
    assert!(
        text.contains("driver: nvidia"),
        "the gpu profile reserves an NVIDIA device"
    );
}

#[test]
fn dashboard_queries_only_metrics_the_stages_export() {
    use hintstream::llm::synth::SynthObserver;
    // Labelled families show in the text only once they have a child: give
    // each one, as the running stages do.
    let mut hints = Registry::with_prefix("hintstream_hints");
    hintstream::metrics::StageMetrics::register(&mut hints).dead_lettered("not_json");
    let hint_metrics = hintstream::hints::metrics::HintMetrics::register(&mut hints, (true, true));
    hint_metrics.attempt("m", "ok", std::time::Duration::from_millis(5));
    hint_metrics.retry("m", "http_429");
    hint_metrics.published(hintstream::messages::HintCategory::StaticFallback);
    hint_metrics.synthesized(&hintstream::llm::Synthesis {
        hint: "h".into(),
        category: hintstream::messages::HintCategory::StaticFallback,
        model: None,
        usage: Default::default(),
        cost_usd: 0.0,
        failure_reason: None,
        latency_ms: 1,
    });
    let mut advantages = Registry::with_prefix("hintstream_advantages");
    hintstream::metrics::StageMetrics::register(&mut advantages).dead_lettered("not_json");
    let advantage_metrics = hintstream::advantages::metrics::AdvantageMetrics::register(&mut advantages);
    advantage_metrics.computed("cpu", 0.001);
    advantage_metrics.step_dead_lettered("step_incomplete");
    let exported = format!(
        "{}{}",
        hintstream::metrics::render(&hints),
        hintstream::metrics::render(&advantages)
    );

    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("deploy/grafana/dashboards/hintstream.json")).unwrap(),
    )
    .unwrap();
    let mut checked = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for token in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if !token.starts_with("hintstream_") {
                    continue;
                }
                let base = ["_total", "_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| token.strip_suffix(s))
                    .unwrap_or(token);
                assert!(
                    exported.contains(&format!("# TYPE {base} ")),
                    "dashboard queries {token}, which no stage exports"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 10, "only {checked} metric references checked");
}
