//! The version of the wire contract every message carries.

/// The only `schema_version` this build reads and writes.
pub const SCHEMA_VERSION: u32 = 1;
