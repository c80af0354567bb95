//! Chunked steps: a step's rows published as several Arrow IPC stream
//! messages, each under a byte bound, and the headers that let a reader put
//! them back together.
//!
//! A publisher splits the step's batch into contiguous row ranges
//! ([`encode_chunks`]) and sends every chunk with the same key, one after
//! another, with the headers [`CHUNK_HEADER`] (0-based index),
//! [`CHUNKS_HEADER`] (how many) and [`ROWS_HEADER`] (the step's row count),
//! all decimal ASCII. A reader keeps a step's chunks by key until all
//! `chunks` are in, then concatenates them in index order
//! (`tools::reassemble`, and the Python client's `wait_advantages`, which
//! follow the same rules: [`ChunkInfo::from_headers`]).
//!
//! Every chunk also carries [`ATTEMPT_HEADER`], the same for all chunks of
//! one publication of a step and different for another: a step
//! republished by another worker (or after a restart) may be cut at other
//! boundaries, and a reader gathers the chunks of one attempt only, never
//! mixing two. Chunks without it (older writers) form one attempt of
//! their own, with the rules from before.

use std::ops::Range;

use arrow_array::cast::AsArray;
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::ArrowError;
use arrow_select::dictionary::garbage_collect_any_dictionary;

use super::ipc;

/// Header: the chunk's 0-based index within its step.
pub const CHUNK_HEADER: &str = "hintstream.chunk";
/// Header: how many chunks the step has.
pub const CHUNKS_HEADER: &str = "hintstream.chunks";
/// Header: the step's total row count (all chunks together).
pub const ROWS_HEADER: &str = "hintstream.rows";
/// Header: which publication of the step the chunk belongs to
/// ([`attempt_id`]); opaque to readers, compared for equality only.
pub const ATTEMPT_HEADER: &str = "hintstream.attempt";

/// The attempt id of one publication of a step: 16 lowercase hex digits of
/// an FNV-1a 64-bit hash of the worker's identity (`worker`: host, process
/// id and the process's start time, say), the time this publication
/// started (nanoseconds since the Unix epoch) and the step's key. Two
/// publications differ in at least one of them.
pub fn attempt_id(worker: &str, started_unix_nanos: u128, step_key: &str) -> String {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    let started = started_unix_nanos.to_le_bytes();
    // A 0xff separator: no UTF-8 text holds that byte.
    for part in [worker.as_bytes(), &[0xff], &started, &[0xff], step_key.as_bytes()] {
        for &byte in part {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(PRIME);
        }
    }
    format!("{hash:016x}")
}

/// One encoded chunk: rows `rows` of the batch as one IPC stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub rows: Range<usize>,
    pub payload: Vec<u8>,
}

/// A batch split by [`encode_chunks`], in row order.
#[derive(Debug, Clone)]
pub struct Chunks {
    pub chunks: Vec<Chunk>,
    /// The bound the chunks were cut for.
    pub max_bytes: usize,
}

impl Chunks {
    /// The first chunk over the bound, if any. Only a single row too large
    /// for the bound on its own can be one: such a row is a chunk of its own,
    /// and the publisher cannot send it (it dead-letters the step).
    pub fn oversized(&self) -> Option<&Chunk> {
        self.chunks.iter().find(|c| c.payload.len() > self.max_bytes)
    }

    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }
}

/// Splits `batch` into contiguous row ranges whose IPC streams are each at
/// most `max_bytes`, and encodes them. A batch that fits is one chunk,
/// byte for byte what [`ipc::encode_stream`] makes of it (an empty batch
/// too). Otherwise the bytes a row takes are estimated from the encoded
/// size, the rows are cut into ranges that should fit, and each encoded
/// range is checked and cut further while it is still too large; a single
/// row over the bound ends up as a chunk of its own
/// ([`Chunks::oversized`]). Deterministic: the same batch and bound always
/// give the same chunks, so a step republished after a crash has the same
/// chunks as the copy that was interrupted.
///
/// Dictionary-encoded columns of a slice carry only the values the slice
/// uses (arrow-ipc writes a sliced dictionary array's whole dictionary).
pub fn encode_chunks(batch: &RecordBatch, max_bytes: usize) -> Result<Chunks, ArrowError> {
    let rows = batch.num_rows();
    // Encoded whole only when it may fit: a batch far over the bound (88 MB
    // for a step of 1M rows) would be encoded whole only to learn its size,
    // which its first rows tell closely enough (`split` cuts a piece that
    // is still too large further).
    let whole = if rows <= 1 || batch.get_array_memory_size() <= MAY_FIT * max_bytes {
        let whole = ipc::encode_stream(std::slice::from_ref(batch))?;
        if whole.len() <= max_bytes || rows <= 1 {
            return Ok(Chunks {
                chunks: vec![Chunk {
                    rows: 0..rows,
                    payload: whole,
                }],
                max_bytes,
            });
        }
        Some(whole.len())
    } else {
        None
    };
    // What every chunk carries whatever its rows: the schema, the batch
    // header and the end-of-stream marker.
    let fixed = encode_range(batch, 0..0)?.len();
    let encoded = match whole {
        Some(len) => len,
        None => {
            let sample = rows.min(SAMPLE_ROWS);
            let bytes = encode_range(batch, 0..sample)?.len().saturating_sub(fixed);
            fixed + bytes.div_ceil(sample) * rows
        }
    };
    let mut chunks = Vec::new();
    split(batch, 0..rows, encoded, fixed, max_bytes, &mut chunks)?;
    Ok(Chunks { chunks, max_bytes })
}

/// A batch whose buffers take at most this many times the bound may encode
/// within it (buffers can be larger than what they hold), and is encoded
/// whole first; a larger one never is.
const MAY_FIT: usize = 4;

/// Rows encoded to learn the bytes a row takes, when the batch is not
/// encoded whole.
const SAMPLE_ROWS: usize = 4096;

/// Cuts `range`, whose rows encoded to `encoded` bytes, into pieces that
/// should fit, and checks each; recurses on a piece that does not.
fn split(
    batch: &RecordBatch,
    range: Range<usize>,
    encoded: usize,
    fixed: usize,
    max_bytes: usize,
    out: &mut Vec<Chunk>,
) -> Result<(), ArrowError> {
    let len = range.len();
    let per_row = encoded.saturating_sub(fixed).div_ceil(len).max(1);
    // A margin for what does not scale with rows (buffer padding) and rows
    // larger than the average.
    let budget = max_bytes.saturating_sub(fixed) / 16 * 15;
    // At least two pieces, so every level of recursion makes progress.
    let per_piece = (budget / per_row).clamp(1, len.div_ceil(2));
    let mut start = range.start;
    while start < range.end {
        let piece = start..(start + per_piece).min(range.end);
        let payload = encode_range(batch, piece.clone())?;
        if payload.len() <= max_bytes || piece.len() == 1 {
            out.push(Chunk {
                rows: piece.clone(),
                payload,
            });
        } else {
            split(batch, piece.clone(), payload.len(), fixed, max_bytes, out)?;
        }
        start = piece.end;
    }
    Ok(())
}

/// Cuts a large `batch` into row ranges whose IPC streams are known to be
/// at most `max_bytes` before any is encoded, so that a publisher knows
/// the chunk count (which every chunk's headers carry) and can send each
/// chunk as soon as it is encoded ([`encode_planned`]; stage 2 plans a
/// batch it never builds whole, with [`plan_unbuilt`]). Each range is as
/// long as an upper bound of its encoded size allows: the bytes of its
/// buffers (computed from its rows and the byte lengths of its strings),
/// each buffer's alignment padding, a validity bitmap a column whether or
/// not it has nulls, and a margin for the batch's metadata. The bound is
/// within a few hundred bytes of the real size, so the chunks are nearly as
/// few as [`encode_chunks`] makes.
///
/// `None` where [`encode_chunks`] should cut instead: a batch that may fit
/// whole (it is then one chunk, as `encode_chunks` promises), columns whose
/// encoded size the bound does not know (dictionaries, nested types), or a
/// row whose bound alone is over `max_bytes` (`encode_chunks` reports it).
/// Deterministic, as `encode_chunks` is.
pub fn plan_chunks(batch: &RecordBatch, max_bytes: usize) -> Result<Option<Vec<Range<usize>>>, ArrowError> {
    let rows = batch.num_rows();
    if rows <= 1 || batch.get_array_memory_size() <= MAY_FIT * max_bytes {
        return Ok(None);
    }
    let Some(shape) = BodyShape::of(batch) else {
        return Ok(None);
    };
    plan_rows(
        batch,
        &shape,
        rows,
        |range| shape.variable_bytes(range),
        max_bytes,
    )
}

/// [`plan_chunks`] for a batch not built yet, whose chunks are then built
/// one at a time (each range's rows as a batch of their own, encoded with
/// [`ipc::encode_stream`]): a large batch is never built whole, and the
/// first chunk can leave before the last is made. `template`: a batch of
/// the same schema (its first row, say), for the shape of a row; `rows`
/// rows in all, whose variable-length values (strings, binaries) take
/// `variable(range)` bytes for the rows of `range`, all columns together
/// (a difference of offsets: the plan reads it a few times a chunk, not
/// once a row). `None` as for `plan_chunks`: build the batch whole and cut
/// it with [`encode_chunks`].
pub fn plan_unbuilt(
    template: &RecordBatch,
    rows: usize,
    variable: impl Fn(Range<usize>) -> usize,
    max_bytes: usize,
) -> Result<Option<Vec<Range<usize>>>, ArrowError> {
    let Some(shape) = BodyShape::of(template) else {
        return Ok(None);
    };
    // What the whole batch's buffers would hold, as plan_chunks reads it
    // from a built one.
    let memory = rows * shape.row_bytes + shape.bitmaps * rows.div_ceil(8) + variable(0..rows);
    if rows <= 1 || memory <= MAY_FIT * max_bytes {
        return Ok(None);
    }
    plan_rows(template, &shape, rows, variable, max_bytes)
}

/// The ranges of [`plan_chunks`]: `rows` rows of `shape` (read from
/// `batch`, which may hold only some of them), whose variable-length values
/// take `variable(range)` bytes for the rows of `range`.
fn plan_rows(
    batch: &RecordBatch,
    shape: &BodyShape<'_>,
    rows: usize,
    variable: impl Fn(Range<usize>) -> usize,
    max_bytes: usize,
) -> Result<Option<Vec<Range<usize>>>, ArrowError> {
    let fixed = encode_range(batch, 0..0)?.len() + METADATA_MARGIN + shape.buffers * IPC_ALIGNMENT;
    let fits = |range: Range<usize>| {
        let n = range.len();
        fixed
            + shape.bitmaps * n.div_ceil(8)
            + shape.extra_offset_bytes
            + n * shape.row_bytes
            + variable(range)
            <= max_bytes
    };
    Ok(longest_runs(rows, fits))
}

/// `0..rows` cut into runs, each the longest from where the one before it
/// ended that `fits` (which, once a run does not fit, holds for no longer
/// one), as a walk row by row would cut them. `None` when a row alone does
/// not fit. Each run is found by doubling its length, then halving the
/// step: a few dozen calls a run, not one a row (a 1M-row step took 25 ms
/// to plan one row at a time).
fn longest_runs(rows: usize, fits: impl Fn(Range<usize>) -> bool) -> Option<Vec<Range<usize>>> {
    let mut runs = Vec::new();
    let mut start = 0;
    while start < rows {
        if !fits(start..start + 1) {
            return None;
        }
        // `len` rows fit; `len + step` (at most the rows left) may not.
        let (mut len, mut step) = (1, 1);
        while start + len < rows && fits(start..(start + len + step).min(rows)) {
            len = (len + step).min(rows - start);
            step *= 2;
        }
        while step > 1 {
            step /= 2;
            if start + len + step <= rows && fits(start..start + len + step) {
                len += step;
            }
        }
        runs.push(start..start + len);
        start += len;
    }
    Some(runs)
}

/// Encodes rows `range` of `batch` as one chunk (a range of
/// [`plan_chunks`]).
pub fn encode_planned(batch: &RecordBatch, range: Range<usize>) -> Result<Chunk, ArrowError> {
    let payload = encode_range(batch, range.clone())?;
    Ok(Chunk { rows: range, payload })
}

/// The alignment of every buffer in an IPC body (arrow-ipc's default
/// write options pad each to 64 bytes; the bound counts a full 64 a buffer).
const IPC_ALIGNMENT: usize = 64;

/// Bytes a record batch's metadata may take beyond the empty batch's (the
/// flatbuffer leaves out fields at their default, such as a length of 0).
const METADATA_MARGIN: usize = 256;

/// What a batch's rows take in an IPC body, by the columns' types.
struct BodyShape<'a> {
    /// Buffers in the body (a validity bitmap for every column, values,
    /// offsets).
    buffers: usize,
    /// Bitmaps: one bit a row each.
    bitmaps: usize,
    /// Fixed bytes a row: primitive values and string offsets.
    row_bytes: usize,
    /// The one offset more than rows of each string column.
    extra_offset_bytes: usize,
    /// The offsets of the columns whose values vary in length.
    variable: Vec<Offsets<'a>>,
}

/// A string or binary column's offsets (its slice's, `rows + 1` of them).
enum Offsets<'a> {
    Small(&'a [i32]),
    Large(&'a [i64]),
}

impl Offsets<'_> {
    /// The bytes of the rows of `rows`.
    fn length(&self, rows: Range<usize>) -> usize {
        match self {
            Offsets::Small(o) => (o[rows.end] - o[rows.start]) as usize,
            Offsets::Large(o) => (o[rows.end] - o[rows.start]) as usize,
        }
    }
}

impl<'a> BodyShape<'a> {
    fn of(batch: &'a RecordBatch) -> Option<BodyShape<'a>> {
        use arrow_schema::DataType as T;
        let mut shape = BodyShape {
            buffers: 0,
            bitmaps: 0,
            row_bytes: 0,
            extra_offset_bytes: 0,
            variable: Vec::new(),
        };
        for column in batch.columns() {
            // A validity bitmap, counted whether or not the column has nulls.
            shape.buffers += 1;
            shape.bitmaps += 1;
            match column.data_type() {
                T::Boolean => {
                    shape.buffers += 1;
                    shape.bitmaps += 1;
                }
                T::Utf8 | T::Binary | T::LargeUtf8 | T::LargeBinary => {
                    let offsets = match column.data_type() {
                        T::Utf8 => Offsets::Small(column.as_string::<i32>().value_offsets()),
                        T::Binary => Offsets::Small(column.as_binary::<i32>().value_offsets()),
                        T::LargeUtf8 => Offsets::Large(column.as_string::<i64>().value_offsets()),
                        _ => Offsets::Large(column.as_binary::<i64>().value_offsets()),
                    };
                    let width = match offsets {
                        Offsets::Small(_) => 4,
                        Offsets::Large(_) => 8,
                    };
                    shape.buffers += 2;
                    shape.row_bytes += width;
                    shape.extra_offset_bytes += width;
                    shape.variable.push(offsets);
                }
                other => {
                    let width = other.primitive_width()?;
                    shape.buffers += 1;
                    shape.row_bytes += width;
                }
            }
        }
        Some(shape)
    }

    /// The bytes of the variable-length values of the rows of `range`, all
    /// columns.
    fn variable_bytes(&self, range: Range<usize>) -> usize {
        self.variable.iter().map(|o| o.length(range.clone())).sum()
    }
}

/// Rows `range` of `batch` as one IPC stream.
fn encode_range(batch: &RecordBatch, range: Range<usize>) -> Result<Vec<u8>, ArrowError> {
    let slice = compact_dictionaries(&batch.slice(range.start, range.len()))?;
    ipc::encode_stream(&[slice])
}

/// `batch` with each dictionary-encoded column keeping only the values its
/// rows use (its keys renumbered; no value is hashed or copied twice).
fn compact_dictionaries(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    if !batch
        .columns()
        .iter()
        .any(|c| c.as_any_dictionary_opt().is_some())
    {
        return Ok(batch.clone());
    }
    let columns = batch
        .columns()
        .iter()
        .map(|column| match column.as_any_dictionary_opt() {
            Some(dictionary) => garbage_collect_any_dictionary(dictionary),
            None => Ok(column.clone()),
        })
        .collect::<Result<Vec<ArrayRef>, ArrowError>>()?;
    RecordBatch::try_new(batch.schema(), columns)
}

/// The chunk headers of one message: `(name, value)` pairs for
/// `kafka::produce::headers`.
pub fn chunk_header_values(index: usize, count: usize, rows: usize) -> [(&'static str, String); 3] {
    [
        (CHUNK_HEADER, index.to_string()),
        (CHUNKS_HEADER, count.to_string()),
        (ROWS_HEADER, rows.to_string()),
    ]
}

/// Where one message sits in its step, from its headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkInfo {
    pub index: usize,
    pub count: usize,
    /// The step's total row count, when the message says it.
    pub rows: Option<usize>,
}

/// Chunk headers that are present but unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkHeaderError {
    #[error("header {name} is not a decimal number: {value:?}")]
    NotDecimal { name: &'static str, value: String },
    #[error("{CHUNK_HEADER} and {CHUNKS_HEADER} must come together")]
    Unpaired,
    #[error("chunk {index} of {count} is out of range")]
    OutOfRange { index: usize, count: usize },
}

impl ChunkInfo {
    /// The chunk headers of a message (`header(name)` gives a header's
    /// value). Without them the message is a whole step: chunk 0 of 1. The
    /// Python client's `wire.chunk_info` reads them by the same rules.
    pub fn from_headers<'a>(
        header: impl Fn(&str) -> Option<&'a [u8]>,
    ) -> Result<ChunkInfo, ChunkHeaderError> {
        let rows = header(ROWS_HEADER).map(|v| decimal(ROWS_HEADER, v)).transpose()?;
        let (index, count) = match (header(CHUNK_HEADER), header(CHUNKS_HEADER)) {
            (None, None) => {
                return Ok(ChunkInfo {
                    index: 0,
                    count: 1,
                    rows,
                })
            }
            (Some(index), Some(count)) => (decimal(CHUNK_HEADER, index)?, decimal(CHUNKS_HEADER, count)?),
            _ => return Err(ChunkHeaderError::Unpaired),
        };
        if count < 1 || index >= count {
            return Err(ChunkHeaderError::OutOfRange { index, count });
        }
        Ok(ChunkInfo { index, count, rows })
    }
}

/// ASCII digits, surrounding whitespace allowed (as Python's `str.strip`).
fn decimal(name: &'static str, value: &[u8]) -> Result<usize, ChunkHeaderError> {
    let bad = || ChunkHeaderError::NotDecimal {
        name,
        value: String::from_utf8_lossy(value).into_owned(),
    };
    let text = std::str::from_utf8(value).map_err(|_| bad())?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    text.parse().map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::types::Int32Type;
    use arrow_array::{Array, DictionaryArray, Float64Array, Int64Array, StringArray};
    use arrow_schema::DataType;

    use super::*;

    #[test]
    fn attempt_ids_differ_by_worker_start_time_and_step() {
        let id = attempt_id("host/1/100", 5, "r/1");
        assert_eq!(id.len(), 16);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(id, attempt_id("host/1/100", 5, "r/1"));
        for other in [
            attempt_id("host/2/100", 5, "r/1"),
            attempt_id("host/1/100", 6, "r/1"),
            attempt_id("host/1/100", 5, "r/2"),
        ] {
            assert_ne!(other, id);
        }
    }

    /// `n` rows whose `text` column is `width(i)` bytes long at row `i`, and
    /// a dictionary column of `n / 8` distinct values.
    fn batch(n: usize, width: impl Fn(usize) -> usize) -> RecordBatch {
        let text: StringArray = (0..n).map(|i| Some("x".repeat(width(i)))).collect();
        let names: Vec<String> = (0..n).map(|i| format!("group-{:06}", i / 8)).collect();
        let groups: DictionaryArray<Int32Type> = names.iter().map(String::as_str).collect();
        RecordBatch::try_from_iter([
            (
                "id",
                Arc::new(Int64Array::from_iter_values(0..n as i64)) as ArrayRef,
            ),
            ("text", Arc::new(text) as ArrayRef),
            ("group", Arc::new(groups) as ArrayRef),
            (
                "value",
                Arc::new(Float64Array::from_iter_values((0..n).map(|i| i as f64 * 0.5))) as ArrayRef,
            ),
        ])
        .unwrap()
    }

    fn decoded(chunks: &Chunks) -> Vec<RecordBatch> {
        chunks
            .chunks
            .iter()
            .map(|c| {
                let batches = ipc::decode_stream(&c.payload).unwrap();
                assert_eq!(batches.len(), 1);
                batches.into_iter().next().unwrap()
            })
            .collect()
    }

    /// The chunks cover the rows in order, each holds exactly its rows, and
    /// their columns (dictionaries as values) equal the input's.
    fn assert_concatenate_to(chunks: &Chunks, input: &RecordBatch) {
        let mut next = 0;
        for (chunk, batch) in chunks.chunks.iter().zip(decoded(chunks)) {
            assert_eq!(chunk.rows.start, next, "contiguous");
            assert_eq!(batch.num_rows(), chunk.rows.len());
            let expected = input.slice(chunk.rows.start, chunk.rows.len());
            assert_eq!(batch.schema(), input.schema());
            for (got, want) in batch.columns().iter().zip(expected.columns()) {
                let plain = |a: &ArrayRef| match a.data_type() {
                    DataType::Dictionary(_, v) => arrow_cast::cast(a, v).unwrap(),
                    _ => a.clone(),
                };
                assert_eq!(plain(got).to_data(), plain(want).to_data());
            }
            next = chunk.rows.end;
        }
        assert_eq!(next, input.num_rows(), "every row is in a chunk");
    }

    #[test]
    fn a_batch_that_fits_is_one_chunk_as_encode_stream_makes_it() {
        let input = batch(100, |_| 10);
        let chunks = encode_chunks(&input, 1 << 20).unwrap();
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks.chunks[0].rows, 0..100);
        assert_eq!(
            chunks.chunks[0].payload,
            ipc::encode_stream(std::slice::from_ref(&input)).unwrap()
        );
        assert!(chunks.oversized().is_none());
        let empty = encode_chunks(&input.slice(0, 0), 1 << 20).unwrap();
        assert_eq!(empty.len(), 1);
        assert_eq!(empty.chunks[0].rows, 0..0);
    }

    #[test]
    fn every_chunk_fits_and_the_chunks_concatenate_to_the_input() {
        for (rows, max) in [(20_000, 64 * 1024), (5_000, 20_000), (3_001, 9_000)] {
            let input = batch(rows, |i| 5 + i % 40);
            let whole = ipc::encode_stream(std::slice::from_ref(&input)).unwrap().len();
            let chunks = encode_chunks(&input, max).unwrap();
            assert!(chunks.len() > 1, "{rows} rows in {whole} bytes under {max}");
            for c in &chunks.chunks {
                assert!(c.payload.len() <= max, "{} > {max}", c.payload.len());
            }
            assert!(chunks.oversized().is_none());
            assert_concatenate_to(&chunks, &input);
            // Close to the fewest chunks the bytes need: the estimate is
            // not wildly off.
            let fewest = whole.div_ceil(max);
            assert!(
                chunks.len() <= 2 * fewest + 1,
                "{} chunks, {fewest} needed",
                chunks.len()
            );
        }
    }

    #[test]
    fn uneven_rows_are_cut_further_until_each_chunk_fits() {
        // The first half's rows are tiny, the second half's large: an
        // estimate from the average is wrong in both halves.
        let input = batch(4_000, |i| if i < 2_000 { 1 } else { 300 });
        let max = 50_000;
        let chunks = encode_chunks(&input, max).unwrap();
        assert!(chunks.chunks.iter().all(|c| c.payload.len() <= max));
        assert_concatenate_to(&chunks, &input);
    }

    #[test]
    fn a_row_larger_than_the_bound_is_a_chunk_of_its_own_and_reported() {
        let input = batch(1_000, |i| if i == 600 { 30_000 } else { 8 });
        let max = 10_000;
        let chunks = encode_chunks(&input, max).unwrap();
        assert_concatenate_to(&chunks, &input);
        let big = chunks.oversized().expect("the large row is reported");
        assert_eq!(big.rows, 600..601);
        assert!(big.payload.len() > max);
        let over: Vec<_> = chunks.chunks.iter().filter(|c| c.payload.len() > max).collect();
        assert_eq!(over.len(), 1, "only that row is over the bound");
    }

    #[test]
    fn a_sliced_dictionary_carries_only_its_own_values() {
        // 20,000 distinct groups: the whole dictionary alone is over the
        // bound, so chunks that carried it could never fit.
        let input = batch(160_000, |_| 1);
        let dictionary_bytes = {
            let groups = input
                .column(2)
                .as_any()
                .downcast_ref::<DictionaryArray<Int32Type>>()
                .unwrap();
            groups.values().get_array_memory_size()
        };
        let max = 100_000;
        assert!(dictionary_bytes > max);
        let chunks = encode_chunks(&input, max).unwrap();
        assert!(chunks.chunks.iter().all(|c| c.payload.len() <= max));
        assert_concatenate_to(&chunks, &input);
    }

    /// `n` rows of the kinds of columns a step's advantages have (strings
    /// of `width(i)` bytes, integers, floats with some nulls, booleans).
    fn flat(n: usize, width: impl Fn(usize) -> usize) -> RecordBatch {
        let text: StringArray = (0..n).map(|i| Some("y".repeat(width(i)))).collect();
        let values: Float64Array = (0..n).map(|i| (i % 7 != 0).then_some(i as f64)).collect();
        let flags: arrow_array::BooleanArray = (0..n).map(|i| Some(i % 3 == 0)).collect();
        RecordBatch::try_from_iter([
            (
                "id",
                Arc::new(Int64Array::from_iter_values(0..n as i64)) as ArrayRef,
            ),
            ("text", Arc::new(text) as ArrayRef),
            ("value", Arc::new(values) as ArrayRef),
            ("flag", Arc::new(flags) as ArrayRef),
        ])
        .unwrap()
    }

    /// The chunks a plan makes, encoded.
    fn planned(input: &RecordBatch, max: usize) -> Chunks {
        let ranges = plan_chunks(input, max).unwrap().expect("a plan");
        let chunks = ranges
            .into_iter()
            .map(|r| encode_planned(input, r).unwrap())
            .collect();
        Chunks {
            chunks,
            max_bytes: max,
        }
    }

    #[test]
    fn a_plan_bounds_every_chunk_before_encoding_and_makes_nearly_the_fewest() {
        for (rows, max, width) in [
            (60_000, 64 * 1024, 40usize),
            (30_000, 20_000, 3),
            (100_000, 1 << 20, 90),
        ] {
            let input = flat(rows, |i| i % width + (i * 7919) % 13);
            let chunks = planned(&input, max);
            for c in &chunks.chunks {
                assert!(c.payload.len() <= max, "{} > {max}", c.payload.len());
            }
            assert_concatenate_to(&chunks, &input);
            let whole = ipc::encode_stream(std::slice::from_ref(&input)).unwrap().len();
            let fewest = whole.div_ceil(max);
            assert!(
                chunks.len() <= fewest + fewest / 8 + 1,
                "{} chunks, {fewest} needed ({rows} rows, {max} bytes)",
                chunks.len()
            );
            // The bound is close: every chunk but the last is nearly full.
            let full = &chunks.chunks[..chunks.len() - 1];
            assert!(full.iter().all(|c| c.payload.len() > max - 2 * 1024 - max / 16));
            assert_eq!(
                plan_chunks(&input, max).unwrap(),
                plan_chunks(&input, max).unwrap()
            );
        }
    }

    #[test]
    fn a_batch_planned_unbuilt_cuts_as_the_built_one_and_its_chunks_built_alone_fit() {
        for (rows, max, width) in [(60_000, 64 * 1024, 40usize), (30_000, 20_000, 3)] {
            let input = flat(rows, |i| i % width + (i * 7919) % 13);
            let text = input.column(1).as_string::<i32>();
            let template = input.slice(0, 1);
            let offsets = text.value_offsets();
            let ranges = plan_unbuilt(
                &template,
                rows,
                |r| (offsets[r.end] - offsets[r.start]) as usize,
                max,
            )
            .unwrap()
            .expect("a plan");
            assert_eq!(Some(ranges.clone()), plan_chunks(&input, max).unwrap());
            // Each range's rows built as a batch of their own (offsets from 0).
            let chunks: Vec<Chunk> = ranges
                .into_iter()
                .map(|r| {
                    let own =
                        RecordBatch::try_from_iter(input.schema().fields().iter().zip(input.columns()).map(
                            |(field, column)| {
                                let sliced = column.slice(r.start, r.len());
                                (
                                    field.name().clone(),
                                    arrow_select::concat::concat(&[sliced.as_ref()]).unwrap(),
                                )
                            },
                        ))
                        .unwrap();
                    Chunk {
                        payload: ipc::encode_stream(&[own]).unwrap(),
                        rows: r,
                    }
                })
                .collect();
            assert!(chunks.iter().all(|c| c.payload.len() <= max));
            assert_concatenate_to(
                &Chunks {
                    chunks,
                    max_bytes: max,
                },
                &input,
            );
        }
        let small = flat(100, |_| 5);
        assert_eq!(
            plan_unbuilt(&small.slice(0, 1), 100, |r| 5 * r.len(), 1 << 20).unwrap(),
            None,
            "fits whole"
        );
        let one_big = flat(20_000, |i| if i == 777 { 50_000 } else { 5 });
        let offsets = one_big.column(1).as_string::<i32>().value_offsets();
        assert_eq!(
            plan_unbuilt(
                &one_big.slice(0, 1),
                20_000,
                |r| (offsets[r.end] - offsets[r.start]) as usize,
                20_000
            )
            .unwrap(),
            None,
            "a row over the bound"
        );
    }

    #[test]
    fn runs_are_cut_where_a_walk_row_by_row_cuts_them() {
        // The walk the search replaced: a row joins the run while the run
        // with it fits.
        fn walk(rows: usize, fits: &dyn Fn(Range<usize>) -> bool) -> Option<Vec<Range<usize>>> {
            let mut runs = Vec::new();
            let mut start = 0;
            for row in 0..rows {
                if row > start && !fits(start..row + 1) {
                    runs.push(start..row);
                    start = row;
                }
                if row == start && !fits(row..row + 1) {
                    return None;
                }
            }
            if rows > 0 {
                runs.push(start..rows);
            }
            Some(runs)
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |below: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % below
        };
        let mut cut = 0;
        for _ in 0..400 {
            let rows = next(300) as usize;
            let spread = 1 + next(40);
            let widths: Vec<usize> = (0..rows).map(|_| next(spread) as usize).collect();
            let mut ends = vec![0];
            for w in &widths {
                ends.push(ends.last().unwrap() + w);
            }
            let (per_row, max) = (next(8) as usize, 1 + next(400) as usize);
            let fits = |r: Range<usize>| 10 + r.len() * per_row + ends[r.end] - ends[r.start] <= max;
            let expected = walk(rows, &fits);
            cut += expected.as_ref().map_or(0, |runs| runs.len().saturating_sub(1));
            assert_eq!(
                longest_runs(rows, fits),
                expected,
                "{rows} rows of {widths:?}, {per_row} a row, max {max}"
            );
        }
        assert!(cut > 1000, "the cases cut runs: {cut}");
        assert_eq!(longest_runs(0, |_| true), Some(vec![]));
        assert_eq!(longest_runs(5, |_| true), Some(vec![Range { start: 0, end: 5 }]));
        assert_eq!(
            longest_runs(5, |r| r.len() <= 1),
            Some((0..5).map(|i| i..i + 1).collect())
        );
    }

    #[test]
    fn a_plan_is_left_to_encode_chunks_where_it_cannot_bound_or_need_not_cut() {
        let max = 20_000;
        assert_eq!(
            plan_chunks(&batch(20_000, |_| 5), max).unwrap(),
            None,
            "a dictionary column"
        );
        assert_eq!(
            plan_chunks(&flat(100, |_| 5), 1 << 20).unwrap(),
            None,
            "fits whole"
        );
        let one_big = flat(20_000, |i| if i == 777 { 50_000 } else { 5 });
        assert_eq!(plan_chunks(&one_big, max).unwrap(), None, "a row over the bound");
        assert!(encode_chunks(&one_big, max).unwrap().oversized().is_some());
    }

    #[test]
    fn the_same_batch_always_gives_the_same_chunks() {
        let input = batch(10_000, |i| 3 + i % 17);
        let a = encode_chunks(&input, 30_000).unwrap();
        let b = encode_chunks(&input, 30_000).unwrap();
        assert_eq!(a.chunks, b.chunks);
    }

    #[test]
    fn chunk_headers_parse_as_the_python_client_reads_them() {
        let parse = |pairs: &[(&str, &str)]| {
            ChunkInfo::from_headers(|name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_bytes()))
        };
        assert_eq!(
            parse(&[]),
            Ok(ChunkInfo {
                index: 0,
                count: 1,
                rows: None
            })
        );
        assert_eq!(
            parse(&[(ROWS_HEADER, "12")]),
            Ok(ChunkInfo {
                index: 0,
                count: 1,
                rows: Some(12)
            })
        );
        assert_eq!(
            parse(&[(CHUNK_HEADER, " 2 "), (CHUNKS_HEADER, "3"), (ROWS_HEADER, "9")]),
            Ok(ChunkInfo {
                index: 2,
                count: 3,
                rows: Some(9)
            })
        );
        let written = chunk_header_values(4, 5, 1_000_000);
        let pairs: Vec<(&str, &str)> = written.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(
            parse(&pairs),
            Ok(ChunkInfo {
                index: 4,
                count: 5,
                rows: Some(1_000_000)
            })
        );
        assert_eq!(parse(&[(CHUNK_HEADER, "0")]), Err(ChunkHeaderError::Unpaired));
        assert_eq!(
            parse(&[(CHUNK_HEADER, "3"), (CHUNKS_HEADER, "3")]),
            Err(ChunkHeaderError::OutOfRange { index: 3, count: 3 })
        );
        assert_eq!(
            parse(&[(CHUNK_HEADER, "0"), (CHUNKS_HEADER, "0")]),
            Err(ChunkHeaderError::OutOfRange { index: 0, count: 0 })
        );
        for bad in ["-1", "+1", "1.0", "", "x", "١"] {
            assert!(
                matches!(
                    parse(&[(CHUNK_HEADER, "0"), (CHUNKS_HEADER, bad)]),
                    Err(ChunkHeaderError::NotDecimal { .. })
                ),
                "{bad:?}"
            );
        }
    }

    /// The vectors both languages read (`schemas/vectors/chunks.json`,
    /// `chunk_info`; python/tests/test_reassembly.py holds `wire.chunk_info`
    /// to them).
    #[test]
    fn chunk_headers_read_as_the_shared_vectors() {
        let vectors = crate::messages::vectors::shared("chunks.json");
        let cases = vectors["chunk_info"].as_array().unwrap();
        assert!(!cases.is_empty());
        for case in cases {
            // A header without a value reads as empty, as readers take it.
            let pairs: Vec<(&str, &[u8])> = case["headers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| {
                    (
                        h[0].as_str().unwrap(),
                        h[1].as_str().unwrap_or_default().as_bytes(),
                    )
                })
                .collect();
            let got = ChunkInfo::from_headers(|name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| *v));
            match case.get("error") {
                Some(error) => {
                    let error = error.as_str().unwrap();
                    assert!(
                        got.as_ref().is_err_and(|e| e.to_string().contains(error)),
                        "{case}: {got:?}"
                    );
                }
                None => {
                    let want = ChunkInfo {
                        index: case["index"].as_u64().unwrap() as usize,
                        count: case["count"].as_u64().unwrap() as usize,
                        rows: case["rows"].as_u64().map(|r| r as usize),
                    };
                    assert_eq!(got, Ok(want), "{case}");
                }
            }
        }
    }
}
