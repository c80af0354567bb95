//! Arrow IPC stream framing: one Kafka message carries one IPC stream
//! (schema, then record batches).

use arrow_array::RecordBatch;
use arrow_ipc::reader::StreamReader;
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

/// Decodes one IPC stream into its batches.
pub fn decode_stream(bytes: &[u8]) -> Result<Vec<RecordBatch>, ArrowError> {
    let reader = StreamReader::try_new(std::io::Cursor::new(bytes), None)?;
    reader.collect()
}
