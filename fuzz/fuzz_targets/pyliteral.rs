//! Verifier stdout is untrusted text: the Python-literal list parser and the
//! accumulator lookup built on it.
#![no_main]

use hintstream::llm::prompt::accumulator;
use hintstream::llm::pyliteral::parse_list;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Some(items) = parse_list(text) {
            assert!(items.iter().map(String::len).sum::<usize>() <= text.len() * 4);
        }
        let _ = accumulator(text, "failed_checks");
        let _ = accumulator(text, "tool_errors");
    }
});
