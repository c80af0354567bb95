//! Outputs held for their inputs under exactly_once, and which of them
//! join the next transaction.
//!
//! Work finishes out of order (hints per group; steps interleaved on one
//! partition), so an output is *held* until its partition's contiguous
//! finished offset (the tracker's committable offset) has passed every one
//! of its inputs ([`Passage::Passed`]); only then does it join a
//! transaction, together with that committable offset, capped so that no
//! commit splits the inputs of an output still waiting.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use rdkafka::message::OwnedHeaders;

use super::partition::Partition;
use super::tracker::{OffsetTracker, Passage, Ticket};

/// An output waiting for its inputs to be passed by the committable offset
/// (no record: inputs finished together with no output, which must not be
/// split by a commit either).
pub(crate) struct Held {
    pub(crate) record: Option<Record>,
    pub(crate) inputs: Inputs,
}

/// The inputs of an output, shared by the outputs made from the same ones
/// (a step's chunks, hint outcomes and metrics, and the marker that binds
/// them): each holds a pointer, not a copy of the list, and [`select`]
/// looks at each list once. A 10,000-row step of JSON rows with hints that
/// learn held 10,001 tickets for each of its 698 outputs, and a step took
/// 21-25 s (docs/BENCHMARKS.md, round thirty-six).
#[derive(Debug, Clone)]
pub(crate) struct Inputs {
    tickets: Arc<[Ticket]>,
    /// One ticket of each partition and life among them (see
    /// [`Ticket::life`]).
    lives: Arc<[Ticket]>,
}

impl Inputs {
    pub(crate) fn new(tickets: Vec<Ticket>) -> Self {
        let mut lives: Vec<Ticket> = Vec::new();
        let mut seen = HashSet::new();
        for ticket in &tickets {
            // Most follow a ticket of their own life.
            if lives.last().is_some_and(|l| l.life() == ticket.life()) {
                continue;
            }
            if seen.insert(ticket.life()) {
                lives.push(ticket.clone());
            }
        }
        Inputs {
            tickets: tickets.into(),
            lives: lives.into(),
        }
    }

    pub(crate) fn tickets(&self) -> &[Ticket] {
        &self.tickets
    }

    pub(crate) fn len(&self) -> usize {
        self.tickets.len()
    }

    /// One ticket of each partition and life among them.
    pub(crate) fn lives(&self) -> &[Ticket] {
        &self.lives
    }

    /// What tells this list from another held at the same time.
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.tickets) as *const Ticket as usize
    }
}

/// An output's record, owned.
pub(crate) struct Record {
    pub(crate) topic: String,
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) payload: Option<Vec<u8>>,
    pub(crate) headers: OwnedHeaders,
}

/// Splits the held outputs into those that join this transaction and those
/// that wait, and returns, per partition, the offset a commit may not pass:
/// the lowest input of a waiting output. An output is ready when every input
/// is passed by the committable offset AND below that cap, so that no commit
/// ever splits an output's inputs (steps interleave on a partition: a step
/// whose rows sit below and above an unfinished one waits whole, and the
/// offset stays below its first row). Stale outputs (of a reset partition)
/// are dropped.
pub(crate) fn select(
    tracker: &OffsetTracker,
    held: Vec<Held>,
) -> (Vec<Held>, Vec<Held>, HashMap<Partition, i64>) {
    let mut ready = Vec::new();
    let mut waiting = Vec::new();
    // Each list of inputs is looked at once, however many outputs share it.
    let mut passages: HashMap<usize, Passage> = HashMap::new();
    for h in held {
        let passage = *passages
            .entry(h.inputs.id())
            .or_insert_with(|| passage_of(tracker, h.inputs.tickets()));
        match passage {
            Passage::Passed => ready.push(h),
            Passage::Waiting => waiting.push(h),
            Passage::Stale => {}
        }
    }
    let mut caps: HashMap<Partition, i64> = HashMap::new();
    let mut lowered: HashSet<usize> = HashSet::new();
    fn lower(caps: &mut HashMap<Partition, i64>, lowered: &mut HashSet<usize>, h: &Held) {
        if !lowered.insert(h.inputs.id()) {
            return;
        }
        for t in h.inputs.tickets() {
            let cap = caps.entry((t.topic.clone(), t.partition)).or_insert(t.offset);
            *cap = (*cap).min(t.offset);
        }
    }
    for h in &waiting {
        lower(&mut caps, &mut lowered, h);
    }
    // A ready output above a cap waits too, which may lower the cap: until
    // nothing moves (each round moves at least one, so at most n rounds).
    loop {
        let mut below: HashMap<usize, bool> = HashMap::new();
        let (stay, held_back): (Vec<Held>, Vec<Held>) = ready.into_iter().partition(|h| {
            *below.entry(h.inputs.id()).or_insert_with(|| {
                h.inputs.tickets().iter().all(|t| {
                    caps.get(&(t.topic.clone(), t.partition))
                        .is_none_or(|cap| t.offset < *cap)
                })
            })
        });
        ready = stay;
        if held_back.is_empty() {
            break;
        }
        for h in &held_back {
            lower(&mut caps, &mut lowered, h);
        }
        waiting.extend(held_back);
    }
    // Outputs of one input set (a step's chunks, outcomes, metrics) move
    // together, so their registration order holds in every transaction.
    (ready, waiting, caps)
}

/// Where an output stands: [`Passage::Passed`] once all its inputs are,
/// [`Passage::Stale`] when any was reset, [`Passage::Waiting`] otherwise.
fn passage_of(tracker: &OffsetTracker, inputs: &[Ticket]) -> Passage {
    let mut all = Passage::Passed;
    for input in inputs {
        match tracker.passage(input) {
            Passage::Stale => return Passage::Stale,
            Passage::Waiting => all = Passage::Waiting,
            Passage::Passed => {}
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_joins_only_once_the_contiguous_offset_passed_all_its_inputs() {
        let mut tracker = OffsetTracker::new();
        let t = |tracker: &mut OffsetTracker, o| tracker.begin("in", 0, o).0;
        let (a, b, c, d) = (
            t(&mut tracker, 10),
            t(&mut tracker, 11),
            t(&mut tracker, 12),
            t(&mut tracker, 13),
        );
        // Output of 11 and 13 (a group of two): both finish, 10 and 12 do not.
        tracker.finish(&b);
        tracker.finish(&d);
        let group = [b.clone(), d.clone()];
        assert_eq!(passage_of(&tracker, &group), Passage::Waiting, "10 is unfinished");
        tracker.finish(&a);
        assert_eq!(
            passage_of(&tracker, std::slice::from_ref(&b)),
            Passage::Passed,
            "10 and 11 finished"
        );
        assert_eq!(
            passage_of(&tracker, &group),
            Passage::Waiting,
            "12 is unfinished: 13 is past the committable offset"
        );
        tracker.finish(&c);
        assert_eq!(passage_of(&tracker, &group), Passage::Passed);
        assert_eq!(tracker.committable("in", 0), Some(14));
    }

    #[test]
    fn an_unfinished_input_holds_its_output_even_below_later_finished_ones() {
        let mut tracker = OffsetTracker::new();
        let a = tracker.begin("in", 0, 5).0;
        let b = tracker.begin("in", 0, 6).0;
        tracker.finish(&b);
        assert_eq!(tracker.passage(&a), Passage::Waiting);
        assert_eq!(tracker.passage(&b), Passage::Waiting);
        // Inputs on two partitions: each partition's offset must pass its own.
        let other = tracker.begin("in", 1, 100).0;
        tracker.finish(&other);
        assert_eq!(
            passage_of(&tracker, std::slice::from_ref(&other)),
            Passage::Passed
        );
        assert_eq!(passage_of(&tracker, &[other, b]), Passage::Waiting);
    }

    fn marker(inputs: &[&Ticket]) -> Held {
        Held {
            record: None,
            inputs: Inputs::new(inputs.iter().map(|t| (*t).clone()).collect()),
        }
    }

    /// Offsets 0-9 of partition 0 of `in` taken, all but 7 finished.
    fn all_finished_but_7(tracker: &mut OffsetTracker) -> Vec<Ticket> {
        let t: Vec<Ticket> = (0..10).map(|o| tracker.begin("in", 0, o).0).collect();
        for (o, ticket) in t.iter().enumerate() {
            if o != 7 {
                tracker.finish(ticket);
            }
        }
        t
    }

    #[test]
    fn no_commit_splits_the_inputs_of_an_output_across_interleaved_steps() {
        let mut tracker = OffsetTracker::new();
        // Step Y: offsets 3 and 9, finished together; step X: offset 5;
        // offset 7 (another step) unfinished; the rest finished alone.
        let t = all_finished_but_7(&mut tracker);
        assert_eq!(tracker.committable("in", 0), Some(7));
        let held = vec![marker(&[&t[3], &t[9]]), marker(&[&t[5]]), marker(&[&t[1]])];
        let (ready, waiting, caps) = select(&tracker, held);
        let key = (t[0].topic.clone(), 0);
        assert_eq!(caps.get(&key), Some(&3), "a commit stops below Y's first input");
        assert_eq!(ready.len(), 1, "only the output of 1 joins");
        assert_eq!(ready[0].inputs.tickets()[0].offset, 1);
        assert_eq!(waiting.len(), 2, "X (5) waits behind Y's cap, Y behind 7");
        tracker.finish(&t[7]);
        let (ready, waiting, caps) = select(&tracker, waiting);
        assert_eq!((ready.len(), waiting.len()), (2, 0));
        assert!(caps.is_empty());
        assert_eq!(tracker.committable("in", 0), Some(10));
    }

    /// A step's outputs share one list of inputs, which `select` looks at
    /// once: they stay and move together, as outputs of copies would.
    #[test]
    fn outputs_sharing_their_inputs_move_together() {
        let mut tracker = OffsetTracker::new();
        let t = all_finished_but_7(&mut tracker);
        // Step Y (3 and 9): three outputs of one list and one of a copy;
        // step X (5): two outputs of one list; offset 1 alone.
        let y = Inputs::new(vec![t[3].clone(), t[9].clone()]);
        let x = Inputs::new(vec![t[5].clone()]);
        let of = |inputs: &Inputs| Held {
            record: None,
            inputs: inputs.clone(),
        };
        let held = vec![
            of(&y),
            of(&x),
            of(&y),
            marker(&[&t[3], &t[9]]),
            of(&x),
            of(&y),
            marker(&[&t[1]]),
        ];
        let (ready, waiting, caps) = select(&tracker, held);
        assert_eq!(caps.get(&(t[0].topic.clone(), 0)), Some(&3));
        assert_eq!(ready.len(), 1, "only the output of 1 joins");
        assert_eq!(waiting.len(), 6, "Y's four wait for 7, X's two behind Y's cap");
        tracker.finish(&t[7]);
        let (ready, waiting, caps) = select(&tracker, waiting);
        assert_eq!((ready.len(), waiting.len()), (6, 0));
        assert!(caps.is_empty());
    }

    #[test]
    fn inputs_keep_one_ticket_of_each_partitions_life() {
        let mut tracker = OffsetTracker::new();
        let a: Vec<Ticket> = (0..3).map(|o| tracker.begin("in", 0, o).0).collect();
        let b = tracker.begin("in", 1, 0).0;
        tracker.reset("in", 0);
        let c = tracker.begin("in", 0, 3).0;
        let inputs = Inputs::new(vec![
            a[0].clone(),
            b.clone(),
            a[1].clone(),
            c.clone(),
            a[2].clone(),
        ]);
        assert_eq!(inputs.len(), 5);
        assert_eq!(inputs.lives(), &[a[0].clone(), b, c][..]);
    }

    #[test]
    fn outputs_of_a_reset_partition_are_stale_and_dropped() {
        let mut tracker = OffsetTracker::new();
        let a = tracker.begin("in", 0, 1).0;
        tracker.finish(&a);
        assert_eq!(tracker.passage(&a), Passage::Passed);
        tracker.reset("in", 0);
        assert_eq!(tracker.passage(&a), Passage::Stale);
        let b = tracker.begin("in", 0, 1).0;
        assert_eq!(passage_of(&tracker, &[b, a]), Passage::Stale);
    }

    #[test]
    fn random_completion_never_lets_an_output_pass_an_unfinished_input() {
        use rand::seq::SliceRandom;
        let mut rng = rand::rng();
        let mut tracker = OffsetTracker::new();
        let tickets: Vec<Ticket> = (0..300).map(|o| tracker.begin("in", 0, o).0).collect();
        // Outputs of three inputs each, far apart.
        let outputs: Vec<Vec<Ticket>> = (0..100)
            .map(|i| {
                vec![
                    tickets[i].clone(),
                    tickets[i + 100].clone(),
                    tickets[i + 200].clone(),
                ]
            })
            .collect();
        let mut order = tickets.clone();
        order.shuffle(&mut rng);
        let mut finished = std::collections::HashSet::new();
        for ticket in order {
            tracker.finish(&ticket);
            finished.insert(ticket.offset);
            for inputs in &outputs {
                if passage_of(&tracker, inputs) == Passage::Passed {
                    let top = inputs.iter().map(|t| t.offset).max().unwrap_or(0);
                    assert!(
                        (0..=top).all(|o| finished.contains(&o)),
                        "passed before {top} was contiguous"
                    );
                }
            }
        }
        assert!(outputs.iter().all(|i| passage_of(&tracker, i) == Passage::Passed));
    }
}
