//! Step assembly: scored rows arrive one message at a time (a JSON row, or an
//! Arrow batch of many rows) and a `step_end` says how many rows the step has.
//! A step is complete when its `step_end` arrived and that many distinct rows
//! (by `trajectory_id`) are in. The messages stay parked, unfinished, until
//! the step is published or dead-lettered, so a crash redelivers them.
//!
//! The assembler knows the bytes each pending step holds (its messages and
//! its decoded rows), so the stage can keep the total under a bound by
//! evicting the oldest incomplete step, and which partition each step came
//! from, so a revoked partition's steps can be let go.
//!
//! It also remembers the last [`COMPLETED_STEPS_REMEMBERED`] steps it
//! completed: a message of one of them (a stray row after `step_end`, a
//! client's retry of the whole step) is [`StepStatus::AlreadyPublished`] at
//! once, never a new pending step that would hold its partition's commits
//! until `step_timeout`.

use std::collections::{BTreeSet, VecDeque};
use std::hash::{BuildHasher, Hash, RandomState};
use std::time::{Duration, Instant};

use hashbrown::hash_map::EntryRef;
use hashbrown::{Equivalent, HashMap};

use crate::batch::{RowKeys, ScoredRows, Strings};
use crate::messages::ScoredRollout;
use crate::normalize::clashes::clashing_rows;
use crate::normalize::groups::{DenseGroups, HashedGroups};

/// Where a message sat: (partition, offset). Rows are put back in this order.
pub type Position = (i32, i64);

/// A step's key: its `run_id` and step number.
type StepKey = (String, i64);

/// A step's key as a message holds it: the maps keyed by [`StepKey`] are
/// asked by it, with no copy of the `run_id` a message (it hashes as the
/// tuple does). Their hasher stays SipHash: the `run_id`s come from the
/// input topic's writers.
#[derive(Hash, Clone, Copy)]
struct StepRef<'a>(&'a str, i64);

impl Equivalent<StepKey> for StepRef<'_> {
    fn equivalent(&self, key: &StepKey) -> bool {
        self.1 == key.1 && self.0 == key.0
    }
}

/// A new step's key.
impl From<&StepRef<'_>> for StepKey {
    fn from(key: &StepRef<'_>) -> Self {
        (key.0.to_string(), key.1)
    }
}

/// Steps by key.
type ByStep<V> = HashMap<StepKey, V, RandomState>;

/// Rows of one (run_id, step) gathered so far, with the messages they came
/// in (`P`: the stage keeps each message's bytes and its unfinished offset).
pub struct PendingStep<P> {
    pub run_id: String,
    pub step: i64,
    /// `count` of the step's `step_end`, once it arrived.
    pub expected: Option<i64>,
    /// The kept rows, in parts, in the order their messages arrived:
    /// input order unless `ordered` is false. A message's rows join the
    /// last part while it holds fewer than [`PART_ROWS`].
    parts: Vec<ScoredRows>,
    /// Each message that brought rows: its position and its first row
    /// (counting across the parts).
    messages: Vec<(Position, usize)>,
    /// Whether each message came after every one before it.
    ordered: bool,
    /// The hash of each held row's `trajectory_id`, in the order of
    /// `parts`, for the duplicates check.
    ///
    /// The check waits until the step may be complete (its `step_end` is in
    /// and it holds at least that many rows): the hashes that clash with
    /// another in their low bits are then sorted, and only rows of equal
    /// hashes compare their ids ([`PendingStep::drop_duplicates`]). A table
    /// that every row looked its id up in as it arrived cost a 1M-row step
    /// ~50-100 ms of the intake's one thread (a cache miss a row in a table
    /// of 16 MB); sorting every hash with its row, 55-60 ms once; the
    /// clashes, 10-15 ms, and about 8 ms once those of the clashes' high
    /// bits are left to sort ([`PendingStep::drop_duplicates`]).
    hashes: Vec<u64>,
    /// The ids as a table, once a check found the step short of its
    /// `step_end` count (duplicates were dropped): each id's hash and where
    /// it sits in `parts` (part, row). A row that arrives then is looked up
    /// at once, so that a stream of duplicates costs a lookup each, not a
    /// sort of the whole step each.
    ids: Option<hashbrown::HashTable<(u64, u32, u32)>>,
    hasher: foldhash::fast::RandomState,
    /// The kept rows' `instance_id`s mapped to dense group ids as they
    /// arrive, while the step's rows are in input order and none was
    /// dropped as a duplicate since it was kept: the step's compute then
    /// starts from them ([`GatheredRows::join_with_groups`]). Mapped after
    /// the join, a 1M-row step's ids were its compute's longest part (57 ms
    /// on one core), after its last message; here they cost the consume
    /// loop about 0.6 ms a message of 10,000 rows. `None` once it no longer
    /// holds (or two ids shared a hash): the ids are then mapped after the
    /// join, as before.
    groups: Option<HashedGroups>,
    pub duplicates: usize,
    pub parked: Vec<P>,
    pub first_seen: Instant,
    /// Bytes held: the parked messages and the rows.
    pub bytes: usize,
    /// Input partitions its messages came from.
    partitions: BTreeSet<i32>,
    /// Rows the step before it had ([`StepSizes`]; 0 when it started
    /// beside another): a part begun by a JSON row gets room for as many,
    /// up to [`PART_ROWS`], where it grew row by row.
    room: usize,
    /// The text bytes of the step before's three string columns
    /// ([`StepSizes::text`]), until a part took the room
    /// ([`PendingStep::new_part`]); `None` when `room` is 0.
    room_text: Option<[usize; 3]>,
}

/// How a message ended its step ([`PendingStep::verdict`]).
enum Verdict {
    Complete,
    Overfull,
    MixedPartitions,
}

/// A completed step's sizes. The next step, when no other is pending as it
/// starts, begins with room for as many (rows, messages, parts, its group
/// map): a trainer's steps are alike, and growing to them cost a 1M-row step
/// about 6% of its CPU (its map rehashed as it doubled, its columns copied)
/// and a step of JSON rows its reallocations; a step of large messages
/// begins one part with room for all its rows, and is not copied into one
/// after its last message ([`PendingStep::new_part`]). The map's room
/// counts with the step's bytes from the start. The room of its lists and
/// of its part does not (a message's share of them is in the bytes it is
/// counted by, as it comes): it is at most one completed step's, one step
/// at a time (a step that starts beside another gets none), in pages the
/// allocator keeps for the next step anyway (`crate::allocator`).
#[derive(Clone, Copy, Default)]
struct StepSizes {
    rows: usize,
    messages: usize,
    parked: usize,
    parts: usize,
    /// The text bytes of its rows' three string columns
    /// ([`ScoredRows::text_lens`]).
    text: [usize; 3],
    /// Its map's groups and their first strings' bytes, when it had one.
    groups: Option<(usize, usize)>,
}

impl StepSizes {
    fn of<P>(step: &PendingStep<P>) -> Self {
        StepSizes {
            rows: step.hashes.len(),
            messages: step.messages.len(),
            parked: step.parked.len(),
            parts: step.parts.len(),
            text: step.text_lens(),
            groups: step.groups.as_ref().map(HashedGroups::room),
        }
    }
}

/// When a step opening now was first seen: an instant given, or [`Now`].
pub trait OpenedAt {
    fn instant(self) -> Instant;
}

impl OpenedAt for Instant {
    fn instant(self) -> Instant {
        self
    }
}

/// The clock, read only when a step opens: most messages join a step that
/// is open already, and a read a message was about 1% of stage 2's intake
/// of JSON rows.
#[derive(Debug, Clone, Copy)]
pub struct Now;

impl OpenedAt for Now {
    fn instant(self) -> Instant {
        Instant::now()
    }
}

/// The pending step of `key`, opened if it has none: with room for the last
/// completed step's sizes when no other step is pending ([`StepSizes`]), its
/// bytes counted in `held`. `Err(first)` when `key` completed already
/// ([`CompletedSteps::late`]); a pending step never has, since a step is
/// remembered as completed only once it is no longer pending, and none
/// opens while it is remembered.
fn open<'s, P>(
    steps: &'s mut ByStep<PendingStep<P>>,
    completed: &mut CompletedSteps,
    held: &mut usize,
    key: StepRef<'_>,
    now: impl OpenedAt,
) -> Result<&'s mut PendingStep<P>, bool> {
    let alone = steps.is_empty();
    match steps.entry_ref(&key) {
        EntryRef::Occupied(step) => Ok(step.into_mut()),
        EntryRef::Vacant(new) => {
            if let Some(first) = completed.late(key) {
                return Err(first);
            }
            let room = completed.sizes.as_ref().filter(|_| alone);
            let step = new.insert(PendingStep::new(key.0, key.1, now.instant(), room));
            *held += step.bytes;
            Ok(step)
        }
    }
}

impl<P> PendingStep<P> {
    /// A step with room for `room` (none when it is `None`: see [`open`]).
    fn new(run_id: &str, step: i64, now: Instant, room: Option<&StepSizes>) -> Self {
        let room = room.copied().unwrap_or_default();
        let groups = match room.groups {
            Some((groups, text)) if room.rows > 0 => HashedGroups::with_room(room.rows, groups, text),
            _ => HashedGroups::new(),
        };
        PendingStep {
            run_id: run_id.to_string(),
            step,
            expected: None,
            parts: Vec::with_capacity(room.parts),
            messages: Vec::with_capacity(room.messages),
            ordered: true,
            hashes: Vec::with_capacity(room.rows),
            ids: None,
            hasher: foldhash::fast::RandomState::default(),
            bytes: groups.footprint(),
            groups: Some(groups),
            duplicates: 0,
            parked: Vec::with_capacity(room.parked),
            first_seen: now,
            partitions: BTreeSet::new(),
            room: room.rows,
            room_text: (room.rows > 0).then_some(room.text),
        }
    }

    /// The text bytes its parts' three string columns hold.
    fn text_lens(&self) -> [usize; 3] {
        ScoredRows::text_lens_of(&self.parts)
    }

    /// A new part for `rows`, which the step's row hashes count already.
    /// The first message of rows that the step before outnumbers at least
    /// twice gets room for the rest of that step's rows and text, so that
    /// the messages after it join it: a step as large as the one before is
    /// then one part, which its compute takes as it is instead of copying
    /// every row into one (the longest part of a 1M-row step's compute).
    /// Only one part a step gets that room: should the rows outgrow it
    /// (longer ids than the step before's), the rest begin parts as they
    /// are. A JSON row's part gets room for up to [`PART_ROWS`] rows like
    /// it.
    fn new_part(&mut self, rows: Incoming) -> ScoredRows {
        let left = self.room.saturating_sub(self.hashes.len());
        match rows {
            Incoming::Rows(rows, _)
                if left >= rows.len()
                    && self.room_text.is_some()
                    && self
                        .expected
                        .is_none_or(|count| (self.hashes.len() as i64) < count) =>
            {
                let room_text = self.room_text.take().unwrap_or_default();
                let held = self.text_lens();
                let mine = rows.text_lens();
                let text = std::array::from_fn(|c| room_text[c].saturating_sub(held[c]).max(mine[c]));
                let mut part = ScoredRows::with_room(rows.len() + left, text);
                part.extend(*rows);
                part
            }
            rows => rows.into_part(left.min(PART_ROWS - 1)),
        }
    }

    /// Whether a message left the step to be ended, and its key then: its
    /// messages came from more than one partition, or its `step_end` is in
    /// and it holds that many distinct rows (complete) or more (overfull).
    /// Once it may be complete, its duplicates are dropped first (then,
    /// should it fall short, its ids are indexed for the rows still to
    /// come); `held`, the assembler's bytes, follows the step's.
    fn verdict(&mut self, held: &mut usize) -> Option<(Verdict, StepKey)> {
        let verdict = if self.partitions.len() > 1 {
            Verdict::MixedPartitions
        } else {
            let expected = self.expected?;
            if self.row_count() as i64 >= expected && self.ids.is_none() {
                let freed = self.drop_duplicates();
                self.bytes = self.bytes.saturating_sub(freed);
                *held = held.saturating_sub(freed);
                if (self.row_count() as i64) < expected {
                    let index = self.index_ids();
                    self.bytes += index;
                    *held += index;
                }
            }
            match (self.row_count() as i64).cmp(&expected) {
                std::cmp::Ordering::Less => return None,
                std::cmp::Ordering::Equal => Verdict::Complete,
                std::cmp::Ordering::Greater => Verdict::Overfull,
            }
        };
        Some((verdict, (self.run_id.clone(), self.step)))
    }

    /// Rows held: distinct once the step was checked against its
    /// `step_end` count, duplicates included before.
    pub fn row_count(&self) -> usize {
        self.hashes.len()
    }

    /// Distinct rows held, checking the step for duplicates first if it was
    /// not yet (for a step that leaves incomplete: evicted, timed out).
    pub fn distinct_rows(&mut self) -> usize {
        if self.ids.is_none() {
            self.drop_duplicates();
        }
        self.row_count()
    }

    /// Drops every row whose `trajectory_id` a row before it has (the first
    /// to arrive stays): the rows whose hashes clash in a bit array of 8 bits
    /// a row (two arrays of at most 1 MiB), and then in their high bits,
    /// are sorted by hash ([`clashing_rows`]), and the ids of equal hashes
    /// compared. At 1M rows about 11% clash in the
    /// first, and this takes about 8 ms (criterion `assemble_end`; 13 ms
    /// sorting all of the 11%, 55-60 ms sorting every row's hash). Returns
    /// the bytes the dropped rows held.
    fn drop_duplicates(&mut self) -> usize {
        // Where the step's last message is handed on (the consume loop or
        // its ordered task), not on rayon's pool: it may be busy with the
        // kernel of a step before this one.
        let order = clashing_rows(&self.hashes, 8, 1 << 23);
        if order.is_empty() {
            return 0;
        }
        let starts: Vec<usize> = self
            .parts
            .iter()
            .scan(0, |start, part| {
                let this = *start;
                *start += part.len();
                Some(this)
            })
            .collect();
        let place = |row: u32| {
            let part = starts.partition_point(|&start| start <= row as usize) - 1;
            (part, row as usize - starts[part])
        };
        let id = |row: u32| {
            let (part, at) = place(row);
            &self.parts[part].trajectory_id[at]
        };
        // Within a run of equal hashes the rows are in arrival order.
        let mut dropped: Vec<u32> = Vec::new();
        let mut kept: Vec<u32> = Vec::new();
        for run in order.chunk_by(|a, b| a.0 == b.0).filter(|run| run.len() > 1) {
            kept.clear();
            for &(_, row) in run {
                if kept.iter().any(|&k| id(k) == id(row)) {
                    dropped.push(row);
                } else {
                    kept.push(row);
                }
            }
        }
        if dropped.is_empty() {
            return 0;
        }
        dropped.sort_unstable();
        let freed: usize = dropped
            .iter()
            .map(|&row| {
                let (part, at) = place(row);
                row_bytes(&self.parts[part], at) + HASH_BYTES
            })
            .sum();
        let mut gone = vec![false; self.hashes.len()];
        for &row in &dropped {
            gone[row as usize] = true;
        }
        for (part, &start) in self.parts.iter_mut().zip(&starts) {
            let gone = &gone[start..start + part.len()];
            if gone.contains(&true) {
                // In place: a step put in one part keeps its room.
                part.retain_rows(gone);
            }
        }
        let mut row = 0;
        self.hashes.retain(|_| {
            row += 1;
            !gone[row - 1]
        });
        for (_, first) in &mut self.messages {
            *first -= dropped.partition_point(|&d| (d as usize) < *first);
        }
        self.duplicates += dropped.len();
        // Rows it mapped are gone: the ids are mapped after the join.
        freed + self.forget_groups()
    }

    /// Drops the group ids mapped as the rows came; returns the bytes they
    /// held.
    fn forget_groups(&mut self) -> usize {
        self.groups.take().map_or(0, |groups| groups.footprint())
    }

    /// Maps `rows`' group ids after the rows before them, while the step is
    /// in input order. Returns the bytes the map holds now less before
    /// (negative when it gave up, or the order broke, and was dropped).
    fn map_groups(&mut self, rows: &Incoming) -> isize {
        let before = self.groups.as_ref().map_or(0, HashedGroups::footprint) as isize;
        if !self.ordered {
            self.groups = None;
        }
        let Some(groups) = self.groups.as_mut() else {
            return -before;
        };
        match rows {
            Incoming::Rows(rows, Some(keys)) if keys.keys.len() == rows.len() => {
                groups.extend_keyed(&keys.keys, keys.values, |row| &rows.instance_id[row])
            }
            rows => groups.extend(rows.instance_ids()),
        }
        groups.footprint() as isize - before
    }

    /// Puts the held rows' ids (distinct) in a table that later rows are
    /// looked up in as they arrive. Returns the bytes it holds.
    fn index_ids(&mut self) -> usize {
        let mut table = hashbrown::HashTable::with_capacity(self.hashes.len());
        let mut hashes = self.hashes.iter();
        for (part, rows) in self.parts.iter().enumerate() {
            for (row, &hash) in (0..rows.len()).zip(&mut hashes) {
                let at = (hash, part as u32, row as u32);
                table.insert_unique(hash, at, |&(hash, ..)| hash);
            }
        }
        self.ids = Some(table);
        self.hashes.len() * ID_SLOT_BYTES
    }

    /// All rows in input order (partition, then offset, then position).
    pub fn into_rows(self) -> (ScoredRows, Vec<P>) {
        let (rows, parked) = self.into_gathered();
        (rows.join(), parked)
    }

    /// Its rows as gathered (not yet put together: see [`GatheredRows`]),
    /// and its messages.
    pub fn into_gathered(self) -> (GatheredRows, Vec<P>) {
        if self.ordered {
            let rows = self.hashes.len();
            let groups = self
                .groups
                .and_then(HashedGroups::finish)
                .filter(|groups| groups.ids.len() == rows);
            let rows = GatheredRows {
                parts: self.parts,
                order: None,
                groups,
            };
            return (rows, self.parked);
        }
        // A message came before one it follows: each message's rows go
        // back to their place.
        let total = self.hashes.len();
        let ends = self.messages.iter().skip(1).map(|&(_, start)| start);
        let mut spans: Vec<(Position, std::ops::Range<usize>)> = self
            .messages
            .iter()
            .zip(ends.chain([total]))
            .map(|(&(position, start), end)| (position, start..end))
            .collect();
        spans.sort_by_key(|(position, _)| *position);
        let order: Vec<usize> = spans.into_iter().flat_map(|(_, rows)| rows).collect();
        let rows = GatheredRows {
            parts: self.parts,
            order: Some(order),
            groups: None,
        };
        (rows, self.parked)
    }
}

/// A complete step's rows as its messages brought them: in parts, and,
/// when a message came before one it follows, the order that puts them
/// back in input order. [`GatheredRows::join`] puts them together, in the
/// step's task, off the ordered assembly.
pub struct GatheredRows {
    parts: Vec<ScoredRows>,
    order: Option<Vec<usize>>,
    /// The rows' group ids, when they were mapped as the rows came (see
    /// [`PendingStep::groups`]).
    groups: Option<DenseGroups>,
}

impl GatheredRows {
    /// Rows gathered in `parts`, in input order already.
    pub fn in_order(parts: Vec<ScoredRows>) -> Self {
        GatheredRows {
            parts,
            order: None,
            groups: None,
        }
    }

    /// The rows in input order, in one [`ScoredRows`].
    pub fn join(self) -> ScoredRows {
        let mut parts = self.parts.into_iter();
        // The first part is the base: its columns grow once to the whole
        // step, not a doubling at a time.
        let mut rows = parts.next().unwrap_or_default();
        let more: Vec<ScoredRows> = parts.collect();
        if more.is_empty() && rows.reward.capacity() > 2 * rows.len() {
            // A part with room for a step before much larger: what it took
            // is given back before the compute (the next step may take
            // room again meanwhile).
            rows.shrink_to_fit();
        }
        rows.reserve_for(&more);
        for part in more {
            rows.extend(part);
        }
        match self.order {
            None => rows,
            Some(order) => rows.take(&order),
        }
    }

    /// [`Self::join`], and the rows' group ids mapped to dense ones
    /// ([`DenseGroups::from_strings`] of the joined `instance_id`, the same
    /// ids). Ids mapped as the rows came (`PendingStep::groups`) are
    /// taken as they are. Otherwise the parts' `instance_id`s are joined and
    /// mapped on a thread of their own while this one puts the other
    /// columns together: at 1M rows
    /// each takes tens of ms, and a machine of two cores does both at once.
    /// Not on rayon's pool, where it would wait behind the kernel of a step
    /// before. Rows that must be put back in input order are joined first,
    /// then mapped.
    pub fn join_with_groups(mut self) -> (ScoredRows, DenseGroups) {
        if let Some(groups) = self.groups.take() {
            let rows = self.join();
            debug_assert_eq!(rows.len(), groups.ids.len());
            return (rows, groups);
        }
        if self.order.is_some() || self.parts.len() < 2 {
            let rows = self.join();
            let groups = DenseGroups::from_strings(rows.instance_id.iter());
            return (rows, groups);
        }
        let ids: Vec<Strings> = self
            .parts
            .iter_mut()
            .map(|part| std::mem::take(&mut part.instance_id))
            .collect();
        let map = move || {
            let count = ids.iter().map(Strings::len).sum();
            let bytes = ids.iter().map(Strings::text_len).sum();
            let mut joined = Strings::with_capacity(count, bytes);
            // Each part's column freed once it is in.
            ids.into_iter().for_each(|column| joined.append(&column));
            let groups = DenseGroups::from_strings(joined.iter());
            (joined, groups)
        };
        let (mut rows, (instance_id, groups)) = std::thread::scope(|scope| {
            let mapping = std::thread::Builder::new()
                .name("step-group-ids".into())
                .spawn_scoped(scope, map)
                .expect("a thread for a step's group ids");
            let rows = self.join();
            let mapped = mapping
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (rows, mapped)
        });
        rows.instance_id = instance_id;
        (rows, groups)
    }
}

/// Where a step stands after a message was added to it.
///
/// Each step or message it carries is boxed: most messages only join their
/// step (`Pending`), and inline the others made every status hundreds of
/// bytes, copied on each message's way out of the assembler (3.5% of stage
/// 2's worker on JSON rows).
pub enum StepStatus<P> {
    /// The step is still missing rows or its `step_end`.
    Pending,
    /// Every row is in: publish it.
    Complete(Box<PendingStep<P>>),
    /// More distinct rows than `step_end` announced: dead-letter it.
    Overfull(Box<PendingStep<P>>),
    /// Its messages came from more than one partition: they were not all
    /// keyed `run_id/step`, so no one member can gather the step for sure.
    MixedPartitions(Box<PendingStep<P>>),
    /// The message belongs to a step completed already (a stray row after
    /// its `step_end`, a retried step): it is not kept.
    AlreadyPublished(Box<LateMessage<P>>),
}

/// A message of a step completed already.
pub struct LateMessage<P> {
    pub run_id: String,
    pub step: i64,
    pub parked: P,
    /// Rows it holds (0 for a `step_end`).
    pub rows: usize,
    /// Whether it is the first such message of its step since it completed:
    /// that one is dead-lettered, the rest only counted.
    pub first: bool,
}

impl<P> LateMessage<P> {
    /// A message of `rows` rows of the step of `key`, completed already.
    fn of(key: StepRef<'_>, parked: P, rows: usize, first: bool) -> StepStatus<P> {
        StepStatus::AlreadyPublished(Box::new(LateMessage {
            run_id: key.0.to_string(),
            step: key.1,
            parked,
            rows,
            first,
        }))
    }
}

/// How many completed steps the assembler remembers, to recognise their
/// late messages; the oldest is forgotten first. A remembered step costs
/// its run_id and ~64 bytes; a late message of a forgotten step waits out
/// `step_timeout` as before.
pub const COMPLETED_STEPS_REMEMBERED: usize = 4096;

/// The last completed steps, with how many late messages each has had and
/// the partitions its messages came from.
#[derive(Default)]
struct CompletedSteps {
    late: ByStep<(u64, BTreeSet<i32>)>,
    order: VecDeque<StepKey>,
    /// The last one's sizes.
    sizes: Option<StepSizes>,
}

impl CompletedSteps {
    fn insert(&mut self, key: StepKey, partitions: BTreeSet<i32>) {
        if self.late.insert(key.clone(), (0, partitions)).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > COMPLETED_STEPS_REMEMBERED {
            if let Some(oldest) = self.order.pop_front() {
                self.late.remove(&oldest);
            }
        }
    }

    /// Counts a late message of `key`; `Some(first)` when `key` completed.
    fn late(&mut self, key: StepRef<'_>) -> Option<bool> {
        let (seen, _) = self.late.get_mut(&key)?;
        *seen += 1;
        Some(*seen == 1)
    }

    /// Forgets the steps whose messages came from any of `partitions`.
    fn forget(&mut self, partitions: &[i32]) {
        self.late
            .retain(|_, (_, from)| !partitions.iter().any(|p| from.contains(p)));
        let late = &self.late;
        self.order.retain(|key| late.contains_key(key));
    }
}

/// Steps in flight, of any number of runs.
pub struct StepAssembler<P> {
    steps: ByStep<PendingStep<P>>,
    bytes: usize,
    completed: CompletedSteps,
}

impl<P> Default for StepAssembler<P> {
    fn default() -> Self {
        StepAssembler {
            steps: ByStep::default(),
            bytes: 0,
            completed: CompletedSteps::default(),
        }
    }
}

/// Bytes an id takes in a step's id table (its hash and place, a control
/// byte, the load factor's share).
const ID_SLOT_BYTES: usize = std::mem::size_of::<(u64, u32, u32)>() + 8;

/// Bytes a row's `trajectory_id` hash takes.
const HASH_BYTES: usize = std::mem::size_of::<u64>();

/// Rows under which a step's last part takes a message's rows in: a step
/// of one-row messages (JSON) is held in a few parts, not a part a message,
/// and a large step's messages are not copied into a part that grows as
/// they arrive (its parts are put together once, after its `step_end`).
const PART_ROWS: usize = 4096;

/// The most bytes a string of a JSON row's part is given room for
/// ([`Incoming::into_part`]): a trainer's ids are tens of bytes, and a part
/// begun by a row of long ids must not reserve thousands of times their
/// length, uncounted (a part's room is not counted against
/// `advantages.max_in_flight_bytes`; at this bound it is at most
/// 3 * 4,095 * 128 bytes, about 1.5 MB).
const ROOM_TEXT_A_ROW: usize = 128;

/// Bytes a row's numbers take in a batch of decoded rows (its step, its
/// reward, its hinted flag).
const ROW_NUMBER_BYTES: usize = 8 + 8 + 1;

/// Bytes a row's optional hint category takes: its text and its header.
fn category_bytes(category: &Option<String>) -> usize {
    category.as_ref().map_or(0, String::len) + std::mem::size_of::<String>()
}

/// Bytes a batch of decoded rows holds (strings and where they end, each
/// optional string and its header, numbers).
pub fn rows_footprint(rows: &ScoredRows) -> usize {
    let strings: usize = [&rows.run_id, &rows.instance_id, &rows.trajectory_id]
        .iter()
        .map(|column| column.capacity_bytes())
        .sum();
    let categories: usize = rows.hint_category.iter().map(category_bytes).sum();
    strings + categories + rows.len() * ROW_NUMBER_BYTES
}

/// Bytes row `row` of `rows` adds to [`rows_footprint`] (its strings and
/// where they end, its category, its numbers), as a dropped row gives back.
fn row_bytes(rows: &ScoredRows, row: usize) -> usize {
    let strings = [
        &rows.run_id[row],
        &rows.instance_id[row],
        &rows.trajectory_id[row],
    ];
    one_row_bytes(strings, rows.hint_category.get(row).map_or(0, category_bytes))
}

/// Bytes one row's three strings (and where each ends), its category's
/// `category` bytes and its numbers take.
fn one_row_bytes(strings: [&str; 3], category: usize) -> usize {
    const END: usize = std::mem::size_of::<usize>();
    strings.iter().map(|value| value.len() + END).sum::<usize>() + category + ROW_NUMBER_BYTES
}

/// Bytes a JSON row adds to its part: what [`row_bytes`] gives back for it.
fn rollout_bytes(row: &ScoredRollout) -> usize {
    let strings: [&str; 3] = [&row.run_id, &row.instance_id, &row.trajectory_id];
    one_row_bytes(strings, category_bytes(&row.hint_category))
}

/// The rows one message brought, all of one (run_id, step): an Arrow
/// batch's, or one JSON row, put into its step's last part as it is (a
/// batch of one row of its own was a dozen allocations, a fifth of a JSON
/// row's way through the consume loop when it assembled them).
pub enum Incoming {
    /// A batch's rows, with its `instance_id`'s dictionary keys when it
    /// came so: its group ids are then mapped once a key.
    Rows(Box<ScoredRows>, Option<RowKeys>),
    Row(Box<ScoredRollout>),
}

impl From<ScoredRows> for Incoming {
    fn from(rows: ScoredRows) -> Self {
        Incoming::Rows(Box::new(rows), None)
    }
}

impl Incoming {
    fn len(&self) -> usize {
        match self {
            Incoming::Rows(rows, _) => rows.len(),
            Incoming::Row(_) => 1,
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first row's run and step (every row's).
    ///
    /// # Panics
    /// When there is no row.
    fn step(&self) -> (&str, i64) {
        match self {
            Incoming::Rows(rows, _) => (&rows.run_id[0], rows.step[0]),
            Incoming::Row(row) => (&row.run_id, row.step),
        }
    }

    /// Row `row`'s `trajectory_id`.
    fn trajectory_id(&self, row: usize) -> &str {
        match self {
            Incoming::Rows(rows, _) => &rows.trajectory_id[row],
            Incoming::Row(one) if row == 0 => &one.trajectory_id,
            Incoming::Row(_) => panic!("row {row} of one JSON row"),
        }
    }

    fn trajectory_ids(&self) -> impl Iterator<Item = &str> {
        (0..self.len()).map(|row| self.trajectory_id(row))
    }

    /// Every row's `instance_id`, in order.
    fn instance_ids(&self) -> impl Iterator<Item = &str> {
        let (rows, one) = match self {
            Incoming::Rows(rows, _) => (Some(rows.instance_id.iter()), None),
            Incoming::Row(row) => (None, Some(row.instance_id.as_str())),
        };
        rows.into_iter().flatten().chain(one)
    }

    /// Bytes it holds: [`rows_footprint`] of a batch, a JSON row's own.
    fn footprint(&self) -> usize {
        match self {
            Incoming::Rows(rows, _) => rows_footprint(rows),
            Incoming::Row(row) => rollout_bytes(row),
        }
    }

    /// The rows at `keep`, in that order.
    fn keep(self, keep: &[usize]) -> Incoming {
        if keep.len() == self.len() {
            return self;
        }
        match self {
            Incoming::Rows(rows, _) => rows.take(keep).into(),
            // Fewer than its one row: none.
            Incoming::Row(_) => ScoredRows::default().into(),
        }
    }

    /// Whether these rows join `last`, the step's last part, rather than
    /// begin one: while both are small (JSON rows), or when `last` has room
    /// for them ([`PendingStep::new_part`]).
    fn joins(&self, last: &ScoredRows) -> bool {
        match self {
            Incoming::Rows(rows, _) if last.has_room_for(rows) => true,
            _ => last.len() < PART_ROWS && self.len() < PART_ROWS,
        }
    }

    fn append_to(self, part: &mut ScoredRows) {
        match self {
            Incoming::Rows(rows, _) => part.extend(*rows),
            Incoming::Row(row) => part.push(&row),
        }
    }

    /// A new part of these rows; a JSON row's has room for `room` more
    /// like it.
    fn into_part(self, room: usize) -> ScoredRows {
        match self {
            Incoming::Rows(rows, _) => *rows,
            Incoming::Row(row) => {
                let mut part = ScoredRows::from_row(&row);
                part.reserve_alike(room, ROOM_TEXT_A_ROW);
                part
            }
        }
    }
}

impl<P> StepAssembler<P> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one message's rows, all of one (run_id, step) and at least one.
    /// Rows whose `trajectory_id` the step already has are dropped as
    /// duplicates: when the step is checked against its `step_end` count
    /// (see [`PendingStep::hashes`]), or as they arrive once it was.
    /// `message_bytes`: what the parked message holds.
    ///
    /// # Panics
    /// When `rows` is empty (the caller checks).
    pub fn add_rows(
        &mut self,
        rows: impl Into<Incoming>,
        position: Position,
        parked: P,
        message_bytes: usize,
        now: impl OpenedAt,
    ) -> StepStatus<P> {
        let rows: Incoming = rows.into();
        assert!(!rows.is_empty(), "add_rows takes at least one row");
        let (run_id, step_no) = rows.step();
        let key = StepRef(run_id, step_no);
        let step = match open(&mut self.steps, &mut self.completed, &mut self.bytes, key, now) {
            Ok(step) => step,
            Err(first) => return LateMessage::of(key, parked, rows.len(), first),
        };
        step.partitions.insert(position.0);
        // Each row's id hash is kept (its bytes count too). Once the step
        // has an id table, only the rows not in it are kept, and each goes
        // into the table at the place it takes once the message's rows are
        // filtered: the last part's next rows when they join it, a new
        // part's first ones otherwise.
        let (at, base) = match step.parts.last() {
            Some(last) if rows.joins(last) => (step.parts.len() - 1, last.len()),
            _ => (step.parts.len(), 0),
        };
        let part = u32::try_from(at).expect("fewer than 2^32 messages a step");
        let (hashes, hasher, parts) = (&mut step.hashes, &step.hasher, &step.parts);
        let (rows, ids) = match step.ids.as_mut() {
            None => {
                hashes.extend(rows.trajectory_ids().map(|id| hasher.hash_one(id)));
                let ids = rows.len() * HASH_BYTES;
                (rows, ids)
            }
            Some(table) => {
                let id_at = |keep: &[usize], (_, p, r): (u64, u32, u32)| -> &str {
                    match (r as usize).checked_sub(base) {
                        Some(new) if p == part => rows.trajectory_id(keep[new]),
                        _ => &parts[p as usize].trajectory_id[r as usize],
                    }
                };
                let mut keep: Vec<usize> = Vec::with_capacity(rows.len());
                table.reserve(rows.len(), |&(hash, ..)| hash);
                for (i, id) in rows.trajectory_ids().enumerate() {
                    let hash = hasher.hash_one(id);
                    let seen = table
                        .find(hash, |&e| e.0 == hash && id_at(&keep, e) == id)
                        .is_some();
                    if !seen {
                        let row = u32::try_from(base + keep.len()).expect("fewer than 2^32 rows a part");
                        table.insert_unique(hash, (hash, part, row), |&(hash, ..)| hash);
                        hashes.push(hash);
                        keep.push(i);
                    }
                }
                let ids = keep.len() * (ID_SLOT_BYTES + HASH_BYTES);
                step.duplicates += rows.len() - keep.len();
                (rows.keep(&keep), ids)
            }
        };
        let added = message_bytes + rows.footprint() + ids;
        step.bytes += added;
        self.bytes += added;
        if !rows.is_empty() {
            step.ordered &= step.messages.last().is_none_or(|&(last, _)| last < position);
            let mapped = step.map_groups(&rows);
            step.bytes = step.bytes.saturating_add_signed(mapped);
            self.bytes = self.bytes.saturating_add_signed(mapped);
            // Every kept row's hash is in already.
            step.messages.push((position, step.hashes.len() - rows.len()));
            match step.parts.get_mut(at) {
                Some(last) => rows.append_to(last),
                None => {
                    let part = step.new_part(rows);
                    step.parts.push(part);
                }
            }
        }
        step.parked.push(parked);
        let verdict = step.verdict(&mut self.bytes);
        self.conclude(verdict)
    }

    /// Records a step's `step_end`, which came from `partition`.
    pub fn end(
        &mut self,
        run_id: &str,
        step_no: i64,
        count: i64,
        (partition, parked, message_bytes): (i32, P, usize),
        now: impl OpenedAt,
    ) -> StepStatus<P> {
        let key = StepRef(run_id, step_no);
        let step = match open(&mut self.steps, &mut self.completed, &mut self.bytes, key, now) {
            Ok(step) => step,
            Err(first) => return LateMessage::of(key, parked, 0, first),
        };
        step.expected = Some(count);
        step.partitions.insert(partition);
        step.bytes += message_bytes;
        self.bytes += message_bytes;
        step.parked.push(parked);
        let verdict = step.verdict(&mut self.bytes);
        self.conclude(verdict)
    }

    fn remove(&mut self, key: &StepKey) -> Option<PendingStep<P>> {
        let step = self.steps.remove(key)?;
        self.bytes -= step.bytes;
        Some(step)
    }

    /// Bytes held by all pending steps.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Removes the oldest steps until the pending bytes are at most `limit`,
    /// oldest first.
    pub fn evict_over(&mut self, limit: usize) -> Vec<PendingStep<P>> {
        let mut evicted = Vec::new();
        while self.bytes > limit {
            let Some(oldest) = self
                .steps
                .iter()
                .min_by_key(|(_, s)| s.first_seen)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            evicted.extend(self.remove(&oldest));
        }
        evicted
    }

    /// Removes the steps of `partitions` (revoked: their rows go on arriving
    /// at the partition's new owner). A step's messages all come from one
    /// partition ([`StepStatus::MixedPartitions`] otherwise).
    pub fn release(&mut self, partitions: &[i32]) -> Vec<PendingStep<P>> {
        let keys: Vec<StepKey> = self
            .steps
            .iter()
            .filter(|(_, s)| partitions.iter().any(|p| s.partitions.contains(p)))
            .map(|(k, _)| k.clone())
            .collect();
        keys.iter().filter_map(|k| self.remove(k)).collect()
    }

    /// Forgets that the steps of `partitions` completed: under exactly_once
    /// a step completed here but not committed is redone when its partition
    /// is rewound or comes back, and must then be assembled again, not taken
    /// for a late message.
    pub fn forget_completed(&mut self, partitions: &[i32]) {
        self.completed.forget(partitions);
    }

    /// Ends the step a message found complete, overfull or of mixed
    /// partitions ([`PendingStep::verdict`]); a complete one is remembered,
    /// for its late messages, with its sizes, for the next step's room.
    fn conclude(&mut self, verdict: Option<(Verdict, StepKey)>) -> StepStatus<P> {
        let Some((verdict, key)) = verdict else {
            return StepStatus::Pending;
        };
        let Some(step) = self.remove(&key) else {
            return StepStatus::Pending;
        };
        match verdict {
            Verdict::MixedPartitions => StepStatus::MixedPartitions(Box::new(step)),
            Verdict::Overfull => StepStatus::Overfull(Box::new(step)),
            Verdict::Complete => {
                self.completed.insert(key, step.partitions.clone());
                self.completed.sizes = Some(StepSizes::of(&step));
                StepStatus::Complete(Box::new(step))
            }
        }
    }

    /// Removes and returns the steps first seen more than `timeout` ago.
    pub fn expired(&mut self, now: Instant, timeout: Duration) -> Vec<PendingStep<P>> {
        let keys: Vec<StepKey> = self
            .steps
            .iter()
            .filter(|(_, s)| now.duration_since(s.first_seen) >= timeout)
            .map(|(k, _)| k.clone())
            .collect();
        keys.into_iter().filter_map(|k| self.remove(&k)).collect()
    }

    /// Steps in flight.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row of `run`'s step `step`, of group `g`, with trajectory `id`.
    fn rollout(run: &str, step: i64, id: &str) -> ScoredRollout {
        ScoredRollout::unhinted(run, step, "g", id, 1.0)
    }

    fn rows(run: &str, step: i64, ids: &[&str]) -> ScoredRows {
        let mut r = ScoredRows::default();
        for id in ids {
            r.push(&rollout(run, step, id));
        }
        r
    }

    #[test]
    fn completes_when_step_end_count_is_reached_in_any_order() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let now = Instant::now();
        assert!(matches!(
            a.add_rows(rows("r", 1, &["b"]), (0, 5), 1, 10, now),
            StepStatus::Pending
        ));
        assert!(matches!(a.end("r", 1, 2, (0, 2, 10), now), StepStatus::Pending));
        assert!(a.bytes() > 20);
        match a.add_rows(rows("r", 1, &["a"]), (0, 3), 3, 10, now) {
            StepStatus::Complete(step) => {
                let (rows, parked) = step.into_rows();
                assert_eq!(rows.trajectory_id, vec!["a", "b"], "rows back in offset order");
                assert_eq!(parked.len(), 3);
            }
            _ => panic!("step should be complete"),
        }
        assert!(a.is_empty());
        assert_eq!(a.bytes(), 0, "a published step's bytes are released");
    }

    #[test]
    fn drops_duplicate_rows_and_flags_overfull_steps() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let now = Instant::now();
        a.add_rows(rows("r", 1, &["a", "b"]), (0, 0), 0, 0, now);
        a.add_rows(rows("r", 1, &["a"]), (0, 1), 1, 0, now);
        assert!(matches!(
            a.end("r", 1, 1, (0, 2, 0), now),
            StepStatus::Overfull(_)
        ));
    }

    #[test]
    fn duplicates_within_and_across_messages_are_dropped_once_each() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let now = Instant::now();
        // Within one message, then against rows of earlier messages whose
        // own duplicates were dropped (their kept rows moved down).
        a.add_rows(rows("r", 1, &["a", "b", "a", "c", "b"]), (0, 0), 0, 0, now);
        a.add_rows(rows("r", 1, &["d", "c", "e", "d"]), (0, 1), 1, 0, now);
        a.add_rows(rows("r", 1, &["e", "f", "a", "g"]), (0, 2), 2, 0, now);
        let StepStatus::Complete(step) = a.end("r", 1, 7, (0, 3, 0), now) else {
            panic!("7 distinct rows complete the step");
        };
        assert_eq!(step.duplicates, 6);
        let (rows, _) = step.into_rows();
        assert_eq!(rows.trajectory_id, ["a", "b", "c", "d", "e", "f", "g"]);
    }

    #[test]
    fn duplicates_among_many_rows_whose_hashes_clash_are_dropped_exactly() {
        // Enough rows that many distinct ids clash in the bit array; every
        // 997th row of the later messages repeats an id of the first.
        let first: Vec<String> = (0..30_000).map(|i| format!("t{i}")).collect();
        let later = |from: usize| -> Vec<String> {
            (from..from + 20_000)
                .map(|i| {
                    if i % 997 == 0 {
                        format!("t{}", i % 30_000)
                    } else {
                        format!("t{i}")
                    }
                })
                .collect()
        };
        let (second, third) = (later(30_000), later(50_000));
        let number = |id: &String| id[1..].parse::<usize>().expect("ids are t<number>");
        let planted = second
            .iter()
            .chain(&third)
            .filter(|id| number(id) < 30_000)
            .count();
        assert!(planted > 30, "{planted} duplicates planted");
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let now = Instant::now();
        for (offset, ids) in [&first, &second, &third].into_iter().enumerate() {
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            a.add_rows(rows("r", 1, &ids), (0, offset as i64), offset as u32, 0, now);
        }
        let distinct = 70_000 - planted;
        let StepStatus::Complete(step) = a.end("r", 1, distinct as i64, (0, 3, 0), now) else {
            panic!("{distinct} distinct rows complete the step");
        };
        assert_eq!(step.duplicates, planted);
        let (rows, _) = step.into_rows();
        let expected: Vec<&String> = first
            .iter()
            .chain(second.iter().chain(&third).filter(|id| number(id) >= 30_000))
            .collect();
        assert_eq!(rows.trajectory_id, expected);
    }

    #[test]
    fn a_step_short_of_its_count_once_its_duplicates_went_takes_later_rows_one_lookup_each() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let now = Instant::now();
        // The step_end first: three rows, two of them one id, are checked
        // at once and leave the step a row short.
        assert!(matches!(a.end("r", 1, 3, (0, 0, 0), now), StepStatus::Pending));
        a.add_rows(rows("r", 1, &["a", "b", "a"]), (0, 1), 1, 0, now);
        let step = &a.steps[&("r".to_string(), 1)];
        assert_eq!((step.row_count(), step.duplicates), (2, 1));
        assert!(step.ids.is_some(), "the ids are indexed for the rows to come");
        // Later duplicates are dropped as they arrive, never held.
        for (offset, id) in [(2, "b"), (3, "a"), (4, "b")] {
            assert!(matches!(
                a.add_rows(rows("r", 1, &[id]), (0, offset), offset as u32, 0, now),
                StepStatus::Pending
            ));
        }
        let StepStatus::Complete(step) = a.add_rows(rows("r", 1, &["b", "c"]), (0, 5), 5, 0, now) else {
            panic!("the third distinct row completes the step");
        };
        assert_eq!(step.duplicates, 5);
        let (rows, parked) = step.into_rows();
        assert_eq!(rows.trajectory_id, ["a", "b", "c"]);
        assert_eq!(parked.len(), 6);
    }

    /// One JSON row, as the decoder hands it on.
    fn json_row(run: &str, step: i64, id: &str) -> Incoming {
        Incoming::Row(Box::new(rollout(run, step, id)))
    }

    #[test]
    fn json_rows_are_put_in_as_batches_of_one_are() {
        // The step_end comes third: the fourth row starts the check (two
        // duplicates go), and the rows after it are looked up as they come.
        let ids = ["a", "b", "a", "b", "c", "a", "d"];
        let assemble = |json: bool| {
            let mut a: StepAssembler<u32> = StepAssembler::new();
            let now = Instant::now();
            for (offset, id) in ids.iter().enumerate() {
                let incoming = if json {
                    json_row("r", 1, id)
                } else {
                    rows("r", 1, &[id]).into()
                };
                match a.add_rows(incoming, (0, offset as i64), offset as u32, 0, now) {
                    StepStatus::Pending => {}
                    StepStatus::Complete(step) => return (offset, step.duplicates, step.into_rows()),
                    _ => panic!("one step of one partition"),
                }
                if offset == 2 {
                    assert!(matches!(a.end("r", 1, 4, (0, 100, 0), now), StepStatus::Pending));
                }
            }
            panic!("four distinct rows complete the step");
        };
        let (at, duplicates, (rows, parked)) = assemble(true);
        assert_eq!((at, duplicates), (6, 3));
        assert_eq!(rows.trajectory_id, ["a", "b", "c", "d"]);
        assert_eq!(parked.len(), 8);
        assert_eq!(assemble(false), (at, duplicates, (rows, parked)));
    }

    #[test]
    fn a_json_row_dropped_as_a_duplicate_gives_back_what_it_took() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let now = Instant::now();
        a.add_rows(json_row("r", 1, "a"), (0, 0), 0, 0, now);
        let once = a.bytes();
        a.add_rows(json_row("r", 1, "a"), (0, 1), 1, 0, now);
        let twice = a.bytes();
        let category = std::mem::size_of::<String>();
        let row = "r".len() + "g".len() + "a".len() + 3 * 8 + category + 17;
        assert_eq!(twice - once, row + HASH_BYTES);
        // Checked one row short: the duplicate's bytes go, the id table's
        // come, and the group ids mapped as the rows came go (a row is gone).
        let map = a.steps[&("r".to_string(), 1)]
            .groups
            .as_ref()
            .map(HashedGroups::footprint);
        assert!(map.is_some_and(|bytes| bytes > 0));
        assert!(matches!(a.end("r", 1, 2, (0, 2, 0), now), StepStatus::Pending));
        assert_eq!(a.bytes(), once + ID_SLOT_BYTES - map.unwrap_or(0));
        let StepStatus::Complete(step) = a.add_rows(json_row("r", 1, "b"), (0, 3), 3, 0, now) else {
            panic!("the second distinct row completes the step");
        };
        assert_eq!(
            (step.duplicates, step.into_rows().0.trajectory_id),
            (1, Strings::from(vec!["a", "b"]))
        );
    }

    #[test]
    fn rows_come_back_in_input_order_when_duplicates_left_a_message_with_none() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let now = Instant::now();
        // Out of order, and the message at offset 11 holds only a
        // duplicate of a row that arrived before it.
        a.add_rows(rows("r", 1, &["c", "d"]), (0, 12), 0, 0, now);
        a.add_rows(rows("r", 1, &["c"]), (0, 11), 1, 0, now);
        a.add_rows(rows("r", 1, &["a", "d", "b"]), (0, 10), 2, 0, now);
        let StepStatus::Complete(step) = a.end("r", 1, 4, (0, 13, 0), now) else {
            panic!("four distinct rows complete the step");
        };
        assert_eq!(step.duplicates, 2);
        let (rows, _) = step.into_rows();
        assert_eq!(rows.trajectory_id, ["a", "b", "c", "d"]);
    }

    #[test]
    fn dropping_duplicates_gives_their_bytes_back() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let now = Instant::now();
        a.add_rows(rows("r", 1, &["a", "b"]), (0, 0), 0, 0, now);
        let distinct = a.bytes();
        a.add_rows(rows("r", 1, &["a", "b"]), (0, 1), 1, 0, now);
        let twice = a.bytes();
        assert!(twice > distinct);
        // Short by one after the check: the duplicates' bytes go (each
        // row's strings, numbers and hash), the id table's come.
        // The group ids mapped as the rows came go too.
        let map = a.steps[&("r".to_string(), 1)]
            .groups
            .as_ref()
            .map_or(0, HashedGroups::footprint);
        assert!(matches!(a.end("r", 1, 3, (0, 2, 0), now), StepStatus::Pending));
        let step = &a.steps[&("r".to_string(), 1)];
        let category = std::mem::size_of::<String>();
        let row = "r".len() + "g".len() + "a".len() + 3 * 8 + category + 17 + HASH_BYTES;
        assert_eq!(a.bytes(), twice - 2 * row + 2 * ID_SLOT_BYTES - map);
        assert_eq!(step.bytes, a.bytes());
    }

    #[test]
    fn rows_of_large_and_small_messages_come_back_in_input_order_whatever_their_parts() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let now = Instant::now();
        let named = |ids: &[String]| rows("r", 1, &ids.iter().map(String::as_str).collect::<Vec<_>>());
        let ids = |range: std::ops::Range<usize>| range.map(|i| format!("t{i}")).collect::<Vec<_>>();
        let big = PART_ROWS + 904;
        // A part of its own; then small messages, one out of order, with
        // duplicates of rows in the big part and in their own.
        a.add_rows(named(&ids(0..big)), (0, 10), 0, 0, now);
        a.add_rows(named(&[format!("t{big}"), "t1".into()]), (0, 12), 1, 0, now);
        a.add_rows(named(&[format!("t{}", big + 1)]), (0, 11), 2, 0, now);
        a.add_rows(
            named(&[format!("t{}", big + 2), format!("t{big}")]),
            (0, 13),
            3,
            0,
            now,
        );
        let StepStatus::Complete(step) = a.end("r", 1, big as i64 + 3, (0, 14, 0), now) else {
            panic!("every distinct row is in");
        };
        assert_eq!(step.duplicates, 2);
        let (rows, _) = step.into_rows();
        let mut expected = ids(0..big);
        expected.extend([big + 1, big, big + 2].map(|i| format!("t{i}")));
        assert_eq!(rows.trajectory_id, expected);
    }

    #[test]
    fn gathered_rows_join_in_input_order_whatever_their_parts() {
        // Rows t0.. in groups g0, g1, g2 by turns; a big part and small
        // messages, in order or not.
        let grouped = |range: std::ops::Range<usize>| {
            let mut r = rows(
                "r",
                1,
                &range
                    .clone()
                    .map(|i| format!("t{i}"))
                    .collect::<Vec<_>>()
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>(),
            );
            r.instance_id = range.map(|i| format!("g{}", i % 3)).collect();
            r
        };
        let big = PART_ROWS + 10;
        for offsets in [[10, 11, 12], [12, 11, 10]] {
            let mut a: StepAssembler<u32> = StepAssembler::new();
            let now = Instant::now();
            a.add_rows(grouped(0..big), (0, offsets[0]), 0, 0, now);
            a.add_rows(grouped(big..big + 2), (0, offsets[1]), 1, 0, now);
            a.add_rows(grouped(big + 2..big + 5), (0, offsets[2]), 2, 0, now);
            let StepStatus::Complete(step) = a.end("r", 1, big as i64 + 5, (0, 13, 0), now) else {
                panic!("every row is in");
            };
            let (gathered, _) = step.into_gathered();
            let rows = gathered.join();
            let mut order = vec![0..big, big..big + 2, big + 2..big + 5];
            if offsets[0] > offsets[2] {
                order.reverse();
            }
            let expected: Vec<usize> = order.into_iter().flatten().collect();
            let ids: Vec<String> = expected.iter().map(|i| format!("t{i}")).collect();
            assert_eq!(rows.trajectory_id, ids, "offsets {offsets:?}");
            let instances: Vec<String> = expected.iter().map(|i| format!("g{}", i % 3)).collect();
            assert_eq!(rows.instance_id, instances, "offsets {offsets:?}");
        }
    }

    #[test]
    fn a_steps_group_ids_are_mapped_as_its_rows_come_while_in_order_and_none_dropped() {
        // Keyed: as a dictionary-encoded batch decodes, its dictionary in
        // another order than its rows, with a value no row has.
        let keyed = std::cell::Cell::new(false);
        let part = |ids: &[&str], groups: &[&str]| {
            let mut r = rows("r", 1, ids);
            r.instance_id = groups.iter().copied().collect();
            let keys = keyed.get().then(|| RowKeys {
                keys: (0..groups.len() as u32).rev().collect(),
                values: groups.len() + 1,
            });
            Incoming::Rows(Box::new(r), keys)
        };
        let cases = [([1, 2, 3], false), ([1, 3, 2], false), ([1, 2, 3], true)];
        for ((offsets, duplicate), with_keys) in cases.into_iter().flat_map(|c| [(c, false), (c, true)]) {
            keyed.set(with_keys);
            let mut a: StepAssembler<u32> = StepAssembler::new();
            let now = Instant::now();
            a.add_rows(part(&["t0", "t1"], &["g2", "g1"]), (0, offsets[0]), 0, 5, now);
            // A JSON row of group "g".
            a.add_rows(json_row("r", 1, "t2"), (0, offsets[1]), 1, 5, now);
            let last = if duplicate { "t1" } else { "t3" };
            a.add_rows(part(&[last, "t4"], &["g1", "g3"]), (0, offsets[2]), 2, 5, now);
            let held = a.bytes();
            let count = if duplicate { 4 } else { 5 };
            let StepStatus::Complete(step) = a.end("r", 1, count, (0, 9, 0), now) else {
                panic!("every row is in ({offsets:?}, duplicate {duplicate})");
            };
            assert_eq!(
                a.bytes(),
                0,
                "what the step held, its map included, is given back"
            );
            let in_order = offsets == [1, 2, 3];
            if in_order {
                let map = HashedGroups::new().footprint();
                assert!(held >= 15 + map, "the map's bytes count: {held}");
            }
            let (gathered, _) = step.into_gathered();
            assert_eq!(
                gathered.groups.is_some(),
                in_order && !duplicate,
                "{offsets:?} {duplicate}"
            );
            let joined = step_rows(&gathered).join();
            let (rows, groups) = gathered.join_with_groups();
            assert_eq!(rows, joined);
            assert_eq!(groups, DenseGroups::from_strings(joined.instance_id.iter()));
            assert_eq!(groups.n_groups, 4);
        }
    }

    #[test]
    fn a_step_after_one_completed_starts_with_its_room_and_gives_it_all_back() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let now = Instant::now();
        let row = |step: i64, i: usize| {
            let mut row = rollout("r", step, &format!("t{i}"));
            row.instance_id = format!("g{}", i / 2);
            Incoming::Row(Box::new(row))
        };
        let mut offset = 0;
        let mut send = |a: &mut StepAssembler<u32>, step: i64, rows: usize| {
            for i in 0..rows {
                offset += 1;
                a.add_rows(row(step, i), (0, offset), 0, 5, now);
            }
            offset += 1;
            a.end("r", step, rows as i64, (0, 0, 0), now)
        };
        assert!(matches!(send(&mut a, 1, 50), StepStatus::Complete(_)));
        // The next step's first row: room for the first step's sizes, its
        // map's counted.
        a.add_rows(row(2, 0), (0, 100), 0, 5, now);
        let step = &a.steps[&("r".to_string(), 2)];
        assert!(step.hashes.capacity() >= 50 && step.messages.capacity() >= 50);
        assert!(step.parked.capacity() >= 51);
        assert!(step.parts[0].trajectory_id.len() == 1 && step.parts[0].reward.capacity() >= 50);
        let map = step.groups.as_ref().expect("in order").footprint();
        assert!(map > HashedGroups::with_room(1, 1, 2).footprint(), "{map}");
        assert_eq!(a.bytes(), step.bytes);
        assert!(a.bytes() >= map + 5);
        // The step completes as any other, its ids mapped as they came, and
        // gives back all it held.
        for i in 1..50 {
            a.add_rows(row(2, i), (0, 100 + i as i64), 0, 5, now);
        }
        let StepStatus::Complete(step) = a.end("r", 2, 50, (0, 200, 0), now) else {
            panic!("every row is in");
        };
        assert_eq!(a.bytes(), 0);
        let (gathered, _) = step.into_gathered();
        let joined = step_rows(&gathered).join();
        let (rows, groups) = gathered.join_with_groups();
        assert_eq!(rows, joined);
        assert_eq!(groups, DenseGroups::from_strings(joined.instance_id.iter()));
        assert_eq!(groups.n_groups, 25);
        // A step that starts beside another gets no room.
        a.add_rows(one_row("q", 1), (0, 300), 0, 5, now);
        a.add_rows(row(3, 0), (0, 301), 0, 5, now);
        let step = &a.steps[&("r".to_string(), 3)];
        assert!(step.hashes.capacity() < 50, "{}", step.hashes.capacity());
        assert_eq!(step.groups.as_ref().map(|g| g.room()), Some((1, 2)));
    }

    /// `n` rows of step `step` from row `from`: ids `t` and `from..` in
    /// `width` digits, in 7 groups by turns.
    fn numbered(step: i64, from: usize, n: usize, width: usize) -> ScoredRows {
        let ids: Vec<String> = (from..from + n).map(|i| format!("t{i:0width$}")).collect();
        let mut r = rows("r", step, &ids.iter().map(String::as_str).collect::<Vec<_>>());
        r.instance_id = Strings::from_iter((from..from + n).map(|i| format!("g{}", i % 7)));
        // Columns of its rows' size, as a decoded message's are.
        r.take(&(0..n).collect::<Vec<_>>())
    }

    /// The rows of a completed step as its compute takes them, checked
    /// against `sent`; and its parts.
    fn gathered_as_sent(step: Box<PendingStep<u32>>, sent: &ScoredRows) -> usize {
        let parts = step.parts.len();
        let (gathered, _) = step.into_gathered();
        let (joined, groups) = gathered.join_with_groups();
        assert_eq!(&joined, sent);
        assert_eq!(groups, DenseGroups::from_strings(sent.instance_id.iter()));
        // No room much beyond its rows goes on to the compute.
        assert!(
            joined.reward.capacity() <= 2 * joined.len(),
            "{}",
            joined.reward.capacity()
        );
        parts
    }

    #[test]
    fn a_step_of_large_messages_as_large_as_the_one_before_is_one_part_and_its_rows_the_same() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let now = Instant::now();
        let big = PART_ROWS + 10;
        let mut offset = 0;
        // A step of `messages` messages of `big` rows; its parts, and the
        // row slots they held before it completed.
        let mut send = |a: &mut StepAssembler<u32>, step: i64, messages: usize, width: usize| {
            let mut sent = ScoredRows::default();
            for m in 0..messages {
                offset += 1;
                let part = numbered(step, m * big, big, width);
                sent.extend(part.clone());
                a.add_rows(part, (0, offset), 0, 5, now);
            }
            let slots: usize = a
                .steps
                .values()
                .flat_map(|s| &s.parts)
                .map(|p| p.reward.capacity())
                .sum();
            offset += 1;
            let StepStatus::Complete(step) = a.end("r", step, (messages * big) as i64, (0, 0, 0), now) else {
                panic!("every row is in");
            };
            assert_eq!(a.bytes(), 0);
            (gathered_as_sent(step, &sent), slots)
        };
        // The first step has no room: a part a message.
        assert_eq!(send(&mut a, 1, 3, 6).0, 3);
        // The next, as large, is put in one part as its messages come,
        // which never grew (its room was the step before's, exactly).
        assert_eq!(send(&mut a, 2, 3, 6), (1, 3 * big));
        // A larger one, of ids three times as long: the part with room is
        // full of text after its first message, and the others begin parts
        // as they are (the room is not reserved again for each).
        let (parts, slots) = send(&mut a, 3, 4, 20);
        assert_eq!((parts, slots), (4, 6 * big));
        // A smaller one again: one part.
        assert_eq!(send(&mut a, 4, 3, 9).0, 1);
        // One of a third the rows: one part, its room given back before
        // the compute.
        assert_eq!(send(&mut a, 5, 1, 9).0, 1);
    }

    #[test]
    fn duplicates_and_late_order_in_a_step_put_in_one_part_keep_its_rows_and_room() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let now = Instant::now();
        let big = PART_ROWS + 10;
        let message = |step: i64, m: usize| numbered(step, m * big, big, 6);
        for (m, offset) in (0..3).zip(1..) {
            a.add_rows(message(1, m), (0, offset), 0, 5, now);
        }
        assert!(matches!(
            a.end("r", 1, 3 * big as i64, (0, 4, 0), now),
            StepStatus::Complete(_)
        ));
        // Step 2: its first message twice (a producer's retry), the others
        // out of order.
        a.add_rows(message(2, 0), (0, 10), 0, 5, now);
        a.add_rows(message(2, 0), (0, 11), 0, 5, now);
        a.add_rows(message(2, 2), (0, 13), 0, 5, now);
        let step = &a.steps[&("r".to_string(), 2)];
        assert_eq!(step.parts.len(), 1);
        let room = step.parts[0].reward.capacity();
        assert!(matches!(
            a.end("r", 2, 3 * big as i64, (0, 14, 0), now),
            StepStatus::Pending
        ));
        // The check dropped the retry's rows in place: the part kept its
        // room, and the late message joins it.
        let step = &a.steps[&("r".to_string(), 2)];
        assert_eq!((step.parts.len(), step.duplicates), (1, big));
        assert_eq!(step.parts[0].reward.capacity(), room);
        let StepStatus::Complete(step) = a.add_rows(message(2, 1), (0, 12), 0, 5, now) else {
            panic!("every distinct row is in");
        };
        assert_eq!(step.parts.len(), 1);
        let mut sent = message(2, 0);
        sent.extend(message(2, 1));
        sent.extend(message(2, 2));
        gathered_as_sent(step, &sent);
        assert_eq!(a.bytes(), 0);
    }

    #[test]
    fn a_part_begun_by_a_row_of_long_ids_gets_room_for_short_ones_only() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let now = Instant::now();
        for i in 0..PART_ROWS + 4 {
            a.add_rows(json_row("r", 1, &format!("t{i}")), (0, i as i64), 0, 5, now);
        }
        let rows = (PART_ROWS + 4) as i64;
        assert!(matches!(
            a.end("r", 1, rows, (0, 0, 0), now),
            StepStatus::Complete(_)
        ));
        // The next step's first row has an id of 256 KiB: room for 4,095
        // more as long would be 1 GiB, uncounted.
        let long = "x".repeat(256 * 1024);
        a.add_rows(json_row("r", 2, &long), (0, 9_000), 0, 5, now);
        let part = &a.steps[&("r".to_string(), 2)].parts[0];
        let room = part.trajectory_id.capacity_bytes();
        assert!(
            room <= long.len() + (PART_ROWS - 1) * (ROOM_TEXT_A_ROW + 8) + 4096,
            "{room}"
        );
        assert!(
            part.reward.capacity() >= PART_ROWS,
            "room for the rows all the same"
        );
    }

    /// One row of `run`'s step `step` ([`rows`], where a binding of that
    /// name hides it).
    fn one_row(run: &str, step: i64) -> ScoredRows {
        rows(run, step, &["x"])
    }

    /// A copy of `gathered`'s parts and order.
    fn step_rows(gathered: &GatheredRows) -> GatheredRows {
        GatheredRows {
            parts: gathered.parts.clone(),
            order: gathered.order.clone(),
            groups: None,
        }
    }

    #[test]
    fn groups_mapped_beside_the_join_are_the_joined_rows_groups() {
        // Three parts, in input order and not; group ids whose first
        // appearances are not sorted; the middle part with the short columns
        // (a hint id and a response length on its first rows only), which
        // the join pads.
        let part = |range: std::ops::Range<usize>| {
            let ids: Vec<String> = range.clone().map(|i| format!("t{i}")).collect();
            let mut r = rows("r", 1, &ids.iter().map(String::as_str).collect::<Vec<_>>());
            if range.start > 0 && range.len() > 3 {
                r.hint_id = vec![None, Some("h".into())];
                r.response_length = vec![7, 3];
            }
            r.instance_id = range.map(|i| format!("g{}", (i * 7919) % 101)).collect();
            r
        };
        let big = PART_ROWS + 10;
        let spans = [0..big, big..2 * big, 2 * big..2 * big + 3];
        for offsets in [[10, 11, 12], [12, 11, 10], [10, 12, 11]] {
            let step = || {
                let mut a: StepAssembler<u32> = StepAssembler::new();
                let now = Instant::now();
                for (i, span) in spans.iter().enumerate() {
                    a.add_rows(part(span.clone()), (0, offsets[i]), i as u32, 0, now);
                }
                let end = a.end("r", 1, (2 * big + 3) as i64, (0, 13, 0), now);
                let StepStatus::Complete(step) = end else {
                    panic!("every row is in");
                };
                step.into_gathered().0
            };
            let joined = step().join();
            let (rows, groups) = step().join_with_groups();
            assert_eq!(rows, joined, "offsets {offsets:?}");
            assert_eq!(rows.hint_id.iter().flatten().count(), 1, "offsets {offsets:?}");
            assert_eq!(
                groups,
                DenseGroups::from_strings(joined.instance_id.iter()),
                "offsets {offsets:?}"
            );
            assert_eq!(groups.n_groups, 101, "offsets {offsets:?}");
        }
    }

    #[test]
    fn a_step_is_put_together_in_the_memory_its_rows_take_whatever_its_first_row() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let now = Instant::now();
        // A first row with a 1 MiB id, then many short ones: the step's
        // columns must not grow as if every row were as long as the first.
        let long = "x".repeat(1 << 20);
        a.add_rows(rows("r", 1, &[long.as_str()]), (0, 0), 0, 0, now);
        let short: Vec<String> = (0..PART_ROWS + 1).map(|i| format!("t{i}")).collect();
        a.add_rows(
            rows("r", 1, &short.iter().map(String::as_str).collect::<Vec<_>>()),
            (0, 1),
            1,
            0,
            now,
        );
        let StepStatus::Complete(step) = a.end("r", 1, PART_ROWS as i64 + 2, (0, 2, 0), now) else {
            panic!("every row is in");
        };
        let (rows, _) = step.into_rows();
        let ids = &rows.trajectory_id;
        assert_eq!(ids.len(), PART_ROWS + 2);
        let held = ids.text_len() + ids.len() * std::mem::size_of::<usize>();
        assert!(
            ids.capacity_bytes() <= 2 * held,
            "{} bytes held for {held} bytes of ids",
            ids.capacity_bytes()
        );
    }

    #[test]
    fn a_step_that_leaves_incomplete_counts_its_distinct_rows() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let t0 = Instant::now();
        a.add_rows(rows("r", 1, &["a", "b", "a"]), (0, 0), 0, 0, t0);
        assert!(matches!(a.end("r", 1, 4, (0, 1, 0), t0), StepStatus::Pending));
        let mut expired = a.expired(t0 + Duration::from_secs(6), Duration::from_secs(6));
        assert_eq!(
            expired[0].row_count(),
            3,
            "not checked: held, duplicates included"
        );
        assert_eq!(expired[0].distinct_rows(), 2);
        assert_eq!(expired[0].duplicates, 1);
    }

    #[test]
    fn expires_steps_that_never_complete() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let t0 = Instant::now();
        a.add_rows(rows("r", 1, &["a"]), (0, 0), 0, 0, t0);
        a.add_rows(rows("r", 2, &["a"]), (0, 1), 1, 0, t0 + Duration::from_secs(5));
        let expired = a.expired(t0 + Duration::from_secs(6), Duration::from_secs(6));
        assert_eq!(expired.len(), 1);
        assert_eq!(expired[0].step, 1);
        assert_eq!(a.len(), 1);
    }

    #[test]
    fn evicts_the_oldest_steps_to_stay_under_the_byte_bound() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let t0 = Instant::now();
        for step in 1..=3 {
            a.add_rows(
                rows("r", step, &["a"]),
                (0, step),
                0,
                1000,
                t0 + Duration::from_secs(step as u64),
            );
        }
        let one = a.bytes() / 3;
        let evicted = a.evict_over(2 * one);
        assert_eq!(evicted.iter().map(|s| s.step).collect::<Vec<_>>(), vec![1]);
        assert_eq!(a.len(), 2);
        assert!(a.bytes() <= 2 * one);
        assert!(a.evict_over(usize::MAX).is_empty());
    }

    #[test]
    fn a_step_from_two_partitions_is_refused() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let now = Instant::now();
        a.add_rows(rows("r", 1, &["a"]), (0, 0), 0, 10, now);
        assert!(matches!(
            a.add_rows(rows("r", 1, &["b"]), (1, 0), 1, 10, now),
            StepStatus::MixedPartitions(_)
        ));
        assert!(a.is_empty());
        assert_eq!(a.bytes(), 0);
    }

    #[test]
    fn messages_of_a_completed_step_are_late_and_only_the_first_is_flagged() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let now = Instant::now();
        a.add_rows(rows("r", 1, &["a"]), (0, 0), 0, 10, now);
        assert!(matches!(
            a.end("r", 1, 1, (0, 1, 10), now),
            StepStatus::Complete(_)
        ));
        let late = |status: StepStatus<u32>| match status {
            StepStatus::AlreadyPublished(m) => (m.parked, m.rows, m.first),
            _ => panic!("not late"),
        };
        // A stray row, then a retry of the whole step.
        assert_eq!(
            late(a.add_rows(rows("r", 1, &["b"]), (0, 2), 2, 10, now)),
            (2, 1, true)
        );
        assert_eq!(
            late(a.add_rows(rows("r", 1, &["a"]), (0, 3), 3, 10, now)),
            (3, 1, false)
        );
        assert_eq!(late(a.end("r", 1, 1, (0, 4, 10), now)), (4, 0, false));
        assert!(a.is_empty(), "nothing of it is pending");
        assert_eq!(a.bytes(), 0);
        // Another step of the run is not.
        assert!(matches!(
            a.add_rows(rows("r", 2, &["a"]), (0, 5), 5, 10, now),
            StepStatus::Pending
        ));
    }

    #[test]
    fn a_completed_step_of_a_rewound_partition_is_assembled_again() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let now = Instant::now();
        for (partition, run) in [(0, "r"), (1, "s")] {
            a.add_rows(rows(run, 1, &["a"]), (partition, 0), 0, 10, now);
            assert!(matches!(
                a.end(run, 1, 1, (partition, 1, 10), now),
                StepStatus::Complete(_)
            ));
        }
        a.forget_completed(&[0]);
        // Redelivered after the rewind: a step again, not a late message.
        a.add_rows(rows("r", 1, &["a"]), (0, 0), 0, 10, now);
        assert!(matches!(
            a.end("r", 1, 1, (0, 1, 10), now),
            StepStatus::Complete(_)
        ));
        // The other partition's step is still remembered.
        assert!(matches!(
            a.add_rows(rows("s", 1, &["a"]), (1, 2), 2, 10, now),
            StepStatus::AlreadyPublished(_)
        ));
    }

    #[test]
    fn the_memory_of_completed_steps_is_bounded() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let now = Instant::now();
        let total = COMPLETED_STEPS_REMEMBERED as i64 + 10;
        for step in 0..total {
            a.add_rows(rows("r", step, &["a"]), (0, step), 0, 0, now);
            assert!(matches!(
                a.end("r", step, 1, (0, 0, 0), now),
                StepStatus::Complete(_)
            ));
        }
        assert_eq!(a.completed.order.len(), COMPLETED_STEPS_REMEMBERED);
        assert_eq!(a.completed.late.len(), COMPLETED_STEPS_REMEMBERED);
        // The oldest are forgotten, the newest remembered.
        assert!(matches!(
            a.add_rows(rows("r", 0, &["b"]), (0, 0), 0, 0, now),
            StepStatus::Pending
        ));
        assert!(matches!(
            a.add_rows(rows("r", total - 1, &["b"]), (0, 0), 0, 0, now),
            StepStatus::AlreadyPublished(_)
        ));
    }

    #[test]
    fn releases_the_steps_of_revoked_partitions() {
        let mut a: StepAssembler<u32> = StepAssembler::new();
        let now = Instant::now();
        a.add_rows(rows("r", 1, &["a"]), (0, 0), 0, 10, now);
        a.add_rows(rows("r", 2, &["a"]), (1, 0), 1, 10, now);
        let released = a.release(&[1]);
        assert_eq!(released.len(), 1);
        assert_eq!(released[0].step, 2);
        assert_eq!(a.len(), 1);
    }
}
