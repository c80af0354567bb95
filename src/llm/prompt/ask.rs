//! What a request asks beyond the hint for a trajectory: the earlier
//! hints of a refined hint, the values the leak guard's second request
//! forbids, the level of a graded hint.

use crate::learn::EarlierHint;
use crate::messages::HintLevel;

/// What a request asks beyond the hint for a trajectory: earlier hints
/// that did not help (a refined hint; newest first), and values the hint
/// must not state (the leak guard's second request, `on_leak =
/// "regenerate"`). The default asks nothing more.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ask<'a> {
    pub earlier: &'a [EarlierHint],
    pub forbidden: &'a [String],
    /// The level a graded hint is asked at (ours: the instruction's ask,
    /// see `levels`); `None`: the plain instruction. A synthesizer made
    /// for a level sets it on every request it sends.
    pub level: Option<HintLevel>,
}

impl<'a> Ask<'a> {
    /// A refined hint's request, showing `earlier`.
    pub fn refining(earlier: &'a [EarlierHint]) -> Self {
        Ask {
            earlier,
            forbidden: &[],
            level: None,
        }
    }
}
