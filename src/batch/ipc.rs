//! Arrow IPC stream framing: one Kafka message carries one IPC stream
//! (schema, then record batches).

use crate::messages::decode::panic_text;
use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::reader::{FileReader, StreamDecoder};
use arrow_ipc::writer::StreamWriter;
use arrow_schema::ArrowError;

/// Encodes batches (all of one schema) as one IPC stream.
pub fn encode_stream(batches: &[RecordBatch]) -> Result<Vec<u8>, ArrowError> {
    let Some(first) = batches.first() else {
        return Err(ArrowError::InvalidArgumentError("no batch to encode".into()));
    };
    let mut out = Vec::new();
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
/// The stream is copied once, into one aligned buffer that the batches'
/// arrays then slice. `StreamReader` copied each message's body into a
/// buffer of its own, zeroed first: two passes over the bytes and, for a
/// large step's ~1 MB messages, freshly faulted pages for each (~40 ms of
/// a 1M-row step's intake on the consume loop's thread).
pub fn decode_stream(bytes: &[u8]) -> Result<Vec<RecordBatch>, ArrowError> {
    let framed = check_framing(bytes)?;
    guarded(|| {
        let mut buffer = Buffer::from(&bytes[..framed]);
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

/// Walks the stream's message frames (optional continuation marker, metadata
/// length, flatbuffer metadata, body) and checks that every body the
/// metadata announces is really there. arrow-ipc allocates (and zeroes) up
/// to 64 MiB for an announced body before it reads it: a 2 KB message that
/// announces large bodies cost a worker 240 MB of resident memory before
/// this check. Returns the length of the stream up to its end-of-stream
/// marker (bytes after it are not read, as `StreamReader` did not).
fn check_framing(bytes: &[u8]) -> Result<usize, ArrowError> {
    let bad = |what: String| ArrowError::IpcError(format!("malformed IPC stream: {what}"));
    let word = |at: usize| {
        bytes
            .get(at..at + 4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| bad(format!("truncated frame header at byte {at}")))
    };
    let mut at = 0usize;
    while at < bytes.len() {
        let mut len = word(at)?;
        at += 4;
        if len == -1 {
            len = word(at)?;
            at += 4;
        }
        if len == 0 {
            return Ok(at);
        }
        let len = usize::try_from(len).map_err(|_| bad(format!("negative metadata length {len}")))?;
        let meta = bytes
            .get(at..at.saturating_add(len))
            .ok_or_else(|| bad(format!("{len} bytes of metadata at byte {at} run past the end")))?;
        let message = arrow_ipc::root_as_message(meta)
            .map_err(|e| bad(format!("unreadable metadata at byte {at}: {e}")))?;
        at += len;
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
    Ok(bytes.len())
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
    use arrow_ipc::reader::StreamReader;

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
    fn framing_rejects_bodies_that_are_not_there_and_keeps_good_streams() {
        use arrow_array::Int64Array;
        let batch = RecordBatch::try_from_iter([(
            "x",
            std::sync::Arc::new(Int64Array::from(vec![1, 2, 3])) as arrow_array::ArrayRef,
        )])
        .unwrap();
        let good = encode_stream(&[batch.clone(), batch]).unwrap();
        assert_eq!(decode_stream(&good).unwrap().len(), 2);
        for cut in [good.len() - 9, good.len() / 2, 6, 3] {
            assert!(decode_stream(&good[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn batches_slice_one_copy_of_the_stream_and_bytes_after_its_end_are_not_read() {
        use arrow_array::{Array, Int64Array};
        let batch = RecordBatch::try_from_iter([(
            "x",
            std::sync::Arc::new(Int64Array::from(vec![1, 2, 3])) as arrow_array::ArrayRef,
        )])
        .unwrap();
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
}
