//! `FailedTrajectory`: a rollout whose verifier said no, as the trainer
//! publishes it on `rl.trajectories.failed`.

use serde::{de, Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use super::decode::{rules, DecodeError, Validate};
use super::ordered::OrderedJson;
use super::SCHEMA_VERSION;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedTrajectory {
    pub schema_version: i64,
    pub run_id: String,
    pub step: i64,
    /// The GRPO group.
    pub instance_id: String,
    pub trajectory_id: String,
    pub task_prompt: String,
    pub chat_history: Vec<ChatMessage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verifier_stdout: Option<String>,
    #[serde(default)]
    pub verifier_error: Option<String>,
    #[serde(default)]
    pub tool_error_messages: Option<Vec<String>>,
    pub reward: f64,
    /// How many failed trajectories of this group to expect (default 1).
    #[serde(default = "default_group_size")]
    pub group_size: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub produced_at: Option<String>,
    /// The model the trainer asked for (the reference's `model` argument, a
    /// litellm id such as `openrouter/anthropic/claude-sonnet-4`). Optional;
    /// stage 1 does not act on it yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint_model: Option<String>,
}

fn default_group_size() -> i64 {
    1
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: ChatContent,
}

/// A chat message's content: plain text or a list of typed blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ChatContent {
    Text(String),
    Blocks(Vec<ContentBlock>),
}

/// One content block. `type` is `text`, `image_url`, `tool_use` or
/// `tool_result`; other types are kept as they are (the prompt shows them
/// shortened).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContentBlock {
    #[serde(rename = "type")]
    pub kind: String,
    /// Every field but `type`.
    #[serde(flatten)]
    pub fields: Map<String, Value>,
    /// The whole block as it arrived, `type` included, keys in their order
    /// (the reference prompt shows blocks as Python `str()`). Not
    /// serialized: a block serializes as `type` and `fields`.
    #[serde(skip_serializing)]
    pub ordered: OrderedJson,
}

impl<'de> Deserialize<'de> for ContentBlock {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let ordered = OrderedJson::deserialize(deserializer)?;
        let OrderedJson::Object(entries) = &ordered else {
            return Err(de::Error::custom("a content block must be an object"));
        };
        let mut kind = None;
        let mut fields = Map::new();
        for (key, value) in entries {
            match (key.as_str(), value) {
                ("type", OrderedJson::String(s)) => kind = Some(s.clone()),
                ("type", _) => return Err(de::Error::custom("a content block's `type` must be a string")),
                _ => {
                    fields.insert(key.clone(), value.to_value());
                }
            }
        }
        let kind = kind.ok_or_else(|| de::Error::missing_field("type"))?;
        Ok(ContentBlock {
            kind,
            fields,
            ordered,
        })
    }
}

impl ContentBlock {
    /// A string field of the block, if present.
    pub fn str_field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).and_then(Value::as_str)
    }
}

impl FailedTrajectory {
    /// `run_id/step/instance_id`.
    pub fn group_key(&self) -> String {
        super::group_key(&self.run_id, self.step, &self.instance_id)
    }
}

impl Validate for FailedTrajectory {
    /// Content blocks keep their keys' order (the reference prompt shows
    /// them as Python dicts).
    const KEEPS_KEY_ORDER: bool = true;

    fn restore_key_order(&mut self, ordered: &OrderedJson) {
        let Some(OrderedJson::Array(messages)) = ordered.get("chat_history") else {
            return;
        };
        for (message, ordered) in self.chat_history.iter_mut().zip(messages) {
            let (ChatContent::Blocks(blocks), Some(OrderedJson::Array(items))) =
                (&mut message.content, ordered.get("content"))
            else {
                continue;
            };
            for (block, item) in blocks.iter_mut().zip(items) {
                if let OrderedJson::Object(_) = item {
                    block.ordered = item.clone();
                }
            }
        }
    }

    fn validate(&self) -> Result<(), DecodeError> {
        rules::schema_version(self.schema_version, SCHEMA_VERSION)?;
        rules::non_empty("run_id", &self.run_id)?;
        rules::step(self.step)?;
        rules::non_empty("instance_id", &self.instance_id)?;
        rules::non_empty("trajectory_id", &self.trajectory_id)?;
        rules::finite("reward", self.reward)?;
        if self.group_size < 1 {
            return Err(DecodeError::invalid(
                "group_size",
                format!("must be >= 1, got {}", self.group_size),
            ));
        }
        for (i, message) in self.chat_history.iter().enumerate() {
            if let ChatContent::Blocks(blocks) = &message.content {
                for (j, block) in blocks.iter().enumerate() {
                    if block.kind.is_empty() {
                        return Err(DecodeError::invalid(
                            format!("chat_history[{i}].content[{j}].type"),
                            "must be a non-empty string",
                        ));
                    }
                }
            }
        }
        rules::rfc3339("produced_at", self.produced_at.as_deref())
    }
}
