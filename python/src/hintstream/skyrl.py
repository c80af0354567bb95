"""The reference trainer's import, for the drop-in (SkyRL-Fleet's
``skyrl_gym.envs.fleet_task.hint_synthesizer``). In its generator, replace::

    from skyrl_gym.envs.fleet_task.hint_synthesizer import synthesize_hints_batch

with::

    from hintstream.skyrl import synthesize_hints_batch

and nothing else: the call, its arguments (``hint_requests``, ``model``,
``timeout``, ``max_concurrency``, ``static_fallback_fn``) and defaults, the
``[(hint_text, category), ...]`` it returns and its batch log line are the
reference's. Where the hints go and come from is set once with
:func:`hintstream.configure` or the environment (``HINTSTREAM_BOOTSTRAP_SERVERS``,
``HINTSTREAM_RUN_ID``); see :mod:`hintstream.dropin`.
"""

from .dropin import DEFAULT_MODEL, configure, synthesize_hints_batch
from .wire import CATEGORY_LLM, CATEGORY_LLM_FAILED, CATEGORY_STATIC

__all__ = [
    "CATEGORY_LLM",
    "CATEGORY_LLM_FAILED",
    "CATEGORY_STATIC",
    "DEFAULT_MODEL",
    "configure",
    "synthesize_hints_batch",
]
