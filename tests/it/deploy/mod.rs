//! What an operator deploys and watches: compose, the image, health, traces, the quick start.

mod compose;
mod health;
mod image;
mod quickstart;
mod tracing;
