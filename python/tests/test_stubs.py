"""python/cobalt/_core.pyi names exactly what cobalt._core exports (classes with their members)."""

from __future__ import annotations

import ast
import re
import os

import cobalt._core as core

STUB = os.path.join(os.path.dirname(core.__file__), "_core.pyi")
TYPING_HELPERS = {"ArrayLike", "I32", "I64", "U64", "F64"}


def _stub_tree() -> ast.Module:
    with open(STUB, encoding="utf-8") as f:
        return ast.parse(f.read())


def test_stub_lists_every_export() -> None:
    tree = _stub_tree()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    exported = {n for n in dir(core) if not n.startswith("_")}
    assert exported - names == set(), "exports missing from _core.pyi"
    assert names - TYPING_HELPERS - exported == set(), "stubs of names the module lacks"


def test_stub_class_members_exist() -> None:
    for node in _stub_tree().body:
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(core, node.name)
        for item in node.body:
            member = None
            if isinstance(item, ast.FunctionDef):
                member = item.name
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                member = item.target.id
            elif isinstance(item, ast.Assign) and isinstance(item.targets[0], ast.Name):
                member = item.targets[0].id
            if member is not None and member != "__init__":
                assert hasattr(cls, member), f"{node.name}.{member} is stubbed but not bound"


def _bound_defaults(doc: str) -> dict[str, str]:
    """`name: type = value` pairs of every signature in a pybind11 docstring."""
    return dict(re.findall(r"(\w+): [\w.\[\], ]+? = ([^,()]+)", doc or ""))


def _stub_defaults(fn: ast.FunctionDef) -> dict[str, object]:
    args = fn.args.args + fn.args.kwonlyargs
    defaults = [None] * (len(fn.args.args) - len(fn.args.defaults)) + list(fn.args.defaults)
    defaults += list(fn.args.kw_defaults)
    return {a.arg: d.value for a, d in zip(args, defaults)
            if isinstance(d, ast.Constant) and isinstance(d.value, (int, float))}


def test_stub_numeric_defaults_match_the_bindings() -> None:
    # A stub default that drifted from the binding's tells users the wrong value (the TopoEP
    # sizes' defaults once did).
    checked = 0
    for node in _stub_tree().body:
        targets: list[tuple[ast.FunctionDef, object]] = []
        if isinstance(node, ast.FunctionDef):
            targets.append((node, getattr(core, node.name)))
        elif isinstance(node, ast.ClassDef):
            cls = getattr(core, node.name)
            targets += [(item, getattr(cls, item.name)) for item in node.body
                        if isinstance(item, ast.FunctionDef) and hasattr(cls, item.name)]
        for fn, bound in targets:
            bound_defaults = _bound_defaults(getattr(bound, "__doc__", ""))
            for name, value in _stub_defaults(fn).items():
                if name not in bound_defaults or isinstance(value, bool):
                    continue
                try:
                    bound_value = float(bound_defaults[name])
                except ValueError:
                    continue  # an enum or object default
                assert float(value) == bound_value, \
                    f"{fn.name}: stub default {name} = {value}, bound {bound_defaults[name]}"
                checked += 1
    assert checked >= 20, f"only {checked} numeric defaults compared: the parsing broke"
