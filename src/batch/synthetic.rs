//! Synthetic steps for benchmarks and load scripts: the rows of one step
//! shaped like a trainer's, the same for the same seed. Groups of
//! `group_size` with string ids like `swe-task-00012345`, rows shuffled,
//! 30% with reward 1 and the rest in [0, 0.5), 10% hinted
//! (`llm_synthesized`).

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::ScoredRows;

/// `rows` rows of step `step` of `run_id`, trajectory ids `traj-<i>`.
pub fn synthetic_step(rows: usize, group_size: usize, run_id: &str, step: i64, seed: u64) -> ScoredRows {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..rows).collect();
    order.shuffle(&mut rng);
    let mut out = ScoredRows::default();
    for i in order {
        out.run_id.push(run_id);
        out.step.push(step);
        out.instance_id
            .push(&format!("swe-task-{:08}", i / group_size.max(1)));
        out.trajectory_id.push(&format!("traj-{i}"));
        out.reward.push(if rng.random_bool(0.3) {
            1.0
        } else {
            rng.random_range(0.0..0.5)
        });
        let hinted = rng.random_bool(0.1);
        out.is_hinted.push(hinted);
        out.hint_category
            .push(hinted.then(|| "llm_synthesized".to_string()));
    }
    out
}

/// `rows` with each group's rows side by side, as GRPO samples them (the
/// groups by id, each group's rows in their order).
pub fn in_group_order(rows: &ScoredRows) -> ScoredRows {
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&row| &rows.instance_id[row]);
    rows.take(&order)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_synthetic_step_has_its_groups_and_repeats_for_its_seed() {
        let a = synthetic_step(80, 8, "r", 3, 7);
        assert_eq!(a.len(), 80);
        let groups: std::collections::HashSet<_> = a.instance_id.iter().collect();
        assert_eq!(groups.len(), 10);
        assert!(a.step.iter().all(|&s| s == 3));
        let b = synthetic_step(80, 8, "r", 3, 7);
        assert_eq!(a.trajectory_id, b.trajectory_id);
        assert_eq!(a.reward, b.reward);
        assert_ne!(synthetic_step(80, 8, "r", 3, 8).reward, a.reward);
    }

    #[test]
    fn in_group_order_puts_each_groups_rows_side_by_side_and_keeps_every_row() {
        let shuffled = synthetic_step(80, 8, "r", 3, 7);
        let grouped = in_group_order(&shuffled);
        let runs = grouped.instance_id.iter().collect::<Vec<_>>();
        assert_eq!(runs.chunk_by(|a, b| a == b).count(), 10, "{runs:?}");
        let mut ids: Vec<&str> = grouped.trajectory_id.iter().collect();
        let mut sent: Vec<&str> = shuffled.trajectory_id.iter().collect();
        ids.sort_unstable();
        sent.sort_unstable();
        assert_eq!(ids, sent);
    }
}
