"""pytest setup: import `cobalt` from this checkout (python/), fail clearly when the extension is
not built, and make the shared helpers of python/tests importable (also by spawned workers)."""

from __future__ import annotations

import os
import sys

_TESTS = os.path.dirname(os.path.abspath(__file__))
_PYTHON = os.path.dirname(_TESTS)
for path in (_PYTHON, _TESTS):
    if path not in sys.path:
        sys.path.insert(0, path)
# Spawned worker processes inherit this (multiprocessing passes sys.path too; this covers exec).
os.environ["PYTHONPATH"] = os.pathsep.join(
    [_PYTHON, _TESTS] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)

try:
    import cobalt._core  # noqa: F401
except ImportError as exc:  # pragma: no cover - a build problem, not a test result
    raise ImportError(
        f"cobalt._core is not built ({exc}); build with -DCOBALT_BUILD_PYTHON=ON "
        "(make test does) so that python/cobalt/_core*.so exists"
    ) from exc
