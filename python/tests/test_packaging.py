"""The wheel of python/ (pyproject.toml, setup.py): built offline with the interpreter's own
setuptools from a copy of the package, installed into a scratch folder, imported from there."""
import glob
import os
import shutil
import subprocess
import sys

import pytest

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_FILES = ["pyproject.toml", "setup.py", "README.md"]


def _copy_package(dest: str, with_extensions: bool = True) -> None:
    os.makedirs(dest)
    for name in PACKAGE_FILES:
        shutil.copy(os.path.join(PYTHON_DIR, name), dest)
    ignore = ["__pycache__"] if with_extensions else ["__pycache__", "_core*.so", "_cuda*.so"]
    shutil.copytree(os.path.join(PYTHON_DIR, "cobalt"), os.path.join(dest, "cobalt"),
                    ignore=shutil.ignore_patterns(*ignore))


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=300)


def _require_build_tools() -> None:
    pytest.importorskip("setuptools")
    pytest.importorskip("wheel")
    if _pip("--version").returncode != 0:
        pytest.skip("pip is not installed for this interpreter")


def test_wheel_builds_installs_and_imports(tmp_path) -> None:
    _require_build_tools()
    src = str(tmp_path / "src")
    _copy_package(src)
    built = _pip("wheel", "--no-build-isolation", "--no-deps", "--no-index", "-w",
                 str(tmp_path / "dist"), src)
    assert built.returncode == 0, built.stdout + built.stderr
    wheels = glob.glob(str(tmp_path / "dist" / "cobalt_moe-*.whl"))
    assert len(wheels) == 1, wheels
    # A platform wheel for this interpreter (it holds compiled extensions).
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert f"-{tag}-{tag}-linux_" in os.path.basename(wheels[0]), wheels[0]

    site = str(tmp_path / "site")
    installed = _pip("install", "--no-deps", "--no-index", "--target", site, wheels[0])
    assert installed.returncode == 0, installed.stdout + installed.stderr
    probe = ("import cobalt, cobalt.torch, cobalt._core; print(cobalt.__file__); "
             "print(','.join(cobalt.policy_names()))")
    env = dict(os.environ, PYTHONPATH=site)
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                         cwd=str(tmp_path), timeout=300)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0].startswith(site), lines[0]  # imported from the install, not the checkout
    assert "cobalt+" in lines[1].split(",")
    assert os.path.exists(os.path.join(site, "cobalt", "_core.pyi"))


def test_wheel_without_extensions_says_how_to_build_them(tmp_path) -> None:
    _require_build_tools()
    src = str(tmp_path / "src")
    _copy_package(src, with_extensions=False)
    built = _pip("wheel", "--no-build-isolation", "--no-deps", "--no-index", "-w",
                 str(tmp_path / "dist"), src)
    assert built.returncode != 0
    assert "make build-python" in built.stdout + built.stderr
