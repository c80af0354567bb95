//! Stage 1's decoding. A failed trajectory is decoded and checked in full
//! once, when it arrives (bad input goes to the dead-letter topic there and
//! then). Its raw bytes stay in the message handle (for the dead-letter
//! topic); the decoded trajectory is kept only while it is its group's best
//! (see `group`), so a group holds one, whatever its size.

use crate::kafka::{RecordMeta, Rejected};
use crate::messages::{decode, DecodeLimits, FailedTrajectory};

/// A decoded member of a group.
#[derive(Debug, Clone, PartialEq)]
pub struct Arrival {
    /// `run_id/step/instance_id`, ids percent-encoded.
    pub group_key: String,
    /// How many trajectories of the group to expect.
    pub expected: usize,
    /// Boxed: it is about 300 bytes, and it passes through the futures
    /// of a message's handling (each would hold it again, and copy it).
    pub trajectory: Box<FailedTrajectory>,
}

/// Decodes and validates a payload of the input topic.
pub fn decode_arrival(bytes: &[u8], _meta: &RecordMeta, limits: DecodeLimits) -> Result<Arrival, Rejected> {
    let trajectory = Box::new(decode::<FailedTrajectory>(bytes, limits)?);
    Ok(Arrival {
        group_key: trajectory.group_key(),
        expected: usize::try_from(trajectory.group_size).unwrap_or(usize::MAX),
        trajectory,
    })
}
