"""Exceptions raised by pyspec. The C++ engine's typed errors arrive as these classes."""

from __future__ import annotations


class SpecError(Exception):
    """Base class of every pyspec error."""


class ModelLoadError(SpecError, OSError):
    """A model file is missing, not GGUF, truncated, or llama.cpp refused to load it."""


class VocabMismatchError(SpecError, ValueError):
    """Target and draft do not share a vocabulary; the message names the first difference."""


class InvalidArgumentError(SpecError, ValueError):
    """A parameter is outside its valid range; the message names it and its value."""


class ContextOverflowError(SpecError, ValueError):
    """The prompt does not fit the context window."""


class DecodeError(SpecError, RuntimeError):
    """llama.cpp failed to evaluate a batch."""


class EngineClosedError(SpecError, RuntimeError):
    """The engine was used after close()."""


class EngineBusyError(SpecError, RuntimeError):
    """The engine was called from the thread that is reading one of its streams, while that stream
    waits for the thread to read on: the call would wait for the stream forever."""


class PoolFileError(SpecError, OSError):
    """A phrase pool file cannot be written or read back (missing, truncated, corrupt, other format)."""


class HeadFileError(SpecError, OSError):
    """A draft head file is missing a key or tensor, is not a head GGUF, or has another format version."""


class HeadMismatchError(SpecError, ValueError):
    """A draft head was trained for another target; the message names the first difference."""


class StatsFileError(SpecError, OSError):
    """A file of auto's acceptance statistics is unreadable, of another format or node-kind layout, or
    was saved for another target model."""


class NgramFileError(SpecError, OSError):
    """An n-gram table file is missing, truncated, corrupt, of another format, or for another vocabulary."""


__all__ = [
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
