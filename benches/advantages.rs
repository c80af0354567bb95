//! Criterion benches of stage 2's computation: the CPU kernel at 10k, 100k
//! and 1M rows (8 rows per group, 10% hinted, shuffled string ids), the
//! string-id mapping alone, and the whole compute path from owned rows
//! (assembly into an Arrow batch, dictionary ids, kernel). With
//! `--features cuda` on a machine with a GPU, the CUDA kernel too.
//!
//!     cargo bench --bench advantages

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hintstream::advantages::compute_step;
use hintstream::batch::ScoredRows;
use hintstream::normalize::{self, AdvantageOptions, Batch, DenseGroups, Device};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const GROUP_SIZE: usize = 8;

/// `n` rows of one step, shuffled, with string ids like a trainer's.
fn rows(n: usize) -> ScoredRows {
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rng);
    let mut rows = ScoredRows::default();
    for i in order {
        rows.run_id.push("run-1".into());
        rows.step.push(12);
        rows.instance_id.push(format!("swe-task-{:08}", i / GROUP_SIZE));
        rows.trajectory_id.push(format!("traj-{i}"));
        rows.reward.push(if rng.random_bool(0.3) {
            1.0
        } else {
            rng.random_range(0.0..0.5)
        });
        let hinted = rng.random_bool(0.1);
        rows.is_hinted.push(hinted);
        rows.hint_category
            .push(hinted.then(|| "llm_synthesized".to_string()));
    }
    rows
}

fn benches(c: &mut Criterion) {
    let options = AdvantageOptions::default();
    for n in [10_000usize, 100_000, 1_000_000] {
        let data = rows(n);
        let groups = DenseGroups::from_strings(data.instance_id.iter().map(String::as_str));
        let batch = Batch {
            group: &groups.ids,
            n_groups: groups.n_groups,
            reward: &data.reward,
            hinted: &data.is_hinted,
        };

        let mut g = c.benchmark_group("advantages");
        g.throughput(Throughput::Elements(n as u64));
        g.sample_size(if n >= 1_000_000 { 10 } else { 30 });
        g.bench_with_input(BenchmarkId::new("cpu_kernel", n), &batch, |b, batch| {
            b.iter(|| normalize::cpu::compute(batch, &options))
        });
        g.bench_with_input(BenchmarkId::new("id_mapping", n), &data, |b, data| {
            b.iter(|| DenseGroups::from_strings(data.instance_id.iter().map(String::as_str)))
        });
        g.bench_with_input(BenchmarkId::new("compute_path", n), &data, |b, data| {
            b.iter_batched(
                || data.clone(),
                |d| compute_step(d, &options, Device::Cpu),
                criterion::BatchSize::LargeInput,
            )
        });
        if normalize::cuda_available() {
            g.bench_with_input(BenchmarkId::new("cuda_kernel", n), &batch, |b, batch| {
                b.iter(|| normalize::compute(batch, &options, Device::Cuda))
            });
        }
        g.finish();
    }
}

criterion_group!(advantage_benches, benches);
criterion_main!(advantage_benches);
