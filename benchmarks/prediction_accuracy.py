"""How right is the prediction on models it never saw? Predicted against measured TTFT and decode, per model and
prompt length, the prediction made the way a user gets it for a model known only by its header: its twin
(random data, same tensors) timed on this machine, whole or as two twins of fewer blocks extrapolated in
blocks. Nothing is fitted here or anywhere: every figure is timed.

The models (built here, none of them ever timed to set anything):
- the default model (Gemma 3 270M, Q4_K_M) and its requantized ladder: Q4_0, Q4_1, Q5_K_M, Q6_K, Q8_0, F16, IQ4_XS;
- the chat model (SmolLM2 135M Instruct, Q4_1) when its package is installed;
- files in the shapes of public models (their Hugging Face config.json, tests/data/hf_configs): Qwen2.5 0.5B,
  Qwen3 0.6B, Gemma 3 1B, and at reduced depth Llama 3.1 8B (16 of 32 blocks), Mistral 7B (6 of 32), Phi-3-mini
  (8 of 32), Qwen3-30B-A3B (a MoE, 4 of 48 blocks); random data, so their twins are other random files of the
  same header (a large one's are two twins of fewer blocks, extrapolated to the file's blocks);
- with `--models full` (not in `all`: a 4.9 GB file, minutes a round): Llama 3.1 8B at its full depth, what
  `ondevice predict --config llama-3.1-8b.json --quant Q4_K_M` predicts for it;
- with `--models more` (not in `all`): two more architectures, Gemma 2 2B and Mixtral 8x7B (a MoE, 4 of 32 blocks);
- with `--models held` (not in `all`): Qwen2.5 7B Q5_K_M (8 of 28 blocks), Llama 3.2 3B IQ4_XS, Gemma 3 4B Q4_K_M (12 of
  34 blocks), shapes and weight types no row had before the timing they were first measured with;
- with `--models held2` (not in `all`): SmolLM2 1.7B Q3_K_M (full multi-head attention, twins), Qwen2.5 1.5B Q2_K,
  SmolLM2 360M BF16 and Qwen2.5 0.5B Q5_1: shapes and weight types added after r12, measured first in r13.
- with `--models held3` (not in `all`): Llama 3.2 1B IQ4_NL, Qwen3 1.7B Q3_K_L, Qwen3 4B Q4_K_S (12 of 36 blocks) and
  Mistral NeMo 12B Q5_0 (4 of 40 blocks): shapes and weight types added after r15, measured first in r16.
- with `--models held4` (not in `all`): SmolLM2 360M F32, Qwen2.5 3B Q5_K_S (12 of 36 blocks) and Qwen3 8B Q3_K_S (6 of
  36 blocks): the weight types no row had, added after r19, measured first in r20.
- with `--models held5` (not in `all`): two architectures no row had, Granite 3 (Granite 3.1 2B IQ3_S, Granite 3.3 8B
  Q6_K, 6 of 40 blocks) and OLMo 2 (OLMo 2 1B IQ3_M, OLMo 2 7B IQ3_XS, 6 of 32 blocks), in weight types no row had
  (IQ3_S, IQ3_M, IQ3_XS; Q6_K on the ladder only), added after r23.
- with `--models held6` (not in `all`): OLMoE 1B-7B (a third mixture of experts, MXFP4_MOE, 4 of 16 blocks), Gemma 2
  9B (TQ2_0, 6 of 42 blocks) and Qwen2.5 14B (Q1_0, 4 of 48 blocks): an architecture and three weight types no row
  had, added after r25.
- with `--models held7` (not in `all`): two architectures no row had, Qwen2-MoE (Qwen1.5-MoE A2.7B Q4_K_M, 2 of 24
  blocks: routed experts and a gated shared expert) and Starcoder2 (Starcoder2 3B Q5_K_M, 12 of 30 blocks: LayerNorm,
  biases everywhere, a non-gated GELU feed-forward), added after r30.
- with `--models held8a` (not in `all`): gpt-oss (gpt-oss-20b MXFP4_MOE, 2 of 24 blocks: attention sinks, a window
  on every other layer, 32 experts with biases), added after r35.
- with `--models held8b` (not in `all`): LFM2 1.2B Q4_K_M, whole: the first hybrid (gated short convolutions in 10
  of its 16 blocks, attention in 6), added after r35.
- with `--models held8c` (not in `all`): DeepSeek-V2-Lite Q4_K_M, 5 of 27 blocks: multi-head latent attention (a
  K-only cache of the latent), a dense first block, routed and shared experts; added after r35.
- with `--models held9` (not in `all`): Granite 4.0-H-Tiny Q4_K_M, 10 of 40 blocks, and Granite 4.0-H-Micro Q4_K_M,
  20 of 40: a second hybrid, Mamba-2 (a recurrent state of 128 per channel and head) in 9 of every 10 blocks and
  attention without rope in the tenth; routed and shared experts in H-Tiny, a dense MLP in H-Micro; added after r37.

Each round, per model: its twin is timed afresh (the full plan, no cache) and predicts; then the model itself,
loaded afresh, is measured at every prompt length: TTFT of a prompt from an empty cache, and TPOT over the
next OUTPUT tokens (at 1,024 tokens or fewer, the median of 3 such generations, each of other ids). The error
of a row is the median over rounds of predicted / measured - 1 (paired). A row meets the target when its decode
is within +-10% and its TTFT within +-15%; the script exits 1 when fewer than 90% of the rows do.

    python -m benchmarks.prediction_accuracy [--rounds 3] [--models all|default,ladder,chat,shapes,full] [--json out.json]
        [--prompts 128,1024,4096]
    python -m benchmarks.prediction_accuracy --replay out.json   # its rows predicted again by the code as it is now
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from benchmarks.common import HF_CONFIGS, cpu_name, write_json

DECODE_TOLERANCE, TTFT_TOLERANCE, ROWS_NEEDED = 0.10, 0.15, 0.90
PROMPTS = (128, 1024, 4096)
OUTPUT = 32
LADDER = ("Q4_0", "Q4_1", "Q5_K_M", "Q6_K", "Q8_0", "F16", "IQ4_XS")
CONFIGS = HF_CONFIGS
# (config file, file type, blocks kept of the model's: None = all)
SHAPES = (
    ("qwen2.5-0.5b.json", "Q8_0", None),
    ("qwen3-0.6b.json", "Q4_K_M", None),
    ("gemma-3-1b-pt.json", "Q4_K_M", None),
    ("llama-3.1-8b.json", "Q4_K_M", 16),
    ("mistral-7b-v0.1.json", "Q4_0", 6),
    ("phi-3-mini-4k-instruct.json", "Q4_0", 8),
    ("qwen3-30b-a3b.json", "Q4_K_M", 4),
)
FULL_DEPTH = (("llama-3.1-8b.json", "Q4_K_M", None),)  # `--models full`
# `--models more`: two architectures no row above has, the timing never looked at on them: Gemma 2 (logit
# soft-capping, every other layer windowed, a 256k vocabulary) and Mixtral (8 experts, 2 routed per token)
MORE = (("gemma-2-2b.json", "Q4_K_M", None), ("mixtral-8x7b-v0.1.json", "Q4_K_M", 4))
# `--models held`: shapes and weight types added after r11, measured first with the timing as it then stood: Qwen2.5
# 7B (152k vocabulary, 7:1 grouped queries) at Q5_K_M, Llama 3.2 3B (tied embedding) at IQ4_XS, whole, and Gemma 3 4B
# (windows of 1,024 on five layers of six, 262k vocabulary) at 12 of its 34 blocks
HELD = (("qwen2.5-7b.json", "Q5_K_M", 8), ("llama-3.2-3b.json", "IQ4_XS", None), ("gemma-3-4b-it.json", "Q4_K_M", 12))
# `--models held2`: added after r12, first measured (r13) with the timing as r12 left it: SmolLM2 1.7B (32 KV heads of
# 32: no grouped queries) at Q3_K_M, timed as twins; Qwen2.5 1.5B at Q2_K; SmolLM2 360M at BF16; Qwen2.5 0.5B at Q5_1
HELD2 = (
    ("smollm2-1.7b.json", "Q3_K_M", None),
    ("qwen2.5-1.5b.json", "Q2_K", None),
    ("smollm2-360m.json", "BF16", None),
    ("qwen2.5-0.5b.json", "Q5_1", None),
)
# `--models held3`: added after r15, first measured (r16) with the timing at the attention settle check: Llama 3.2 1B
# at IQ4_NL, Qwen3 1.7B at Q3_K_L, Qwen3 4B (head_dim 128 where width / heads is 80) at Q4_K_S, 12 of its 36 blocks, and
# Mistral NeMo 12B (head_dim 128, width 5,120, a 131k vocabulary) at Q5_0, 4 of its 40 blocks
HELD3 = (
    ("llama-3.2-1b.json", "IQ4_NL", None),
    ("qwen3-1.7b.json", "Q3_K_L", None),
    ("qwen3-4b.json", "Q4_K_S", 12),
    ("mistral-nemo-base-2407.json", "Q5_0", 4),
)
# `--models held4`: added after r19, first measured (r20) with the timing as r19 left it, the three weight types the
# issue names that no row had: SmolLM2 360M at F32 (twins of an F32 file), Qwen2.5 3B (16:2 grouped queries, tied
# embedding) at Q5_K_S, 12 of its 36 blocks, and Qwen3 8B (untied 152k vocabulary) at Q3_K_S, 6 of its 36 blocks
HELD4 = (
    ("smollm2-360m.json", "F32", None),
    ("qwen2.5-3b.json", "Q5_K_S", 12),
    ("qwen3-8b.json", "Q3_K_S", 6),
)
# `--models held5`: added after r23, two architectures the timing never ran on, in three weight types no row had and Q6_K
# (the ladder's 270M only): Granite 3.1 2B (Llama's blocks with multipliers on embeddings, residuals, attention and
# logits; 40 blocks of width 2,048, 32:8 grouped queries, tied 49k vocabulary) at IQ3_S, whole; Granite 3.3 8B (width
# 4,096, feed-forward 12,800) at Q6_K, 6 of its 40 blocks; OLMo 2 1B (no norm before attention or the feed-forward, one
# after each, q and k normed over all heads; 16 heads and 16 KV heads, an untied 100k vocabulary) at IQ3_M, whole; and
# OLMo 2 7B (32 KV heads of 32, feed-forward 11,008) at IQ3_XS (IQ3_XXS and IQ3_S tensors), 6 of its 32 blocks
HELD5 = (
    ("granite-3.1-2b-base.json", "IQ3_S", None),
    ("granite-3.3-8b-instruct.json", "Q6_K", 6),
    ("olmo-2-0425-1b.json", "IQ3_M", None),
    ("olmo-2-1124-7b.json", "IQ3_XS", 6),
)
# `--models held6`: added after r25, an architecture the timing never ran on and three weight types no row had (the
# last file types the quantizer makes without an importance matrix): OLMoE 1B-7B (64 experts of width 1,024, 8 used
# a token, no shared expert; Llama's norms before attention and the feed-forward, q and k normed over all heads; an
# untied 50k vocabulary) at MXFP4_MOE (experts MXFP4, everything else Q8_0), 4 of its 16 blocks; Gemma 2 9B (width
# 3,584, 16:8 grouped queries of width 256, a tied 256k vocabulary: the Q6_K embedding is 70% of the file) at TQ2_0
# (ternary), 6 of its 42 blocks, timed whole; and Qwen2.5 14B (width 5,120, 40:8 grouped queries, feed-forward
# 13,824, an untied 152k vocabulary) at Q1_0 (one sign bit a weight; output Q6_K), 4 of its 48 blocks
HELD6 = (
    ("olmoe-1b-7b-0924.json", "MXFP4_MOE", 4),
    ("gemma-2-9b.json", "TQ2_0", 6),
    ("qwen2.5-14b.json", "Q1_0", 4),
)
# `--models held7`: added after r30, two architectures the timing never ran on, in weight types the rows have (so the
# architecture is what is new): Qwen1.5-MoE A2.7B (a fourth mixture of experts and the first with a shared expert: 60
# routed experts of width 1,408, 4 used a token, beside one of width 5,632 that every token runs, behind its own
# sigmoid gate; 16 KV heads of 16, q/k/v biases, an untied 152k vocabulary: embedding and head are a third of the
# file) at Q4_K_M (routed down-projections Q8_0 in these first blocks), 2 of its 24 blocks (1.26 GB), timed whole; and
# Starcoder2 3B (LayerNorm with biases, biases on every projection, a non-gated GELU feed-forward 4x wide, 24:2
# grouped queries, a tied 49k vocabulary; its 4,096 window is not in the file, llama.cpp attends the whole context) at
# Q5_K_M, 12 of its 30 blocks (0.95 GB), timed as twins of 1 and 3 blocks
HELD7 = (
    ("qwen1.5-moe-a2.7b.json", "Q4_K_M", 2),
    ("starcoder2-3b.json", "Q5_K_M", 12),
)
# `--models held8a`: added after r35, an architecture the timing never ran on, in the weight type its published files
# have: gpt-oss-20b (a fifth mixture of experts: 32 experts of width 2,880, 4 used a token, each with its biases;
# 64:8 grouped queries of width 64 with biases and a sink logit per head; a 128-token window on the even layers, the
# odd ones attend the whole context; an untied 201k vocabulary: embedding and head are 1.23 GB of Q8_0) at MXFP4_MOE
# (experts MXFP4, everything else Q8_0: the published 12.1 GB file's mix), 2 of its 24 blocks (2.14 GB: one windowed
# layer and one full, the model's proportion; 1 block would be 1.68 GB, all windowed), timed whole
HELD8A = (("gpt-oss-20b.json", "MXFP4_MOE", 2),)
# `--models held8b`: added after r35, the first hybrid model: LFM2 1.2B (Liquid; 10 of its 16 blocks a gated short
# convolution over the last 3 tokens, with a small recurrent state and no KV cache, 6 grouped-query attention blocks
# (32:8, q/k norms) at 2, 5, 8, 10, 12 and 14: what a longer context adds comes from 6 blocks of 16; a SwiGLU
# feed-forward of 8,192, a tied 65k vocabulary) at Q4_K_M (its GGUF's usual type; the embedding Q6_K, 30% of the
# file), all 16 blocks (0.73 GB), timed whole: under the 768 MiB a twin is needed for, and a pattern that never
# repeats (no twin of fewer blocks keeps its mix)
HELD8B = (("lfm2-1.2b.json", "Q4_K_M", None),)
# `--models held8c`: added after r35, an attention no row had: DeepSeek-V2-Lite (multi-head latent attention: one
# cached K row of 576 a token and layer, the 512 latent and the rope key, V read as a view of it, and per head q of 192
# and v of 128 through split k_b/v_b products; a dense first block of width 10,944, then 64 routed experts of 1,408, 6
# used a token, beside 2 shared ones run as one of 2,816; YaRN x40; an untied 102k vocabulary) at Q4_K_M (attn_k_b's
# rows of 128 fall back to Q5_0, routed down-projections Q5_0/Q8_0), 5 of its 27 blocks (1.90 GB), timed as twins of 2
# blocks (the dense one and a MoE block; r36 timed twins of 1 and 3) and 4; cut from 27 blocks the header says q_lora_rank 0, which
# llama.cpp otherwise asks for below 26 blocks
HELD8C = (("deepseek-v2-lite.json", "Q4_K_M", 5),)
# `--models held9`: added after r37, a second hybrid and the first with a state-space layer: Granite 4.0-H (IBM; 36 of
# its 40 blocks a Mamba-2 mixer: in_proj to z, x, B, C and a dt per head, a convolution over the last 4 positions, a
# selective scan over a state of 128 per channel, read and written every token, a grouped norm and out_proj; 4
# grouped-query attention blocks without rope at 5, 15, 25 and 35, so the pattern repeats every 10 blocks; a tied 100k
# vocabulary). H-Tiny (64 experts of 512, 6 used a token, and a shared one of 1,024; 1,536 wide, 48 SSM heads) at
# Q4_K_M, 10 of its 40 blocks (1.1 GB: one period, 9 Mamba-2 and 1 attention); H-Micro (a dense SwiGLU of 8,192;
# 2,048 wide, 64 SSM heads) at Q4_K_M, 20 of 40 (two periods); both timed whole (a twin of one period and one of three
# would need 30 blocks)
HELD9 = (
    ("granite-4.0-h-tiny.json", "Q4_K_M", 10),
    ("granite-4.0-h-micro.json", "Q4_K_M", 20),
)
# `--models held10`: added after r41, the file types whose quantizing needs an importance matrix (llama.cpp's dry run
# gives a header their tensor types without one, so a twin and a random-weight file have them) and Q2_K_S and TQ1_0,
# none of which a row had: Qwen2.5 1.5B at IQ2_XXS, whole; Llama 3.2 3B at IQ2_M (IQ2_S with IQ3_S), whole; Qwen3 1.7B
# at IQ1_M, whole; Gemma 3 1B at IQ3_XXS (with Q3_K, IQ2_S and IQ3_S), whole; Phi-3-mini at TQ1_0, 8 of its 32
# blocks; Mistral 7B at Q2_K_S, 6 of its 32
HELD10 = (
    ("qwen2.5-1.5b.json", "IQ2_XXS", None),
    ("llama-3.2-3b.json", "IQ2_M", None),
    ("qwen3-1.7b.json", "IQ1_M", None),
    ("gemma-3-1b-pt.json", "IQ3_XXS", None),
    ("phi-3-mini-4k-instruct.json", "TQ1_0", 8),
    ("mistral-7b-v0.1.json", "Q2_K_S", 6),
)
# `--models held11`: added after r43, architectures the rows have in file types they never had together, all timed on
# twins (today's twin plan: the fewer twin's chain on its own prefill, no decode steps after its chunks): Qwen2.5 7B at
# IQ4_NL, 6 of its 28 blocks; Phi-3-mini at Q8_0, 8 of its 32; SmolLM2 1.7B at Q4_1, whole (24 blocks, 1.07 GB); Gemma
# 2 2B at Q5_1, whole (26 blocks of a window pattern of period 2: twins of 2 and 6)
HELD11 = (
    ("qwen2.5-7b.json", "IQ4_NL", 6),
    ("phi-3-mini-4k-instruct.json", "Q8_0", 8),
    ("smollm2-1.7b.json", "Q4_1", None),
    ("gemma-2-2b.json", "Q5_1", None),
)
# `--models NAME`: the sets of files in public models' shapes, in the order a run measures them
SHAPE_SETS = {
    "shapes": SHAPES,
    "full": FULL_DEPTH,
    "more": MORE,
    "held": HELD,
    "held2": HELD2,
    "held3": HELD3,
    "held4": HELD4,
    "held5": HELD5,
    "held6": HELD6,
    "held7": HELD7,
    "held8a": HELD8A,
    "held8b": HELD8B,
    "held8c": HELD8C,
    "held9": HELD9,
    "held10": HELD10,
    "held11": HELD11,
}
# a prompt this short is measured SHORT_REPEATS times a round and its median kept: one generation of a few hundred
# ms is one sample of a noisy machine (single TTFTs at 128 tokens moved up to 86% between rounds)
SHORT_PROMPT, SHORT_REPEATS = 1024, 3
LONG_PROMPT_BYTES = 2 << 30  # a model larger than this is measured at prompts of 1,024 tokens or fewer (minutes each)


def say(msg: str) -> None:
    print(f"  {msg}", file=sys.stderr, flush=True)


def build_models(which: set[str], work: Path) -> list[tuple[str, Path]]:
    """(label, GGUF path) of every model measured, built in work/ (kept there between runs)."""
    from ondevice.quant.quantize import quantize

    from ondevice.models.materialize import resolve_model

    default = resolve_model(None)
    out = [("gemma3-270m Q4_K_M", default)] if "default" in which else []
    if "ladder" in which:
        for qtype in LADDER:
            path = work / f"gemma3-270m-{qtype}.gguf"
            if not path.exists():
                say(f"quantizing the default model to {qtype}")
                quantize(default, path, qtype, allow_requantize=True)
            out.append((f"gemma3-270m {qtype}", path))
    if "chat" in which:
        try:
            out.append(("smollm2-135m-instruct Q4_1", resolve_model("smollm2-135m-instruct")))
        except Exception as exc:  # noqa: BLE001 - the chat model is optional here
            say(f"chat model left out: {exc}")
    for name in sorted(which & SHAPE_SETS.keys(), key=list(SHAPE_SETS).index):
        out += [shape_model(config, qtype, keep, work) for config, qtype, keep in SHAPE_SETS[name]]
    return out


def shape_model(config: str, qtype: str, keep: int | None, work: Path) -> tuple[str, Path]:
    """A random-data model file in a public model's shape (its config.json), quantized as llama.cpp would."""
    from ondevice.quant.hfconfig import header_from_hf_config
    from ondevice.quant.twin import quantized_header, reduce_layers, write_twin

    stem = config.removesuffix(".json")
    path = work / f"{stem}-{qtype}{f'-{keep}blk' if keep else ''}.gguf"
    if not path.exists():
        say(f"writing {path.name}")
        header = quantized_header(header_from_hf_config(CONFIGS / config), qtype)
        if keep:
            header = reduce_layers(header, keep)
        write_twin(header, path, seed=12345)  # another seed than any twin: the model is not its twin's copy
    return f"{stem} {qtype}" + (f" ({keep} blocks)" if keep else ""), path


def predicted(path: Path, cache: Path):
    """The predictor a user of this header gets: its twin timed now (the full plan, nothing cached)."""
    from ondevice.quant.twin import read_header

    from ondevice.gguf.spec import inspect
    from ondevice.probing import timing_for_header

    spec = inspect(path)
    timing = timing_for_header(read_header(path), spec, refresh=True, cache_root=cache)
    how = "twins of {} and {} blocks".format(*timing.layers) if timing.layers else "whole"  # what was timed
    return _timed_predictor(spec, timing), how, timing.elapsed_s


def _timed_predictor(spec, timing):
    """The prediction from a timing alone (the ceiling's bandwidth is not what is measured here)."""
    from ondevice.roofline import Calibration, TimedPredictor

    return TimedPredictor(spec, Calibration("CPU", ceiling_gbs=1e3), timing)


def measured(path: Path, prompts: tuple[int, ...], salt: int) -> tuple[dict[int, tuple[float, float]], int]:
    """{P: (TTFT s, TPOT s)} of the model loaded afresh, and its chunk (min(n_batch, n_ubatch))."""
    from ondevice.engine import load
    from ondevice.probing.timing import probe_ids

    engine = load(path, n_ctx=max(prompts) + OUTPUT + 256)
    try:
        engine.generate(probe_ids(engine.n_vocab, 8, salt), max_tokens=2, ignore_eos=True, reuse_prefix=False)
        out = {}
        for p in prompts:
            runs = [
                engine.generate(
                    probe_ids(engine.n_vocab, p, salt + p + k),
                    max_tokens=OUTPUT,
                    ignore_eos=True,
                    reuse_prefix=False,
                    seed=0,
                ).timings
                for k in range(SHORT_REPEATS if p <= SHORT_PROMPT else 1)
            ]
            out[p] = (statistics.median(t.ttft_s for t in runs), statistics.median(t.tpot_s for t in runs))
        return out, min(engine.info.n_batch, engine.info.n_ubatch)
    finally:
        engine.close()


def prompts_for(path: Path, prompts: tuple[int, ...] = PROMPTS) -> tuple[int, ...]:
    """The prompt lengths this model is measured at: those its trained context holds, and for a large model only
    those of 1,024 tokens or fewer."""
    from ondevice.gguf.spec import inspect

    spec = inspect(path)
    limit = spec.n_ctx_train or 4096
    longest = limit if spec.weight_bytes <= LONG_PROMPT_BYTES else SHORT_PROMPT + OUTPUT + 256
    return tuple(p for p in prompts if p + OUTPUT + 256 <= min(limit, longest))


def run(
    models: list[tuple[str, Path]], rounds: int, work: Path, keep=None, prompts: tuple[int, ...] = PROMPTS
) -> list[dict]:
    """Every round's figures per (model, prompt) row, with its median errors; `keep(rows)` after every model (the
    run is long: what finished is kept if it stops)."""
    rows: dict[tuple[str, int], dict] = {}
    for r in range(rounds):
        for label, path in models:
            lengths = prompts_for(path, prompts)
            if not lengths:
                say(f"{label}: left out, none of the prompt lengths fits its trained context and size")
                continue
            say(f"round {r + 1}/{rounds}: {label}")
            pred, how, timing_s = predicted(path, work / "cache")
            meas, chunk = measured(path, lengths, salt=1000 * (r + 1))
            for p in lengths:
                ttft, tpot = meas[p]
                row = rows.setdefault(
                    (label, p), {"model": label, "file": str(path), "prompt": p, "twin": how, "rounds": []}
                )
                row["rounds"].append(
                    {
                        "ttft_s": ttft,
                        "tpot_s": tpot,
                        "timing_s": timing_s,
                        "chunk": chunk,
                        **_predicted_figures(pred, p, chunk),
                        "timing": pred.timing.to_dict(),  # what predicted it: the arithmetic can be replayed on it
                    }
                )
            if keep:
                keep(_with_errors(rows))
    return _with_errors(rows)


def _predicted_figures(pred, prompt: int, chunk: int) -> dict[str, float]:
    return {
        "predicted_ttft_s": pred.ttft_s(prompt, 0, chunk),
        "predicted_tpot_s": pred.decode_s(prompt, OUTPUT) / (OUTPUT - 1),
    }


def replay(stored: list[dict]) -> list[dict]:
    """A stored run's rows predicted again from each round's stored timing by the arithmetic as it is now, against
    the same measurements: what a change of the arithmetic alone moves, with the machine's noise held still. It is
    in-sample (the rows it is judged on are the ones it was looked at on): only a fresh run shows accuracy."""
    from ondevice.gguf.spec import inspect
    from ondevice.roofline import ShapeTiming

    rows: dict[tuple[str, int], dict] = {}
    for row in stored:
        if "file" not in row or any("timing" not in r for r in row["rounds"]):
            raise SystemExit(f"{row['model']}: this run stored no file or timings to replay (runs before r11 did not)")
        spec = inspect(Path(row["file"]))
        rounds = []
        for r in row["rounds"]:
            pred = _timed_predictor(spec, ShapeTiming.from_dict(r["timing"]))
            rounds.append({**r, **_predicted_figures(pred, row["prompt"], r.get("chunk", 512))})
        rows[(row["model"], row["prompt"])] = {**row, "rounds": rounds}
    return _with_errors(rows)


def _with_errors(rows: dict[tuple[str, int], dict]) -> list[dict]:
    for row in rows.values():
        rs = row["rounds"]
        row["ttft_error"] = statistics.median(x["predicted_ttft_s"] / x["ttft_s"] - 1 for x in rs)
        row["decode_error"] = statistics.median(x["tpot_s"] / x["predicted_tpot_s"] - 1 for x in rs)  # tok/s
        row["meets"] = abs(row["decode_error"]) <= DECODE_TOLERANCE and abs(row["ttft_error"]) <= TTFT_TOLERANCE
        # how far the model's own measurements differed between rounds: a machine whose speed moves more than the
        # tolerance between minutes cannot show a prediction within it, however good
        row["decode_spread"] = _spread([x["tpot_s"] for x in rs])
        row["ttft_spread"] = _spread([x["ttft_s"] for x in rs])
    return list(rows.values())


def _spread(values: list[float]) -> float:
    return max(values) / min(values) - 1 if len(values) > 1 else 0.0


def report(rows: list[dict]) -> str:
    head = f"{'model':<34} {'P':>5}  {'decode err':>10}  {'TTFT err':>9}  {'measured spread':>16}  twin"
    lines = [head, "-" * 100]
    for row in rows:
        mark = "" if row["meets"] else "   MISS"
        spread = f"{100 * row.get('decode_spread', 0):.0f}% / {100 * row.get('ttft_spread', 0):.0f}%"
        lines.append(
            f"{row['model']:<34} {row['prompt']:>5}  {100 * row['decode_error']:>+9.1f}%  "
            f"{100 * row['ttft_error']:>+8.1f}%  {spread:>16}  {row['twin']}{mark}"
        )
    met = sum(r["meets"] for r in rows)
    unsteady = sum(r.get("decode_spread", 0) > 2 * DECODE_TOLERANCE for r in rows)
    lines.append(
        f"{met}/{len(rows)} rows within decode +-{100 * DECODE_TOLERANCE:.0f}% and TTFT "
        f"+-{100 * TTFT_TOLERANCE:.0f}% (decode error: predicted / measured decode tok/s - 1)"
    )
    lines.append(
        f"measured spread: slowest / fastest round of the model's own measurement - 1 (decode / TTFT); on {unsteady} "
        f"rows the model's own decode moved more than {200 * DECODE_TOLERANCE:.0f}% between rounds"
    )
    return "\n".join(lines)


def _lengths(text: str) -> tuple[int, ...]:
    try:
        lengths = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of token counts: {text!r}") from None
    if not lengths or min(lengths) < 1:
        raise argparse.ArgumentTypeError(f"prompt lengths must be positive: {text!r}")
    return lengths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--models",
        default="all",
        help=f"all (default,ladder,chat,shapes), or some of those, {', '.join(n for n in SHAPE_SETS if n != 'shapes')}",
    )
    ap.add_argument(
        "--prompts",
        type=_lengths,
        default=PROMPTS,
        help=f"prompt lengths in tokens, comma-separated (default {','.join(map(str, PROMPTS))})",
    )
    ap.add_argument("--work", type=Path, default=Path.home() / ".cache" / "ondevice-bench" / "prediction")
    ap.add_argument("--json", type=Path, help="write every round's figures here")
    ap.add_argument("--replay", type=Path, help="a stored run (--json): its rows predicted again by this code")
    args = ap.parse_args(argv)
    if args.replay:
        import json

        stored = json.loads(args.replay.read_text())
        print(f"CPU: {stored['cpu']}; {stored['rounds']} rounds, replayed from {args.replay}")
        print(report(replay(stored["rows"])))
        return 0
    which = {"default", "ladder", "chat", "shapes"} if args.models == "all" else set(args.models.split(","))
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    models = build_models(which, args.work)

    def keep(rows: list[dict]) -> None:
        if args.json:
            write_json(args.json, {"cpu": cpu_name(), "rounds": args.rounds, "rows": rows})

    rows = run(models, args.rounds, args.work, keep, args.prompts)
    print(f"CPU: {cpu_name()}; {args.rounds} rounds; {time.time() - started:.0f} s")
    print(report(rows))
    keep(rows)
    met = sum(r["meets"] for r in rows)
    return 0 if rows and met >= ROWS_NEEDED * len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
