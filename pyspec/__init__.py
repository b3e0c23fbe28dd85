"""pyspec: exact speculative decoding for GGUF models on llama.cpp.

    >>> from pyspec import Engine
    >>> with Engine("qwen2.5-coder-1.5b-instruct", draft="qwen2.5-coder-0.5b-instruct") as engine:
    ...     result = engine.generate([{"role": "user", "content": "Write fizzbuzz"}], max_tokens=128)
    ...     print(result.text, result.stats.tokens_per_second)
"""

from __future__ import annotations

import logging

from .calibration import CostCurve
from .config import METHODS, GenerationConfig
from .engine import Engine, TextStream, rpc_supported
from .errors import (
    ContextOverflowError,
    DecodeError,
    EngineBusyError,
    EngineClosedError,
    HeadFileError,
    HeadMismatchError,
    InvalidArgumentError,
    ModelLoadError,
    NgramFileError,
    PoolFileError,
    SpecError,
    StatsFileError,
    VocabMismatchError,
)
from .results import GenerationResult, GenerationStats, StreamChunk, TokenLogprobs, Trace

# Quiet by default: nothing reaches stderr unless the application configures logging.
logging.getLogger("pyspec").addHandler(logging.NullHandler())

__version__ = "0.1.0"

__all__ = [
    "Engine",
    "TextStream",
    "rpc_supported",
    "CostCurve",
    "METHODS",
    "GenerationConfig",
    "GenerationResult",
    "GenerationStats",
    "Trace",
    "StreamChunk",
    "TokenLogprobs",
    "SpecError",
    "ModelLoadError",
    "VocabMismatchError",
    "InvalidArgumentError",
    "ContextOverflowError",
    "DecodeError",
    "EngineClosedError",
    "EngineBusyError",
    "PoolFileError",
    "HeadFileError",
    "HeadMismatchError",
    "NgramFileError",
    "StatsFileError",
]
