"""python/cobalt/_core.pyi names exactly what cobalt._core exports (classes with their members)."""

from __future__ import annotations

import ast
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
