//! Stage 1 (`hintstream hints`): synthesis, the LLM client's hardening, storms, bad input, byte bounds, eval, hints that learn.

mod bad_input;
mod byte_bounds;
mod eval;
mod hints_kafka;
mod learning;
mod llm_hardening;
mod llm_storm;
mod reference_prompt;
mod reference_prompt_loopback;
mod synthesis;
