//! A JSON value that keeps each object's keys in the order they arrived, as
//! Python's `json.loads` does: what the reference prompt shows as the
//! Python `str()` of a content block (`serde_json::Map` sorts its keys).

use std::collections::HashMap;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::{Map, Number, Value};

/// A JSON value with ordered objects.
#[derive(Debug, Clone, PartialEq)]
pub enum OrderedJson {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Array(Vec<OrderedJson>),
    /// Keys in arrival order; a repeated key keeps its first place and takes
    /// its last value, as a Python dict built by `json.loads` does.
    Object(Vec<(String, OrderedJson)>),
}

impl OrderedJson {
    /// The value of `key` when this is an object that has it.
    pub fn get(&self, key: &str) -> Option<&OrderedJson> {
        match self {
            OrderedJson::Object(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The same value as a `serde_json::Value` (objects' keys sorted).
    pub fn to_value(&self) -> Value {
        match self {
            OrderedJson::Null => Value::Null,
            OrderedJson::Bool(b) => Value::Bool(*b),
            OrderedJson::Number(n) => Value::Number(n.clone()),
            OrderedJson::String(s) => Value::String(s.clone()),
            OrderedJson::Array(items) => Value::Array(items.iter().map(OrderedJson::to_value).collect()),
            OrderedJson::Object(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_value()))
                    .collect::<Map<_, _>>(),
            ),
        }
    }
}

impl Serialize for OrderedJson {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            OrderedJson::Null => serializer.serialize_unit(),
            OrderedJson::Bool(b) => serializer.serialize_bool(*b),
            OrderedJson::Number(n) => n.serialize(serializer),
            OrderedJson::String(s) => serializer.serialize_str(s),
            OrderedJson::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            OrderedJson::Object(entries) => {
                let mut map = serializer.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for OrderedJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(OrderedVisitor)
    }
}

struct OrderedVisitor;

impl<'de> Visitor<'de> for OrderedVisitor {
    type Value = OrderedJson;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<OrderedJson, E> {
        Ok(OrderedJson::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<OrderedJson, E> {
        Ok(OrderedJson::Number(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<OrderedJson, E> {
        Ok(OrderedJson::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<OrderedJson, E> {
        Number::from_f64(v)
            .map(OrderedJson::Number)
            .ok_or_else(|| E::custom("a number must be finite"))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<OrderedJson, E> {
        Ok(OrderedJson::String(v.to_string()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<OrderedJson, E> {
        Ok(OrderedJson::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<OrderedJson, E> {
        Ok(OrderedJson::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<OrderedJson, E> {
        Ok(OrderedJson::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<OrderedJson, D::Error> {
        OrderedJson::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<OrderedJson, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(OrderedJson::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OrderedJson, A::Error> {
        let mut entries: Vec<(String, OrderedJson)> = Vec::new();
        let mut places: HashMap<String, usize> = HashMap::new();
        while let Some((key, value)) = map.next_entry::<String, OrderedJson>()? {
            match places.get(&key) {
                Some(&i) => entries[i].1 = value,
                None => {
                    places.insert(key.clone(), entries.len());
                    entries.push((key, value));
                }
            }
        }
        Ok(OrderedJson::Object(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{decode, ChatContent, DecodeLimits, FailedTrajectory};

    #[test]
    fn a_decoded_trajectory_s_blocks_keep_their_keys_order_and_repeated_keys_still_decode() {
        let payload =
            br#"{"schema_version":1,"run_id":"r","step":7,"step":1,"instance_id":"i","trajectory_id":"t",
            "task_prompt":"p","reward":0.0,"chat_history":[{"role":"assistant","content":[
            {"type":"tool_use","name":"click","input":{"y":2,"x":1}},{"z":0,"type":"custom","a":1}]}]}"#;
        let t: FailedTrajectory = decode(payload, DecodeLimits::default()).unwrap();
        assert_eq!(t.step, 1, "the last of a repeated key wins, as before");
        let ChatContent::Blocks(blocks) = &t.chat_history[0].content else {
            panic!("{:?}", t.chat_history)
        };
        let keys = |v: &OrderedJson| match v {
            OrderedJson::Object(entries) => entries.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
            _ => vec![],
        };
        assert_eq!(keys(blocks[0].ordered.get("input").unwrap()), ["y", "x"]);
        assert_eq!(keys(&blocks[1].ordered), ["z", "type", "a"]);
        assert_eq!(blocks[1].kind, "custom");
    }

    #[test]
    fn keeps_the_order_of_keys_and_the_last_value_of_a_repeated_key() {
        let v: OrderedJson =
            serde_json::from_str(r#"{"z": 1, "a": [true, null, -2, 1.5], "z": "again"}"#).unwrap();
        let OrderedJson::Object(entries) = &v else {
            panic!("{v:?}")
        };
        let keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["z", "a"]);
        assert_eq!(v.get("z"), Some(&OrderedJson::String("again".into())));
        assert_eq!(
            v.to_value(),
            serde_json::json!({"a": [true, null, -2, 1.5], "z": "again"})
        );
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            r#"{"z":"again","a":[true,null,-2,1.5]}"#
        );
    }
}
