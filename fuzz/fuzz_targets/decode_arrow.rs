//! Untrusted Arrow IPC bytes of `rl.rollouts.scored`, decoded as stage 2
//! does under a small `limits.max_decoded_bytes`: nothing panics out of
//! decoding, what decodes holds no more string bytes than the limit, and
//! the `instance_id` keys it keeps map the rows' groups as their strings do.
//! Seeds: the amplification cases (views of one buffer, dictionary keys of
//! one large value) and a valid step.
#![no_main]

use hintstream::advantages::decode::{arrow_meta, decode_scored_bounded, ScoredInput};
use hintstream::batch::{bound, ipc};
use hintstream::messages::DecodeLimits;
use hintstream::normalize::groups::HashedGroups;
use libfuzzer_sys::fuzz_target;

/// The decoded-bytes bound under test: small, so that amplification past
/// it is cheap to reach.
const MAX_DECODED_BYTES: usize = 4 << 20;

fuzz_target!(init: {
    // libfuzzer-sys aborts on every panic, even one the code under test
    // catches (decoding's panic guard); the default hook lets caught panics
    // through, and an uncaught one still aborts.
    let _ = std::panic::take_hook();
}, |data: &[u8]| {
    let limits = DecodeLimits {
        max_bytes: 1 << 20,
        max_depth: 64,
    };
    let meta = arrow_meta("rl.rollouts.scored");
    if let Ok(ScoredInput::Rows(rows, keys)) = decode_scored_bounded(data, &meta, limits, MAX_DECODED_BYTES) {
        let strings: usize = [&rows.run_id, &rows.instance_id, &rows.trajectory_id]
            .iter()
            .map(|column| column.text_len())
            .chain(rows.hint_category.iter().chain(&rows.hint_id).map(|s| s.as_ref().map_or(0, String::len)))
            .sum();
        assert!(strings <= MAX_DECODED_BYTES, "{strings} string bytes decoded");
        // The dictionary keys a decode keeps map the rows' groups as their
        // strings do.
        if let Some(keys) = keys {
            assert_eq!(keys.keys.len(), rows.len());
            let mut by_key = HashedGroups::new();
            by_key.extend_keyed(&keys.keys, keys.values, |row| &rows.instance_id[row]);
            let mut by_string = HashedGroups::new();
            by_string.extend(rows.instance_id.iter());
            assert_eq!(by_key.finish(), by_string.finish());
        }
    }
    // The measure itself never panics on what the IPC reader accepts.
    if let Ok(batches) = ipc::decode_stream(data) {
        let _ = bound::check_decoded_size(&batches, MAX_DECODED_BYTES);
    }
});
