//! The trainer side: the Python package's suite against real stages.

mod python_client;
mod trl_smoke;
