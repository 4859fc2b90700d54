"""microllm: a compact, genuine LLM training framework (tensor, pipeline, sequence and data
parallelism; mixed precision; checkpointing; KV-cache decoding).

Ranks are simulated as threads of one process by default (``backend="sim"``) and can run as
real ``torch.distributed`` gloo processes (``backend="gloo"``). The package never imports
FastCI: parallel degrees, rank roles and phases live in plain attributes and config dataclasses
that are passed as arguments, so an argument-abstracting recorder can see them.
"""

from __future__ import annotations

import logging
import warnings

# torch warns at import when numpy is absent; microllm does not use numpy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"


class MicroLLMError(Exception):
    """Root of every error microllm raises on purpose."""


class ConfigError(MicroLLMError):
    """A configuration violates a rule (divisibility, ranges, unknown flag)."""


class CheckpointError(MicroLLMError):
    """A checkpoint is missing, corrupt or incompatible."""
