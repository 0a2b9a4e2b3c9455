"""The package ships its type information: py.typed in the package and the wheel's package data, and every
lazily resolved public name also imported under TYPE_CHECKING so a type checker or IDE sees it."""

import ast
import tomllib
from dataclasses import fields
from inspect import signature
from pathlib import Path

import ondevice
from ondevice.engine.chat import SPEC_KEYS, ChatArgs
from ondevice.engine.engine import Engine, StreamArgs
from ondevice.engine.sampling import SAMPLING_KEYS, SamplingArgs, SamplingParams

ROOT = Path(__file__).resolve().parent.parent


def test_py_typed_is_in_the_package_and_its_package_data():
    assert (ROOT / "ondevice" / "py.typed").is_file()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["ondevice"]


def _type_checking_imports() -> set[str]:
    tree = ast.parse((ROOT / "ondevice" / "__init__.py").read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom):
                    names.update(alias.asname or alias.name for alias in stmt.names)
    return names


def test_every_public_name_is_imported_for_type_checkers():
    assert set(ondevice.__all__) <= _type_checking_imports()


def test_type_checking_imports_name_the_same_objects_as_the_lazy_lookup():
    for name in ondevice._LAZY:
        module = __import__(ondevice._LAZY[name], fromlist=[name])
        assert getattr(ondevice, name) is getattr(module, name)


def test_sampling_keywords_are_the_sampling_dataclass_fields():
    names = {f.name for f in fields(SamplingParams)}
    assert set(SamplingArgs.__optional_keys__) == names == set(SAMPLING_KEYS)


def test_stream_keywords_are_what_engine_stream_and_chat_stream_accept():
    stream_params = set(signature(Engine.stream).parameters) - {"self", "prompt"}
    assert set(StreamArgs.__optional_keys__) == stream_params
    assert set(ChatArgs.__optional_keys__) == set(SAMPLING_KEYS) | SPEC_KEYS | {"cancel"}
