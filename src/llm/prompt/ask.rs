//! What a request asks beyond the hint for a trajectory: the earlier
//! hints of a refined hint, the values the leak guard's second request
//! forbids.

use crate::learn::EarlierHint;

/// What a request asks beyond the hint for a trajectory: earlier hints
/// that did not help (a refined hint; newest first), and values the hint
/// must not state (the leak guard's second request, `on_leak =
/// "regenerate"`). The default asks nothing more.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ask<'a> {
    pub earlier: &'a [EarlierHint],
    pub forbidden: &'a [String],
}

impl<'a> Ask<'a> {
    /// A refined hint's request, showing `earlier`.
    pub fn refining(earlier: &'a [EarlierHint]) -> Self {
        Ask {
            earlier,
            forbidden: &[],
        }
    }
}
