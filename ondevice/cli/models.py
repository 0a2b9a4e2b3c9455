"""`ondevice models`: the registry, with what is on this machine."""

from __future__ import annotations

from ondevice.cli.output import dump_json
from ondevice.fmt import human_bytes, table
from ondevice.registry import load_registry, user_registry_path


def register(sub) -> None:
    p = sub.add_parser("models", help="list the model registry")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--where", action="store_true", help="print the registry files read and the user registry path")
    p.set_defaults(func=run)


def run(args) -> int:
    reg = load_registry()
    if args.where:
        for f in reg.files:
            print(f)
        print(f"user registry: {user_registry_path()}")
        return 0
    rows = []
    for name, e in sorted(reg.entries.items()):
        rows.append(
            {
                "name": name,
                "default": name == reg.default_name,
                "quant": e.quant,
                "size_bytes": e.size_bytes,
                "source": f"{e.source_kind}:{e.source_value}",
                "present": e.is_present(),
                "description": e.description,
            }
        )
    if args.json:
        dump_json(rows)
        return 0
    print(
        table(
            ["name", "quant", "size", "present", "source"],
            [
                [
                    r["name"] + (" (default)" if r["default"] else ""),
                    r["quant"],
                    human_bytes(r["size_bytes"]) if r["size_bytes"] else "?",
                    "yes" if r["present"] else "no",
                    r["source"],
                ]
                for r in rows
            ],
            align="llrll",
        )
    )
    return 0
