"""pytest setup: import `cobalt` from this checkout (python/), fail clearly when the extension is
not built, and make the shared helpers of python/tests importable (also by spawned workers)."""

from __future__ import annotations

import os
import sys

_TESTS = os.path.dirname(os.path.abspath(__file__))
# COBALT_PYTHON_PACKAGE_DIR: a directory holding another build of the `cobalt` package (e.g. the one
# bench/gpu/build_python.sh makes for the GPU machine's interpreter) to test instead of python/.
_PYTHON = os.environ.get("COBALT_PYTHON_PACKAGE_DIR") or os.path.dirname(_TESTS)
if not os.path.isfile(os.path.join(_PYTHON, "cobalt", "__init__.py")):
    raise ImportError(f"COBALT_PYTHON_PACKAGE_DIR={_PYTHON!r} holds no cobalt package "
                      "(cobalt/__init__.py)")
_PYTHON = os.path.abspath(_PYTHON)
for path in (_TESTS, _PYTHON):  # _PYTHON first on the path, ahead of any other `cobalt`
    while path in sys.path:
        sys.path.remove(path)
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
