//! Gathering a GRPO group: the trajectories of one `run_id/step/instance_id`
//! arrive as separate messages; the group is ready when `group_size` of them
//! are in or its wait ran out. The best trajectory (highest reward; the first
//! on ties) is the one the hint is built from: the group knows it as members
//! join, and a member that is outranked lets go of what only the best needs
//! (its decoded trajectory), so a group holds one of those, not one a member.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::Notify;

/// What gathering asks of a member.
pub trait Ranked {
    /// The best member has the highest score (the first on ties).
    fn score(&self) -> f64;
    /// Another member is better now: let go of what only the best needs.
    fn outranked(&mut self) {}
}

/// One group being gathered. `T` is a member (the trajectory with its
/// unfinished offset).
pub struct Gathering<T> {
    pub members: Vec<T>,
    /// The index of the best member so far.
    pub best: usize,
    pub expected: usize,
    /// Woken when the last expected member arrives.
    pub complete: Arc<Notify>,
}

impl<T: Ranked> Gathering<T> {
    /// Adds `member`; the one of the two that is not the best now is told.
    fn push(&mut self, mut member: T) {
        if member.score() > self.members[self.best].score() {
            self.members[self.best].outranked();
            self.best = self.members.len();
        } else {
            member.outranked();
        }
        self.members.push(member);
    }

    /// The members, the best first (the others in arrival order, but for
    /// the one the best's place went to).
    pub fn best_first(mut self) -> Vec<T> {
        self.members.swap(0, self.best);
        self.members
    }
}

/// What adding a member means for the caller.
pub enum Joined {
    /// This member opened the group: the caller waits for it to fill (or the
    /// wait to pass), then takes it and produces the hint.
    Leader(Arc<Notify>),
    /// Another task leads the group.
    Member,
}

/// Groups being gathered, by key.
pub struct Groups<T> {
    open: HashMap<String, Gathering<T>>,
}

impl<T> Default for Groups<T> {
    fn default() -> Self {
        Groups { open: HashMap::new() }
    }
}

impl<T: Ranked> Groups<T> {
    /// Adds a member to the group `key`, which expects `expected` members.
    pub fn join(&mut self, key: &str, expected: usize, member: T) -> Joined {
        if let Some(group) = self.open.get_mut(key) {
            group.push(member);
            if group.members.len() >= group.expected {
                group.complete.notify_one();
            }
            return Joined::Member;
        }
        let complete = Arc::new(Notify::new());
        if expected <= 1 {
            complete.notify_one();
        }
        self.open.insert(
            key.to_string(),
            Gathering {
                members: vec![member],
                best: 0,
                expected: expected.max(1),
                complete: complete.clone(),
            },
        );
        Joined::Leader(complete)
    }

    /// Takes out the group `key` its leader opened, known by the `complete`
    /// it was given ([`Joined::Leader`]); later members of the same key
    /// open a new group. None when that group was taken out already (a
    /// revoke's [`Groups::take_incomplete`]) and the key names a newer
    /// group, which its own leader takes.
    pub fn take_led(&mut self, key: &str, complete: &Arc<Notify>) -> Option<Gathering<T>> {
        if !self
            .open
            .get(key)
            .is_some_and(|g| Arc::ptr_eq(&g.complete, complete))
        {
            return None;
        }
        self.open.remove(key)
    }

    /// Takes out every group still short of members whose key `pick`s, and
    /// wakes its leader (which then finds its group gone).
    pub fn take_incomplete(&mut self, pick: impl Fn(&str) -> bool) -> Vec<Gathering<T>> {
        let keys: Vec<String> = self
            .open
            .iter()
            .filter(|(k, g)| g.members.len() < g.expected && pick(k))
            .map(|(k, _)| k.clone())
            .collect();
        keys.iter()
            .filter_map(|k| self.open.remove(k))
            .inspect(|g| g.complete.notify_one())
            .collect()
    }

    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

/// Index of the best member: highest score, the earliest on ties (what
/// [`Gathering`] keeps as members join, for a list at hand).
pub fn best_index<T>(members: &[T], score: impl Fn(&T) -> f64) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, m) in members.iter().enumerate() {
        let s = score(m);
        if best.is_none_or(|(_, b)| s > b) {
            best = Some((i, s));
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Ranked for u32 {
        fn score(&self) -> f64 {
            f64::from(*self)
        }
    }

    #[test]
    fn a_leader_takes_only_the_group_it_opened() {
        let mut g: Groups<u32> = Groups::default();
        let Joined::Leader(first) = g.join("k", 3, 1) else {
            panic!("the first member leads");
        };
        // A revoke takes the short group out; the key opens anew.
        assert_eq!(g.take_incomplete(|_| true).len(), 1);
        let Joined::Leader(second) = g.join("k", 3, 2) else {
            panic!("a member after the revoke leads a new group");
        };
        assert!(
            g.take_led("k", &first).is_none(),
            "the old leader's group is gone"
        );
        assert_eq!(g.len(), 1, "the newer group stays for its own leader");
        let group = g.take_led("k", &second).expect("its own leader takes it");
        assert_eq!(group.members, vec![2]);
    }

    #[test]
    fn first_member_leads_and_the_last_completes() {
        let mut g: Groups<u32> = Groups::default();
        let Joined::Leader(led) = g.join("k", 3, 1) else {
            panic!("the first member leads");
        };
        assert!(matches!(g.join("k", 3, 2), Joined::Member));
        assert!(matches!(g.join("k", 3, 3), Joined::Member));
        let group = g.take_led("k", &led).unwrap();
        assert_eq!(group.members, vec![1, 2, 3]);
        assert!(g.is_empty());
        assert!(
            matches!(g.join("k", 3, 4), Joined::Leader(_)),
            "a late member opens a new group"
        );
    }

    #[test]
    fn takes_out_only_incomplete_groups_that_match() {
        let mut g: Groups<u32> = Groups::default();
        g.join("0:a", 2, 1);
        g.join("0:b", 1, 2);
        g.join("1:c", 2, 3);
        let taken = g.take_incomplete(|k| k.starts_with("0:"));
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].members, vec![1]);
        assert_eq!(g.len(), 2, "complete 0:b and other-partition 1:c stay");
    }

    /// A score, and whether it still holds what only the best needs.
    #[derive(Debug, PartialEq)]
    struct Scored(f64, bool);

    impl Ranked for Scored {
        fn score(&self) -> f64 {
            self.0
        }
        fn outranked(&mut self) {
            self.1 = false;
        }
    }

    #[test]
    fn picks_the_highest_reward_first_on_ties() {
        assert_eq!(best_index(&[0.1, 0.5, 0.5, -1.0], |x| *x), Some(1));
        assert_eq!(best_index::<f64>(&[], |x| *x), None);
    }

    #[test]
    fn a_gathering_keeps_the_best_as_best_index_picks_it_and_only_the_best_keeps_its_detail() {
        let mut g: Groups<Scored> = Groups::default();
        let Joined::Leader(led) = g.join("k", 4, Scored(0.1, true)) else {
            panic!("the first member leads");
        };
        for score in [0.5, 0.5, -1.0] {
            g.join("k", 4, Scored(score, true));
        }
        let group = g.take_led("k", &led).unwrap();
        assert_eq!(Some(group.best), best_index(&group.members, |m| m.0));
        assert_eq!(group.best, 1);
        let held: Vec<bool> = group.members.iter().map(|m| m.1).collect();
        assert_eq!(
            held,
            [false, true, false, false],
            "one decoded trajectory a group"
        );
        let first = group.best_first();
        assert_eq!(first[0], Scored(0.5, true));
    }

    #[tokio::test]
    async fn completion_wakes_the_leader() {
        let mut g: Groups<u32> = Groups::default();
        let Joined::Leader(done) = g.join("k", 2, 1) else {
            panic!("leader")
        };
        g.join("k", 2, 2);
        tokio::time::timeout(std::time::Duration::from_secs(1), done.notified())
            .await
            .unwrap();
    }
}
