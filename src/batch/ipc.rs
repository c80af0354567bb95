//! Arrow IPC stream framing: one Kafka message carries one IPC stream
//! (schema, then record batches).

use crate::messages::decode::panic_text;
use arrow_array::RecordBatch;
use arrow_buffer::{Buffer, MutableBuffer};
use arrow_ipc::reader::{FileReader, StreamDecoder, StreamReader};
use arrow_ipc::writer::StreamWriter;
use arrow_schema::ArrowError;
use bytes::Bytes;

/// Room for a stream's framing besides its arrays' bytes: the schema
/// message and the end-of-stream marker.
const STREAM_FRAMING: usize = 4096;
/// And for each batch: its header and each buffer's padding (a few KB for a
/// schema of a dozen columns).
const BATCH_FRAMING: usize = 4096;

/// The most an output is sized for at once; a larger stream grows from it.
/// The bytes a column's rows take are an estimate: a view column counts the
/// whole of every data buffer it holds, which for a batch decoded from a
/// message can be the message's whole body.
const MAX_PRESIZED: usize = 64 << 20;

/// Encodes batches (all of one schema) as one IPC stream. The output is
/// sized once, from the bytes the batches' rows take (a slice's own rows,
/// not its parent's buffers, except for view columns), up to
/// [`MAX_PRESIZED`]: grown by doubling, a 900 KB chunk was copied once more
/// in pieces on the way, each new piece's pages faulted in.
pub fn encode_stream(batches: &[RecordBatch]) -> Result<Vec<u8>, ArrowError> {
    let Some(first) = batches.first() else {
        return Err(ArrowError::InvalidArgumentError("no batch to encode".into()));
    };
    let arrays: usize = batches
        .iter()
        .flat_map(RecordBatch::columns)
        .map(|column| column.to_data().get_slice_memory_size().unwrap_or(0))
        .fold(0, usize::saturating_add);
    let framing = STREAM_FRAMING + BATCH_FRAMING * batches.len();
    let mut out = Vec::with_capacity(arrays.saturating_add(framing).min(MAX_PRESIZED));
    let mut writer = StreamWriter::try_new(&mut out, &first.schema())?;
    for batch in batches {
        writer.write(batch)?;
    }
    writer.finish()?;
    drop(writer);
    Ok(out)
}

/// Decodes one IPC stream into its batches. Untrusted bytes: arrow-ipc 60
/// panics on some malformed streams (a buffer slice past the body, found by
/// `fuzz/fuzz_targets/decode_scored.rs`), so a panic is an error here.
///
/// A stream as writers make it (its bodies 8-byte aligned, as the format
/// asks, and only schema, record batch and dictionary messages) is copied
/// once, into one aligned buffer that the batches' arrays then slice.
/// `StreamReader` copies each message's body into a buffer of its own,
/// zeroed first: two passes over the bytes. Any other stream still goes
/// through `StreamReader`, so that what is accepted and refused does not
/// change: `StreamDecoder` skips messages of no type, where the reader
/// refuses them, and places a misaligned body as it lies, where the reader
/// gives each body an aligned buffer.
pub fn decode_stream(bytes: &[u8]) -> Result<Vec<RecordBatch>, ArrowError> {
    decode_framed(bytes, None)
}

/// [`decode_stream`] of bytes held in a shared buffer: a stream as writers
/// make it, with its end-of-stream marker, in bytes that start
/// [`ALIGNMENT`]-aligned (any allocation of jemalloc's or glibc's), is not
/// copied at all: its batches' arrays slice `bytes` itself (a 1M-row step's 77 MB of
/// Arrow input were copied once more here, into memory never touched
/// before, on the consume loop's thread). Any other stream is decoded as
/// [`decode_stream`] decodes it.
pub fn decode_shared(bytes: &Bytes) -> Result<Vec<RecordBatch>, ArrowError> {
    decode_framed(bytes, Some(bytes))
}

/// The alignment of a stream read in place: the largest any native Arrow
/// type needs (16, for 128-bit values). A body that lies misaligned for its
/// type all the same is copied into place by arrow-ipc, as for the copy.
pub const ALIGNMENT: usize = 16;

fn decode_framed(bytes: &[u8], shared: Option<&Bytes>) -> Result<Vec<RecordBatch>, ArrowError> {
    let framing = check_framing(bytes)?;
    if !framing.plain {
        return guarded(|| StreamReader::try_new(std::io::Cursor::new(bytes), None)?.collect());
    }
    guarded(|| {
        let in_place = shared.filter(|b| framing.ended && (b.as_ptr() as usize).is_multiple_of(ALIGNMENT));
        let mut buffer = match in_place {
            Some(shared) => Buffer::from(shared.slice(..framing.len)),
            None => {
                let stream = &bytes[..framing.len];
                let mut copy = MutableBuffer::with_capacity(stream.len() + END_OF_STREAM.len());
                copy.extend_from_slice(stream);
                // A stream may end without its marker (the reader takes the
                // end of the bytes as the end): the decoder is given one, so
                // that a last message with an empty body is read, not left
                // waiting for one.
                if !framing.ended {
                    copy.extend_from_slice(&END_OF_STREAM);
                }
                Buffer::from(copy)
            }
        };
        let mut decoder = StreamDecoder::new();
        let mut batches = Vec::new();
        while let Some(batch) = decoder.decode(&mut buffer)? {
            batches.push(batch);
        }
        decoder.finish()?;
        if decoder.schema().is_none() {
            return Err(ArrowError::IpcError(
                "malformed IPC stream: no schema message".into(),
            ));
        }
        Ok(batches)
    })
}

/// The end-of-stream marker: a continuation marker and a length of 0.
const END_OF_STREAM: [u8; 8] = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];

/// What [`check_framing`] found of a stream.
struct Framing {
    /// Bytes up to its end-of-stream marker (bytes after it are not read,
    /// as `StreamReader` does not read them), or all of them.
    len: usize,
    /// Whether it has an end-of-stream marker.
    ended: bool,
    /// Whether every body starts 8-byte aligned and every message is a
    /// schema, a record batch or a dictionary batch.
    plain: bool,
}

/// Walks the stream's message frames (optional continuation marker, metadata
/// length, flatbuffer metadata, body) and checks that every body the
/// metadata announces is really there. arrow-ipc allocates (and zeroes) up
/// to 64 MiB for an announced body before it reads it: a 2 KB message that
/// announces large bodies cost a worker 240 MB of resident memory before
/// this check.
fn check_framing(bytes: &[u8]) -> Result<Framing, ArrowError> {
    use arrow_ipc::MessageHeader;
    let bad = |what: String| ArrowError::IpcError(format!("malformed IPC stream: {what}"));
    let word = |at: usize| {
        bytes
            .get(at..at + 4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| bad(format!("truncated frame header at byte {at}")))
    };
    let mut at = 0usize;
    let mut plain = true;
    while at < bytes.len() {
        let mut len = word(at)?;
        at += 4;
        if len == -1 {
            len = word(at)?;
            at += 4;
        }
        if len == 0 {
            return Ok(Framing {
                len: at,
                ended: true,
                plain,
            });
        }
        let len = usize::try_from(len).map_err(|_| bad(format!("negative metadata length {len}")))?;
        let meta = bytes
            .get(at..at.saturating_add(len))
            .ok_or_else(|| bad(format!("{len} bytes of metadata at byte {at} run past the end")))?;
        let message = arrow_ipc::root_as_message(meta)
            .map_err(|e| bad(format!("unreadable metadata at byte {at}: {e}")))?;
        at += len;
        plain &= at.is_multiple_of(8)
            && matches!(
                message.header_type(),
                MessageHeader::Schema | MessageHeader::RecordBatch | MessageHeader::DictionaryBatch
            );
        let body = usize::try_from(message.bodyLength())
            .map_err(|_| bad(format!("negative body length {}", message.bodyLength())))?;
        if body > bytes.len() - at {
            return Err(bad(format!(
                "a {body}-byte body at byte {at} runs past the end of the {}-byte stream",
                bytes.len()
            )));
        }
        at += body;
    }
    Ok(Framing {
        len: bytes.len(),
        ended: false,
        plain,
    })
}

/// Decodes an IPC file (`ARROW1` magic) into its batches, panics as errors.
pub fn decode_file(bytes: &[u8]) -> Result<Vec<RecordBatch>, ArrowError> {
    guarded(|| FileReader::try_new(std::io::Cursor::new(bytes), None)?.collect())
}

fn guarded(
    decode: impl FnOnce() -> Result<Vec<RecordBatch>, ArrowError>,
) -> Result<Vec<RecordBatch>, ArrowError> {
    // The decoder only reads `bytes` and builds new arrays, so nothing is
    // left half-changed when it unwinds.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(decode)).unwrap_or_else(|panic| {
        let what = panic_text(panic.as_ref()).unwrap_or("panic");
        Err(ArrowError::IpcError(format!("malformed IPC data: {what}")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_that_panics_arrow_ipc_is_an_error() {
        // Found by the decode_scored fuzz target: arrow-ipc 60 panics slicing
        // a buffer past the end of the message body.
        let bytes = include_bytes!("../../fuzz/regressions/decode_scored-arrow-slice-panic.bin");
        let err = decode_stream(bytes).unwrap_err();
        assert!(err.to_string().contains("malformed IPC"), "{err}");
        // The decoder's panic is caught too, should a stream pass the
        // framing check and still break it.
        let err =
            guarded(|| StreamReader::try_new(std::io::Cursor::new(&bytes[..]), None)?.collect()).unwrap_err();
        assert!(err.to_string().contains("malformed IPC data"), "{err}");
    }

    #[test]
    fn a_stream_is_sized_once_from_the_rows_it_carries() {
        // A step's worth of rows: large enough that growing by doubling
        // leaves far more room than the framing, and a slice whose parent's
        // buffers are a thousand times its own.
        let rows = crate::batch::synthetic::synthetic_step(20_000, 8, "run-1", 3, 7);
        let batch = rows.to_batch().unwrap();
        for (name, batch) in [("whole", batch.clone()), ("slice", batch.slice(100, 20))] {
            let stream = encode_stream(std::slice::from_ref(&batch)).unwrap();
            assert_eq!(decode_stream(&stream).unwrap(), vec![batch], "{name}");
            let room = stream.capacity() - stream.len();
            assert!(
                room <= STREAM_FRAMING + BATCH_FRAMING,
                "{name}: {room} bytes to spare past {}",
                stream.len()
            );
        }
    }

    #[test]
    fn framing_rejects_bodies_that_are_not_there_and_keeps_good_streams() {
        let (batch, _) = three_rows_and_none();
        let good = encode_stream(&[batch.clone(), batch]).unwrap();
        assert_eq!(decode_stream(&good).unwrap().len(), 2);
        for cut in [good.len() - 9, good.len() / 2, 6, 3] {
            assert!(decode_stream(&good[..cut]).is_err(), "cut at {cut}");
        }
    }

    /// `batch` (of one Int64 column) with 3 rows and with none.
    fn three_rows_and_none() -> (RecordBatch, RecordBatch) {
        use arrow_array::Int64Array;
        let batch = RecordBatch::try_from_iter([(
            "x",
            std::sync::Arc::new(Int64Array::from(vec![1, 2, 3])) as arrow_array::ArrayRef,
        )])
        .unwrap();
        let empty = batch.slice(0, 0);
        (batch, empty)
    }

    /// What `StreamReader` makes of `bytes`, the reference for what is
    /// accepted and refused.
    fn as_the_reader_reads(bytes: &[u8]) -> Result<Vec<RecordBatch>, String> {
        guarded(|| StreamReader::try_new(std::io::Cursor::new(bytes), None)?.collect())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_stream_without_its_end_marker_whose_last_body_is_empty_is_read_whole() {
        let (batch, empty) = three_rows_and_none();
        let stream = encode_stream(&[batch.clone(), empty.clone()]).unwrap();
        let unended = &stream[..stream.len() - END_OF_STREAM.len()];
        assert_eq!(&stream[unended.len()..], END_OF_STREAM);
        assert_eq!(decode_stream(unended).unwrap(), [batch, empty]);
        assert!(as_the_reader_reads(unended).is_ok());
    }

    #[test]
    fn a_message_of_no_type_or_a_misaligned_body_is_read_as_the_reader_reads_it() {
        let (batch, _) = three_rows_and_none();
        let stream = encode_stream(&[batch]).unwrap();
        // A message of no type first, framed as the writer frames messages.
        let mut fbb = flatbuffers::FlatBufferBuilder::new();
        let mut message = arrow_ipc::MessageBuilder::new(&mut fbb);
        message.add_version(arrow_ipc::MetadataVersion::V5);
        message.add_header_type(arrow_ipc::MessageHeader::NONE);
        message.add_bodyLength(0);
        let message = message.finish();
        fbb.finish(message, None);
        let mut meta = fbb.finished_data().to_vec();
        meta.resize(meta.len().next_multiple_of(8), 0);
        let mut none_first = vec![0xff, 0xff, 0xff, 0xff];
        none_first.extend_from_slice(&(meta.len() as i32).to_le_bytes());
        none_first.extend_from_slice(&meta);
        none_first.extend_from_slice(&stream);
        let decoded = decode_stream(&none_first).map_err(|e| e.to_string());
        assert!(decoded.is_err(), "{decoded:?}");
        assert_eq!(decoded, as_the_reader_reads(&none_first));
        // The schema's metadata 4 bytes longer: every body after it starts
        // 4 bytes off 8-byte alignment.
        let schema_len = i32::from_le_bytes(stream[4..8].try_into().unwrap()) as usize;
        let mut misaligned = stream[..4].to_vec();
        misaligned.extend_from_slice(&(schema_len as i32 + 4).to_le_bytes());
        misaligned.extend_from_slice(&stream[8..8 + schema_len]);
        misaligned.extend_from_slice(&[0; 4]);
        misaligned.extend_from_slice(&stream[8 + schema_len..]);
        assert!(!check_framing(&misaligned).unwrap().plain);
        assert_eq!(
            decode_stream(&misaligned).map_err(|e| e.to_string()),
            as_the_reader_reads(&misaligned)
        );
    }

    #[test]
    fn batches_slice_one_copy_of_the_stream_and_bytes_after_its_end_are_not_read() {
        use arrow_array::Array;
        let (batch, _) = three_rows_and_none();
        let mut bytes = encode_stream(&[batch.clone(), batch.clone()]).unwrap();
        bytes.extend_from_slice(b"after the end");
        let batches = decode_stream(&bytes).unwrap();
        assert_eq!(batches, [batch.clone(), batch]);
        // One allocation under both batches' values: not a buffer a message.
        let values = |b: &RecordBatch| b.column(0).to_data().buffers()[0].data_ptr();
        assert_eq!(values(&batches[0]), values(&batches[1]));
        // No schema, no stream.
        assert!(decode_stream(&[]).is_err());
        assert!(decode_stream(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]).is_err());
    }

    /// `bytes` in a shared buffer that starts `offset` bytes past an
    /// [`ALIGNMENT`] boundary.
    fn shared_at(bytes: &[u8], offset: usize) -> Bytes {
        let mut room = vec![0u8; bytes.len() + 2 * ALIGNMENT];
        let start = room.as_ptr().align_offset(ALIGNMENT) + offset;
        room[start..start + bytes.len()].copy_from_slice(bytes);
        Bytes::from(room).slice(start..start + bytes.len())
    }

    #[test]
    fn a_shared_stream_is_read_in_place_when_it_is_aligned_and_ended_and_copied_otherwise() {
        let rows = crate::batch::synthetic::synthetic_step(5_000, 8, "run-1", 3, 7);
        let batch = rows.to_batch().unwrap();
        let stream = encode_stream(std::slice::from_ref(&batch)).unwrap();
        let unended = &stream[..stream.len() - END_OF_STREAM.len()];
        // Whether every buffer of every column lies inside `payload`.
        let inside = |batches: &[RecordBatch], payload: &Bytes| {
            let range = payload.as_ptr_range();
            batches.iter().flat_map(|b| b.columns()).all(|column| {
                let data = column.to_data();
                let mut all = data.buffers().to_vec();
                all.extend(data.child_data().iter().flat_map(|c| c.buffers().to_vec()));
                all.iter().all(|buffer| range.contains(&buffer.as_ptr()))
            })
        };
        for (name, payload, in_place) in [
            ("aligned and ended", shared_at(&stream, 0), true),
            ("misaligned", shared_at(&stream, 8), false),
            ("without its end marker", shared_at(unended, 0), false),
        ] {
            let batches = decode_shared(&payload).unwrap();
            assert_eq!(batches, std::slice::from_ref(&batch), "{name}");
            assert_eq!(inside(&batches, &payload), in_place, "{name}");
        }
        // Refused as decode_stream refuses it.
        let cut = shared_at(&stream[..stream.len() / 2], 0);
        assert_eq!(
            decode_shared(&cut).map_err(|e| e.to_string()),
            decode_stream(&cut).map_err(|e| e.to_string())
        );
    }
}
