"""examples/train_moe_lm.py runs (it had no test), and its checkpoints resume: training 2 steps,
saving, and resuming for 2 more gives the losses of 4 uninterrupted steps bit for bit (static
layout: the same summation order), and a saved state resumes on another node shape."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_moe_lm.py"
DATA = ROOT.parent / "shared" / "data" / "text"
TINY = ["--layers", "1", "--seq-len", "16", "--batch", "2", "--d-model", "16", "--ffn", "32",
        "--num-experts", "4"]

pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason=f"no text samples at {DATA}")


def _train(out: pathlib.Path, *args: str) -> dict:
    """Runs the example; returns {policy: run} from its results.json."""
    done = subprocess.run([sys.executable, str(EXAMPLE), *TINY, "--out-dir", str(out), *args],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Per policy" in done.stdout  # the report ran
    runs = json.loads((out / "results.json").read_text())["runs"]
    return {run["policy"]: run for run in runs}


def test_training_resumes_from_a_saved_state(tmp_path: pathlib.Path) -> None:
    shape = ["--nodes", "1", "--ranks-per-node", "2"]
    whole = _train(tmp_path / "whole", *shape, "--policies", "static", "--steps", "4")
    states = tmp_path / "states"
    states.mkdir()
    first = _train(tmp_path / "first", *shape, "--policies", "static,cobalt+", "--steps", "2",
                   "--save-state", str(states))
    assert sorted(p.name for p in states.iterdir()) == ["state_cobalt+.pt", "state_static.pt"]
    second = _train(tmp_path / "second", *shape, "--policies", "static", "--steps", "2",
                    "--resume-state", str(states))
    assert second["static"]["first_step"] == 2
    assert (first["static"]["history"]["loss"] + second["static"]["history"]["loss"]
            == whole["static"]["history"]["loss"])
    # Another node shape: 2 nodes x 1 rank, cobalt+ (its statistics start afresh).
    moved = _train(tmp_path / "moved", "--nodes", "2", "--ranks-per-node", "1", "--policies",
                   "cobalt+", "--steps", "1", "--resume-state", str(states))
    assert moved["cobalt+"]["first_step"] == 2
    assert 0 < moved["cobalt+"]["history"]["loss"][0] < first["cobalt+"]["history"]["loss"][0]


def test_a_missing_saved_state_is_a_usage_error(tmp_path: pathlib.Path) -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE), "--resume-state", str(tmp_path),
                           "--policies", "static"], capture_output=True, text=True,
                          timeout=60, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    assert done.returncode == 2
    assert f"--resume-state: no saved state ['{tmp_path}/state_static.pt']" in done.stderr
