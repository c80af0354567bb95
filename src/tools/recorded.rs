//! One recorded Kafka message as a JSONL line. Keys, values and header values
//! are kept as text when they are UTF-8 and as base64 (`*_b64`) otherwise, so
//! Arrow payloads survive a round trip byte for byte.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedMessage {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// Milliseconds since the epoch, when the broker gave one.
    pub timestamp: Option<i64>,
    #[serde(flatten)]
    pub key: Bytes<KeyField>,
    #[serde(flatten)]
    pub value: Bytes<ValueField>,
    #[serde(default)]
    pub headers: Vec<RecordedHeader>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedHeader {
    pub key: String,
    #[serde(flatten)]
    pub value: Bytes<ValueField>,
}

/// Field names of an encoded byte string.
pub trait FieldNames {
    const TEXT: &'static str;
    const B64: &'static str;
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyField;
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueField;

impl FieldNames for KeyField {
    const TEXT: &'static str = "key";
    const B64: &'static str = "key_b64";
}

impl FieldNames for ValueField {
    const TEXT: &'static str = "value";
    const B64: &'static str = "value_b64";
}

/// Optional bytes, written as `NAME` (UTF-8 text) or `NAME_b64`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bytes<N> {
    pub bytes: Option<Vec<u8>>,
    _names: std::marker::PhantomData<N>,
}

impl<N> Bytes<N> {
    pub fn new(bytes: Option<Vec<u8>>) -> Self {
        Bytes {
            bytes,
            _names: std::marker::PhantomData,
        }
    }
}

impl<N: FieldNames> Serialize for Bytes<N> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(1))?;
        match &self.bytes {
            None => map.serialize_entry(N::TEXT, &None::<String>)?,
            Some(b) => match std::str::from_utf8(b) {
                Ok(text) => map.serialize_entry(N::TEXT, text)?,
                Err(_) => map.serialize_entry(N::B64, &B64.encode(b))?,
            },
        }
        map.end()
    }
}

impl<'de, N: FieldNames> Deserialize<'de> for Bytes<N> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = serde_json::Map::deserialize(d)?;
        if let Some(encoded) = map.get(N::B64).and_then(|v| v.as_str()) {
            let bytes = B64.decode(encoded).map_err(serde::de::Error::custom)?;
            return Ok(Bytes::new(Some(bytes)));
        }
        match map.get(N::TEXT) {
            None | Some(serde_json::Value::Null) => Ok(Bytes::new(None)),
            Some(serde_json::Value::String(s)) => Ok(Bytes::new(Some(s.clone().into_bytes()))),
            Some(other) => Err(serde::de::Error::custom(format!(
                "`{}` must be a string or null, got {other}",
                N::TEXT
            ))),
        }
    }
}

impl RecordedMessage {
    /// A consumed message as it is recorded: topic, partition, offset,
    /// timestamp, key, value and headers.
    pub fn of(message: &impl rdkafka::message::Message) -> Self {
        use rdkafka::message::Headers;
        RecordedMessage {
            topic: message.topic().to_string(),
            partition: message.partition(),
            offset: message.offset(),
            timestamp: message.timestamp().to_millis(),
            key: Bytes::new(message.key().map(<[u8]>::to_vec)),
            value: Bytes::new(message.payload().map(<[u8]>::to_vec)),
            headers: message
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| RecordedHeader {
                            key: h.key.to_string(),
                            value: Bytes::new(h.value.map(<[u8]>::to_vec)),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    pub fn key_bytes(&self) -> Option<&[u8]> {
        self.key.bytes.as_deref()
    }

    pub fn value_bytes(&self) -> Option<&[u8]> {
        self.value.bytes.as_deref()
    }

    /// Parses one JSONL line.
    pub fn from_line(line: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(line)
    }

    pub fn to_line(&self) -> String {
        // A struct of strings, numbers and vectors always serialises.
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_binary_and_text() {
        let message = RecordedMessage {
            topic: "t".into(),
            partition: 2,
            offset: 9,
            timestamp: Some(1),
            key: Bytes::new(Some(b"run/1".to_vec())),
            value: Bytes::new(Some(vec![0xff, 0x00, 0x41])),
            headers: vec![RecordedHeader {
                key: "content-type".into(),
                value: Bytes::new(Some(b"application/json".to_vec())),
            }],
        };
        let line = message.to_line();
        assert!(line.contains("\"key\":\"run/1\""), "{line}");
        assert!(line.contains("value_b64"), "{line}");
        assert_eq!(RecordedMessage::from_line(&line).unwrap(), message);
    }
}
