//! Untrusted bytes of `rl.trajectories.failed`: decoding, then everything
//! stage 1 builds from a decoded trajectory (feedback, prompt, static hint).
#![no_main]

use hintstream::llm::prompt::{feedback, static_hint, PromptVersion};
use hintstream::messages::{decode, DecodeLimits, FailedTrajectory};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = DecodeLimits {
        max_bytes: 1 << 20,
        max_depth: 64,
    };
    if let Ok(t) = decode::<FailedTrajectory>(data, limits) {
        let fb = feedback(&t);
        let prompt = PromptVersion::V3.user_message(&t);
        // Bounded whatever the input size (the message may hold 1 MB).
        let chars = prompt.chars().count();
        assert!(chars <= 200_000, "prompt bound broken: {chars} chars");
        let _ = static_hint(&fb);
        let _ = t.group_key();
    }
});
