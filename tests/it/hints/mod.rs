//! Stage 1 (`hintstream hints`): synthesis, the LLM client's hardening, storms, bad input, byte bounds, context windows, eval, the spend budget's bound, the group's budget, the spend ledger's leader stopped, long replies, provider prompt caching, hedged requests, hints that learn, graded hints, saturation, hints settled off their handlers, a real model server, untrusted text kept in its elements, the leak guard, no URL secret shown.

mod bad_input;
mod budget_bound;
mod byte_bounds;
mod context_window;
mod eval;
mod graded;
mod group_budget;
mod hedging;
mod hints_kafka;
mod leak_guard;
mod learning;
mod learning_stage;
mod ledger_outage;
mod llm_hardening;
mod llm_storm;
mod local_model;
mod long_replies;
mod prompt_cache;
mod reference_prompt;
mod reference_prompt_loopback;
mod saturation;
mod settled;
mod synthesis;
mod untrusted_prompt;
mod url_secrets;
