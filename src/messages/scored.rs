//! Messages of `rl.rollouts.scored`: one `scored_rollout` per rollout of a
//! step, then one `step_end` that says how many rows the step has.

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::decode::{rules, DecodeError, Validate};
use super::SCHEMA_VERSION;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoredRollout {
    pub schema_version: i64,
    pub run_id: String,
    pub step: i64,
    pub instance_id: String,
    pub trajectory_id: String,
    pub reward: f64,
    pub is_hinted: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint_category: Option<String>,
    /// The hint the rollout ran with (hinted rows): stage 2 turns these
    /// into one `HintOutcome` per hint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint_id: Option<String>,
    /// The response's length in tokens (the reference's `response_mask`
    /// sum), an integer from 1 to [`MAX_RESPONSE_LENGTH`]; 1 when absent.
    /// Only `reinforce_pp` reads it: its mean and variance are over tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_length: Option<i64>,
    /// The sum of the response's token log-probs under the hinted prompt,
    /// for the policy that sampled it (hinted rows; at most 0, with
    /// [`LOGPROB_ROUNDING`] allowed). A row with a log-prob must have a
    /// `response_length`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob_hinted: Option<f64>,
    /// The same response's log-prob under the unhinted prompt, with the same
    /// weights (one forward pass without gradients in the trainer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob_unhinted: Option<f64>,
}

/// How far above 0 a log-prob may be (rounding in the trainer's sums).
pub const LOGPROB_ROUNDING: f64 = 1e-6;

/// Checks one optional log-prob: finite and at most [`LOGPROB_ROUNDING`].
pub fn check_logprob(field: &str, value: Option<f64>) -> Result<(), DecodeError> {
    let Some(v) = value else { return Ok(()) };
    rules::finite(field, v)?;
    if v > LOGPROB_ROUNDING {
        return Err(DecodeError::invalid(
            field,
            format!("must be at most 0 (a sum of log-probabilities; 1e-6 of rounding allowed), got {v}"),
        ));
    }
    Ok(())
}

/// The largest `response_length` accepted (u32's range, which the kernels
/// take).
pub const MAX_RESPONSE_LENGTH: i64 = u32::MAX as i64;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepEnd {
    pub schema_version: i64,
    pub run_id: String,
    pub step: i64,
    /// Rows in the step.
    pub count: i64,
}

/// Any JSON message of `rl.rollouts.scored`, told apart by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ScoredMessage {
    ScoredRollout(ScoredRollout),
    StepEnd(StepEnd),
}

impl ScoredRollout {
    /// An unhinted rollout with none of the optional fields, of the
    /// current schema: a test's or a tool's row (struct update syntax sets
    /// the rest).
    pub fn unhinted(run_id: &str, step: i64, instance_id: &str, trajectory_id: &str, reward: f64) -> Self {
        ScoredRollout {
            schema_version: i64::from(SCHEMA_VERSION),
            run_id: run_id.into(),
            step,
            instance_id: instance_id.into(),
            trajectory_id: trajectory_id.into(),
            reward,
            is_hinted: false,
            hint_category: None,
            hint_id: None,
            response_length: None,
            logprob_hinted: None,
            logprob_unhinted: None,
        }
    }
}

impl Validate for ScoredRollout {
    fn validate(&self) -> Result<(), DecodeError> {
        rules::schema_version(self.schema_version, SCHEMA_VERSION)?;
        rules::non_empty("run_id", &self.run_id)?;
        rules::step(self.step)?;
        rules::non_empty("instance_id", &self.instance_id)?;
        rules::non_empty("trajectory_id", &self.trajectory_id)?;
        if let Some(id) = &self.hint_id {
            rules::non_empty("hint_id", id)?;
        }
        if let Some(length) = self.response_length {
            if !(1..=MAX_RESPONSE_LENGTH).contains(&length) {
                return Err(DecodeError::invalid(
                    "response_length",
                    "must be an integer from 1 to 4294967295",
                ));
            }
        }
        check_logprob("logprob_hinted", self.logprob_hinted)?;
        check_logprob("logprob_unhinted", self.logprob_unhinted)?;
        if (self.logprob_hinted.is_some() || self.logprob_unhinted.is_some())
            && self.response_length.is_none()
        {
            return Err(DecodeError::invalid(
                "response_length",
                "is required on a row with logprob_hinted or logprob_unhinted (the log-probs are per token)",
            ));
        }
        rules::finite("reward", self.reward)
    }
}

impl Validate for StepEnd {
    fn validate(&self) -> Result<(), DecodeError> {
        rules::schema_version(self.schema_version, SCHEMA_VERSION)?;
        rules::non_empty("run_id", &self.run_id)?;
        rules::step(self.step)?;
        if self.count < 0 {
            return Err(DecodeError::invalid("count", "must be >= 0"));
        }
        Ok(())
    }
}

impl Validate for ScoredMessage {
    fn validate(&self) -> Result<(), DecodeError> {
        match self {
            ScoredMessage::ScoredRollout(row) => row.validate(),
            ScoredMessage::StepEnd(end) => end.validate(),
        }
    }

    /// Read through [`EitherScored`] first: serde's tagged enum copies
    /// every field into a buffer of its own before it knows the variant,
    /// and read so a JSON row was a third of stage 2's intake of JSON rows.
    /// The derived reading when that refuses it.
    fn read_direct(text: &str) -> Option<Self> {
        serde_json::from_str::<EitherScored>(text)
            .ok()
            .and_then(EitherScored::message)
            .or_else(|| serde_json::from_str(text).ok())
    }
}

/// The variant a [`ScoredMessage`]'s `type` names: a string only, read as
/// the derived reading reads its tag (an identifier, not an enum).
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum ScoredType {
    ScoredRollout,
    StepEnd,
}

/// The keys [`EitherScored`] reads; any other is [`Field::Other`].
#[derive(Clone, Copy, Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum Field {
    #[serde(rename = "type")]
    Kind,
    SchemaVersion,
    RunId,
    Step,
    InstanceId,
    TrajectoryId,
    Reward,
    IsHinted,
    HintCategory,
    HintId,
    ResponseLength,
    LogprobHinted,
    LogprobUnhinted,
    Count,
    #[serde(other)]
    Other,
}

/// The fields of both [`ScoredMessage`]s, read in one pass with nothing
/// buffered ([`ScoredMessage::read_direct`]). Each is read as its variant
/// reads it, and a value under any other key is read through (its numbers,
/// escapes and depth checked) as the derived reading's buffer reads it,
/// not skipped: so when this accepts a message and it has its variant's
/// fields, the derived reading accepts it and reads the same value. What
/// this refuses (a field of the other variant of another type, a field
/// missing or null, a key twice) goes to the derived reading, which has the
/// last word.
#[derive(Default)]
struct EitherScored {
    kind: Option<ScoredType>,
    schema_version: Option<i64>,
    run_id: Option<String>,
    step: Option<i64>,
    instance_id: Option<String>,
    trajectory_id: Option<String>,
    reward: Option<f64>,
    is_hinted: Option<bool>,
    hint_category: Option<String>,
    hint_id: Option<String>,
    response_length: Option<i64>,
    logprob_hinted: Option<f64>,
    logprob_unhinted: Option<f64>,
    count: Option<i64>,
}

impl<'de> Deserialize<'de> for EitherScored {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(EitherVisitor)
    }
}

struct EitherVisitor;

impl<'de> Visitor<'de> for EitherVisitor {
    type Value = EitherScored;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a scored_rollout or step_end object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<EitherScored, A::Error> {
        /// `value` into `slot`, once: a key twice is refused.
        fn once<T, E: de::Error>(slot: &mut Option<T>, seen: &mut bool, value: Option<T>) -> Result<(), E> {
            if std::mem::replace(seen, true) {
                return Err(E::custom("a key twice"));
            }
            *slot = value;
            Ok(())
        }
        let mut out = EitherScored::default();
        // A mark for each key read (`Other` is the last variant).
        let mut seen = [false; Field::Other as usize];
        while let Some(field) = map.next_key::<Field>()? {
            let at = field as usize;
            match field {
                Field::Kind => once(&mut out.kind, &mut seen[at], Some(map.next_value()?))?,
                Field::SchemaVersion => once(&mut out.schema_version, &mut seen[at], map.next_value()?)?,
                Field::RunId => once(&mut out.run_id, &mut seen[at], map.next_value()?)?,
                Field::Step => once(&mut out.step, &mut seen[at], map.next_value()?)?,
                Field::InstanceId => once(&mut out.instance_id, &mut seen[at], map.next_value()?)?,
                Field::TrajectoryId => once(&mut out.trajectory_id, &mut seen[at], map.next_value()?)?,
                Field::Reward => once(&mut out.reward, &mut seen[at], map.next_value()?)?,
                Field::IsHinted => once(&mut out.is_hinted, &mut seen[at], map.next_value()?)?,
                Field::HintCategory => once(&mut out.hint_category, &mut seen[at], map.next_value()?)?,
                Field::HintId => once(&mut out.hint_id, &mut seen[at], map.next_value()?)?,
                Field::ResponseLength => once(&mut out.response_length, &mut seen[at], map.next_value()?)?,
                Field::LogprobHinted => once(&mut out.logprob_hinted, &mut seen[at], map.next_value()?)?,
                Field::LogprobUnhinted => once(&mut out.logprob_unhinted, &mut seen[at], map.next_value()?)?,
                Field::Count => once(&mut out.count, &mut seen[at], map.next_value()?)?,
                Field::Other => {
                    map.next_value::<ReadThrough>()?;
                }
            }
        }
        Ok(out)
    }
}

/// Any JSON value, read through and dropped: its numbers in range, its
/// escapes whole, its depth within the parser's, as serde's buffer for a
/// tagged enum reads it (`IgnoredAny` checks none of these).
struct ReadThrough;

impl<'de> Deserialize<'de> for ReadThrough {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ReadThrough)
    }
}

impl<'de> Visitor<'de> for ReadThrough {
    type Value = ReadThrough;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_unit<E>(self) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<ReadThrough>()?.is_some() {}
        Ok(self)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self, A::Error> {
        while map.next_entry::<ReadThrough, ReadThrough>()?.is_some() {}
        Ok(self)
    }
}

impl EitherScored {
    /// The message, when its variant's required fields are all there.
    fn message(self) -> Option<ScoredMessage> {
        Some(match self.kind? {
            ScoredType::ScoredRollout => ScoredMessage::ScoredRollout(ScoredRollout {
                schema_version: self.schema_version?,
                run_id: self.run_id?,
                step: self.step?,
                instance_id: self.instance_id?,
                trajectory_id: self.trajectory_id?,
                reward: self.reward?,
                is_hinted: self.is_hinted?,
                hint_category: self.hint_category,
                hint_id: self.hint_id,
                response_length: self.response_length,
                logprob_hinted: self.logprob_hinted,
                logprob_unhinted: self.logprob_unhinted,
            }),
            ScoredType::StepEnd => ScoredMessage::StepEnd(StepEnd {
                schema_version: self.schema_version?,
                run_id: self.run_id?,
                step: self.step?,
                count: self.count?,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field of both variants with values for it, well typed first,
    /// and two keys neither reads with values the parser refuses (a number
    /// out of range, a lone surrogate, nesting past its limit) and takes.
    fn scored_fields() -> Vec<(&'static str, Vec<String>)> {
        let text = |v: &str| format!("\"{v}\"");
        let strings = [
            text("r-1"),
            text(""),
            text("é\\n\\u00e9"),
            "null".into(),
            "7".into(),
        ];
        let ints = [
            "1",
            "0",
            "-3",
            "1.0",
            "1e2",
            "18446744073709551615",
            "null",
            "\"1\"",
        ];
        let floats = ["0.25", "1", "-0.0", "1e400", "null", "\"x\"", "true"];
        let bools = ["true", "false", "null", "0"];
        let types = [
            text("scored_rollout"),
            text("step_end"),
            text("scored"),
            text("step\\u005fend"),
            "null".into(),
            "1".into(),
            "{\"scored_rollout\":null}".into(),
            "{\"step_end\":null}".into(),
        ];
        // Under keys neither variant reads: values the parser refuses (a
        // number out of range, a lone surrogate, nesting past its limit)
        // and values it takes.
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let extra: Vec<String> = vec![
            "{\"a\":[1]}".into(),
            "null".into(),
            "1e400".into(),
            "-1e400".into(),
            "1".repeat(400),
            text("\\ud800"),
            text("\\ud83d\\ude00"),
            deep(100),
            deep(200),
            "{\"k\":\"\\udfff\"}".into(),
        ];
        vec![
            ("type", types.to_vec()),
            ("schema_version", ints.iter().map(|v| v.to_string()).collect()),
            ("run_id", strings.to_vec()),
            ("step", ints.iter().map(|v| v.to_string()).collect()),
            ("instance_id", strings.to_vec()),
            ("trajectory_id", strings.to_vec()),
            ("reward", floats.iter().map(|v| v.to_string()).collect()),
            ("is_hinted", bools.iter().map(|v| v.to_string()).collect()),
            ("hint_category", strings.to_vec()),
            ("hint_id", strings.to_vec()),
            ("response_length", ints.iter().map(|v| v.to_string()).collect()),
            ("logprob_hinted", floats.iter().map(|v| v.to_string()).collect()),
            ("logprob_unhinted", floats.iter().map(|v| v.to_string()).collect()),
            ("count", ints.iter().map(|v| v.to_string()).collect()),
            ("extra", extra.clone()),
            ("chat_history", extra),
        ]
    }

    /// A message of `fields`, each mostly well typed, mostly there, now and
    /// then twice, in any order; its `type` half the time `step_end`.
    fn random_message(rng: &mut rand::rngs::StdRng, fields: &[(&str, Vec<String>)]) -> String {
        use rand::seq::IndexedRandom;
        use rand::Rng;
        let mut members = Vec::new();
        for (key, values) in fields {
            // Mostly well formed, so that both readings accept many.
            let value = if rng.random_bool(0.85) {
                &values[0]
            } else {
                values.choose(rng).unwrap()
            };
            if *key == "type" || rng.random_bool(0.9) {
                members.push(format!("\"{key}\":{value}"));
            }
            if rng.random_bool(0.01) {
                members.push(format!("\"{key}\":{}", values.choose(rng).unwrap()));
            }
        }
        if rng.random_bool(0.5) {
            members.retain(|m| !m.starts_with("\"type\""));
            members.insert(0, "\"type\":\"step_end\"".to_string());
        }
        let last = members.len() - 1;
        members.swap(rng.random_range(0..=last), last);
        format!("{{{}}}", members.join(","))
    }

    /// Messages made at random from every field of both variants, each
    /// absent, null, well typed or of another type, some twice, with
    /// unknown keys: wherever the one-pass reading accepts one, the derived
    /// reading reads the same message, and `read_direct` agrees with the
    /// derived reading on every one.
    #[test]
    fn the_one_pass_reading_reads_what_the_derived_one_reads() {
        use rand::SeedableRng;
        let fields = scored_fields();
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let (mut one_pass, mut derived_read) = (0, 0);
        for _ in 0..40_000 {
            let json = random_message(&mut rng, &fields);
            let derived = serde_json::from_str::<ScoredMessage>(&json).ok();
            derived_read += usize::from(derived.is_some());
            if let Some(read) = serde_json::from_str::<EitherScored>(&json)
                .ok()
                .and_then(EitherScored::message)
            {
                one_pass += 1;
                assert_eq!(Some(&read), derived.as_ref(), "{json}");
            }
            assert_eq!(ScoredMessage::read_direct(&json), derived, "{json}");
        }
        assert!(
            one_pass > 4_000 && derived_read > one_pass,
            "{one_pass} read in one pass, {derived_read} derived"
        );
    }

    fn rollout(response_length: Option<i64>) -> ScoredRollout {
        ScoredRollout {
            schema_version: i64::from(SCHEMA_VERSION),
            run_id: "r".into(),
            step: 0,
            instance_id: "i".into(),
            trajectory_id: "t".into(),
            reward: 1.0,
            is_hinted: false,
            hint_category: None,
            hint_id: None,
            response_length,
            logprob_hinted: None,
            logprob_unhinted: None,
        }
    }

    #[test]
    fn response_length_is_optional_and_must_be_at_least_1() {
        for ok in [None, Some(1), Some(4096), Some(MAX_RESPONSE_LENGTH)] {
            rollout(ok).validate().unwrap();
        }
        for bad in [Some(0), Some(-1), Some(MAX_RESPONSE_LENGTH + 1)] {
            let err = rollout(bad).validate().unwrap_err().to_string();
            assert!(err.contains("response_length"), "{bad:?}: {err}");
        }
        // Absent on the wire when absent.
        let json = serde_json::to_value(rollout(None)).unwrap();
        assert!(json.get("response_length").is_none());
    }

    #[test]
    fn log_probs_are_finite_at_most_0_and_need_a_length() {
        let with = |hinted: Option<f64>, unhinted: Option<f64>, length: Option<i64>| ScoredRollout {
            logprob_hinted: hinted,
            logprob_unhinted: unhinted,
            ..rollout(length)
        };
        for ok in [
            with(Some(-3.5), Some(-9.0), Some(4)),
            with(Some(0.0), None, Some(1)),
            with(None, Some(1e-6), Some(2)),
            with(None, None, None),
        ] {
            ok.validate().unwrap();
        }
        for (bad, field) in [
            (with(Some(0.5), Some(-1.0), Some(3)), "logprob_hinted"),
            (with(Some(-1.0), Some(f64::NAN), Some(3)), "logprob_unhinted"),
            (with(Some(-1.0), Some(-2.0), None), "response_length"),
            (with(None, Some(-2.0), None), "response_length"),
        ] {
            let err = bad.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{bad:?}: {err}");
        }
        let json = serde_json::to_value(rollout(None)).unwrap();
        assert!(json.get("logprob_hinted").is_none() && json.get("logprob_unhinted").is_none());
    }
}
