//! Criterion benches of stage 2's computation on one step (8 rows per group,
//! 10% hinted, shuffled string ids like a trainer's `swe-task-00012345`):
//!
//! - `kernel_1t/<estimator>`: the CPU kernel on one thread from dense group
//!   ids, i.e. from a dictionary-encoded Arrow batch whose keys are the ids,
//!   writing into output columns reused from the previous call
//!   (`cpu::compute_on`);
//! - `kernel_1t_fresh/<estimator>`: the same into freshly allocated columns
//!   (`cpu::compute` on one thread): the difference is the allocator and
//!   the page faults of 24 MB of new memory per call;
//! - `kernel/<estimator>`: reused columns, on rayon's pool (every core);
//! - `from_dictionary/<estimator>`: from an Arrow `RecordBatch` with a
//!   dictionary-encoded `instance_id` (keys, reward and hinted columns read
//!   in place) to advantages, one thread;
//! - `from_strings/<estimator>`: string ids mapped to dense ids, then the
//!   kernel, one thread;
//! - `id_mapping`: the string → dense id mapping alone;
//! - `compute_path`: `compute_step` from owned rows (mapping and kernel on
//!   rayon's pool).
//! - `decode_arrow`: a step's Arrow input, cut into messages under 900,000
//!   bytes as a trainer sends it, decoded into rows (`decode_scored`) and
//!   put together (`ScoredRows::extend`), as stage 2's intake does;
//! - `map_groups/strings`, `map_groups/keys`: the group ids of that step's
//!   rows in group order (as GRPO samples them), cut into messages the
//!   same way and decoded, mapped a message at a time as stage 2's intake
//!   does: by each row's string (`HashedGroups::extend`) and by each
//!   message's `instance_id` dictionary keys (`HashedGroups::extend_keyed`);
//! - `decode_json` (10,000 rows): the same step as a trainer's JSON rows,
//!   one `scored_rollout` a message, each decoded (`decode_scored`) and
//!   put together as stage 2's intake does a message at a time;
//! - `assemble_json` (10,000 and 100,000 rows): the rows of those JSON
//!   messages, decoded, put into a step a message at a time
//!   (`StepAssembler::add_rows`, then `end`), after a step before it;
//! - `assemble_end` (100,000 and 1M rows): a step's `step_end` after its
//!   Arrow messages' rows are in (`StepAssembler::end`, the rows added
//!   untimed, after a step before it): the duplicates check, what a step
//!   waits for on the consume loop's thread after its last message;
//! - `step_metrics`, `hint_outcomes`: a computed step's metrics
//!   (`step_metrics`: what a step's worker makes beside its kernel, and
//!   `advantage/extreme_count`) and hint outcomes;
//! - `output_batch`: the advantages batch a step publishes, built from its
//!   rows and advantages (`advantages_batch`);
//! - `free_rows`: a step's rows freed.
//! - `gathered/join_then_map`, `gathered/join_with_groups`: a step's parts
//!   (one per input message of the decode above) put together and their
//!   group ids mapped, one after the other (`GatheredRows::join`, then
//!   `DenseGroups::from_strings`) and beside each other, the ids on a
//!   thread of their own (`GatheredRows::join_with_groups`, what a step's
//!   compute does; a step of one message, as 10,000 rows are, takes the
//!   first way in both).
//!
//! grpo runs at 10k, 100k and 1M rows, the other estimators at 1M. With
//! `--features cuda` on a machine with a GPU, the CUDA kernel too.
//!
//!     cargo bench --bench advantages
//!     cargo bench --bench advantages -- 'kernel_1t/grpo'   (one group)

use std::time::Instant;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

use hintstream::advantages::assemble::{GatheredRows, Incoming, StepAssembler, StepStatus};
use hintstream::advantages::compute::advantages_batch;
use hintstream::advantages::decode::{arrow_meta, decode_scored, ScoredInput};
use hintstream::advantages::outcomes::hint_outcomes;
use hintstream::advantages::step_metrics::{step_metrics, MetricOptions};
use hintstream::advantages::{compute_batch, compute_step};
use hintstream::batch::chunk::encode_chunks;
use hintstream::batch::synthetic::{in_group_order, synthetic_step};
use hintstream::batch::{RowKeys, ScoredRows};
use hintstream::messages::{DecodeLimits, ScoredMessage, ScoredRollout};
use hintstream::normalize::groups::HashedGroups;
use hintstream::normalize::{
    self, cpu, AdvantageOptions, Advantages, Batch, DenseGroups, Device, Estimator, HintedWeight,
};

const GROUP_SIZE: usize = 8;

/// `n` rows of one step, shuffled, with string ids like a trainer's.
fn rows(n: usize) -> ScoredRows {
    synthetic_step(n, GROUP_SIZE, "run-1", 12, 42)
}

/// Runs `f` on a one-thread rayon pool, as "one core" figures need.
fn one_thread<R: Send>(pool: &rayon::ThreadPool, f: impl FnOnce() -> R + Send) -> R {
    pool.install(f)
}

fn benches(c: &mut Criterion) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread pool");
    for n in [10_000usize, 100_000, 1_000_000] {
        let data = rows(n);
        let arrow = data.to_batch().expect("bench rows form a batch");
        let groups = DenseGroups::from_strings(data.instance_id.iter());
        let batch = Batch {
            group: &groups.ids,
            n_groups: groups.n_groups,
            reward: &data.reward,
            hinted: &data.is_hinted,
            response_length: &[],
        };
        let estimators: &[Estimator] = if n >= 1_000_000 {
            &Estimator::ALL
        } else {
            &[Estimator::Grpo]
        };

        let mut g = c.benchmark_group("advantages");
        g.throughput(Throughput::Elements(n as u64));
        g.sample_size(if n >= 1_000_000 { 20 } else { 30 });
        for &estimator in estimators {
            let options = AdvantageOptions {
                estimator,
                ..AdvantageOptions::default()
            };
            let e = estimator.as_str();
            let mut out = Advantages::default();
            g.bench_with_input(
                BenchmarkId::new(format!("kernel_1t/{e}"), n),
                &batch,
                |b, batch| b.iter(|| cpu::compute_on(batch, &options, 1, &mut out)),
            );
            g.bench_with_input(
                BenchmarkId::new(format!("kernel_1t_fresh/{e}"), n),
                &batch,
                |b, batch| b.iter(|| one_thread(&pool, || cpu::compute(batch, &options))),
            );
            g.bench_with_input(BenchmarkId::new(format!("kernel/{e}"), n), &batch, |b, batch| {
                b.iter(|| cpu::compute_into(batch, &options, &mut out))
            });
            g.bench_with_input(
                BenchmarkId::new(format!("from_dictionary/{e}"), n),
                &arrow,
                |b, arrow| b.iter(|| one_thread(&pool, || compute_batch(arrow, &options, Device::Cpu))),
            );
            g.bench_with_input(
                BenchmarkId::new(format!("from_strings/{e}"), n),
                &data,
                |b, data| {
                    b.iter(|| {
                        one_thread(&pool, || {
                            let groups = DenseGroups::from_strings(data.instance_id.iter());
                            let batch = Batch {
                                group: &groups.ids,
                                n_groups: groups.n_groups,
                                reward: &data.reward,
                                hinted: &data.is_hinted,
                                response_length: &[],
                            };
                            normalize::compute(&batch, &options, Device::Cpu)
                        })
                    })
                },
            );
            if normalize::cuda_check().is_ok() {
                g.bench_with_input(
                    BenchmarkId::new(format!("cuda_kernel/{e}"), n),
                    &batch,
                    |b, batch| b.iter(|| normalize::compute(batch, &options, Device::Cuda)),
                );
            }
        }
        g.bench_with_input(BenchmarkId::new("id_mapping", n), &data, |b, data| {
            b.iter(|| DenseGroups::from_strings(data.instance_id.iter()))
        });
        let options = AdvantageOptions::default();
        g.bench_with_input(BenchmarkId::new("compute_path", n), &data, |b, data| {
            b.iter_batched(
                || data.clone(),
                |d| compute_step(d, &options, Device::Cpu),
                criterion::BatchSize::LargeInput,
            )
        });
        step_io(&mut g, n, &data, &arrow);
        g.finish();
    }
}

/// The step's way in and out around the kernel: its Arrow messages decoded
/// and put together, its output batch built, its rows freed.
fn step_io(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    n: usize,
    data: &ScoredRows,
    arrow: &arrow_array::RecordBatch,
) {
    let messages = encode_chunks(arrow, 900_000).expect("the step encodes");
    let meta = arrow_meta("rl.rollouts.scored");
    g.bench_with_input(BenchmarkId::new("decode_arrow", n), &messages, |b, messages| {
        b.iter(|| {
            let mut rows = ScoredRows::default();
            for message in &messages.chunks {
                match decode_scored(&message.payload, &meta, DecodeLimits::default()) {
                    Ok(ScoredInput::Rows(part, _)) => rows.extend(*part),
                    _ => panic!("a step's message decodes to rows"),
                }
            }
            rows
        })
    });
    // A step's group ids mapped as its messages come, each message's by
    // string (a hash a row) and by its dictionary's keys (a look-up a
    // group): its rows in group order, as a trainer's GRPO samples are.
    let grouped = in_group_order(data).to_batch().expect("bench rows form a batch");
    let decoded: Vec<(ScoredRows, RowKeys)> = encode_chunks(&grouped, 900_000)
        .expect("the step encodes")
        .chunks
        .iter()
        .map(
            |message| match decode_scored(&message.payload, &meta, DecodeLimits::default()) {
                Ok(ScoredInput::Rows(part, Some(keys))) => (*part, keys),
                _ => panic!("a message of rows in group order decodes with its keys"),
            },
        )
        .collect();
    g.bench_with_input(
        BenchmarkId::new("map_groups/strings", n),
        &decoded,
        |b, decoded| {
            b.iter(|| {
                let mut groups = HashedGroups::new();
                for (part, _) in decoded {
                    groups.extend(part.instance_id.iter());
                }
                groups.finish()
            })
        },
    );
    g.bench_with_input(BenchmarkId::new("map_groups/keys", n), &decoded, |b, decoded| {
        b.iter(|| {
            let mut groups = HashedGroups::new();
            for (part, keys) in decoded {
                groups.extend_keyed(&keys.keys, keys.values, |row| &part.instance_id[row]);
            }
            groups.finish()
        })
    });
    if n <= 100_000 {
        assemble_json(g, n, data);
    }
    // The step's rows a message each, as the decode gives them.
    let parts: Vec<ScoredRows> = messages
        .chunks
        .iter()
        .map(|chunk| data.take(&chunk.rows.clone().collect::<Vec<_>>()))
        .collect();
    if n >= 100_000 {
        assemble_end(g, n, data, &parts);
    }
    if n <= 10_000 {
        let json = json_rows(data);
        let meta = arrow_meta("rl.rollouts.scored");
        let meta = hintstream::kafka::RecordMeta {
            headers: Vec::new(),
            ..meta
        };
        g.bench_with_input(BenchmarkId::new("decode_json", n), &json, |b, json| {
            b.iter(|| {
                let mut rows = ScoredRows::default();
                for payload in json {
                    match decode_scored(payload, &meta, DecodeLimits::default()) {
                        Ok(ScoredInput::Row(row)) => rows.push(&row),
                        _ => panic!("a JSON row decodes to a row"),
                    }
                }
                rows
            })
        });
    }
    let result =
        compute_step(data.clone(), &AdvantageOptions::default(), Device::Cpu).expect("the step computes");
    let metric_options = MetricOptions {
        success_threshold: 0.0,
        pass_at_k: &[1, 4],
        samples_per_prompt: None,
    };
    g.bench_with_input(BenchmarkId::new("step_metrics", n), &result, |b, result| {
        b.iter(|| step_metrics(&result.rows, &result.groups, &result.advantages, &metric_options))
    });
    g.bench_with_input(BenchmarkId::new("hint_outcomes", n), &result, |b, result| {
        b.iter(|| hint_outcomes(&result.rows, 0.0, "2026-12-05T00:00:00.000Z"))
    });
    g.bench_with_input(BenchmarkId::new("output_batch", n), &result, |b, result| {
        b.iter(|| advantages_batch(&result.rows, &result.advantages, HintedWeight::None))
    });
    g.bench_with_input(BenchmarkId::new("free_rows", n), data, |b, data| {
        b.iter_batched(|| data.clone(), drop, criterion::BatchSize::LargeInput)
    });
    let gathered = || GatheredRows::in_order(parts.clone());
    g.bench_function(BenchmarkId::new("gathered/join_then_map", n), |b| {
        b.iter_batched(
            gathered,
            |rows| {
                let rows = rows.join();
                let groups = DenseGroups::from_strings(rows.instance_id.iter());
                (rows, groups)
            },
            criterion::BatchSize::LargeInput,
        )
    });
    g.bench_function(BenchmarkId::new("gathered/join_with_groups", n), |b| {
        b.iter_batched(
            gathered,
            GatheredRows::join_with_groups,
            criterion::BatchSize::LargeInput,
        )
    });
}

/// `data`'s rows as a trainer's JSON messages, one `scored_rollout` each.
fn json_rows(data: &ScoredRows) -> Vec<Vec<u8>> {
    rollouts(data)
        .into_iter()
        .map(|row| serde_json::to_vec(&ScoredMessage::ScoredRollout(row)).expect("a row encodes"))
        .collect()
}

/// The step's rows as a trainer's `scored_rollout`s.
fn rollouts(data: &ScoredRows) -> Vec<ScoredRollout> {
    (0..data.len()).map(|i| data.rollout(i)).collect()
}

/// `assemble_json`: the step's rows, decoded, through the assembler a JSON
/// row a message as the consume loop puts them in (`StepAssembler::add_rows`,
/// then the step's `step_end`), the step before it completed in the same
/// assembler (as a trainer's steps follow each other). The rows' strings are
/// copied for each step outside the timing, as the decode makes them.
fn assemble_json(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    n: usize,
    data: &ScoredRows,
) {
    let template = rollouts(data);
    let run = template[0].run_id.clone();
    let step = std::cell::Cell::new(0i64);
    let mut assembler: StepAssembler<()> = StepAssembler::new();
    g.bench_function(BenchmarkId::new("assemble_json", n), |b| {
        b.iter_batched(
            || {
                step.set(step.get() + 1);
                let messages: Vec<Incoming> = template
                    .iter()
                    .map(|row| {
                        Incoming::Row(Box::new(ScoredRollout {
                            step: step.get(),
                            ..row.clone()
                        }))
                    })
                    .collect();
                messages
            },
            |messages| {
                let now = Instant::now();
                for (offset, row) in messages.into_iter().enumerate() {
                    let status = assembler.add_rows(row, (0, offset as i64), (), 200, now);
                    assert!(matches!(status, StepStatus::Pending));
                }
                match assembler.end(&run, step.get(), n as i64, (0, (), 100), now) {
                    StepStatus::Complete(step) => step,
                    _ => panic!("the step completes"),
                }
            },
            criterion::BatchSize::PerIteration,
        )
    });
}

/// `assemble_end`: a step's `step_end` timed alone, after its rows came as
/// `parts`, a message's each (untimed), the step before it completed in the
/// same assembler. Each step's rows are copied outside the timing.
fn assemble_end(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    n: usize,
    data: &ScoredRows,
    parts: &[ScoredRows],
) {
    let run = data.run_id[0].to_string();
    let mut step = data.step[0];
    let mut assembler: StepAssembler<()> = StepAssembler::new();
    g.bench_function(BenchmarkId::new("assemble_end", n), |b| {
        b.iter_custom(|iters| {
            let mut timed = std::time::Duration::ZERO;
            for _ in 0..iters {
                step += 1;
                let now = Instant::now();
                for (offset, part) in parts.iter().enumerate() {
                    let mut part = part.clone();
                    part.step.iter_mut().for_each(|s| *s = step);
                    let status = assembler.add_rows(part, (0, offset as i64), (), 200, now);
                    assert!(matches!(status, StepStatus::Pending));
                }
                let start = Instant::now();
                let status = assembler.end(&run, step, n as i64, (0, (), 100), now);
                timed += start.elapsed();
                assert!(matches!(status, StepStatus::Complete(_)), "the step completes");
            }
            timed
        })
    });
}

criterion_group!(advantage_benches, benches);
criterion_main!(advantage_benches);
