"""What the CLI writes to stdout besides text: JSON."""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["dump_json"]


def dump_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
