//! Arms: the `[[hints.arms]]` entries (a prompt version x a model chain, or
//! static hints as the control), the `[hints]` options that steer them, their
//! validation, and the `hint_id` an arm gives a group.

use thiserror::Error;

use crate::config::arms::{default_min_share, default_prior, default_weight};
use crate::config::ArmEntry;
pub use crate::config::{ArmReward, ArmSelection, LearnOptions};
use crate::config::{PromptVersion, PROMPT_VERSION};
use crate::messages::{HintLevel, DEFAULT_ARM};

/// Most arms one stage may configure. More are rejected by [`Arms::new`]:
/// every arm costs a Beta draw per group and a set of metric series.
pub const MAX_ARMS: usize = 16;
/// Longest arm name, in bytes. Names appear in metric names
/// (`hint/arm/<name>/rescue_rate`) and Prometheus labels.
pub const MAX_ARM_NAME_BYTES: usize = 64;
/// Largest `refine_max`: a task remembers at most this many of its hints
/// (see [`super::limits::MAX_HINTS_PER_TASK`]).
pub const MAX_REFINE_MAX: usize = super::limits::MAX_HINTS_PER_TASK;

/// An arm as the stage runs it: a `[[hints.arms]]` entry
/// ([`ArmEntry`], where the file's fields, defaults and rules are written)
/// with its prompt version resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ArmSpec {
    /// Unique; letters, digits, `_`, `-` and `.` only (it names metrics).
    pub name: String,
    /// The prompt version the arm's LLM calls use. A refined hint is
    /// stamped `<prompt_version>+refine`.
    pub prompt_version: String,
    /// The model chain, tried in order (then the static fallback). Empty for
    /// the static arm.
    pub models: Vec<String>,
    /// The control: static hints built from the verifier feedback, no LLM.
    pub is_static: bool,
    /// The arm's share under `arm_selection = "fixed"`.
    pub weight: f64,
    /// A floor on the probability that a group goes to this arm (see
    /// [`super::select`]).
    pub min_share: f64,
    /// The Beta prior of the arm's rescue rate: pseudo-rescues and
    /// pseudo-failures.
    pub prior_alpha: f64,
    pub prior_beta: f64,
    /// Graded hints: the levels a task's hints under this arm climb, least
    /// specific first (see [`super::levels`]); empty: no levels.
    pub levels: Vec<HintLevel>,
}

pub fn default_prompt_version() -> String {
    PROMPT_VERSION.to_string()
}

/// The chain label of a static arm, or of one without models
/// ([`ArmSpec::chain_label`]): what its hint ids are made with.
pub const STATIC_CHAIN: &str = "static";

impl ArmSpec {
    /// The arm of a `[[hints.arms]]` entry; an entry without a
    /// prompt_version takes `default_prompt_version` (`llm.prompt_version`).
    pub fn from_entry(entry: &ArmEntry, default_prompt_version: &str) -> ArmSpec {
        ArmSpec {
            name: entry.name.clone(),
            prompt_version: entry
                .prompt_version
                .clone()
                .unwrap_or_else(|| default_prompt_version.to_string()),
            models: entry.models.clone(),
            is_static: entry.is_static,
            weight: entry.weight,
            min_share: entry.min_share,
            prior_alpha: entry.prior_alpha,
            prior_beta: entry.prior_beta,
            levels: entry.levels.clone(),
        }
    }

    /// An LLM arm with the defaults.
    pub fn llm(name: &str, models: &[&str]) -> ArmSpec {
        ArmSpec {
            name: name.to_string(),
            prompt_version: default_prompt_version(),
            models: models.iter().map(|m| m.to_string()).collect(),
            is_static: false,
            weight: default_weight(),
            min_share: default_min_share(),
            prior_alpha: default_prior(),
            prior_beta: default_prior(),
            levels: Vec::new(),
        }
    }

    /// The static control arm with the defaults.
    pub fn control(name: &str) -> ArmSpec {
        ArmSpec {
            is_static: true,
            models: Vec::new(),
            ..ArmSpec::llm(name, &[])
        }
    }

    /// The chain as the `hint_id` hashes it: `static` for static hints,
    /// otherwise the model ids joined with `,`.
    pub fn chain_label(&self) -> String {
        if self.is_static || self.models.is_empty() {
            STATIC_CHAIN.to_string()
        } else {
            self.models.join(",")
        }
    }
}

/// Why an arm configuration was refused; each names what to fix.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ArmConfigError {
    #[error("{count} arms configured; at most {MAX_ARMS}")]
    TooMany { count: usize },
    #[error("arm name {name:?} must be 1-{MAX_ARM_NAME_BYTES} bytes of letters, digits, '_', '-' or '.'")]
    BadName { name: String },
    #[error("two arms are named {name:?}; names must be unique")]
    DuplicateName { name: String },
    #[error("arm {name:?} sets both static = true and models; a static arm has no models")]
    StaticWithModels { name: String },
    #[error("arm {name:?} has no models; give it a model chain or set static = true")]
    NoModels { name: String },
    #[error("arms {first:?} and {second:?} are both static; at most one arm is the control")]
    TwoControls { first: String, second: String },
    #[error("arm {name:?}: {field} = {value} is invalid: {rule}")]
    BadNumber {
        name: String,
        field: &'static str,
        value: f64,
        rule: &'static str,
    },
    #[error("the arms' min_share add up to {sum}; they must add up to at most 1")]
    MinSharesOverOne { sum: f64 },
    #[error("arm_selection = \"fixed\" needs an arm with weight > 0")]
    NoWeight,
    #[error("half_life_steps = {value} must be a finite number > 0")]
    BadHalfLife { value: f64 },
    #[error("refine_max = {value} is over the limit of {MAX_REFINE_MAX}")]
    RefineMaxTooLarge { value: usize },
    #[error("arm {name:?} is static and sets levels; levels are prompts, and a static arm asks no LLM")]
    LevelsOnStatic { name: String },
    #[error("arm {name:?} sets levels with prompt_version = {prompt_version:?}; levels are prompts of ours (\"v3\"), the reference prompt has none")]
    LevelsNeedOurPrompt { name: String, prompt_version: String },
    #[error("arm {name:?}: levels = {levels:?} must name each of \"concept\", \"plan\", \"step\" at most once, in that order (least specific first)")]
    LevelsOutOfOrder { name: String, levels: Vec<String> },
}

/// A validated set of arms with the options that steer them.
#[derive(Debug, Clone, PartialEq)]
pub struct Arms {
    specs: Vec<ArmSpec>,
    options: LearnOptions,
    /// Index of the static arm, if there is one.
    control: Option<usize>,
    /// True for the one implicit arm of a stage without `[[hints.arms]]`.
    implicit: bool,
}

impl Arms {
    /// The configured arms, or with none the implicit arm: named
    /// [`DEFAULT_ARM`], this build's prompt version, `default_models` (the
    /// stage's model chain as configured; empty when hints are static).
    pub fn from_config(
        arms: Vec<ArmSpec>,
        options: LearnOptions,
        default_models: &[String],
    ) -> Result<Arms, ArmConfigError> {
        if arms.is_empty() {
            return Arms::implicit(default_models, options);
        }
        Arms::new(arms, options)
    }

    /// The arms of a stage: its `[[hints.arms]]` entries (an entry without a
    /// prompt_version takes `prompt_version`), or without any the implicit
    /// arm with the stage's model chain (`default_models`) and
    /// `prompt_version`, whose `hint_id`s are what stage 1 always wrote.
    pub fn for_stage(
        entries: &[ArmEntry],
        options: LearnOptions,
        default_models: &[String],
        prompt_version: &str,
    ) -> Result<Arms, ArmConfigError> {
        if entries.is_empty() {
            let mut arms = Arms::implicit(default_models, options)?;
            arms.specs[0].prompt_version = prompt_version.to_string();
            return Ok(arms);
        }
        let specs = entries
            .iter()
            .map(|e| ArmSpec::from_entry(e, prompt_version))
            .collect();
        Arms::new(specs, options)
    }

    /// The one implicit arm (see [`Arms::from_config`]). It keeps today's
    /// `hint_id`s, so a stage without arms behaves exactly as before.
    pub fn implicit(default_models: &[String], options: LearnOptions) -> Result<Arms, ArmConfigError> {
        let spec = ArmSpec {
            name: DEFAULT_ARM.to_string(),
            models: default_models.to_vec(),
            is_static: default_models.is_empty(),
            ..ArmSpec::llm(DEFAULT_ARM, &[])
        };
        let mut arms = Arms::new(vec![spec], options)?;
        arms.implicit = true;
        Ok(arms)
    }

    /// Checks every rule that spans the arms and options.
    pub fn new(specs: Vec<ArmSpec>, options: LearnOptions) -> Result<Arms, ArmConfigError> {
        if specs.len() > MAX_ARMS {
            return Err(ArmConfigError::TooMany { count: specs.len() });
        }
        let mut control: Option<usize> = None;
        for (i, spec) in specs.iter().enumerate() {
            check_spec(spec)?;
            if specs[..i].iter().any(|other| other.name == spec.name) {
                return Err(ArmConfigError::DuplicateName {
                    name: spec.name.clone(),
                });
            }
            if spec.is_static {
                if let Some(first) = control {
                    return Err(ArmConfigError::TwoControls {
                        first: specs[first].name.clone(),
                        second: spec.name.clone(),
                    });
                }
                control = Some(i);
            }
        }
        let sum: f64 = specs.iter().map(|s| s.min_share).sum();
        if sum > 1.0 + 1e-12 {
            return Err(ArmConfigError::MinSharesOverOne { sum });
        }
        if options.arm_selection == ArmSelection::Fixed && !specs.iter().any(|s| s.weight > 0.0) {
            return Err(ArmConfigError::NoWeight);
        }
        if let Some(h) = options.half_life_steps {
            if !(h.is_finite() && h > 0.0) {
                return Err(ArmConfigError::BadHalfLife { value: h });
            }
        }
        if options.refine_max > MAX_REFINE_MAX {
            return Err(ArmConfigError::RefineMaxTooLarge {
                value: options.refine_max,
            });
        }
        Ok(Arms {
            specs,
            options,
            control,
            implicit: false,
        })
    }

    /// The arms, in configuration order (an arm's index is its place here).
    pub fn specs(&self) -> &[ArmSpec] {
        &self.specs
    }

    pub fn options(&self) -> &LearnOptions {
        &self.options
    }

    /// The static arm, if one is configured.
    pub fn control(&self) -> Option<&ArmSpec> {
        self.control.map(|i| &self.specs[i])
    }

    /// Whether this is the implicit arm of a stage without `[[hints.arms]]`.
    pub fn is_implicit(&self) -> bool {
        self.implicit
    }

    /// The arm named `name`, with its index.
    pub fn find(&self, name: &str) -> Option<(usize, &ArmSpec)> {
        self.specs.iter().enumerate().find(|(_, s)| s.name == name)
    }

    /// The `hint_id` arm `index` gives the group `group_key` (see
    /// [`hint_id`]).
    ///
    /// # Panics
    /// When `index` is not below `specs().len()` (indices come from
    /// [`super::select::select_arm`], which never returns one out of range).
    pub fn hint_id(&self, index: usize, group_key: &str) -> String {
        let spec = &self.specs[index];
        hint_id(group_key, &spec.prompt_version, &spec.chain_label(), &spec.name)
    }
}

/// The deterministic id of a group's hint: SHA-256 of the group key, the
/// prompt version and the chain label ([`ArmSpec::chain_label`]), and of
/// the arm name for arms other than [`DEFAULT_ARM`]; its first 16 bytes in
/// hex. Without arms the id is exactly what stage 1 always wrote. The prompt
/// version is the arm's own, never the `+refine` one: a redelivered group
/// gets the same id whatever its refinement, and so its cached text.
pub fn hint_id(group_key: &str, prompt_version: &str, chain_label: &str, arm: &str) -> String {
    use sha2::{Digest, Sha256};
    // The parts fed in turn, NUL between them: the digest of the joined
    // text, without joining it (stage 1 makes an id for every message).
    let mut hasher = Sha256::new()
        .chain_update(group_key)
        .chain_update([0])
        .chain_update(prompt_version)
        .chain_update([0])
        .chain_update(chain_label);
    if arm != DEFAULT_ARM {
        hasher = hasher.chain_update([0]).chain_update(arm);
    }
    let digest = hasher.finalize();
    hex::encode(&digest[..16])
}

fn check_spec(spec: &ArmSpec) -> Result<(), ArmConfigError> {
    let name = &spec.name;
    let name_ok = !name.is_empty()
        && name.len() <= MAX_ARM_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if !name_ok {
        return Err(ArmConfigError::BadName { name: name.clone() });
    }
    if spec.is_static && !spec.models.is_empty() {
        return Err(ArmConfigError::StaticWithModels { name: name.clone() });
    }
    if !spec.is_static && spec.models.iter().all(|m| m.trim().is_empty()) {
        return Err(ArmConfigError::NoModels { name: name.clone() });
    }
    let bad = |field, value, rule| ArmConfigError::BadNumber {
        name: name.clone(),
        field,
        value,
        rule,
    };
    if !(spec.weight.is_finite() && spec.weight >= 0.0) {
        return Err(bad("weight", spec.weight, "must be a finite number >= 0"));
    }
    if !(0.0..=1.0).contains(&spec.min_share) {
        return Err(bad("min_share", spec.min_share, "must be between 0 and 1"));
    }
    for (field, value) in [("prior_alpha", spec.prior_alpha), ("prior_beta", spec.prior_beta)] {
        if !(value.is_finite() && value > 0.0) {
            return Err(bad(field, value, "must be a finite number > 0"));
        }
    }
    check_levels(spec)
}

/// Levels: on an LLM arm of our prompt, each level once, least specific
/// first.
fn check_levels(spec: &ArmSpec) -> Result<(), ArmConfigError> {
    if spec.levels.is_empty() {
        return Ok(());
    }
    let name = spec.name.clone();
    if spec.is_static {
        return Err(ArmConfigError::LevelsOnStatic { name });
    }
    if matches!(spec.prompt_version.parse(), Ok(PromptVersion::Reference)) {
        return Err(ArmConfigError::LevelsNeedOurPrompt {
            name,
            prompt_version: spec.prompt_version.clone(),
        });
    }
    if !spec.levels.windows(2).all(|w| w[0] < w[1]) {
        return Err(ArmConfigError::LevelsOutOfOrder {
            name,
            levels: spec.levels.iter().map(|l| l.to_string()).collect(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[test]
    fn the_default_arm_keeps_todays_hint_id() {
        // Pinned from stage 1's hash before arms existed: SHA-256 of
        // "group\0prompt version\0chain", 16 bytes in hex.
        assert_eq!(
            hint_id("r/3/i", "v2", "static", DEFAULT_ARM),
            "cb6db1ece69222ae5f2b0a035da1cb16"
        );
        assert_eq!(
            hint_id(
                "run-7/12/task-41",
                "v2",
                "claude-sonnet-4-5,gpt-4o-mini",
                DEFAULT_ARM
            ),
            "4c2d9dbaf0c04c85a576c17f573ee3c1"
        );
        let implicit = Arms::from_config(Vec::new(), LearnOptions::default(), &[]).unwrap();
        assert!(implicit.is_implicit());
        assert_eq!(implicit.specs()[0].name, DEFAULT_ARM);
        assert!(
            implicit.control().is_some(),
            "no models: the implicit arm is static"
        );
        assert_eq!(
            implicit.hint_id(0, "r/3/i"),
            hint_id("r/3/i", PROMPT_VERSION, "static", DEFAULT_ARM)
        );
    }

    #[test]
    fn named_arms_get_their_own_hint_ids() {
        let a = hint_id("r/3/i", "v2", "m", "a");
        assert_ne!(a, hint_id("r/3/i", "v2", "m", "b"));
        assert_ne!(a, hint_id("r/3/i", "v2", "m", DEFAULT_ARM));
        assert_eq!(a, hint_id("r/3/i", "v2", "m", "a"));
        // Pinned: SHA-256 of "group\0prompt version\0chain\0arm", 16 bytes in hex.
        assert_eq!(a, "73ee18167dd60774f4c3878fb82dc67d");
    }

    #[test]
    fn arm_entries_parse_with_their_defaults_and_refuse_unknown_fields() {
        #[derive(Deserialize)]
        struct Section {
            arms: Vec<ArmEntry>,
        }
        let text = r#"
            [[arms]]
            name = "sonnet"
            models = ["anthropic/claude-sonnet-4-5"]
            [[arms]]
            name = "control"
            static = true
            min_share = 0.1
        "#;
        let section: Section = toml::from_str(text).unwrap();
        let specs: Vec<ArmSpec> = section
            .arms
            .iter()
            .map(|e| ArmSpec::from_entry(e, PROMPT_VERSION))
            .collect();
        assert_eq!(specs[0].prompt_version, PROMPT_VERSION);
        assert_eq!((specs[0].min_share, specs[0].prior_alpha), (0.05, 1.0));
        assert!(specs[1].is_static);
        let arms = Arms::new(specs, LearnOptions::default()).unwrap();
        assert_eq!(arms.control().map(|c| c.name.as_str()), Some("control"));
        let err = toml::from_str::<Section>("[[arms]]\nname = \"x\"\nmodel = \"m\"")
            .err()
            .unwrap();
        assert!(err.to_string().contains("unknown field"), "{err}");
        let options: LearnOptions =
            toml::from_str("arm_selection = \"fixed\"\nhalf_life_steps = 5.0").unwrap();
        assert_eq!(
            (options.arm_selection, options.refine_max),
            (ArmSelection::Fixed, 2)
        );
    }

    #[test]
    fn bad_arm_sets_are_refused_naming_what_to_fix() {
        let ok = || vec![ArmSpec::llm("a", &["m"]), ArmSpec::control("c")];
        let opts = LearnOptions::default;
        let refuse = |specs: Vec<ArmSpec>, options: LearnOptions| Arms::new(specs, options).unwrap_err();
        assert!(Arms::new(ok(), opts()).is_ok());
        let mut s = ok();
        s[1].name = "a".into();
        assert!(matches!(refuse(s, opts()), ArmConfigError::DuplicateName { .. }));
        let mut s = ok();
        s[0].name = "a/b".into();
        assert!(matches!(refuse(s, opts()), ArmConfigError::BadName { .. }));
        let mut s = ok();
        s[1].models = vec!["m".into()];
        assert!(matches!(
            refuse(s, opts()),
            ArmConfigError::StaticWithModels { .. }
        ));
        let mut s = ok();
        s[0].models.clear();
        assert!(matches!(refuse(s, opts()), ArmConfigError::NoModels { .. }));
        let mut s = ok();
        s.push(ArmSpec::control("c2"));
        assert!(matches!(refuse(s, opts()), ArmConfigError::TwoControls { .. }));
        let mut s = ok();
        s[0].min_share = 0.6;
        s[1].min_share = 0.6;
        assert!(matches!(
            refuse(s, opts()),
            ArmConfigError::MinSharesOverOne { .. }
        ));
        let mut s = ok();
        s[0].prior_beta = 0.0;
        assert!(matches!(
            refuse(s, opts()),
            ArmConfigError::BadNumber {
                field: "prior_beta",
                ..
            }
        ));
        let mut s = ok();
        s[0].weight = 0.0;
        s[1].weight = 0.0;
        let fixed = LearnOptions {
            arm_selection: ArmSelection::Fixed,
            ..opts()
        };
        assert_eq!(refuse(s, fixed), ArmConfigError::NoWeight);
        let half = LearnOptions {
            half_life_steps: Some(0.0),
            ..opts()
        };
        assert!(matches!(refuse(ok(), half), ArmConfigError::BadHalfLife { .. }));
        let refine = LearnOptions {
            refine_max: MAX_REFINE_MAX + 1,
            ..opts()
        };
        assert!(matches!(
            refuse(ok(), refine),
            ArmConfigError::RefineMaxTooLarge { .. }
        ));
        let many: Vec<ArmSpec> = (0..=MAX_ARMS)
            .map(|i| ArmSpec::llm(&format!("a{i}"), &["m"]))
            .collect();
        assert!(matches!(refuse(many, opts()), ArmConfigError::TooMany { .. }));
    }

    #[test]
    fn levels_parse_and_are_refused_on_static_arms_the_reference_prompt_and_out_of_order() {
        #[derive(Deserialize)]
        struct Section {
            arms: Vec<ArmEntry>,
        }
        let parse = |levels: &str, extra: &str| -> Result<Arms, ArmConfigError> {
            let text = format!("[[arms]]\nname = \"graded\"\nmodels = [\"m\"]\nlevels = {levels}\n{extra}");
            let section: Section = toml::from_str(&text).unwrap();
            let specs = section
                .arms
                .iter()
                .map(|e| ArmSpec::from_entry(e, PROMPT_VERSION))
                .collect();
            Arms::new(specs, LearnOptions::default())
        };
        let arms = parse(r#"["concept", "plan", "step"]"#, "").unwrap();
        assert_eq!(
            arms.specs()[0].levels,
            [HintLevel::Concept, HintLevel::Plan, HintLevel::Step]
        );
        assert!(parse(r#"["plan", "step"]"#, "").is_ok());
        let err = parse(r#"["concept"]"#, "prompt_version = \"reference\"").unwrap_err();
        assert!(matches!(err, ArmConfigError::LevelsNeedOurPrompt { .. }), "{err}");
        assert!(err.to_string().contains("reference prompt has none"), "{err}");
        let err = parse(r#"["step", "concept"]"#, "").unwrap_err();
        assert!(matches!(err, ArmConfigError::LevelsOutOfOrder { .. }), "{err}");
        let err = parse(r#"["plan", "plan"]"#, "").unwrap_err();
        assert!(matches!(err, ArmConfigError::LevelsOutOfOrder { .. }), "{err}");
        let mut control = ArmSpec::control("c");
        control.levels = vec![HintLevel::Concept];
        let err = Arms::new(vec![control], LearnOptions::default()).unwrap_err();
        assert!(matches!(err, ArmConfigError::LevelsOnStatic { .. }), "{err}");
        let bad =
            toml::from_str::<Section>("[[arms]]\nname = \"x\"\nmodels = [\"m\"]\nlevels = [\"answer\"]");
        assert!(bad.is_err());
    }
}
