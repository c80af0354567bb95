//! Untrusted bytes of `rl.rollouts.scored`, as JSON and as Arrow IPC: stage
//! 2's decoding, and the computation of whatever rows decode.
#![no_main]

use hintstream::advantages::compute_step;
use hintstream::advantages::decode::{arrow_meta, decode_scored, ScoredInput};
use hintstream::kafka::RecordMeta;
use hintstream::messages::DecodeLimits;
use hintstream::normalize::{AdvantageOptions, Device};
use libfuzzer_sys::fuzz_target;

fuzz_target!(init: {
    // libfuzzer-sys aborts on every panic, even one the code under test
    // catches (the Arrow decoder's, turned into errors); the default hook
    // lets caught panics through, and an uncaught one still aborts.
    let _ = std::panic::take_hook();
}, |data: &[u8]| {
    let limits = DecodeLimits {
        max_bytes: 1 << 20,
        max_depth: 64,
    };
    let arrow = arrow_meta("rl.rollouts.scored");
    let plain = RecordMeta {
        headers: vec![],
        ..arrow.clone()
    };
    for meta in [&plain, &arrow] {
        if let Some(rows) = decode_scored(data, meta, limits).ok().and_then(ScoredInput::into_rows) {
            let n = rows.len();
            if let Ok(step) = compute_step(rows, &AdvantageOptions::default(), Device::Cpu) {
                assert_eq!(step.advantages.advantage.len(), n);
            }
        }
    }
});
