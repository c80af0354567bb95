"""hintstream for Python trainers.

- :class:`TrainerClient`: publish failed trajectories and scored rollouts,
  wait for a step's hints, advantages (``pyarrow.Table``) and metrics.
- :func:`synthesize_hints_batch` (also ``hintstream.skyrl``): a drop-in for
  the reference trainer's hint synthesis (same signature and defaults, same
  ``[(hint_text, category), ...]``), with a local fallback at the deadline;
  :func:`configure` says where it sends; :func:`apply_hint` builds the
  hinted prompt.
- :func:`static_hint`: the static hint stage 1 builds from verifier feedback.
- :func:`report_hint_outcomes`: what delivered hints did, for a trainer that
  keeps its own advantages.
- ``python -m hintstream.wandb_bridge``: step metrics to Weights & Biases.
"""

from .client import ConsumeError, DeliveryError, HintstreamError, TrainerClient, WaitTimeout
from .dropin import apply_hint, build_trajectories, configure, report_hint_outcomes, synthesize_hints_batch
from .keys import decode_id, encode_id, group_key, parse_group_key, parse_step_key, step_key
from .static_hint import static_hint
from .wire import (
    CATEGORY_LLM,
    CATEGORY_LLM_FAILED,
    CATEGORY_STATIC,
    SCHEMA_VERSION,
    Topics,
    failed_trajectory,
)

__version__ = "0.1.0"

__all__ = [
    "CATEGORY_LLM",
    "CATEGORY_LLM_FAILED",
    "CATEGORY_STATIC",
    "ConsumeError",
    "DeliveryError",
    "HintstreamError",
    "SCHEMA_VERSION",
    "Topics",
    "TrainerClient",
    "WaitTimeout",
    "__version__",
    "apply_hint",
    "build_trajectories",
    "configure",
    "decode_id",
    "encode_id",
    "failed_trajectory",
    "group_key",
    "parse_group_key",
    "parse_step_key",
    "report_hint_outcomes",
    "static_hint",
    "step_key",
    "synthesize_hints_batch",
]
