"""KV cache element types (llama.cpp's -ctk/-ctv, Ollama's OLLAMA_KV_CACHE_TYPE), as data.

Bytes per element come from gguf's GGML_QUANT_SIZES (block bytes / block elements), so the
roofline's KV bytes per token and the memory verdict follow the type the engine uses.
"""

from __future__ import annotations

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ondevice.core.errors import InvalidParameterError

__all__ = ["KV_CACHE_TYPES", "DEFAULT_KV_TYPE", "kv_ggml_type", "kv_bytes_per_element", "kv_is_quantized"]

# The types llama.cpp accepts for its K and V caches (common/arg.cpp kv_cache_types), f16 first.
KV_CACHE_TYPES = ("f16", "q8_0", "q4_0", "f32", "bf16", "q4_1", "q5_0", "q5_1", "iq4_nl")
DEFAULT_KV_TYPE = "f16"


def kv_ggml_type(name: str) -> GGMLQuantizationType:
    """ "q8_0" -> GGMLQuantizationType.Q8_0; InvalidParameterError for a type llama.cpp's cache does not take."""
    key = str(name).strip().lower()
    if key not in KV_CACHE_TYPES:
        raise InvalidParameterError(f"KV cache type must be one of {', '.join(KV_CACHE_TYPES)}, not {name!r}")
    return GGMLQuantizationType[key.upper()]


def kv_bytes_per_element(name: str) -> float:
    """Bytes one cached K or V element takes: 2.0 for f16, 34/32 for q8_0, 18/32 for q4_0."""
    block_elements, block_bytes = GGML_QUANT_SIZES[kv_ggml_type(name)]
    return block_bytes / block_elements


def kv_is_quantized(name: str) -> bool:
    """A block-quantized type (a quantized V cache needs flash attention)."""
    return GGML_QUANT_SIZES[kv_ggml_type(name)][0] > 1
