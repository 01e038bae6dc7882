"""The runtime's tools around training (multi-process, gloo): bounded records
(ExpertParallelRuntime(keep_records=...): they grew by one per forward and layer for the whole
run), frozen layouts for evaluation (runtime.frozen_layouts()), and expert weights gathered on
one world size and loaded on another (load_expert_weights)."""

from __future__ import annotations

import os
from typing import Optional

import numpy as np
import pytest
import torch

from cobalt.torch import ExpertParallelRuntime, ReferenceMoE, launch

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
    with pytest.raises(ValueError, match=r"keep_records 2.5 must be True, False, None or an int"):
        ExpertParallelRuntime(None, None, keep_records=2.5)  # type: ignore[arg-type]


def test_records_stay_a_list_under_a_bound_set_later() -> None:
    rt = ExpertParallelRuntime.__new__(ExpertParallelRuntime)  # no process group needed
    rt.records = []
    rt.keep_records = np.int64(2)  # numpy integers are ints
    assert rt.keep_records
    for i in range(5):
        rt.add_record(i)  # type: ignore[arg-type]
    assert rt.records == [3, 4] and rt.records[-2:] == [3, 4]  # a list: slices work
    rt.keep_records = False
    assert not rt.keep_records
    rt.keep_records = None
    for i in range(5, 10):
        rt.add_record(i)  # type: ignore[arg-type]
    assert rt.records == [3, 4, 5, 6, 7, 8, 9]


def test_frozen_layouts_keep_the_trained_layout(tmp_path) -> None:
    launch(small_workers.frozen_layouts, 4, (str(tmp_path),), timeout_s=120)
    for rank in range(4):
        got = torch.load(os.path.join(tmp_path, f"rank{rank}.pt"))
        trained, frozen = got["trained"], got["frozen"]
        assert trained["calls"] == 3 and trained["version"] >= 1
        assert frozen["calls"] == trained["calls"]  # the layout source saw no eval forward
        assert frozen["version"] == trained["version"]  # nothing moved
        assert (frozen["slots"] == trained["slots"]).all()
        # The four frozen forwards draw with the source's seed, keyed by their routing
        # (routing_token_offset): four batches, four offsets.
        keys = frozen["keys"]
        assert [{k: v for k, v in key.items() if k != "token_offset"} for key in keys] == \
            [{"seed": 77, "step": 3, "layer": 0}] * 4
        offsets = [key["token_offset"] for key in keys]
        assert len(set(offsets)) == 4 and all(0 <= o < 2**62 for o in offsets), offsets
        assert got["after"]["calls"] == trained["calls"] + 4  # asked again once thawed
        assert got["after"]["max_diff"] < 1e-5  # outputs are exact under either layout


def test_expert_weights_move_to_another_world_size(tmp_path) -> None:
    """gather_expert_weights on 2x2 ranks after layout changes, load_expert_weights on 2x1:
    the same experts, and the layer computes what ReferenceMoE computes with them."""
    launch(small_workers.reshard, 4, (2, str(tmp_path)), timeout_s=120)
    saved = torch.load(os.path.join(tmp_path, "experts.pt"))
    assert saved["version"] >= 1  # experts moved before they were saved
    launch(small_workers.reshard, 2, (1, str(tmp_path)), timeout_s=120)
    reference = ReferenceMoE(4, 6, 8, 2)
    reference.router.load_state_dict(saved["router"])
    with torch.no_grad():
        for param, weights in zip((reference.w1, reference.w3, reference.w2), saved["weights"]):
            param.copy_(weights)
    for rank in range(2):
        got = torch.load(os.path.join(tmp_path, f"loaded{rank}.pt"))
        for loaded, weights in zip(got["gathered"], saved["weights"]):
            assert torch.equal(loaded, weights)
        with torch.no_grad():
            torch.testing.assert_close(got["y"], reference(got["x"]), rtol=1e-5, atol=1e-5)
        assert "load_expert_weights while a forward waits for its backward pass" in got["errors"][0]
        assert "w2 has shape [8, 4, 6], expected [8, 6, 4]" in got["errors"][1]


def test_frozen_layouts_use_the_layout_in_force(tmp_path) -> None:
    """A change deferred while a backward was pending leaves the last decided layout different
    from the one in force: a frozen forward runs the one in force and moves nothing."""
    launch(small_workers.frozen_after_a_deferred_change, 4, (str(tmp_path),), timeout_s=120)
    for rank in range(4):
        got = torch.load(os.path.join(tmp_path, f"rank{rank}.pt"))
        assert got["before"]["deferred"] == 1
        assert got["after"] == got["before"]["version"]
        assert got["calls"] == 2


@pytest.mark.parametrize("kind,src", [("adam", None), ("adam", 1), ("row_adagrad", 0)])
def test_training_state_moves_to_another_world_size(tmp_path, kind: str,
                                                    src: Optional[int]) -> None:
    """Training on 2x2 ranks while cobalt+ moves experts, gather_training_state, then
    load_training_state on 2x1 (the state on every rank, or on rank `src` only) and more steps:
    the weights of one uninterrupted run of ReferenceMoE. With Adam (moments shaped like the
    bank, a step count) and with a per-row optimizer state of another shape ([slots, 1, 1]),
    which was copied from rank 0 as a scalar."""
    launch(small_workers.reshard_training, 4, (2, str(tmp_path), kind, None), timeout_s=120)
    saved = torch.load(os.path.join(tmp_path, "state.pt"))
    row_key = "w1.exp_avg" if kind == "adam" else "w1.row_sq"
    assert saved["version"] >= 1 and row_key in saved["experts"]["experts"]["rows"]
    launch(small_workers.reshard_training, 2, (1, str(tmp_path), kind, src), timeout_s=120)
    reference = ReferenceMoE(4, 6, 8, 2)
    opt = small_workers.make_optimizer(kind, reference.parameters())
    before, after = small_workers.RESHARD_STEPS
    for step in range(before + after):
        world = 4 if step < before else 2
        batches = [small_workers.reshard_batch(r, step) for r in range(world)]
        y = reference(torch.cat(batches), router_chunks=[b.shape[0] for b in batches])
        y.pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    for rank in range(2):
        got = torch.load(os.path.join(tmp_path, f"final{rank}.pt"))
        for loaded, param in zip(got["weights"], (reference.w1, reference.w3, reference.w2)):
            torch.testing.assert_close(loaded, param.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got["router"], reference.router.weight.detach(), rtol=1e-5,
                                   atol=1e-5)
        assert "w2 has shape [8, 4, 6], expected [8, 6, 4]" in got["refused"]
        if src is not None:
            assert f"rank {src}: expert store" in got["refused"]
            assert f"rank {src}: malformed state (KeyError: 'optimizer')" in got["malformed"]
            assert "src must be the same rank in [0, 2) on every rank (or None on every " \
                   "rank), got [0, 1] by rank" in got["src_refused"]
        assert got["router_unchanged"]  # refused before anything was loaded
        assert got["step"] == before  # the runtime's step counter came back
        assert got["router_only_states"] == 1


def test_load_training_state_refuses_what_does_not_fit() -> None:
    from cobalt.torch import load_training_state

    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="not a dict from gather_training_state"):
        load_training_state(model, {"weight": torch.zeros(2, 2)})
    state = {"format": "cobalt-training-state", "experts": {}, "optimizer": {},
             "model": {"weight": torch.ones(2, 2)}}
    with pytest.raises(ValueError, match=r"missing: \['bias'\], unexpected: \[\]"):
        load_training_state(model, state)
    state["model"]["bias"] = torch.ones(2)
    state["optimizer"] = {"scale": {"step": 1}}
    with pytest.raises(ValueError, match=r"optimizer state for parameters the model lacks: "
                                         r"\['scale'\]"):
        load_training_state(model, state)
    assert (model.weight != 1).any()  # nothing was loaded


def test_copies_of_the_runtime_are_refused_with_what_to_do(tmp_path) -> None:
    """copy.deepcopy / pickle / torch.save of a model holding an ExpertParallelMoE (and
    AveragedModel, which deep-copies) raise a TypeError naming the class and what to use
    instead (it was "cannot pickle 'cobalt._core.PolicyConfig' object"); training goes on."""
    launch(small_workers.copies_refused, 2, (str(tmp_path),), timeout_s=120)
    got = torch.load(os.path.join(tmp_path, "rank1.pt"))
    assert got.pop("step") == "2"
    classes = {"runtime": "ExpertParallelRuntime", "store": "ExpertStore"}
    for name, message in got.items():
        assert message.startswith(f"{classes.get(name, 'ExpertParallelMoE')} cannot be copied "
                                  "or pickled"), (name, message)
        assert "moe.gather_expert_weights()" in message


def test_gathered_rows_keep_their_bits(tmp_path) -> None:
    """gather_expert_weights and gather_training_state (everywhere or to one rank) copy each main
    row bit for bit, -0.0 included, in float32 and bfloat16."""
    launch(small_workers.bits_kept, 2, (str(tmp_path),), timeout_s=120)
    for rank in range(2):
        got = torch.load(os.path.join(tmp_path, f"rank{rank}.pt"))
        for dtype in ("torch.float32", "torch.bfloat16"):
            assert got[dtype] == {"weights": [True, True], "state": [True, True]}, (rank, got)
