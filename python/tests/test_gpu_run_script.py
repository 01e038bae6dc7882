"""bench/gpu/run.sh's run mode, without a GPU: its verdicts and exit statuses.

The script spends a GPU session's few minutes of device time, so its logic is checked here on a
copy of it in a scratch tree with stand-ins: a fake check program (exit status from
FAKE_CHECK_STATUS), a fake compute-sanitizer (behaviour from FAKE_SANITIZER), a fake
build_python.sh and a fake interpreter for the Python stage. What they stand in for is tested
elsewhere (the check program's own logic by its --dry-run and the host emulation, the Python build
by `make test-gpu-bundle`).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[2]
_RUN_SH = _REPO / "bench" / "gpu" / "run.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("sha256sum") is None,
                                reason="needs bash and sha256sum")


def _script(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


class Tree:
    """A scratch tree with run.sh, the files its source digest covers and a fake bundle."""

    def __init__(self, root: Path) -> None:
        self.root = root
        _script(root / "bench" / "gpu" / "run.sh", _RUN_SH.read_text())
        for rel in ("src/a.cpp", "include/a.hpp", "cmake/a.cmake", "CMakeLists.txt",
                    "CMakePresets.json"):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(f"// {rel}\n")
        self.bundle = root / "build" / "gpu-bundle"
        (self.bundle / "lib").mkdir(parents=True)
        (self.bundle / "traces").mkdir()
        _script(self.bundle / "cobalt_gpu_check", """#!/bin/bash
echo "fake check: $*"
status=${FAKE_CHECK_STATUS:-0}
[[ $status -eq 0 ]] && echo "all checks passed"
exit "$status"
""")
        _script(root / "fakebin" / "compute-sanitizer", """#!/bin/bash
# compute-sanitizer --tool T --error-exitcode 9 --print-limit 100 BIN ARGS...
case ${FAKE_SANITIZER:-clean} in
  clean) shift 6; exec "$@" ;;
  errors)
    echo "========= Invalid __global__ read of size 4"
    echo "========= ERROR SUMMARY: 1 error"
    exit 9
    ;;
  unsupported) echo "========= Error: Device not supported"; echo "CUDA error 999"; exit 9 ;;
  nosummary) exit 0 ;;
  checkfail) echo "check failed"; exit 1 ;;
  timeout) exit 124 ;;
esac
""")
        # The Python stage's stand-ins: the build script and the interpreter running pytest.
        _script(root / "bench" / "gpu" / "build_python.sh",
                "#!/bin/bash\necho \"fake build_python $*\"\nexit ${FAKE_BUILD_STATUS:-0}\n")
        _script(root / "fakebin" / "fake-python", """#!/bin/bash
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH-}" > "$FAKE_PYTHON_LOG"
echo "COBALT_EXPECT_CUDA_DEVICE=${COBALT_EXPECT_CUDA_DEVICE-}" >> "$FAKE_PYTHON_LOG"
echo "COBALT_PYTHON_PACKAGE_DIR=${COBALT_PYTHON_PACKAGE_DIR-}" >> "$FAKE_PYTHON_LOG"
echo "fake pytest $*"
exit ${FAKE_PYTEST_STATUS:-0}
""")
        self.write_build_info("0000000000000000")
        stale = self.run()
        match = re.search(r"this tree has (\w+)", stale.stdout)
        assert stale.returncode == 5 and match, stale.stdout
        self.write_build_info(match.group(1))

    def write_build_info(self, digest: str) -> None:
        (self.bundle / "BUILD_INFO").write_text(f"sources {digest}\ncommit test\n")

    def add_python_parts(self) -> None:
        (self.bundle / "python" / "lib").mkdir(parents=True, exist_ok=True)
        (self.bundle / "python" / "lib" / "libcobalt.a").write_text("")

    def run(self, **env: str) -> subprocess.CompletedProcess[str]:
        full_env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("COBALT_GPU_", "FAKE_")) and k not in ("OUT", "PYTHON")}
        full_env["PATH"] = f"{self.root / 'fakebin'}:{full_env.get('PATH', '/usr/bin:/bin')}"
        full_env["FAKE_PYTHON_LOG"] = str(self.root / "python_env.txt")
        full_env["OUT"] = str(self.root / "out")
        (self.root / "out").mkdir(exist_ok=True)
        full_env.update(env)
        return subprocess.run(["bash", str(self.root / "bench" / "gpu" / "run.sh"), "--quick"],
                              cwd=self.root, env=full_env, capture_output=True, text=True,
                              timeout=120)


@pytest.fixture()
def tree(tmp_path: Path) -> Tree:
    return Tree(tmp_path)


def test_a_bundle_from_other_sources_is_refused(tree: Tree) -> None:
    (tree.root / "src" / "a.cpp").write_text("// changed\n")
    result = tree.run()
    assert result.returncode == 5 and "stale bundle" in result.stdout
    assert tree.run(COBALT_GPU_ALLOW_STALE="1").returncode == 0


@pytest.mark.parametrize("check_status", [0, 1, 3])
def test_the_check_programs_status_is_the_runs(tree: Tree, check_status: int) -> None:
    result = tree.run(FAKE_CHECK_STATUS=str(check_status))
    assert result.returncode == check_status, result.stdout
    assert f"cobalt_gpu_check exit status {check_status}" in result.stdout
    assert (tree.root / "out" / "gpu_check.txt").is_file()


def test_no_stage_runs_without_a_device(tree: Tree) -> None:
    tree.add_python_parts()
    result = tree.run(FAKE_CHECK_STATUS="2", COBALT_GPU_PYTHON="1", COBALT_GPU_SANITIZE="1",
                      PYTHON=str(tree.root / "fakebin" / "fake-python"))
    assert result.returncode == 2
    assert "compute-sanitizer --tool" not in result.stdout
    assert not (tree.root / "python_env.txt").exists()
    # Each asked-for stage says why it did not run.
    assert "the Python stage not run: the check program did not reach the device" in result.stdout
    assert "the sanitizers not run: the check program did not reach the device" in result.stdout


@pytest.mark.parametrize("mode,status,verdict", [
    ("clean", 0, "clean"),
    ("errors", 8, "errors reported"),
    ("unsupported", 0, "the tool could not run here"),
    ("nosummary", 8, "summary is missing"),
    ("checkfail", 8, "a check failed under the tool"),
    ("timeout", 8, "timed out"),
])
def test_sanitizer_verdicts(tree: Tree, mode: str, status: int, verdict: str) -> None:
    result = tree.run(COBALT_GPU_SANITIZE="1", FAKE_SANITIZER=mode)
    assert result.returncode == status, result.stdout
    verdicts = [line for line in result.stdout.splitlines()
                if line.startswith("run.sh: compute-sanitizer --tool")]
    assert [line.split()[3] for line in verdicts] == ["memcheck", "synccheck", "racecheck"]
    assert all(verdict in line for line in verdicts), result.stdout


def test_the_sanitizers_run_the_check_without_its_injected_error(tree: Tree) -> None:
    """The check that makes a failing CUDA call on purpose is left out under compute-sanitizer
    (the tools would count that call as an error); the main run keeps it."""
    result = tree.run(COBALT_GPU_SANITIZE="1", FAKE_SANITIZER="clean")
    assert result.returncode == 0, result.stdout
    main_run = [line for line in (tree.root / "out" / "gpu_check.txt").read_text().splitlines()
                if line.startswith("fake check:")][0]
    assert "--no-injected-errors" not in main_run, main_run
    for tool in ("memcheck", "synccheck", "racecheck"):
        log = (tree.root / "out" / f"sanitizer_{tool}.txt").read_text()
        assert "--quick --no-timing --no-injected-errors --tokens 20000" in log, log


def test_a_failed_check_keeps_its_status_under_the_sanitizers(tree: Tree) -> None:
    result = tree.run(COBALT_GPU_SANITIZE="1", FAKE_SANITIZER="errors", FAKE_CHECK_STATUS="1")
    assert result.returncode == 1 and "errors reported" in result.stdout


def test_python_stage_needs_the_bundles_python_parts(tree: Tree) -> None:
    result = tree.run(COBALT_GPU_PYTHON="1")
    assert result.returncode == 10 and "no Python parts" in result.stdout


@pytest.mark.parametrize("build_status,pytest_status,status", [(0, 0, 0), (3, 0, 10), (0, 1, 10)])
def test_python_stage(tree: Tree, build_status: int, pytest_status: int, status: int) -> None:
    tree.add_python_parts()
    result = tree.run(COBALT_GPU_PYTHON="1", PYTHON=str(tree.root / "fakebin" / "fake-python"),
                      FAKE_BUILD_STATUS=str(build_status), FAKE_PYTEST_STATUS=str(pytest_status),
                      LD_LIBRARY_PATH="/machine/lib")
    assert result.returncode == status, result.stdout
    if build_status == 0:
        seen = (tree.root / "python_env.txt").read_text()
        # The interpreter sees the machine's library path, not the bundle's (kept for the check).
        assert "LD_LIBRARY_PATH=/machine/lib\n" in seen
        assert "COBALT_EXPECT_CUDA_DEVICE=1" in seen
        assert f"COBALT_PYTHON_PACKAGE_DIR={tree.root / 'build' / 'gpu-python'}" in seen
    else:
        assert not (tree.root / "python_env.txt").exists()
        assert "build_python exit status 3" in result.stdout
        assert "test_cuda exit status" not in result.stdout  # nothing to test after a failed build


def test_stages_past_the_time_budget_are_skipped(tree: Tree) -> None:
    tree.add_python_parts()
    result = tree.run(COBALT_GPU_PYTHON="1", COBALT_GPU_SANITIZE="1", COBALT_GPU_BUDGET_S="40",
                      PYTHON=str(tree.root / "fakebin" / "fake-python"))
    assert result.returncode == 11, result.stdout
    assert "build_python skipped" in result.stdout
    assert "compute-sanitizer --tool memcheck skipped" in result.stdout
    # A skip does not hide a worse verdict.
    failed = tree.run(COBALT_GPU_SANITIZE="1", COBALT_GPU_BUDGET_S="40", FAKE_CHECK_STATUS="1")
    assert failed.returncode == 1


def test_a_sanitizer_cut_short_by_the_budget_is_incomplete_not_failed(tree: Tree) -> None:
    # 100 s budget: each tool gets 100 - 15 = 85 s < its own 150 s.
    result = tree.run(COBALT_GPU_SANITIZE="1", FAKE_SANITIZER="timeout", COBALT_GPU_BUDGET_S="100")
    assert result.returncode == 11, result.stdout
    # Each gets what is left (85 s at most, less as the seconds pass).
    cut = re.findall(r"stopped after (\d+) s by the run's time budget: incomplete", result.stdout)
    assert len(cut) == 3 and all(70 <= int(s) <= 85 for s in cut), result.stdout


def test_a_sanitizer_error_outranks_a_python_failure(tree: Tree) -> None:
    tree.add_python_parts()
    result = tree.run(COBALT_GPU_SANITIZE="1", FAKE_SANITIZER="errors", COBALT_GPU_PYTHON="1",
                      PYTHON=str(tree.root / "fakebin" / "fake-python"), FAKE_PYTEST_STATUS="1")
    assert result.returncode == 8, result.stdout
    assert "test_cuda exit status 1" in result.stdout


def test_torch_ops_bench_runs_on_cpu() -> None:
    """The GPU run's benchmark script, small and on CPU tensors (here no device): it runs, prints
    a row per op and exits 0."""
    env = dict(os.environ, PYTHONPATH=str(_REPO / "python"))
    for dtype in ("int32", "int64"):
        result = subprocess.run(
            [sys.executable, str(_REPO / "bench" / "gpu" / "torch_ops_bench.py"), "--tokens",
             "3000", "--experts", "32", "--nodes", "2", "--gpus-per-node", "4", "--reps", "2",
             "--cpu-reps", "1", "--ids-dtype", dtype],
            env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"({dtype} ids)" in result.stdout, result.stdout
        for op in ("assign_tasks", "dispatch_layout", "routing_counts", "solve_topoep"):
            assert re.search(rf"^{op}\s", result.stdout, re.M), result.stdout
    bad = subprocess.run([sys.executable, str(_REPO / "bench" / "gpu" / "torch_ops_bench.py"),
                          "--experts", "30", "--nodes", "2", "--gpus-per-node", "4"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "must be a multiple of the rank count" in bad.stderr


# --- build_python.sh's choice of pybind11 (--print-pybind11: the choice, no build) ---------------

def _headers(include: Path, version: tuple[int, int, int]) -> Path:
    """A stand-in pybind11 include directory (pybind11.h and the version macros)."""
    (include / "pybind11" / "detail").mkdir(parents=True)
    (include / "pybind11" / "pybind11.h").write_text("// stand-in\n")
    (include / "pybind11" / "detail" / "common.h").write_text("".join(
        f"#define PYBIND11_VERSION_{part} {value}\n"
        for part, value in zip(("MAJOR", "MINOR", "PATCH"), version)))
    return include


def _choose_pybind11(tmp_path: Path, *, pip: bool = False, torch: bool = False,
                     torch_version: tuple[int, int, int] = (3, 0, 0), bundle: bool = True,
                     numpy2: bool = False,
                     env_include: Path | None = None) -> subprocess.CompletedProcess:
    """build_python.sh --print-pybind11 in a scratch tree; the interpreter is this one with stand-in
    packages (pybind11, torch, numpy) first on its path, each present or hiding the machine's own,
    so the result does not depend on what the machine has installed."""
    root = tmp_path / "tree"
    _script(root / "bench" / "gpu" / "build_python.sh",
            (_REPO / "bench" / "gpu" / "build_python.sh").read_text())
    parts = root / "build" / "gpu-bundle" / "python"
    for rel in ("lib/libcobalt.a", "lib/libcobalt_cuda.a", "lib/libcudart_static.a",
                "include/fmt/format.h"):
        (parts / rel).parent.mkdir(parents=True, exist_ok=True)
        (parts / rel).write_text("")
    if bundle:
        _headers(parts / "pybind11", (2, 10, 3))
        (parts / "pybind11" / "VERSION").write_text("2.10.3-1\n")
    site = tmp_path / "site"
    site.mkdir()
    (site / "pybind11").mkdir()
    if pip:
        include = _headers(tmp_path / "pip-include", (3, 0, 1))
        (site / "pybind11" / "__init__.py").write_text(
            f"__version__ = '3.0.1'\ndef get_include():\n    return {str(include)!r}\n")
    else:  # hides a pybind11 the machine may have
        (site / "pybind11" / "__init__.py").write_text("raise ImportError('stand-in: none')\n")
    # The stand-in torch hides Debian's (which ships no pybind11) unless asked for one.
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("")
    if torch:
        _headers(site / "torch" / "include", torch_version)
        (site / "torch" / "include" / "fmt").mkdir()  # torch's own fmt: must stay off the path
    (site / "numpy").mkdir()
    (site / "numpy" / "__init__.py").write_text(
        f"__version__ = {'2.1.3' if numpy2 else '1.26.4'!r}\n")
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(site))
    env.pop("PYBIND11_INCLUDE", None)
    if env_include is not None:
        env["PYBIND11_INCLUDE"] = str(env_include)
    return subprocess.run(["bash", str(root / "bench" / "gpu" / "build_python.sh"),
                           "--print-pybind11"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=60)


def test_pybind11_choice_order(tmp_path: Path) -> None:
    """PYBIND11_INCLUDE, then pip's pybind11, then torch's, then the bundle's."""
    cases = [
        (dict(), "the bundle's pybind11 (2.10.3-1)", "build/gpu-bundle/python/pybind11/pybind11"),
        (dict(torch=True), "torch's pybind11 3.0.0", "site/torch/include/pybind11"),
        (dict(torch=True, pip=True), "'s pybind11 3.0.1", "pip-include/pybind11"),
    ]
    for i, (kwargs, source, path) in enumerate(cases):
        result = _choose_pybind11(tmp_path / str(i), **kwargs)
        assert result.returncode == 0, result.stdout + result.stderr
        chosen_from, chosen_dir = result.stdout.strip().splitlines()
        assert source in chosen_from and chosen_dir.endswith(path), result.stdout
        assert "warning" not in result.stderr
    explicit = _headers(tmp_path / "explicit", (2, 13, 6))
    result = _choose_pybind11(tmp_path / "env", pip=True, torch=True, env_include=explicit)
    assert result.stdout.startswith("pybind11 2.13.6 from PYBIND11_INCLUDE"), result.stdout
    bad = _choose_pybind11(tmp_path / "bad", env_include=tmp_path / "nowhere")
    assert bad.returncode == 2 and "has no pybind11/pybind11.h" in bad.stderr


def test_pybind11_fallbacks_warn_or_fail(tmp_path: Path) -> None:
    """A pybind11 older than 2.12 with numpy 2 is a warning (the bundle's 2.10, an old torch's);
    3.x with numpy 2 is not; nothing to choose from is exit 2."""
    warned = _choose_pybind11(tmp_path / "numpy2", numpy2=True)
    assert warned.returncode == 0 and "predates numpy 2" in warned.stderr, warned.stderr
    assert "the bundle's pybind11 (2.10.3-1)" in warned.stderr
    old_torch = _choose_pybind11(tmp_path / "old-torch", torch=True, torch_version=(2, 11, 1),
                                 numpy2=True)
    assert "torch's pybind11 2.11.1" in old_torch.stderr, old_torch.stderr
    new_torch = _choose_pybind11(tmp_path / "new-torch", torch=True, numpy2=True)
    assert new_torch.returncode == 0 and "warning" not in new_torch.stderr, new_torch.stderr
    none = _choose_pybind11(tmp_path / "none", bundle=False)
    assert none.returncode == 2 and "no pybind11" in none.stderr, none.stderr
