//! Criterion benches of stage 1's own work on one static hint (issue 34),
//! on the failed trajectory `scripts/bench-static-hints.sh` sends (one of
//! `group_size` 1, one failed check in its verifier output, no key for any
//! model), step by step as the worker does it, outside Kafka and tokio:
//!
//! - `decode`: the input's bytes decoded and checked (`decode_arrival`);
//! - `hint_id`: the hint's id, from its group key, prompt version, chain and
//!   arm (`learn::hint_id`);
//! - `synthesize`: the static hint from the verifier's feedback
//!   (`Synthesizer::synthesize` with no model);
//! - `leak_guard`: the values the verifier presents as expected, and
//!   whether the hint repeats one (`expected_values`, `repeated`);
//! - `build_encode`: the hint message built and encoded as the cache keeps
//!   it (`build_hint`, `CachedHint::new`);
//! - `all`: the five in turn, i.e. the hint work of one message.
//!
//! `all` against the worker's CPU a message under load (the bench script's
//! CPU column over its messages) says how much of that is the hint work and
//! how much the machinery around it: tasks, bounds, the learner's plan (its
//! barrier, its state's lock, the arm's choice), the cache's lookup and
//! insert, produce and settlement, none of which is benched here.
//!
//!     cargo bench --bench static_hint

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use futures::executor::block_on;
use hintstream::config::LlmConfig;
use hintstream::hints::cache::CachedHint;
use hintstream::hints::decode::decode_arrival;
use hintstream::hints::{build_hint, HintLabels};
use hintstream::kafka::RecordMeta;
use hintstream::learn::{hint_id, STATIC_CHAIN};
use hintstream::llm::prompt::leak::{expected_values, repeated};
use hintstream::llm::synth::LlmEnv;
use hintstream::llm::Synthesizer;
use hintstream::messages::{DecodeLimits, DEFAULT_ARM};

/// The bench script's trajectory number 12,345 (`trajectory` in
/// scripts/bench_static_hints.py).
const PAYLOAD: &str = r#"{"schema_version": 1, "run_id": "bench", "step": 12, "instance_id": "task-00012345", "trajectory_id": "task-00012345-r0", "task_prompt": "Solve task-00012345", "reward": 0.0, "group_size": 1, "env_class": "swe", "chat_history": [{"role": "user", "content": "go"}, {"role": "assistant", "content": "done"}], "verifier_stdout": ">>> ERROR_ACCUMULATOR >>>\n['check_output failed']\n<<< ERROR_ACCUMULATOR <<<"}"#;

fn meta() -> RecordMeta {
    RecordMeta {
        topic: "in".into(),
        partition: 3,
        offset: 12_345,
        key: Some(b"bench/12/task-00012345".to_vec()),
        headers: Vec::new(),
    }
}

fn benches(c: &mut Criterion) {
    let meta = meta();
    let limits = DecodeLimits::default();
    let synth = Synthesizer::new(&LlmConfig::default(), &LlmEnv::default()).expect("a static synthesizer");
    let prompt = synth.prompt_version().to_string();
    let arrival = decode_arrival(PAYLOAD.as_bytes(), &meta, limits).expect("the bench's trajectory decodes");
    let t = &arrival.trajectory;
    let synthesis = block_on(synth.synthesize(t));
    let id = hint_id(&arrival.group_key, &prompt, STATIC_CHAIN, DEFAULT_ARM);
    assert!(synth.chain_ids().is_empty(), "no model: the hint is static");

    let mut g = c.benchmark_group("static_hint");
    g.bench_function("decode", |b| {
        b.iter(|| decode_arrival(PAYLOAD.as_bytes(), &meta, limits).expect("decodes"))
    });
    g.bench_function("hint_id", |b| {
        b.iter(|| hint_id(&arrival.group_key, &prompt, STATIC_CHAIN, DEFAULT_ARM))
    });
    g.bench_function("synthesize", |b| b.iter(|| block_on(synth.synthesize(t))));
    g.bench_function("leak_guard", |b| {
        b.iter(|| repeated(&synthesis.hint, &expected_values(t)))
    });
    g.bench_function("build_encode", |b| {
        b.iter_batched(
            || (id.clone(), synthesis.clone()),
            |(id, synthesis)| {
                let hint = build_hint(id, t, &meta, synthesis, HintLabels::default_arm(&prompt));
                CachedHint::new(hint)
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("all", |b| {
        b.iter(|| {
            let arrival = decode_arrival(PAYLOAD.as_bytes(), &meta, limits).expect("decodes");
            let t = &arrival.trajectory;
            let id = hint_id(&arrival.group_key, &prompt, STATIC_CHAIN, DEFAULT_ARM);
            let synthesis = block_on(synth.synthesize(t));
            let leaked = repeated(&synthesis.hint, &expected_values(t));
            let hint = build_hint(id, t, &meta, synthesis, HintLabels::default_arm(&prompt));
            (leaked, CachedHint::new(hint))
        })
    });
    g.finish();
}

criterion_group!(static_hint, benches);
criterion_main!(static_hint);
