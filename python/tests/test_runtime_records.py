"""ExpertParallelRuntime(keep_records=...): records stay bounded by default (they grew by one per
forward and layer for the whole run), and the bound is the caller's to choose."""

from __future__ import annotations

import os

import pytest
import torch

from cobalt.torch import ExpertParallelRuntime, launch

import small_workers


def test_records_keep_the_most_recent(tmp_path) -> None:
    launch(small_workers.records_kept, 2, (str(tmp_path),), timeout_s=120)
    kept = torch.load(os.path.join(tmp_path, "rank1.pt"))
    assert ExpertParallelRuntime.DEFAULT_RECORDS >= 1000
    assert kept["True"] == [0, 1, 2, 3, 4]
    assert kept["3"] == [2, 3, 4]
    assert kept["0"] == [] and kept["False"] == []
    assert kept["None"] == [0, 1, 2, 3, 4]


def test_a_bad_keep_records_is_refused() -> None:
    with pytest.raises(ValueError, match=r"keep_records -1 must be True, False, None or an int"):
        ExpertParallelRuntime(None, None, keep_records=-1)  # type: ignore[arg-type]


def test_frozen_layouts_keep_the_trained_layout(tmp_path) -> None:
    launch(small_workers.frozen_layouts, 4, (str(tmp_path),), timeout_s=120)
    for rank in range(4):
        got = torch.load(os.path.join(tmp_path, f"rank{rank}.pt"))
        trained, frozen = got["trained"], got["frozen"]
        assert trained["calls"] == 3 and trained["version"] >= 1
        assert frozen["calls"] == trained["calls"]  # the layout source saw no eval forward
        assert frozen["version"] == trained["version"]  # nothing moved
        assert (frozen["slots"] == trained["slots"]).all()
        assert got["after"]["calls"] == trained["calls"] + 4  # asked again once thawed
        assert got["after"]["max_diff"] < 1e-5  # outputs are exact under either layout
