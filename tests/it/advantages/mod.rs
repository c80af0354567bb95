//! Stage 2 (`hintstream advantages`): estimators, steps over Kafka and offline, chunked steps, bad and hostile scored input.

mod advantages_kafka;
mod advantages_offline;
mod bad_input_scored;
mod chunked_steps;
mod estimators;
mod hostile_input;
