//! The docker-compose stack, checked without a Docker engine: the file
//! validates with `docker-compose config` under every profile combination and
//! each profile runs one stage-1 and one stage-2 service; ports stay on
//! loopback, and the stages' metrics ports inside the compose network; LLM
//! keys reach stage 1 alone; Kafka keeps its data in a volume; healthchecks
//! probe the endpoints the stages serve on their metrics ports;
//! every stage's environment is a valid hintstream config; every dashboard and
//! alert query uses only metrics the stages export; the alert rules pass
//! promtool and their scenarios; the book's panel table (docs/deployment.md) is the dashboard's.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use prometheus_client::registry::Registry;
use serde_json::Value;

/// The profiles of docker-compose.yml. Each is a whole stack.
const PROFILES: [&str; 4] = ["cpu", "gpu", "ollama", "ollama-gpu"];

/// Paths the healthchecks may probe: liveness and readiness, served on each
/// stage's metrics port.
const HEALTH_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// Metric names the dashboard or alerts may use before the stages export
/// them (none now). Once a name is exported, the test fails until it is
/// removed from here, so the list cannot go stale.
const AWAITING_RUST_SIDE: [&str; 0] = [];

/// Variables docker-compose.yml reads from the caller's environment: removed
/// from every `docker-compose config` run, so the tests see the stack's own
/// defaults whatever the shell that runs them.
const STACK_VARIABLES: [&str; 10] = [
    "COMPOSE_PROFILES",
    "GRAFANA_ADMIN_PASSWORD",
    "STACK_PUBLISH_ADDR",
    "OLLAMA_MODEL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "RUST_LOG",
    "HINTSTREAM_BOOTSTRAP_SERVERS",
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The Python that runs docker-compose (v1 is a Python program built on
/// PyYAML), so that the tests read YAML without a YAML crate.
fn compose_python() -> String {
    let out = Command::new("sh")
        .args(["-c", "command -v docker-compose"])
        .output()
        .unwrap();
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        !path.is_empty(),
        "docker-compose is not installed; run scripts/setup.sh"
    );
    let script = std::fs::read(&path).unwrap_or_default();
    let first = script.split(|b| *b == b'\n').next().unwrap_or_default();
    String::from_utf8_lossy(first)
        .strip_prefix("#!")
        .and_then(|s| s.split_whitespace().next())
        .map_or_else(|| "python3".to_string(), str::to_string)
}

fn yaml_to_json(yaml: &str) -> Value {
    let mut child = Command::new(compose_python())
        .args([
            "-c",
            "import sys, json, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(yaml.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "PyYAML (python3-yaml, a docker-compose dependency) could not read YAML: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn yaml_file(path: &str) -> Value {
    yaml_to_json(&read(path))
}

/// `docker-compose [--profile P]... config` with `env` set, parsed.
fn compose_config(profiles: &[&str], env: &[(&str, &str)]) -> Value {
    let mut command = Command::new("docker-compose");
    command.current_dir(root());
    for var in STACK_VARIABLES {
        command.env_remove(var);
    }
    command.envs(env.iter().copied());
    for profile in profiles {
        command.args(["--profile", profile]);
    }
    let out = command
        .arg("config")
        .output()
        .unwrap_or_else(|e| panic!("docker-compose is not installed ({e}); run scripts/setup.sh"));
    assert!(
        out.status.success(),
        "docker-compose {profiles:?} config: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_to_json(&String::from_utf8_lossy(&out.stdout))
}

/// COMPOSE_PROFILES as `.env` sets it.
fn dot_env_profiles() -> Vec<String> {
    read(".env")
        .lines()
        .find_map(|l| l.trim().strip_prefix("COMPOSE_PROFILES="))
        .map(|v| v.split(',').map(|p| p.trim().to_string()).collect())
        .unwrap_or_default()
}

/// The services `docker compose up` starts with these `--profile` flags:
/// those without profiles, and those with a profile of the active set, which
/// is the flags or, when there are none, COMPOSE_PROFILES from `.env` (a
/// flag replaces that default in Compose v1 and v2 alike).
fn active_services<'a>(config: &'a Value, flags: &[&str]) -> BTreeMap<&'a str, &'a Value> {
    let active: Vec<String> = if flags.is_empty() {
        dot_env_profiles()
    } else {
        flags.iter().map(|s| s.to_string()).collect()
    };
    config["services"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, s)| match s["profiles"].as_array() {
            None => true,
            Some(p) => p.iter().any(|p| active.iter().any(|a| p == a)),
        })
        .map(|(name, s)| (name.as_str(), s))
        .collect()
}

/// `hints` or `advantages` for a service that runs a stage.
fn stage_of(service: &Value) -> Option<&str> {
    match service["command"][0].as_str() {
        Some(stage @ ("hints" | "advantages")) => Some(stage),
        _ => None,
    }
}

fn stages<'a>(services: &BTreeMap<&'a str, &'a Value>, stage: &str) -> Vec<&'a str> {
    services
        .iter()
        .filter(|(_, s)| stage_of(s) == Some(stage))
        .map(|(name, _)| *name)
        .collect()
}

fn env<'a>(service: &'a Value, key: &str) -> Option<&'a str> {
    service["environment"][key].as_str()
}

fn reserves_gpu(service: &Value) -> bool {
    service["deploy"]["resources"]["reservations"]["devices"]
        .as_array()
        .is_some_and(|d| d.iter().any(|d| d["driver"] == "nvidia"))
}

/// The port of a stage's `--metrics-addr HOST:PORT`.
fn metrics_port(service: &Value) -> Option<String> {
    let args: Vec<&str> = service["command"]
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let addr = args.windows(2).find(|w| w[0] == "--metrics-addr")?[1];
    Some(addr.rsplit_once(':')?.1.to_string())
}

#[test]
fn every_profile_combination_validates_and_each_profile_runs_one_stage_of_each() {
    let out = Command::new("docker-compose")
        .current_dir(root())
        .args(["config", "--profiles"])
        .output()
        .unwrap_or_else(|e| panic!("docker-compose is not installed ({e}); run scripts/setup.sh"));
    let declared: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(
        declared,
        PROFILES.iter().map(|s| s.to_string()).collect(),
        "the profiles the book documents (docs/deployment.md)"
    );
    assert_eq!(dot_env_profiles(), ["cpu"], ".env makes cpu the default");

    for mask in 0u32..(1 << PROFILES.len()) {
        let flags: Vec<&str> = (0..PROFILES.len())
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| PROFILES[i])
            .collect();
        let config = compose_config(&flags, &[]);
        if flags.len() > 1 {
            continue; // valid, and documented as "pick one"
        }
        let services = active_services(&config, &flags);
        let hints = stages(&services, "hints");
        let advantages = stages(&services, "advantages");
        assert_eq!(hints.len(), 1, "{flags:?}: stage-1 services {hints:?}");
        assert_eq!(advantages.len(), 1, "{flags:?}: stage-2 services {advantages:?}");
        for name in hints.iter().chain(&advantages) {
            let s = services[name];
            let args = s["command"].to_string();
            assert!(
                !args.contains("--group-id") && !s["environment"].to_string().contains("GROUP_ID"),
                "{name} keeps the default consumer group of its stage"
            );
        }
        for name in ["kafka", "topic-init", "prometheus", "grafana"] {
            assert!(services.contains_key(name), "{flags:?} lacks {name}");
        }
        // `docker compose up --wait` counts a one-shot's exit 0 as success
        // only when a running service waits for it to complete.
        for (one_shot, _) in services.iter().filter(|(_, s)| s["restart"] == "no") {
            assert!(
                services.values().any(|s| {
                    s["restart"] != "no"
                        && s["depends_on"][one_shot]["condition"] == "service_completed_successfully"
                }),
                "{flags:?}: no running service waits for the one-shot {one_shot}"
            );
        }

        let profile = flags.first().copied().unwrap_or("cpu");
        let stage2 = services[advantages[0]];
        let gpu = profile.contains("gpu");
        assert_eq!(reserves_gpu(stage2), gpu, "{profile}: {}", advantages[0]);
        assert_eq!(
            env(stage2, "HINTSTREAM_NORMALIZE__DEVICE"),
            Some(if gpu { "auto" } else { "cpu" }),
            "{profile}: {}",
            advantages[0]
        );

        let ollama = profile.starts_with("ollama");
        assert_eq!(services.contains_key("ollama"), ollama, "{profile}");
        assert_eq!(services.contains_key("ollama-pull"), ollama, "{profile}");
        let stage1 = services[hints[0]];
        if ollama {
            let pulled = services["ollama-pull"]["command"][1].as_str().unwrap();
            assert_eq!(services["ollama-pull"]["command"][0], "pull");
            assert_eq!(env(stage1, "HINTSTREAM_LLM__PROVIDER"), Some("openai"));
            assert_eq!(
                env(stage1, "HINTSTREAM_LLM__MODELS"),
                Some(format!("[{pulled}]").as_str()),
                "{profile}: hints ask the model ollama-pull pulls"
            );
            assert_eq!(env(stage1, "OPENAI_BASE_URL"), Some("http://ollama:11434/v1"));
            assert_eq!(
                stage1["depends_on"]["ollama-pull"]["condition"],
                "service_completed_successfully"
            );
        } else {
            assert_eq!(env(stage1, "HINTSTREAM_LLM__PROVIDER"), None, "{profile}");
        }
    }
}

#[test]
fn published_ports_bind_to_loopback_unless_told_otherwise() {
    let ports = |config: &Value| -> Vec<String> {
        config["services"]
            .as_object()
            .unwrap()
            .values()
            .filter_map(|s| s["ports"].as_array())
            .flatten()
            .map(|p| p.as_str().unwrap().to_string())
            .collect()
    };
    let default = ports(&compose_config(&["ollama-gpu", "cpu"], &[]));
    assert_eq!(
        default.len(),
        4,
        "kafka, prometheus, grafana, ollama: {default:?}"
    );
    for port in &default {
        assert!(
            port.starts_with("127.0.0.1:"),
            "{port} is published beyond loopback"
        );
    }
    let open = ports(&compose_config(
        &["ollama-gpu", "cpu"],
        &[("STACK_PUBLISH_ADDR", "0.0.0.0")],
    ));
    assert!(open.iter().all(|p| p.starts_with("0.0.0.0:")), "{open:?}");
}

#[test]
fn stage_metrics_ports_stay_inside_the_compose_network() {
    let scraped = read("deploy/prometheus/prometheus.yml");
    for publish in ["127.0.0.1", "0.0.0.0"] {
        let config = compose_config(&PROFILES, &[("STACK_PUBLISH_ADDR", publish)]);
        let mut stages = 0;
        for (name, service) in config["services"].as_object().unwrap() {
            if stage_of(service).is_none() {
                continue;
            }
            stages += 1;
            assert!(
                service["ports"].as_array().is_none_or(|p| p.is_empty()),
                "{name} publishes {} on the host",
                service["ports"]
            );
            let port = metrics_port(service).unwrap_or_else(|| panic!("{name} sets no --metrics-addr"));
            let exposed: Vec<String> = service["expose"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| p.as_str().map_or_else(|| p.to_string(), str::to_string))
                .collect();
            assert_eq!(
                exposed,
                std::slice::from_ref(&port),
                "{name} exposes its metrics port to the network alone"
            );
            assert!(
                scraped.contains(&format!("port: {port}")),
                "Prometheus scrapes {name}'s port {port}"
            );
        }
        assert_eq!(stages, 4, "hints, hints-ollama, advantages, advantages-gpu");
    }
}

#[test]
fn llm_keys_reach_stage_one_only() {
    let keys = [
        ("ANTHROPIC_API_KEY", "sk-ant-test"),
        ("OPENAI_API_KEY", "sk-test"),
    ];
    let config = compose_config(&["cpu", "ollama-gpu"], &keys);
    for (name, service) in config["services"].as_object().unwrap() {
        let environment = service["environment"].to_string();
        for (key, value) in keys {
            let has = environment.contains(key) || environment.contains(value);
            if name == "hints" {
                assert_eq!(env(service, key), Some(value), "hints gets {key}");
            } else {
                assert!(!has, "{name} gets {key}, which only stage 1 needs");
            }
        }
    }
}

#[test]
fn kafka_keeps_its_data_in_a_named_volume() {
    let config = compose_config(&[], &[]);
    let kafka = &config["services"]["kafka"];
    let log_dirs = env(kafka, "KAFKA_LOG_DIRS").expect("KAFKA_LOG_DIRS is set");
    let mounts: Vec<&str> = kafka["volumes"]
        .as_array()
        .expect("kafka has volumes")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let volume = mounts
        .iter()
        .find_map(|m| {
            let mut parts = m.split(':');
            let (source, target) = (parts.next()?, parts.next()?);
            (target == log_dirs).then_some(source)
        })
        .unwrap_or_else(|| panic!("nothing is mounted at {log_dirs}: {mounts:?}"));
    assert!(
        config["volumes"].get(volume).is_some(),
        "{volume} is a named volume of the stack"
    );
    let id = env(kafka, "CLUSTER_ID").expect("a fixed CLUSTER_ID, so the volume's log dirs match it");
    assert_eq!(id.len(), 22, "a KRaft cluster id is 22 base64url characters");
}

/// The stack's broker is the Apache Kafka the tests run on: the image tag,
/// `KAFKA_VERSION` of scripts/kafka.sh and the pom's `kafka.version` agree.
#[test]
fn kafka_runs_the_version_the_tests_run() {
    let config = compose_config(&[], &[]);
    let image = config["services"]["kafka"]["image"]
        .as_str()
        .expect("kafka has an image");
    let tag = image
        .strip_prefix("apache/kafka:")
        .unwrap_or_else(|| panic!("{image} is not apache/kafka"));
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = std::fs::read_to_string(root.join("scripts/kafka.sh")).unwrap();
    let script_version = script
        .lines()
        .find_map(|l| l.strip_prefix("KAFKA_VERSION="))
        .expect("KAFKA_VERSION= in scripts/kafka.sh");
    let pom = std::fs::read_to_string(root.join("scripts/kafka/pom.xml")).unwrap();
    let pom_version = pom
        .split("<kafka.version>")
        .nth(1)
        .and_then(|rest| rest.split("</kafka.version>").next())
        .expect("<kafka.version> in scripts/kafka/pom.xml");
    assert_eq!(tag, script_version, "docker-compose.yml against scripts/kafka.sh");
    assert_eq!(
        pom_version, script_version,
        "scripts/kafka/pom.xml against scripts/kafka.sh"
    );
}

#[test]
fn grafana_admin_password_comes_from_the_environment() {
    let password = |env: &[(&str, &str)]| {
        compose_config(&[], env)["services"]["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(password(&[]), "change-me");
    assert_eq!(password(&[("GRAFANA_ADMIN_PASSWORD", "s3cret")]), "s3cret");
    let chapter = read("docs/deployment.md");
    assert!(
        chapter.contains("GRAFANA_ADMIN_PASSWORD") && chapter.contains("change-me"),
        "docs/deployment.md documents the default password as one to change"
    );
}

#[test]
fn healthchecks_probe_health_endpoints_on_each_stage_metrics_port() {
    let config = compose_config(&PROFILES, &[]);
    let services = config["services"].as_object().unwrap();
    let mut probed = 0;
    for (name, service) in services {
        if stage_of(service).is_none() {
            continue;
        }
        let test: Vec<&str> = service["healthcheck"]["test"]
            .as_array()
            .unwrap_or_else(|| panic!("{name} has no healthcheck"))
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let port = metrics_port(service).unwrap_or_else(|| panic!("{name} sets no --metrics-addr"));
        assert_eq!(test.len(), 4, "{name}: {test:?}");
        assert_eq!(&test[..2], ["CMD", "hintstream-probe"], "{name}");
        assert_eq!(test[2], port, "{name} probes its metrics port");
        assert!(HEALTH_PATHS.contains(&test[3]), "{name} probes {}", test[3]);
        assert_eq!(
            service["depends_on"]["topic-init"]["condition"], "service_completed_successfully",
            "{name} starts once its topics exist"
        );
        probed += 1;
    }
    assert_eq!(probed, 4, "hints, hints-ollama, advantages, advantages-gpu");

    assert_eq!(
        services["topic-init"]["depends_on"]["kafka"]["condition"],
        "service_healthy"
    );
    assert_eq!(
        services["ollama-pull"]["depends_on"]["ollama"]["condition"],
        "service_healthy"
    );
    for (name, service) in services {
        for (dependency, how) in service["depends_on"].as_object().into_iter().flatten() {
            if how["condition"] == "service_healthy" {
                assert!(
                    services[dependency]["healthcheck"]["test"].is_array(),
                    "{name} waits for {dependency} to be healthy, which has no healthcheck"
                );
            }
        }
    }
    assert!(
        read("Dockerfile").contains("deploy/hintstream-probe /usr/local/bin/hintstream-probe"),
        "the image has the probe on PATH"
    );
}

/// Runs deploy/hintstream-probe as a healthcheck does.
fn probe(port: u16, path: &str) -> bool {
    Command::new("bash")
        .arg(root().join("deploy/hintstream-probe"))
        .args([&port.to_string(), path])
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_probe_passes_on_200_and_fails_on_any_other_answer_or_none() {
    let registry = std::sync::Arc::new(Registry::with_prefix("hintstream_test"));
    let addr = hintstream::health::serve("127.0.0.1:0".parse().unwrap(), registry)
        .await
        .unwrap();
    let port = addr.port();
    let (ok, missing) =
        tokio::task::spawn_blocking(move || (probe(port, "/metrics"), probe(port, "/no-such-path")))
            .await
            .unwrap();
    assert!(ok, "200 on /metrics passes");
    assert!(!missing, "404 fails");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    assert!(
        !tokio::task::spawn_blocking(move || probe(closed_port, "/readyz"))
            .await
            .unwrap(),
        "nothing listening fails"
    );
}

#[test]
fn every_hintstream_service_environment_is_a_valid_config() {
    for profile in PROFILES {
        let config = compose_config(&[profile], &[]);
        for (name, service) in active_services(&config, &[profile]) {
            if service["image"] != "hintstream:local" {
                continue;
            }
            // The image's entrypoint reads this file (Dockerfile).
            let mut command = Command::new(env!("CARGO_BIN_EXE_hintstream"));
            command
                .current_dir(root())
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .args(["--config", "hintstream.example.toml", "config"]);
            for (key, value) in service["environment"].as_object().into_iter().flatten() {
                let value = match value {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                command.env(key, value);
            }
            let out = command.output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{profile}/{name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                text.contains("bootstrap_servers = \"kafka:9092\""),
                "{profile}/{name}: {text}"
            );
            if name == "hints-ollama" {
                for line in [
                    "provider = \"openai\"",
                    "models = [\"qwen2.5:0.5b\"]",
                    "timeout_secs = 120.0",
                ] {
                    assert!(text.contains(line), "{profile}/{name} lacks {line}:\n{text}");
                }
            }
        }
    }
}

/// The text the stages' registries render, every labelled family with a
/// child, as the running stages have.
fn exported_metrics() -> String {
    use hintstream::llm::synth::SynthObserver;
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
        hint_truncated: false,
        cache_saved_usd: 0.0,
        hedged: false,
    });
    let arms = hintstream::hints::learning::ArmMetrics::register(&mut hints);
    arms.show(
        &hintstream::learn::RunReport {
            arms: vec![hintstream::learn::ArmReport {
                name: "a".into(),
                pulls: 1,
                leaks: 0,
                trials: 1,
                rescues: 1,
                rescue_rate: Some(1.0),
                transfer_rate: Some(0.5),
                transfer: Default::default(),
                reliance: Default::default(),
                posterior_mean: 0.6,
                spend_usd: 0.01,
                cost_per_rescue_usd: Some(0.01),
            }],
            refined_rescue_rate: None,
            fresh_rescue_rate: None,
            cost_per_rescue_usd: None,
        },
        1,
    );
    hintstream::hints::ledger::LedgerMetrics::register(&mut hints, true);
    let mut advantages = Registry::with_prefix("hintstream_advantages");
    hintstream::metrics::StageMetrics::register(&mut advantages).dead_lettered("not_json");
    let advantage_metrics = hintstream::advantages::metrics::AdvantageMetrics::register(&mut advantages);
    advantage_metrics.computed("cpu", 0.001);
    advantage_metrics.step_dead_lettered("step_incomplete");
    format!(
        "{}{}",
        hintstream::metrics::render(&hints),
        hintstream::metrics::render(&advantages)
    )
}

/// Checks every `hintstream_*` name in `expr` against `exported`: the family
/// exists, and the suffix fits its type (`_total` on counters, `_bucket`,
/// `_sum` or `_count` on histograms, none on gauges). Returns the names.
fn check_expr(expr: &str, exported: &str, what: &str) -> Vec<String> {
    let mut names = vec![];
    for token in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if !token.starts_with("hintstream_") {
            continue;
        }
        names.push(token.to_string());
        if AWAITING_RUST_SIDE.contains(&token) {
            continue;
        }
        let (base, suffix) = ["_total", "_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| token.strip_suffix(s).map(|b| (b, *s)))
            .unwrap_or((token, ""));
        let kind = exported
            .lines()
            .find_map(|l| l.strip_prefix(&format!("# TYPE {base} ")))
            .or_else(|| {
                exported
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("# TYPE {token} ")))
                    .filter(|k| *k == "gauge")
            })
            .unwrap_or_else(|| panic!("{what} queries {token}, which no stage exports"));
        let fits = match kind {
            "counter" => suffix == "_total",
            "histogram" => ["_bucket", "_sum", "_count"].contains(&suffix),
            _ => exported.contains(&format!("# TYPE {token} ")),
        };
        assert!(fits, "{what} queries {token}, but {base} is a {kind}");
    }
    names
}

#[test]
fn dashboard_and_alert_queries_use_only_exported_metrics() {
    let exported = exported_metrics();
    for name in AWAITING_RUST_SIDE {
        assert!(
            !exported.contains(&format!("# TYPE {name} ")),
            "{name} is exported now: remove it from AWAITING_RUST_SIDE in tests/it/deploy/compose.rs"
        );
    }
    let mut seen = BTreeSet::new();
    let dashboard: Value = serde_json::from_str(&read("deploy/grafana/dashboards/hintstream.json")).unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap();
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            seen.extend(check_expr(expr, &exported, &format!("dashboard panel {title:?}")));
        }
    }
    let dashboard_names = seen.len();
    assert!(
        dashboard_names >= 18,
        "only {dashboard_names} metric names on the dashboard"
    );
    for rule in alert_rules() {
        let name = rule["alert"].as_str().unwrap();
        seen.extend(check_expr(
            rule["expr"].as_str().unwrap(),
            &exported,
            &format!("alert {name}"),
        ));
    }
    for name in [
        "hintstream_hints_llm_retries_total",
        "hintstream_hints_groups_open",
        "hintstream_advantages_pending_steps",
        "hintstream_advantages_compute_seconds_bucket",
        "hintstream_hints_llm_budget_remaining_usd",
        "hintstream_hints_llm_budget_remaining_tokens",
        "hintstream_hints_dead_letters_total",
        "hintstream_advantages_dead_letters_total",
        "hintstream_hints_consumer_lag",
        "hintstream_advantages_consumer_lag",
        "hintstream_hints_ready",
        "hintstream_advantages_ready",
    ] {
        assert!(seen.contains(name), "nothing queries {name}");
    }
}

fn alert_rules() -> Vec<Value> {
    yaml_file("deploy/prometheus/alerts.yml")["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .collect()
}

fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .current_dir(root().join("deploy/prometheus"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("promtool is not installed ({e}); run scripts/setup.sh"));
    assert!(
        out.status.success(),
        "promtool {args:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn alert_rules_pass_promtool_and_their_scenarios_and_prometheus_loads_them() {
    promtool(&["check", "rules", "alerts.yml"]);
    promtool(&["test", "rules", "alerts.test.yml"]);
    promtool(&["check", "config", "prometheus.yml"]);
    let prometheus = yaml_file("deploy/prometheus/prometheus.yml");
    assert_eq!(prometheus["rule_files"], serde_json::json!(["alerts.yml"]));
    let config = compose_config(&[], &[]);
    let mounts = config["services"]["prometheus"]["volumes"].to_string();
    assert!(
        mounts.contains("deploy/prometheus:/etc/prometheus:ro"),
        "compose mounts prometheus.yml and alerts.yml together: {mounts}"
    );

    let alerts: BTreeSet<String> = alert_rules()
        .iter()
        .map(|r| r["alert"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        alerts,
        [
            "HintstreamLlmFallbackShareHigh",
            "HintstreamConsumerLagGrowing",
            "HintstreamDeadLetters",
            "HintstreamStageNotReady"
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    );
    let chapter = read("docs/deployment.md");
    for alert in &alerts {
        assert!(
            chapter.contains(alert.as_str()),
            "docs/deployment.md lists {alert}"
        );
    }
}

const TABLE_START: &str =
    "<!-- dashboard-panels: generated from deploy/grafana/dashboards/hintstream.json by tests/it/deploy/compose.rs -->";
const TABLE_END: &str = "<!-- /dashboard-panels -->";

/// The book's table of the dashboard's panels (docs/deployment.md): panel, queries, what it tells.
fn panel_table(dashboard: &Value) -> String {
    let cell = |s: &str| s.replace('|', "\\|");
    let mut table = String::from("| panel | query | what it tells |\n|---|---|---|\n");
    for panel in dashboard["panels"].as_array().unwrap() {
        let queries: Vec<String> = panel["targets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| format!("`{}`", cell(t["expr"].as_str().unwrap())))
            .collect();
        let description = panel["description"]
            .as_str()
            .unwrap_or_else(|| panic!("panel {} has no description", panel["title"]));
        table.push_str(&format!(
            "| {} | {} | {} |\n",
            cell(panel["title"].as_str().unwrap()),
            queries.join("<br>"),
            cell(description)
        ));
    }
    table
}

#[test]
fn book_panel_table_is_the_dashboard() {
    let dashboard: Value = serde_json::from_str(&read("deploy/grafana/dashboards/hintstream.json")).unwrap();
    let expected = panel_table(&dashboard);
    let chapter = read("docs/deployment.md");
    let start = chapter
        .find(TABLE_START)
        .expect("docs/deployment.md has the panel table's start marker")
        + TABLE_START.len();
    let end = start
        + chapter[start..]
            .find(TABLE_END)
            .expect("docs/deployment.md has the panel table's end marker");
    let current = chapter[start..end].trim_matches('\n');
    if current != expected.trim_end() {
        if std::env::var_os("UPDATE_BOOK").is_some() {
            let updated = format!("{}\n{}{}", &chapter[..start], expected, &chapter[end..]);
            std::fs::write(root().join("docs/deployment.md"), updated).unwrap();
            return;
        }
        panic!(
            "docs/deployment.md's panel table differs from the dashboard; \
             `UPDATE_BOOK=1 cargo test --test it deploy::compose::book` rewrites it as:\n{expected}"
        );
    }
}
