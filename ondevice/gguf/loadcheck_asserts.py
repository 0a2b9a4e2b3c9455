"""What llama.cpp asserts instead of checking, checked first (part of ondevice.gguf.loadcheck).

A file that breaks one of these does not get an error from llama.cpp: the process aborts
(GGML_ASSERT) while the model loads. Mirrored from llama.cpp's sources as built here:
ggml-backend.cpp (the CPU buffer over the mapped file must be aligned), gguf.cpp (tensor
table layout, name length) and llama-model.cpp load_hparams (layer and expert counts, RoPE
scaling type, checked for every architecture). What llama.cpp refuses with an error needs
no mirror here: it reaches the caller as ModelLoadError.
"""

from __future__ import annotations

from typing import Any

from gguf import Keys, RopeScalingType

from ondevice.core.errors import GGUFFormatError
from ondevice.gguf.reader import ArrayRef, GGUFFile

__all__ = ["check_layout", "check_hparams", "MMAP_ALIGNMENT_BYTES", "LLAMA_MAX_LAYERS", "LLAMA_MAX_EXPERTS"]

# llama.cpp maps the file and wraps the mapped tensor data in a CPU buffer that must start on this
# boundary (ggml's TENSOR_ALIGNMENT), or GGML_ASSERT "buffer pointer must be aligned" aborts
MMAP_ALIGNMENT_BYTES = 32
MAX_TENSOR_NAME_BYTES = 63  # ggml's GGML_MAX_NAME (64) less the terminating NUL
LLAMA_MAX_LAYERS = 512  # llama-hparams.h
LLAMA_MAX_EXPERTS = 1024  # llama-hparams.h
ROPE_SCALING_TYPES = frozenset(t.value for t in RopeScalingType)  # "none", "linear", "yarn", "longrope"


def check_layout(g: GGUFFile, where: str) -> None:
    """The tensor table as llama.cpp reads it: names it can hold, data in file order with each
    tensor padded to general.alignment (gguf.cpp), and every tensor's data on a 32-byte boundary
    in the file. A general.alignment below 32 can leave data off one; llama.cpp aborts then."""
    expected = 0  # where gguf.cpp expects the next tensor's data, bytes into the data section
    for t in g.tensors:
        if len(t.name.encode("utf-8", "surrogateescape")) > MAX_TENSOR_NAME_BYTES:
            raise GGUFFormatError(
                f"{where}: tensor name {t.name[:40]!r}... is longer than {MAX_TENSOR_NAME_BYTES} bytes"
            )
        if t.offset - g.data_offset != expected:
            raise GGUFFormatError(
                f"{where}: tensor {t.name!r} data is at offset {t.offset - g.data_offset}, expected {expected} "
                f"(tensors in file order, each padded to the alignment of {g.alignment} bytes)"
            )
        if t.offset % MMAP_ALIGNMENT_BYTES:
            raise GGUFFormatError(
                f"{where}: tensor {t.name!r} data starts at byte {t.offset}, not on a {MMAP_ALIGNMENT_BYTES}-byte "
                f"boundary (general.alignment is {g.alignment}); llama.cpp cannot map it"
            )
        expected += -(-t.n_bytes // g.alignment) * g.alignment


def _count(g: GGUFFile, key: str, arch: str) -> int:
    """A count as llama.cpp reads it: the value, the largest of a per-layer array, or 0 when
    absent or of a type llama.cpp refuses itself (with an error, not an abort)."""
    value: Any = g.get(key.format(arch=arch))
    if isinstance(value, ArrayRef) and value.count <= LLAMA_MAX_LAYERS:
        value = g.read_array(value)
        value = value.tolist() if hasattr(value, "tolist") else value
    if isinstance(value, list):
        ints = [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
        return max(ints) if ints and len(ints) == len(value) else 0
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def check_hparams(g: GGUFFile, arch: str, where: str) -> None:
    """llama-model.cpp load_hparams' asserts on layer, next-token-prediction and expert counts,
    and its RoPE scaling type."""
    n_layer = _count(g, Keys.LLM.BLOCK_COUNT, arch)
    if not 0 < n_layer <= LLAMA_MAX_LAYERS:
        raise GGUFFormatError(f"{where}: {n_layer} layers; llama.cpp loads 1 to {LLAMA_MAX_LAYERS}")
    nextn = _count(g, Keys.LLM.NEXTN_PREDICT_LAYERS, arch)
    if nextn > n_layer:
        raise GGUFFormatError(f"{where}: {nextn} next-token-prediction layers but only {n_layer} layers")
    n_expert, used = _count(g, Keys.LLM.EXPERT_COUNT, arch), _count(g, Keys.LLM.EXPERT_USED_COUNT, arch)
    groups, groups_used = (
        _count(g, Keys.LLM.EXPERT_GROUP_COUNT, arch),
        _count(g, Keys.LLM.EXPERT_GROUP_USED_COUNT, arch),
    )
    experts = f"{n_expert} experts, {used} used per token, {groups} groups with {groups_used} used"
    if n_expert > LLAMA_MAX_EXPERTS or used > n_expert:
        raise GGUFFormatError(
            f"{where}: {experts}: llama.cpp needs at most {LLAMA_MAX_EXPERTS} experts and no more used than exist"
        )
    if n_expert and (not used or groups >= n_expert):
        raise GGUFFormatError(f"{where}: {experts}: a mixture of experts needs some used and fewer groups than experts")
    if n_expert and groups > 1 and (n_expert % groups or not 0 < groups_used < groups):
        raise GGUFFormatError(f"{where}: {experts}: groups must divide the experts, and some but not all be used")
    if not n_expert and (used or groups):
        raise GGUFFormatError(f"{where}: {experts}: expert settings on a model without experts")
    for key in (Keys.Attention.LAYERNORM_RMS_EPS, Keys.Attention.LAYERNORM_EPS):
        eps = g.get(key.format(arch=arch))
        if isinstance(eps, (int, float)) and not eps >= 0:  # GGML_ASSERT(eps >= 0.0f) in the norm; NaN fails it too
            raise GGUFFormatError(f"{where}: {key.format(arch=arch)} is {eps}; a norm's epsilon must be 0 or more")
    rope = g.get(Keys.Rope.SCALING_TYPE.format(arch=arch))
    if isinstance(rope, str) and rope not in ROPE_SCALING_TYPES:
        raise GGUFFormatError(
            f"{where}: RoPE scaling type {rope!r} is not one of {', '.join(sorted(ROPE_SCALING_TYPES))}"
        )
