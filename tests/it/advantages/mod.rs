//! Stage 2 (`hintstream advantages`): estimators (ours and the reference's cases), steps over Kafka and offline, chunked steps, bad and hostile scored input, hint outcomes.

mod advantages_kafka;
mod advantages_offline;
mod bad_input_scored;
mod chunked_steps;
mod estimators;
mod hostile_input;
mod outcomes;
mod reference_estimators;
