//! Stage 1's decoding. A failed trajectory is checked in full when it
//! arrives (bad input goes to the dead-letter topic there and then), but a
//! group member keeps only what gathering needs: its raw bytes stay in the
//! message handle (for the dead-letter topic), and the group's best member is
//! decoded again when the group is ready. One copy of each member, not two.

use crate::kafka::{RecordMeta, Rejected};
use crate::messages::{decode, DecodeError, DecodeLimits, FailedTrajectory};

/// What a member of a group keeps besides its bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Arrival {
    /// `run_id/step/instance_id`, ids percent-encoded.
    pub group_key: String,
    /// How many trajectories of the group to expect.
    pub expected: usize,
    pub reward: f64,
}

/// Decodes and validates a payload of the input topic.
pub fn decode_arrival(bytes: &[u8], _meta: &RecordMeta, limits: DecodeLimits) -> Result<Arrival, Rejected> {
    let t = decode_trajectory(bytes, limits)?;
    Ok(Arrival {
        group_key: t.group_key(),
        expected: usize::try_from(t.group_size).unwrap_or(usize::MAX),
        reward: t.reward,
    })
}

/// The full trajectory (the group's best member, when its hint is built).
pub fn decode_trajectory(bytes: &[u8], limits: DecodeLimits) -> Result<FailedTrajectory, DecodeError> {
    decode::<FailedTrajectory>(bytes, limits)
}
