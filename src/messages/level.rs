//! `HintLevel`: how specific a graded hint is (`[[hints.arms]] levels`).

use serde::{Deserialize, Serialize};

/// A graded hint's level, from the least specific to the most: a task's
/// hints under an arm with levels climb after a hint that did not rescue
/// it and step down after one that did (`learn::levels`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum HintLevel {
    /// The missing knowledge or principle, never the answer.
    Concept,
    /// The approach in a few steps.
    Plan,
    /// The next concrete action.
    Step,
}

impl HintLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            HintLevel::Concept => "concept",
            HintLevel::Plan => "plan",
            HintLevel::Step => "step",
        }
    }
}

impl std::fmt::Display for HintLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_written_as_their_names_and_ordered_by_specificity() {
        for level in [HintLevel::Concept, HintLevel::Plan, HintLevel::Step] {
            assert_eq!(serde_json::to_value(level).unwrap(), level.as_str());
        }
        assert!(HintLevel::Concept < HintLevel::Plan && HintLevel::Plan < HintLevel::Step);
        assert!(serde_json::from_str::<HintLevel>("\"answer\"").is_err());
    }
}
