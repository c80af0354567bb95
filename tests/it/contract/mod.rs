//! The wire contract and the command line: schemas, decoding of untrusted bytes, the CLI surface.

mod cli;
mod decoding;
mod file_graph;
mod layout;
mod schemas;
