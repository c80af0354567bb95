//! Command-line tools around the topics: `produce`, `record`, `replay`, the
//! JSONL format `record` writes and `replay` reads, and reassembling the
//! chunked steps of a recorded advantages topic.

pub mod produce;
pub mod reassemble;
pub mod record;
pub mod recorded;
pub mod replay;

pub use reassemble::{reassemble_steps, Reassembled, Reassembler};
pub use recorded::RecordedMessage;

use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub(crate) fn progress_bar(len: Option<u64>, what: &str) -> ProgressBar {
    let bar = match len {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new_spinner(),
    };
    let template = if len.is_some() {
        "{spinner} {msg} [{bar:40}] {pos}/{len} ({per_sec}, eta {eta})"
    } else {
        "{spinner} {msg} {pos} ({per_sec})"
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}
