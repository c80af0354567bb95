//! Hints that learn, end to end: the simulated training run
//! (`examples/simulate.rs`) drives the real `hintstream hints` and
//! `hintstream advantages` processes over a real broker with a loopback LLM.
//! Two LLM arms with hidden rescue rates 0.7 and 0.1 and the static control
//! at 0.05, 40 failed groups a step, 15 steps: Thompson sampling moves the
//! pulls to the better arm and every arm keeps its floor; the report renders
//! its arm chart in headless Chromium.
//!
//! Both tests share one run of the simulation (about a minute here).
//!
//! Hints that teach: a leaky arm (hidden rescue rate 0.9, reliance 2 nats a
//! token), a teacher (0.5, 0.1) and the static control (0.05, 0), with the
//! simulated trainer reporting each hinted response's log-probs. Rewarded
//! by rescue, the leaky arm takes the majority; by transfer, the teacher.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use clap::Parser;

use crate::common;

#[path = "../../../examples/simulate.rs"]
#[allow(dead_code)]
mod simulate;

use simulate::{SimArgs, SimReport};

const STEPS: i64 = 15;
const GROUPS: usize = 40;
const MIN_SHARE: f64 = 0.05;

/// One simulated run: its report and output folder.
fn simulate_run(extra: &[&str]) -> (SimReport, PathBuf) {
    let broker = common::shared_kafka();
    let out = tempfile::tempdir().unwrap().keep();
    let mut argv = vec![
        "simulate".to_string(),
        "--bootstrap-servers".into(),
        broker.bootstrap.clone(),
        "--steps".into(),
        STEPS.to_string(),
        "--groups".into(),
        GROUPS.to_string(),
        "--min-share".into(),
        MIN_SHARE.to_string(),
        "--hintstream".into(),
        env!("CARGO_BIN_EXE_hintstream").into(),
        "--out".into(),
        out.display().to_string(),
        "--no-progress".into(),
    ];
    argv.extend(extra.iter().map(|a| a.to_string()));
    let args = SimArgs::parse_from(argv);
    // A runtime of its own: the run outlives any one test's runtime.
    let started = Instant::now();
    let report = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        let result = runtime.block_on(simulate::run(&args));
        drop(broker);
        result
    })
    .join()
    .unwrap()
    .unwrap_or_else(|e| panic!("the simulation failed: {e:#}"));
    println!(
        "simulation {extra:?}: {STEPS} steps of {GROUPS} groups in {:.1} s ({})",
        started.elapsed().as_secs_f64(),
        out.display()
    );
    (report, out)
}

/// The one simulated run of the default arms both first tests read.
fn shared_run() -> &'static (SimReport, PathBuf) {
    static RUN: OnceLock<(SimReport, PathBuf)> = OnceLock::new();
    RUN.get_or_init(|| simulate_run(&[]))
}

/// The arms of hints that teach: a leaky arm (rescues 90%, and the policy
/// relies on it by 2 nats a token), a teacher (50%, 0.1) and the static
/// control (5%, 0).
const TEACHING_ARMS: [&str; 6] = [
    "--arm",
    "leaky=0.9/2.0",
    "--arm",
    "teacher=0.5/0.1",
    "--arm",
    "control=0.05/0:static",
];

/// The teaching arms under `arm_reward`.
fn teaching_run(arm_reward: &'static str) -> SimReport {
    let mut args = TEACHING_ARMS.to_vec();
    args.extend(["--arm-reward", arm_reward]);
    let (report, _) = simulate_run(&args);
    println!("arm_reward = {arm_reward}\n{}", report.table());
    report
}

fn pulls(report: &SimReport, arm: &str, steps: std::ops::RangeInclusive<i64>) -> (u64, u64) {
    let rows = report.steps.iter().filter(|s| steps.contains(&s.step));
    let (mut mine, mut all) = (0, 0);
    for s in rows {
        mine += s.pulls.get(arm).copied().unwrap_or(0);
        all += s.pulls.values().sum::<u64>();
    }
    (mine, all)
}

#[test]
fn thompson_moves_the_pulls_to_the_better_arm_and_every_arm_keeps_its_floor() {
    let (report, _) = shared_run();
    println!("{}", report.table());
    assert_eq!(report.steps.len(), STEPS as usize);
    for s in &report.steps {
        assert_eq!(s.pulls.values().sum::<u64>(), GROUPS as u64, "step {}", s.step);
        assert_eq!(s.outcomes, GROUPS as u64, "one outcome per hint, step {}", s.step);
    }
    // Steps count from 1: step 10 on is the last six steps.
    let (strong, late) = pulls(report, "strong", 10..=STEPS);
    let share = strong as f64 / late as f64;
    assert!(
        share >= 0.8,
        "strong got {strong} of {late} pulls over steps 10-{STEPS} ({:.1}%)",
        share * 100.0
    );
    for arm in ["strong", "weak", "control"] {
        let (mine, all) = pulls(report, arm, 1..=STEPS);
        assert!(
            mine as f64 / all as f64 >= MIN_SHARE,
            "{arm} got {mine} of {all} pulls, under its min_share {MIN_SHARE}"
        );
    }
    // The eval arm table and stage 1's gauges agree on who is better.
    let table = &report.arm_table[0];
    let row = |name: &str| table.arms.iter().find(|a| a.arm == name).unwrap();
    assert!(row("strong").rescue_rate > row("weak").rescue_rate, "{table:?}");
    assert!(row("control").control);
    assert_eq!(table.leader.as_deref(), Some("strong"));
    assert!(
        !table.not_separated.contains(&"weak".to_string()),
        "the strong arm's interval should separate from the weak arm's: {table:?}"
    );
    let gauge = |arm: &str| {
        report
            .prometheus
            .get(&format!("hintstream_hints_arm_posterior_mean{{arm=\"{arm}\"}}"))
            .copied()
            .unwrap_or_else(|| panic!("no posterior mean of {arm}: {:?}", report.prometheus))
    };
    assert!(gauge("strong") > gauge("weak"), "{:?}", report.prometheus);
    assert!(report.llm_requests.get("strong-model").copied().unwrap_or(0) > 0);
}

#[test]
fn the_simulation_report_shows_the_arm_chart_in_chromium() {
    let (report, out) = shared_run();
    let page = out.join("index.html");
    let url = format!("file://{}", page.display());
    let dir = tempfile::tempdir().unwrap();
    let (dom, _) = run_chromium(
        &dir.path().join("profile-dom"),
        &["--dump-dom".into(), url.clone()],
    );
    for id in ["steps", "arms"] {
        assert!(
            dom.contains(&format!("<table id=\"{id}\"")),
            "no table {id} in the DOM"
        );
    }
    let at = dom.find("<figure id=\"plot-arm-shares\"").expect("no arm chart");
    assert!(
        dom[at..]
            .split_once('>')
            .is_some_and(|(_, rest)| rest.starts_with("<svg")),
        "the arm chart is no inline SVG"
    );
    let shot = dir.path().join("report.png");
    let (_, stderr) = run_chromium(
        &dir.path().join("profile-shot"),
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1280,900".into(),
            url,
        ],
    );
    assert!(shot.exists(), "no screenshot: {stderr}");
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (1280, 900));
    let channels = info.color_type.samples();
    let pixels = &buf[..info.buffer_size()];
    for (i, arm) in report.arms.iter().enumerate() {
        let rgb = simulate::arm_color(i);
        let n = pixels
            .chunks(channels)
            .filter(|p| (p[0], p[1], p[2]) == rgb)
            .count();
        assert!(n > 500, "{}'s colour {rgb:?}: {n} pixels", arm.name);
    }
}

fn chromium() -> PathBuf {
    let path = std::env::var_os("CHROMIUM").map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    assert!(
        path.exists(),
        "{} is missing: run scripts/setup.sh (installs Debian's chromium) or set CHROMIUM",
        path.display()
    );
    path
}

/// Headless Chromium as tests/it/hints/eval.rs runs it; (stdout, stderr).
fn run_chromium(profile: &Path, args: &[String]) -> (String, String) {
    std::fs::create_dir_all(profile).unwrap();
    let (out, err) = (profile.join("stdout"), profile.join("stderr"));
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            panic!("chromium did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let read = |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    (read(&out), read(&err))
}

fn share(report: &SimReport, arm: &str, steps: std::ops::RangeInclusive<i64>) -> f64 {
    let (mine, all) = pulls(report, arm, steps);
    mine as f64 / all as f64
}

#[test]
fn rewarded_by_transfer_the_teaching_arm_takes_the_pulls_from_the_leaky_one() {
    let report = teaching_run("transfer");
    let (teacher, leaky) = (
        share(&report, "teacher", 10..=STEPS),
        share(&report, "leaky", 10..=STEPS),
    );
    assert!(
        teacher >= 0.75,
        "teacher got {:.1}% of steps 10-{STEPS}",
        teacher * 100.0
    );
    assert!(
        leaky <= 0.15,
        "leaky got {:.1}% of steps 10-{STEPS}",
        leaky * 100.0
    );
    // Stage 2's transfer per outcome: the teacher's policy keeps more.
    let late = &report.steps[STEPS as usize - 1];
    assert!(
        late.transfer["teacher"] > late.transfer.get("leaky").copied().unwrap_or(0.0),
        "{late:?}"
    );
    // The step metrics, the eval arm table and stage 1's gauges say so too.
    assert!(
        late.metrics.contains_key("hint/transfer_rate"),
        "{:?}",
        late.metrics
    );
    assert!(late.metrics.contains_key("hint/reliance"), "{:?}", late.metrics);
    let table = &report.arm_table[0];
    let row = |name: &str| table.arms.iter().find(|a| a.arm == name).unwrap();
    assert_eq!(table.leader.as_deref(), Some("teacher"), "{table:?}");
    assert!(row("leaky").rescue_rate > row("teacher").rescue_rate, "{table:?}");
    let (leaky_reliance, teacher_reliance) =
        (row("leaky").reliance.unwrap(), row("teacher").reliance.unwrap());
    assert!(
        (leaky_reliance - 2.0).abs() < 1e-9 && (teacher_reliance - 0.1).abs() < 1e-9,
        "{table:?}"
    );
    let gauge = |name: &str, arm: &str| {
        report
            .prometheus
            .get(&format!("hintstream_hints_arm_{name}{{arm=\"{arm}\"}}"))
            .copied()
            .unwrap_or_else(|| panic!("no {name} of {arm}: {:?}", report.prometheus))
    };
    assert!(gauge("transfer_rate", "teacher") > gauge("transfer_rate", "leaky"));
    assert!(gauge("posterior_mean", "teacher") > gauge("posterior_mean", "leaky"));
}

#[test]
fn rewarded_by_rescue_the_leaky_arm_takes_the_majority() {
    let report = teaching_run("rescue");
    let leaky = share(&report, "leaky", 10..=STEPS);
    assert!(leaky > 0.5, "leaky got {:.1}% of steps 10-{STEPS}", leaky * 100.0);
    assert_eq!(report.arm_table[0].leader.as_deref(), Some("leaky"));
}
