//! The wire contract and the command line: schemas, decoding of untrusted bytes, the CLI surface;
//! and the documentation that describes them (the README and the book).

mod book;
mod cli;
mod decoding;
mod file_graph;
mod layout;
mod schemas;
mod wire_names;
