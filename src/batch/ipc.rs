//! Arrow IPC stream framing: one Kafka message carries one IPC stream
//! (schema, then record batches).

use arrow_array::RecordBatch;
use arrow_ipc::reader::{FileReader, StreamReader};
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
pub fn decode_stream(bytes: &[u8]) -> Result<Vec<RecordBatch>, ArrowError> {
    guarded(|| StreamReader::try_new(std::io::Cursor::new(bytes), None)?.collect())
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
        let what = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("panic");
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
        assert!(err.to_string().contains("malformed IPC data"), "{err}");
    }
}
