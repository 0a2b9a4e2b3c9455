"""Typed errors. The CLI turns each into one line and exit status 2."""

from __future__ import annotations

__all__ = [
    "OndeviceError",
    "RegistryError",
    "ModelNotFoundError",
    "GGUFFormatError",
    "DefaultModelError",
    "EngineError",
    "EngineBusyError",
    "ContextOverflowError",
    "InvalidParameterError",
    "ModelLoadError",
    "InsufficientMemoryError",
    "ProbeError",
    "SpecError",
    "EstimateDataError",
    "QuantError",
    "BenchError",
    "DestinationError",
    "StateFileError",
    "MissingExtraError",
]


class OndeviceError(Exception):
    """Base class: every error the library raises on bad input or state."""


class RegistryError(OndeviceError):
    """models.toml (built-in or user) is malformed."""


class ModelNotFoundError(OndeviceError):
    """A model reference names no registry entry and no file."""


class GGUFFormatError(OndeviceError):
    """A file is not a well-formed GGUF (bad magic, truncated, out-of-range offsets)."""


class DefaultModelError(OndeviceError):
    """The default model's package is missing or its chunks do not assemble to the right hash."""


class EngineError(OndeviceError):
    """Generic engine failure (llama.cpp returned an error code)."""


class ModelLoadError(EngineError):
    """llama.cpp could not load the model or create a context."""


class InsufficientMemoryError(ModelLoadError):
    """A load would not fit the memory that is free: refused before llama.cpp allocates anything.
    needed_bytes and available_bytes give the figures, where says which memory ("RAM", "VRAM", ...)."""

    def __init__(self, message: str, *, needed_bytes: int, available_bytes: int, where: str):
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes
        self.where = where


class EngineBusyError(EngineError):
    """A second generation was started while one is running on the same engine."""


class ContextOverflowError(EngineError):
    """prompt tokens + max_tokens exceed the context window."""


class InvalidParameterError(OndeviceError, ValueError):
    """A parameter is out of its valid range; the message names it."""


class ProbeError(OndeviceError):
    """A bandwidth/compute/kernel probe could not run."""


class SpecError(OndeviceError, ValueError):
    """A model spec for prediction is incomplete or inconsistent."""


class EstimateDataError(OndeviceError):
    """The published-measurement table or the fitted estimate that ships with the package is
    missing, unreadable or malformed (the estimate for a machine you do not have needs both)."""


class QuantError(OndeviceError):
    """Quantization or quality evaluation failed on bad input."""


class BenchError(OndeviceError):
    """A benchmark configuration or result file is invalid."""


class DestinationError(OndeviceError, OSError):
    """An output cannot go where it was asked to: the folder is missing or not writable, the path
    is a directory, a device or another special file, or an existing file without force.
    Also an OSError, so callers that handle a failed write handle this one too."""


class StateFileError(OndeviceError):
    """A saved KV state cannot be used: another model, llama.cpp build, context settings or prompt, or a file
    that is truncated, garbage or not a regular file. The caller recomputes the prompt instead."""


class MissingExtraError(OndeviceError):
    """An optional feature needs a package that is not installed; the message names the extra to install."""
