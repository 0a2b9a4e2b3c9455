"""The sampler flags every command that samples takes (`run`, `chat`, `bench`): declared here once,
with the engine's names and defaults (ondevice.engine.sampling.DEFAULTS), and read back validated by
the same rules as the API (make_params): a bad value is one line naming the flag, exit 2.

Length, seed and stop flags are not here: they mean different things per command (`bench -n` is the
workloads' output lengths, its --seed also seeds the prompt texts)."""

from __future__ import annotations

import argparse
from typing import Any

from ondevice.core.errors import InvalidParameterError
from ondevice.engine.sampling import DEFAULTS, make_params

__all__ = ["SAMPLER_FLAGS", "add_sampling_args", "sampling_settings"]

# flag -> SamplingParams field, in the sampler chain's order of use
SAMPLER_FLAGS = {
    "--temperature": "temperature",
    "--top-k": "top_k",
    "--top-p": "top_p",
    "--min-p": "min_p",
    "--repeat-penalty": "repeat_penalty",
}

_HELP = {
    "temperature": "0 = greedy",
    "top_k": "keep the k most likely tokens; 0 = off",
    "top_p": "nucleus sampling: keep the most likely tokens up to this mass, in (0, 1]; 1 = off",
    "min_p": "drop tokens below this share of the top token's probability, in [0, 1]; 0 = off",
    "repeat_penalty": "penalty on tokens of the last 64; 1 = off",
}


def add_sampling_args(p: argparse.ArgumentParser, *, short_temperature: bool = True) -> None:
    """--temperature (also -t unless the command uses -t for something else), --top-k, --top-p, --min-p and
    --repeat-penalty, each defaulting to the engine's default."""
    group = p.add_argument_group("sampling")
    for flag, name in SAMPLER_FLAGS.items():
        default = getattr(DEFAULTS, name)
        names = ("-t", flag) if name == "temperature" and short_temperature else (flag,)
        group.add_argument(
            *names,
            dest=name,
            type=int if isinstance(default, int) else float,
            default=default,
            help=f"{_HELP[name]} (default {default:g})",
        )


def sampling_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The sampler settings the flags give ({"temperature": ..., "top_k": ..., ...}), each checked as the API
    checks it; InvalidParameterError naming the flag otherwise."""
    for flag, name in SAMPLER_FLAGS.items():
        try:
            make_params(**{name: getattr(args, name)})
        except InvalidParameterError as exc:
            raise InvalidParameterError(f"{flag}: {exc}") from None
    values = {name: getattr(args, name) for name in SAMPLER_FLAGS.values()}
    return make_params(**values).sampler_settings()
