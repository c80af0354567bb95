//! Per-partition bookkeeping of messages taken but not yet finished, so that
//! concurrent, out-of-order completion still commits in order.
//!
//! The committable offset of a partition is the lowest offset still in flight,
//! or one past the highest offset seen when nothing is in flight. Every offset
//! below it has finished; nothing above it is ever committed early.
//!
//! The tracker also knows each partition's life: an epoch that changes on
//! every assign and revoke (a ticket of an older epoch is stale), a
//! `revoking` mark while a revoked partition drains, and a cancellation token
//! that stops the partition's unfinished work when the drain ends.

use std::collections::{BTreeSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use hashbrown::hash_map::EntryRef;
use hashbrown::{Equivalent, HashMap};

use tokio_util::sync::CancellationToken;

/// Identifies one message taken from a partition. Finishing a ticket issued
/// before the partition was revoked or re-assigned has no effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    pub topic: Arc<str>,
    pub partition: i32,
    pub offset: i64,
    epoch: u64,
}

/// A partition's offsets taken and not finished, abandoned ones included:
/// the commit never passes any of them. A partition's messages come in
/// offset order, so they are kept in the order taken, each with whether it
/// finished since, and the finished ones at the front go: taking and
/// finishing a message cost a push and a binary search, where a
/// `BTreeSet` cost an insert and a removal (a node's allocation now and
/// then, 4% of a JSON row's way through the consume loop with the map's
/// `SipHash` of the topic). The finished ones behind an unfinished one go
/// once they outnumber the unfinished (see [`InFlight::remove`]). An offset
/// taken out of order (never, in practice: a partition is reset before it
/// is read again) is put in its place.
/// Finished offsets [`InFlight`] keeps beyond twice the unfinished ones
/// before it lets them go.
const COMPACT_SLACK: usize = 1024;

#[derive(Debug, Default)]
struct InFlight {
    /// Ascending; the first, when any, is unfinished.
    taken: VecDeque<(i64, bool)>,
    /// The unfinished ones.
    unfinished: usize,
}

impl InFlight {
    fn insert(&mut self, offset: i64) {
        match self.taken.back() {
            Some(&(last, _)) if last >= offset => match self.find(offset) {
                Ok(at) => {
                    let (_, finished) = &mut self.taken[at];
                    if std::mem::take(finished) {
                        self.unfinished += 1;
                    }
                }
                Err(at) => {
                    self.taken.insert(at, (offset, false));
                    self.unfinished += 1;
                }
            },
            _ => {
                self.taken.push_back((offset, false));
                self.unfinished += 1;
            }
        }
    }

    /// Marks `offset` finished; `false` when it was not in flight.
    fn remove(&mut self, offset: i64) -> bool {
        let Ok(at) = self.find(offset) else {
            return false;
        };
        let (_, finished) = &mut self.taken[at];
        if std::mem::replace(finished, true) {
            return false;
        }
        self.unfinished -= 1;
        while self.taken.front().is_some_and(|&(_, finished)| finished) {
            self.taken.pop_front();
        }
        // Finished offsets behind one held long (a step's first message,
        // parked until the step completes) would otherwise pile up with
        // every message after it: they go once they outnumber the
        // unfinished ones, so what is kept stays within twice the bound on
        // messages in flight.
        if self.taken.len() > 2 * self.unfinished + COMPACT_SLACK {
            self.taken.retain(|&(_, finished)| !finished);
            if self.taken.capacity() > 4 * self.taken.len() + COMPACT_SLACK {
                self.taken.shrink_to(2 * self.taken.len());
            }
        }
        true
    }

    fn contains(&self, offset: i64) -> bool {
        self.find(offset).is_ok_and(|at| !self.taken[at].1)
    }

    /// The lowest unfinished offset.
    fn first(&self) -> Option<i64> {
        self.taken.front().map(|&(offset, _)| offset)
    }

    fn len(&self) -> usize {
        self.unfinished
    }

    fn find(&self, offset: i64) -> Result<usize, usize> {
        self.taken.binary_search_by_key(&offset, |&(taken, _)| taken)
    }
}

/// A partition as the tracker's map is asked for it, without an `Arc` of
/// its topic: it hashes as the map's keys do (a tuple hashes its fields in
/// turn, and an `Arc<str>` as its `str`).
#[derive(PartialEq)]
struct Key<'a>(&'a str, i32);

impl Hash for Key<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
        self.1.hash(state);
    }
}

impl Equivalent<(Arc<str>, i32)> for Key<'_> {
    fn equivalent(&self, key: &(Arc<str>, i32)) -> bool {
        self.1 == key.1 && self.0 == &*key.0
    }
}

/// A new partition's key.
impl From<&Key<'_>> for (Arc<str>, i32) {
    fn from(key: &Key<'_>) -> Self {
        (Arc::from(key.0), key.1)
    }
}

impl Ticket {
    fn key(&self) -> Key<'_> {
        Key(&self.topic, self.partition)
    }

    /// Its partition and the life of it it was taken in (no reset
    /// between two tickets of one life): all that
    /// [`OffsetTracker::is_current`] and a partition's reset look at.
    pub(crate) fn life(&self) -> (&str, i32, u64) {
        (&self.topic, self.partition, self.epoch)
    }
}

#[derive(Debug, Default)]
struct PartitionState {
    epoch: u64,
    /// Offsets taken and not finished, abandoned ones included: the commit
    /// never passes any of them.
    in_flight: InFlight,
    /// The offsets of `in_flight` whose handles were dropped unfinished
    /// (abandoned): no work is left on them, but they stay uncommitted.
    abandoned: BTreeSet<i64>,
    /// One past the highest offset taken in this epoch.
    next_after_seen: Option<i64>,
    /// The last offset handed out as committable.
    stored: Option<i64>,
    /// The partition was revoked and its in-flight work is draining: work
    /// that finishes still commits, work dropped unfinished is abandoned.
    revoking: bool,
    /// Cancelled when the partition's drain ends: stops its unfinished work.
    /// Each message's work holds it behind an `Arc`: a count raised
    /// atomically, where a token's clone takes its tree's lock (about 2% of
    /// the consume loop's thread on one-row messages).
    work: Arc<CancellationToken>,
}

impl PartitionState {
    fn committable(&self) -> Option<i64> {
        self.in_flight.first().or(self.next_after_seen)
    }
}

/// Where a taken message stands against its partition's committable offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Passage {
    /// It and every offset below it finished: the committable offset passed it.
    Passed,
    /// It, or an offset below it, is unfinished.
    Waiting,
    /// Its partition was reset (revoked, re-assigned or rewound) since it
    /// was taken: it is redone, so what it made must be dropped.
    Stale,
}

#[derive(Debug, Default)]
pub struct OffsetTracker {
    /// foldhash: the keys are the worker's own assigned partitions.
    partitions: HashMap<(Arc<str>, i32), PartitionState, foldhash::fast::RandomState>,
    next_epoch: u64,
}

impl OffsetTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `offset` was taken and is now in flight. The token is
    /// cancelled when the partition is revoked and its drain ends.
    pub fn begin(&mut self, topic: &str, partition: i32, offset: i64) -> (Ticket, Arc<CancellationToken>) {
        let (key, state) = self.state(topic, partition);
        state.in_flight.insert(offset);
        state.next_after_seen = Some(state.next_after_seen.map_or(offset + 1, |n| n.max(offset + 1)));
        let ticket = Ticket {
            topic: key,
            partition,
            offset,
            epoch: state.epoch,
        };
        (ticket, state.work.clone())
    }

    /// Whether dropping `ticket` unfinished abandons it (its partition is
    /// revoking, or was reset since) rather than losing it to a failure.
    pub fn abandons(&self, ticket: &Ticket) -> bool {
        self.partitions
            .get(&ticket.key())
            .is_none_or(|s| s.revoking || s.epoch != ticket.epoch)
    }

    /// Marks a revoked partition as draining.
    pub fn mark_revoking(&mut self, topic: &str, partition: i32) {
        self.state(topic, partition).1.revoking = true;
    }

    /// Messages with live work on the given partition: in flight and not
    /// abandoned. A revoke drain waits for this to reach 0.
    pub fn live_on(&self, topic: &str, partition: i32) -> usize {
        self.partitions
            .get(&Key(topic, partition))
            .map_or(0, |s| s.in_flight.len() - s.abandoned.len())
    }

    /// Records that a ticket's handle was dropped unfinished: it stays in
    /// flight (uncommitted) but has no work left.
    pub fn abandon(&mut self, ticket: &Ticket) {
        if let Some(state) = self.partitions.get_mut(&ticket.key()) {
            if state.epoch == ticket.epoch && state.in_flight.contains(ticket.offset) {
                state.abandoned.insert(ticket.offset);
            }
        }
    }

    /// Cancels the partition's unfinished work.
    pub fn cancel(&self, topic: &str, partition: i32) {
        if let Some(state) = self.partitions.get(&Key(topic, partition)) {
            state.work.cancel();
        }
    }

    /// Marks a ticket finished. Returns the new committable offset when it
    /// advanced past the last one returned; `None` when it did not, or when
    /// the ticket is from before a reset.
    pub fn finish(&mut self, ticket: &Ticket) -> Option<i64> {
        let state = self.partitions.get_mut(&ticket.key())?;
        if state.epoch != ticket.epoch || !state.in_flight.remove(ticket.offset) {
            return None;
        }
        let next = state.committable()?;
        if state.stored.is_some_and(|s| s >= next) {
            return None;
        }
        state.stored = Some(next);
        Some(next)
    }

    /// [`OffsetTracker::finish`] for each of `tickets`: each partition whose
    /// committable offset advanced, once, with its furthest offset (offsets
    /// only advance), in the order each first advanced.
    pub fn finish_all(&mut self, tickets: impl IntoIterator<Item = Ticket>) -> Vec<(Ticket, i64)> {
        let mut advanced: Vec<(Ticket, i64)> = Vec::new();
        for ticket in tickets {
            let Some(next) = self.finish(&ticket) else {
                continue;
            };
            let same = |(seen, _): &&mut (Ticket, i64)| seen.key() == ticket.key();
            match advanced.iter_mut().find(same) {
                Some(last) => last.1 = next,
                None => advanced.push((ticket, next)),
            }
        }
        advanced
    }

    /// Forgets a partition (revoked or newly assigned): its in-flight tickets
    /// become stale, so a late finish cannot store an offset for a new owner,
    /// and its unfinished work is cancelled.
    pub fn reset(&mut self, topic: &str, partition: i32) {
        self.next_epoch += 1;
        let epoch = self.next_epoch;
        let (_, state) = self.state(topic, partition);
        let old = std::mem::replace(
            state,
            PartitionState {
                epoch,
                ..PartitionState::default()
            },
        );
        old.work.cancel();
    }

    /// The offset that may be committed now: every offset below it finished.
    pub fn committable(&self, topic: &str, partition: i32) -> Option<i64> {
        self.partitions
            .get(&Key(topic, partition))
            .and_then(PartitionState::committable)
    }

    /// Where `ticket`'s message stands against its partition's committable
    /// offset (the exactly-once rule: an output joins a transaction only
    /// once every one of its inputs is [`Passage::Passed`]).
    pub fn passage(&self, ticket: &Ticket) -> Passage {
        match self.partitions.get(&ticket.key()) {
            Some(state) if state.epoch == ticket.epoch => match state.committable() {
                Some(next) if next > ticket.offset && !state.in_flight.contains(ticket.offset) => {
                    Passage::Passed
                }
                _ => Passage::Waiting,
            },
            _ => Passage::Stale,
        }
    }

    /// Whether `ticket` is of its partition's current epoch (not reset
    /// since it was issued).
    pub fn is_current(&self, ticket: &Ticket) -> bool {
        self.partitions
            .get(&ticket.key())
            .is_some_and(|s| s.epoch == ticket.epoch)
    }

    /// Every partition's committable offset, where it has one.
    pub fn committable_all(&self) -> Vec<((Arc<str>, i32), i64)> {
        self.partitions
            .iter()
            .filter_map(|(key, state)| state.committable().map(|next| (key.clone(), next)))
            .collect()
    }

    /// Messages in flight over all partitions.
    pub fn in_flight(&self) -> usize {
        self.partitions.values().map(|s| s.in_flight.len()).sum()
    }

    /// Messages with live work on any partition (see [`OffsetTracker::live_on`]).
    pub fn live(&self) -> usize {
        self.partitions
            .values()
            .map(|s| s.in_flight.len() - s.abandoned.len())
            .sum()
    }

    /// The state of `topic`'s `partition`, a new one when it is not known,
    /// and the topic's name as its key holds it (one lookup, and a copy of
    /// the name only for a new partition).
    fn state(&mut self, topic: &str, partition: i32) -> (Arc<str>, &mut PartitionState) {
        let entry = match self.partitions.entry_ref(&Key(topic, partition)) {
            EntryRef::Occupied(entry) => entry,
            EntryRef::Vacant(entry) => entry.insert_entry(PartitionState::default()),
        };
        let topic = entry.key().0.clone();
        (topic, entry.into_mut())
    }
}

/// Locks the tracker. A panic while holding it cannot leave the tracker
/// half-updated in a way that commits too far (every method either completes
/// or changes nothing committable), so a poisoned lock is taken over.
pub(crate) fn lock(tracker: &Mutex<OffsetTracker>) -> MutexGuard<'_, OffsetTracker> {
    tracker.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    impl OffsetTracker {
        fn take(&mut self, topic: &str, partition: i32, offset: i64) -> Ticket {
            self.begin(topic, partition, offset).0
        }
    }

    #[test]
    fn commits_only_up_to_lowest_unfinished() {
        let mut t = OffsetTracker::new();
        let a = t.take("t", 0, 10);
        let b = t.take("t", 0, 11);
        let c = t.take("t", 0, 12);
        assert_eq!(t.finish(&c), Some(10), "12 finished but 10 is still in flight");
        assert_eq!(t.committable("t", 0), Some(10));
        assert_eq!(t.finish(&a), Some(11));
        assert_eq!(t.finish(&b), Some(13));
        assert_eq!(t.committable("t", 0), Some(13));
    }

    #[test]
    fn ignores_tickets_from_before_a_reset() {
        let mut t = OffsetTracker::new();
        let (old, work) = t.begin("t", 1, 5);
        assert!(!t.abandons(&old));
        t.reset("t", 1);
        assert!(work.is_cancelled(), "a reset stops the old epoch's work");
        assert!(t.abandons(&old));
        assert_eq!(t.finish(&old), None);
        assert_eq!(t.committable("t", 1), None);
        let new = t.take("t", 1, 3);
        assert_eq!(t.finish(&new), Some(4));
    }

    #[test]
    fn a_revoking_partition_still_commits_what_finishes() {
        let mut t = OffsetTracker::new();
        let a = t.take("t", 0, 1);
        let b = t.take("t", 0, 2);
        t.mark_revoking("t", 0);
        assert!(t.abandons(&b), "dropped unfinished while revoking: abandoned");
        assert_eq!(t.live_on("t", 0), 2);
        assert_eq!(t.finish(&a), Some(2), "the drain still stores offsets");
        assert_eq!(t.live_on("t", 0), 1);
        t.abandon(&b);
        assert_eq!(t.live_on("t", 0), 0, "nothing left to wait for");
        assert_eq!(
            t.committable("t", 0),
            Some(2),
            "but the abandoned offset is never passed"
        );
    }

    #[test]
    fn keeps_partitions_apart() {
        let mut t = OffsetTracker::new();
        let a = t.take("t", 0, 1);
        let b = t.take("t", 1, 100);
        assert_eq!(t.finish(&b), Some(101));
        assert_eq!(t.committable("t", 0), Some(1));
        assert_eq!(t.in_flight(), 1);
        assert_eq!(t.finish(&a), Some(2));
    }

    #[test]
    fn finishing_together_stores_each_partition_once_where_one_by_one_ends() {
        use rand::seq::SliceRandom;
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(21);
        for round in 0..200 {
            let (mut together, mut alone) = (OffsetTracker::new(), OffsetTracker::new());
            let partitions = [("t", 0), ("t", 1), ("u", 0)];
            let mut tickets = Vec::new();
            for offset in 0..rng.random_range(1..60) {
                let (topic, partition) = partitions[rng.random_range(0..3)];
                let ticket = together.take(topic, partition, offset);
                assert_eq!(alone.take(topic, partition, offset), ticket);
                tickets.push(ticket);
            }
            tickets.shuffle(&mut rng);
            // Some finish before, one at a time in both; the rest together.
            let (before, rest) = tickets.split_at(rng.random_range(0..=tickets.len()));
            for ticket in before {
                assert_eq!(together.finish(ticket), alone.finish(ticket));
            }
            let mut last = Vec::<(Ticket, i64)>::new();
            for ticket in rest {
                if let Some(next) = alone.finish(ticket) {
                    last.retain(|(seen, _)| seen.key() != ticket.key());
                    last.push((ticket.clone(), next));
                }
            }
            let advanced = together.finish_all(rest.iter().cloned());
            let key = |(t, next): &(Ticket, i64)| (t.topic.to_string(), t.partition, *next);
            let mut want: Vec<_> = last.iter().map(key).collect();
            let mut got: Vec<_> = advanced.iter().map(key).collect();
            want.sort();
            got.sort();
            assert_eq!(got, want, "round {round}");
            for (topic, partition) in partitions {
                assert_eq!(
                    together.committable(topic, partition),
                    alone.committable(topic, partition)
                );
            }
            assert_eq!(together.in_flight(), 0);
        }
    }

    #[test]
    fn offsets_in_flight_behave_as_a_set_whatever_the_order_taken() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(34);
        let mut set = BTreeSet::new();
        let mut in_flight = InFlight::default();
        for round in 0..20_000 {
            // Mostly in order, now and then below what was taken, or again.
            let last = set.last().copied().unwrap_or(0);
            let offset = match rng.random_range(0..10) {
                0 => rng.random_range(0..=last + 3),
                _ => last + rng.random_range(1..3),
            };
            if rng.random_range(0..3) > 0 {
                in_flight.insert(offset);
                set.insert(offset);
            } else {
                let (want, got) = (set.remove(&offset), in_flight.remove(offset));
                assert_eq!(got, want, "round {round}: finishing {offset}");
            }
            // One taken finishes, at random.
            if !set.is_empty() {
                let taken = set.iter().copied().nth(rng.random_range(0..set.len()));
                let taken = taken.expect("within the set");
                let (want, got) = (set.remove(&taken), in_flight.remove(taken));
                assert_eq!(got, want, "round {round}: finishing {taken}");
            }
            assert_eq!(in_flight.first(), set.first().copied(), "round {round}");
            assert_eq!(in_flight.len(), set.len(), "round {round}");
            let probe = rng.random_range(0..=last + 3);
            assert_eq!(
                in_flight.contains(probe),
                set.contains(&probe),
                "round {round}: {probe}"
            );
        }
    }

    #[test]
    fn finished_offsets_behind_one_held_long_do_not_pile_up() {
        let mut in_flight = InFlight::default();
        // Offset 0 is held (a step's first message, parked) while a million
        // after it come and finish.
        in_flight.insert(0);
        for offset in 1..1_000_000 {
            in_flight.insert(offset);
            assert!(in_flight.remove(offset));
        }
        assert!(
            in_flight.taken.len() <= 2 + COMPACT_SLACK,
            "{} kept",
            in_flight.taken.len()
        );
        assert!(in_flight.taken.capacity() <= 4 * (2 + COMPACT_SLACK) + COMPACT_SLACK);
        assert_eq!((in_flight.first(), in_flight.len()), (Some(0), 1));
        // Finished and let go: not in flight, and taken again, it is.
        assert!(!in_flight.contains(5) && !in_flight.remove(5));
        in_flight.insert(5);
        assert!(in_flight.contains(5));
        assert!(in_flight.remove(0));
        assert_eq!(in_flight.first(), Some(5));
    }

    #[test]
    fn random_completion_never_passes_an_unfinished_offset() {
        use rand::seq::SliceRandom;
        let mut rng = rand::rng();
        let mut t = OffsetTracker::new();
        let mut tickets: Vec<_> = (0..500).map(|o| t.take("t", 0, o)).collect();
        tickets.shuffle(&mut rng);
        let mut finished = std::collections::HashSet::new();
        for ticket in tickets {
            finished.insert(ticket.offset);
            if let Some(next) = t.finish(&ticket) {
                assert!(
                    (0..next).all(|o| finished.contains(&o)),
                    "stored {next} past an unfinished offset"
                );
            }
        }
        assert_eq!(t.committable("t", 0), Some(500));
    }
}
