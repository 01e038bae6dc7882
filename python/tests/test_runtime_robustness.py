"""The expert-parallel runtime beyond one forward and one backward per step (gloo, 2 nodes x 2
ranks; scenarios in robustness_workers.py and disagreement_workers.py), against the
single-process ReferenceMoE:

* gradient accumulation over two backward passes with every main instance moving in between:
  expert and router gradients equal the reference, vacated bank slots keep no gradient;
* two forwards summed into one backward while the layout changes at the second: the change
  waits for the pending backward (nothing moves under it), gradients equal the reference, and
  the next forward applies it;
* two backward passes through one retained graph with replicas: nothing counted twice;
* a float64 layer trained with Adam while every main moves at every step ends exactly where the
  same training on a fixed layout ends (no rollback: rows migrate as bytes);
* a step without any token, an input dtype that differs from the bank's on one rank (a clear
  error on every rank, no hang), a checkpoint written after layout changes and loaded into a
  fresh layer (same experts in the same rows; another bank capacity refuses it);
* a router-only backward pass then zero_grad (no stale gradient comes back), a retained graph
  that keeps mains in place until its last backward, forwards never backpropagated (no window
  left open), checkpoints readable with weights_only=True and refused before any copy when
  written for another world size, the routing recorder over a step without tokens;
* activation checkpointing (reentrant and not) of two stacked layers whose layouts change every
  step: recomputations replay the original decisions, gradients equal the plain run's; five
  checkpointed micro-batches into one backward; an ambiguous recomputation raises on every rank;
* frozen expert weights (the whole bank, or w2 only with replicas) get no gradient and do not
  move under the optimizer; router-only backward passes before and after the MoE's are summed
  over the ranks at their own end (the router gradient is the same on every rank);
* an input, router output or expert bank on a non-CPU device on one rank, and a layout source
  whose exec_rank is not [T, K], raise a clear error; a forward under torch.inference_mode()
  runs as under no_grad;
* mains of a trainable bank do not move before the optimizer is declared
  (attach_optimizer), nor with an optimizer that does not hold the bank; ranks that loaded
  checkpoints of different versions raise on every rank; a router returning lists on one rank
  and a layout source raising on one rank raise on every rank (no hang); layers built with
  another top-k, hidden size or input dtype on one rank, and forwards under no_grad or with the
  bank frozen on one rank only, raise on every rank (gloo aborted);
* (one process) a checkpoint whose expert placement is refused (another world size, another
  rank's, bank rows without a placement, a placement without all its bank rows or with a row
  of another shape, a malformed placement) changes nothing in the layer, and check_checkpoint
  refuses it before anything is loaded; a plain-callable router warns that its parameters are
  not summed.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import cobalt
from cobalt.torch import (EPGroup, ExpertParallelMoE, ExpertParallelRuntime, FixedLayoutSource,
                          ReferenceMoE, check_checkpoint, launch)
from cobalt.torch.experts import TopKRouter
from cobalt.torch.routing_gather import check_input

import robustness_workers as rw

RTOL, ATOL = 1e-5, 1e-5


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out_dir = str(tmp_path_factory.mktemp("robustness"))
    try:
        launch(rw.worker, rw.WORLD, (out_dir,), timeout_s=150, collective_timeout_s=60)
    finally:
        saved = [os.path.join(out_dir, f"rank{r}.pt") for r in range(rw.WORLD)]
        loaded = [torch.load(p) if os.path.exists(p) else None for p in saved]
        failures = {r: res["failures"] for r, res in enumerate(loaded) if res and res["failures"]}
        assert not failures, f"scenarios failed: {failures}"
    return loaded  # type: ignore[return-value]


def reference_grads(losses: list[str], micro_batches: list[int]) -> tuple[list[torch.Tensor],
                                                                          torch.Tensor]:
    """Expert gradients [w1, w3, w2] and the router gradient of the summed losses over the given
    micro-batches of every rank ('target': sum(y * target), 'square': sum(y ** 2))."""
    ref = ReferenceMoE(rw.H, rw.F, rw.E, rw.K, seed=rw.SEED)
    for index in micro_batches:
        parts = [rw.micro_batch(r, index) for r in range(rw.WORLD)]
        x = torch.cat([p[0] for p in parts])
        target = torch.cat([p[1] for p in parts])
        y = ref(x, router_chunks=rw.TOKENS)
        loss = torch.zeros(())
        for kind in losses:
            loss = loss + ((y * target).sum() if kind == "target" else (y ** 2).sum())
        loss.backward()
    return [ref.w1.grad, ref.w3.grad, ref.w2.grad], ref.router.weight.grad  # type: ignore


def assert_grads(got: dict[str, Any], ref: tuple[list[torch.Tensor], torch.Tensor]) -> None:
    for name, a, b in zip(("w1", "w3", "w2"), got["grads"], ref[0]):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=f"{name} gradients differ")
    torch.testing.assert_close(got["router"], ref[1], rtol=RTOL, atol=ATOL,
                               msg="router gradient differs")


def test_accumulation_across_a_layout_change(results: list[dict[str, Any]]) -> None:
    ref = reference_grads(["target"], [0, 1])
    for rank, res in enumerate(results):
        got = res["accumulation"]
        assert got["moves"][1] > got["moves"][0], "the second micro-batch moved no main instance"
        assert got["vacant"] == 0.0
        assert_grads(got, ref)
        torch.testing.assert_close(got["router"], results[0]["accumulation"]["router"],
                                   rtol=0, atol=0, msg=f"rank {rank}'s router gradient differs")


def test_layout_change_waits_for_a_pending_backward(results: list[dict[str, Any]]) -> None:
    ref = reference_grads(["target"], [0, 1])
    for res in results:
        got = res["two_forwards"]
        assert got["deferred"] == 1
        assert got["moves_before"] == 0, "main instances moved under a pending backward"
        assert got["moves_after"] > 0, "the deferred layout change never landed"
        assert_grads(got, ref)


def test_retained_graph_counts_every_pass_once(results: list[dict[str, Any]]) -> None:
    ref = reference_grads(["target", "square"], [0])
    for res in results:
        got = res["retained_graph"]
        assert got["replicas"] == 16
        assert_grads(got, ref)


def test_float64_training_migrates_exactly(results: list[dict[str, Any]]) -> None:
    got = results[0]["float64"]
    moving, fixed = got["moving"], got["fixed"]
    assert moving["rollbacks"] == 0 and moving["versions"] == 4 and moving["moves"] > 0
    for a, b in zip(moving["weights"], fixed["weights"]):
        assert a.dtype == torch.float64
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_step_without_tokens(results: list[dict[str, Any]]) -> None:
    for rank, res in enumerate(results):
        assert res["empty_step"]["empty_shape"] == (0, rw.H)
        assert res["empty_step"]["after_shape"] == (rw.TOKENS[rank], rw.H)


def test_input_dtype_mismatch_raises_on_every_rank(results: list[dict[str, Any]]) -> None:
    for rank, res in enumerate(results):
        error = res["dtype_mismatch"]["error"]
        assert error is not None and "rank 0: input has dtype torch.float64" in error, error
        assert res["dtype_mismatch"]["after_shape"] == (rw.TOKENS[rank], rw.H)


def test_checkpoint_after_layout_changes(results: list[dict[str, Any]]) -> None:
    got = results[0]["checkpoint"]
    assert got["moves"] > 0
    for a, b in zip(got["before"], got["after"]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert (got["main_rank"][0] == got["main_rank"][1]).all()
    assert got["capacity_error"] is not None and "capacity" in got["capacity_error"]


def test_activation_checkpointing_replays_the_original_decisions(
        results: list[dict[str, Any]]) -> None:
    for rank, res in enumerate(results):
        got = res["activation_checkpointing"]
        plain = got["none"]
        assert plain["calls"] == 4 and plain["records"] == 4 and plain["replayed"] == 0
        assert plain["moves"] > 0
        for mode in ("reentrant", "non_reentrant"):
            run = got[mode]
            assert run["calls"] == 4, f"{mode}: the layout source was asked {run['calls']} times"
            assert run["records"] == 4 and run["moves"] == plain["moves"], mode
            assert run["replayed"] == 4, mode
            for layer in range(2):
                for a, b in zip(run["grads"][layer], plain["grads"][layer]):
                    torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL,
                                               msg=f"rank {rank} {mode} layer {layer}")
                torch.testing.assert_close(run["router"][layer], plain["router"][layer],
                                           rtol=RTOL, atol=ATOL)
            for a, b in zip(run["x_grads"], plain["x_grads"]):
                torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)


def test_checkpointed_micro_batches_replay_their_own_decisions(
        results: list[dict[str, Any]]) -> None:
    for rank, res in enumerate(results):
        got = res["checkpointed_micro_batches"]
        assert got["non_reentrant"]["replayed"] == 5
        for a, b in zip(got["non_reentrant"]["grads"], got["none"]["grads"]):
            torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=f"rank {rank}")
        error = got["ambiguous_error"]
        assert error is not None and "two forwards of this step" in error, error


def test_router_only_pass_then_zero_grad_leaves_nothing_stale(
        results: list[dict[str, Any]]) -> None:
    for res in results:
        got = res["auxiliary_pass"]
        torch.testing.assert_close(got["aux_then_zero"], got["clean"], rtol=0, atol=0)


def test_retained_graph_holds_main_instances(results: list[dict[str, Any]]) -> None:
    ref = reference_grads(["target"], [0, 0, 1])  # graph 0 backpropagated twice
    for res in results:
        got = res["retained_then_migrate"]
        assert got["moves_under_graph"] == 0 and got["deferred"] == 1
        assert got["vacant"] == 0.0
        assert_grads(got, ref)


def test_dropped_forwards_leave_no_window_open(results: list[dict[str, Any]]) -> None:
    for res in results:
        assert res["forwards_without_backward"]["open_windows"] == 0, res["forwards_without_backward"]


def test_checkpoint_loading(results: list[dict[str, Any]]) -> None:
    for res in results:
        got = res["checkpoint_loading"]
        assert got["weights_only"] is None, got["weights_only"]
        assert got["refused"] is not None and "world_size" in got["refused"]
        assert got["bank_unchanged"] and got["router_unchanged"]
        assert got["refused_pending"] is not None and (
            "load_state_dict while a forward waits for its backward pass (load between steps)"
            in got["refused_pending"]), got["refused_pending"]
        assert got["unchanged_pending"] and got["loaded_after"]


def test_frozen_expert_weights_are_not_updated(results: list[dict[str, Any]]) -> None:
    ref = reference_grads(["target"], [0])
    for rank, res in enumerate(results):
        got = res["frozen_experts"]
        assert got["all_frozen"]["grads"] == [False] * 3, f"rank {rank}: frozen bank has .grad"
        assert got["all_frozen"]["bank_changed"] == [False] * 3, f"rank {rank}: bank stepped"
        assert got["all_frozen"]["router_changed"]
        w2 = got["w2_frozen"]
        assert not w2["w2_grad"] and not w2["w2_changed"], f"rank {rank}: frozen w2 updated"
        for name, a, b in zip(("w1", "w3"), w2["grads"][:2], ref[0][:2]):
            torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=f"{name} gradients differ")


def test_router_only_passes_are_summed_at_their_end(results: list[dict[str, Any]]) -> None:
    ref = ReferenceMoE(rw.H, rw.F, rw.E, rw.K, seed=rw.SEED)
    parts = [rw.micro_batch(r, 0) for r in range(rw.WORLD)]
    x = torch.cat([p[0] for p in parts])
    target = torch.cat([p[1] for p in parts])
    loss = (ref(x, router_chunks=rw.TOKENS) * target).sum()
    for chunk in torch.split(x, rw.TOKENS):  # the auxiliary loss, twice, on every rank's tokens
        loss = loss + 2 * (ref.router(chunk)[1] ** 2).sum()
    loss.backward()
    for rank, res in enumerate(results):
        got = res["auxiliary_after_main"]["router"]
        torch.testing.assert_close(got, results[0]["auxiliary_after_main"]["router"], rtol=0,
                                   atol=0, msg=f"rank {rank}'s router gradient differs")
        torch.testing.assert_close(got, ref.router.weight.grad, rtol=RTOL, atol=ATOL)


def test_non_cpu_tensors_raise_on_every_rank(results: list[dict[str, Any]]) -> None:
    for rank, res in enumerate(results):
        got = res["device_mismatch"]
        assert got["input"] is not None and "rank 0: input is on device meta" in got["input"]
        assert got["router"] is not None and \
            "rank 2: router returned topk_ids on device meta" in got["router"]
        assert got["bank"] is not None and "rank 1: expert bank is on device meta" in got["bank"]
        for error in (got["input"], got["router"], got["bank"]):
            assert "CPU tensors only" in error and "\n" not in error
        assert got["after_shape"] == (rw.TOKENS[rank], rw.H)


def test_exec_rank_of_the_wrong_shape_or_dtype_is_refused(results: list[dict[str, Any]]) -> None:
    for res in results:
        error = res["bad_exec_rank"]["error"]
        tokens = sum(rw.TOKENS)
        assert error is not None and (
            f"layout source 'flat' returned exec_rank of shape [{tokens * rw.K}], expected "
            f"[tokens, top_k] = [{tokens}, {rw.K}]") in error, error
        # Cast to int32, both would have become the right ranks again.
        error = res["bad_exec_rank"]["float_error"]
        assert error is not None and ("layout source 'float' returned exec_rank of dtype "
                                      "float64, expected integers") in error, error
        error = res["bad_exec_rank"]["wrapped_error"]
        assert error is not None and "layout source 'wrapped' returned exec_rank 42949672" in \
            error and f"for task 0, out of range [0, {rw.WORLD})" in error, error


def test_layers_that_differ_between_ranks_fail_on_every_rank(
        results: list[dict[str, Any]]) -> None:
    for rank, res in enumerate(results):
        got = res["settings_disagreement"]
        others = ", ".join(str(r) for r in range(rw.WORLD) if r != 1)
        for key, words in (("top_k", f"top_k: {rw.K} on ranks {others}; 3 on rank 1"),
                           ("hidden",
                            f"hidden size: {rw.H} on ranks {others}; {rw.H + 1} on rank 1"),
                           ("dtype", f"input dtype: float32 on ranks {others}; float64 on rank 1")):
            assert got[key] is not None and words in got[key], (rank, key, got[key])
        for key, words in (("no_grad", "gradient mode (1: enabled; torch.no_grad() on some ranks "
                                        f"only?): 1 on ranks {others}; 0 on rank 1"),
                           ("frozen", f"expert bank's requires_grad (1: trainable; experts frozen "
                                      f"on some ranks only?): 1 on ranks {others}; 0 on rank 1")):
            assert got[key] is not None and words in got[key], (rank, key, got[key])
        for key in ("router_frozen", "no_sync"):
            words = (f"dense gradient elements summed per backward pass (trainable router "
                     f"parameters with sync_dense_grads, 0: none; router frozen or "
                     f"sync_dense_grads off on some ranks only?): {rw.E * rw.H} on ranks "
                     f"{others}; 0 on rank 1")
            assert got[key] is not None and words in got[key], (rank, key, got[key])
        assert got["no_sync_no_grad"] is None, got["no_sync_no_grad"]
        assert got["from_sizes"] is not None and (
            f"rank {rank} of world size {2 * rw.WORLD} given, but the process group has this "
            f"process as rank {rank} of {rw.WORLD}") in got["from_sizes"], got["from_sizes"]
        assert got["after_shape"][1] == rw.H


def test_forward_under_inference_mode(results: list[dict[str, Any]]) -> None:
    for res in results:
        got = res["inference_mode"]
        assert got["equal"] and not got["inference_tensor"]
        assert got["moves"] > 0 and got["rollbacks"] == 0


def _one_process_layer(rank: int = 0) -> ExpertParallelMoE:
    """A layer of rank `rank` of a 2 x 2 group, built without a process group (loading a
    state_dict needs no collective)."""
    ep = EPGroup.from_sizes(rank, rw.WORLD, rw.RANKS_PER_NODE)
    rt = ExpertParallelRuntime(ep, FixedLayoutSource(rw.layout(rw.LAYOUT_A), seed=rw.SEED))
    return ExpertParallelMoE(rt, 0, rw.H, rw.F, rw.E, rw.K, seed=rw.SEED)


def test_refused_checkpoint_changes_nothing_and_check_checkpoint() -> None:
    model = nn.ModuleDict({"embed": nn.Linear(rw.H, rw.H), "moe": _one_process_layer()})
    good = model.state_dict()
    check_checkpoint(model, good)  # fits: no error
    bad = {k: (v + 1.0 if torch.is_tensor(v) and v.is_floating_point() else v)
           for k, v in good.items()}
    extra = dict(bad["moe.experts._extra_state"])
    extra["world_size"] = 2 * rw.WORLD
    bad["moe.experts._extra_state"] = extra
    before = {k: v.clone() for k, v in good.items() if torch.is_tensor(v)}
    with pytest.raises(ValueError, match=r"check_checkpoint: ExpertStore 'moe.experts': .*"
                                         r"world_size = 8, this store has 4"):
        check_checkpoint(model, bad)
    moe = model["moe"]
    with pytest.raises(ValueError, match="world_size = 8"):
        moe.load_state_dict({k[len("moe."):]: v for k, v in bad.items() if k.startswith("moe.")})
    after = model.state_dict()
    for k, v in before.items():  # nothing changed: not the router, not the bank
        assert torch.equal(after[k], v), k
    # Missing placement or bank tensors of the wrong shape are refused too (strict by default).
    missing = {k: v for k, v in good.items() if k != "moe.experts._extra_state"}
    with pytest.raises(ValueError, match="has no 'moe.experts._extra_state'"):
        check_checkpoint(model, missing)
    # Bank rows without their placement cannot be placed: refused even when not strict, and by
    # load_state_dict before any row is copied (strict or not).
    with pytest.raises(ValueError, match="has no 'moe.experts._extra_state'"):
        check_checkpoint(model, missing, strict=False)
    no_bank = {k: v for k, v in missing.items() if not k.startswith("moe.experts.")}
    check_checkpoint(model, no_bank, strict=False)
    shifted = {k: (v + 1.0 if torch.is_tensor(v) and v.is_floating_point() else v)
               for k, v in missing.items() if k.startswith("moe.")}
    for strict in (True, False):
        with pytest.raises(ValueError, match=r"has moe\.experts\.w1, moe\.experts\.w3, "
                                             r"moe\.experts\.w2 but no 'moe\.experts\._extra_state'"):
            model.load_state_dict(shifted, strict=strict)
        with pytest.raises(ValueError, match=r"has w1, w3, w2 but no '_extra_state'"):
            moe.experts.load_state_dict({k[len("moe.experts."):]: v for k, v in shifted.items()
                                         if k.startswith("moe.experts.")}, strict=strict)
        after = model.state_dict()
        for k, v in before.items():
            assert torch.equal(after[k], v), k
    # Another rank's checkpoint (each rank's bank holds its own experts) is refused.
    theirs = _one_process_layer(rank=1).state_dict()
    with pytest.raises(ValueError, match="saved by rank 1, loaded on rank 0"):
        moe.load_state_dict(theirs)
    with pytest.raises(ValueError, match="saved by rank 1, loaded on rank 0"):
        check_checkpoint(moe, theirs)
    after = model.state_dict()
    for k, v in before.items():
        assert torch.equal(after[k], v), k
    wrong = dict(good)
    wrong["moe.experts.w2"] = good["moe.experts.w2"][:, :, :-1]
    with pytest.raises(ValueError, match=r"'moe.experts.w2' has shape \[3, 16, 7\], this store "
                                         r"\[3, 16, 8\]"):
        check_checkpoint(model, wrong)
    # The placement without all its bank rows: torch applied it and skipped the missing rows
    # (strict=False), so rows held other experts than the placement said; and a row of the wrong
    # shape made load_state_dict raise after applying it. Both are refused before anything
    # changes, and check_checkpoint refuses the first even when not strict.
    swapped = dict(good)
    extra = dict(good["moe.experts._extra_state"])
    extra["main_slot"] = extra["main_slot"].clone()
    first, second = [int(e) for e in np.flatnonzero(extra["main_rank"].numpy() == 0)[:2]]
    extra["main_slot"][[first, second]] = extra["main_slot"][[second, first]]
    swapped["moe.experts._extra_state"] = extra
    without_w1 = {k: v for k, v in swapped.items() if k != "moe.experts.w1"}
    with pytest.raises(ValueError, match=r"'moe.experts._extra_state' \(the main placement\) "
                                         r"but no moe.experts.w1"):
        check_checkpoint(model, without_w1, strict=False)
    wrong_shape = dict(swapped)
    wrong_shape["moe.experts.w2"] = good["moe.experts.w2"][:, :, :-1]
    for partial, words in ((without_w1, r"but no moe.experts.w1: a placement loads with all"),
                           ({k: v for k, v in swapped.items() if not k.startswith("moe.experts.w")},
                            "but no moe.experts.w1, moe.experts.w3, moe.experts.w2"),
                           (wrong_shape, r"'moe.experts.w2' has shape \[3, 16, 7\]")):
        with pytest.raises(ValueError, match=words):
            model.load_state_dict(partial, strict=False)
        after = model.state_dict()
        for k, v in before.items():
            assert torch.equal(after[k], v), k
        assert torch.equal(after["moe.experts._extra_state"]["main_slot"],
                           good["moe.experts._extra_state"]["main_slot"])
    # A malformed placement names what it lacks (was a bare KeyError).
    lacking = dict(good)
    lacking["moe.experts._extra_state"] = {k: v for k, v in extra.items() if k != "capacity"}
    with pytest.raises(ValueError, match="the extra state lacks capacity"):
        model.load_state_dict(lacking)
    with pytest.raises(ValueError, match="the extra state lacks capacity"):
        check_checkpoint(model, lacking)
    # A checkpoint that fits loads.
    other = nn.ModuleDict({"embed": nn.Linear(rw.H, rw.H), "moe": _one_process_layer()})
    other.load_state_dict(good)
    assert torch.equal(other["moe"].experts.w1, model["moe"].experts.w1)


def test_a_plain_callable_router_warns_that_its_parameters_are_not_synced() -> None:
    outside = nn.Linear(rw.H, rw.E)  # a module the layer does not own

    def router(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weights, ids = torch.topk(torch.softmax(outside(x), dim=-1), rw.K)
        return ids, weights

    ep = EPGroup.from_sizes(0, rw.WORLD, rw.RANKS_PER_NODE)
    rt = ExpertParallelRuntime(ep, FixedLayoutSource(rw.layout(rw.LAYOUT_A), seed=rw.SEED))
    with pytest.warns(UserWarning, match="router is a plain callable"):
        layer = ExpertParallelMoE(rt, 0, rw.H, rw.F, rw.E, rw.K, router=router)
    assert layer.dense_parameters() == []  # the case it warns about
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ExpertParallelMoE(rt, 0, rw.H, rw.F, rw.E, rw.K, router=router, sync_dense_grads=False)
        ExpertParallelMoE(rt, 0, rw.H, rw.F, rw.E, rw.K, router=TopKRouter(rw.H, rw.E, rw.K))


def test_recorder_step_without_tokens(results: list[dict[str, Any]]) -> None:
    for res in results:
        assert res["recorder_empty_step"] == {"num_steps": 2, "num_tokens": sum(rw.TOKENS)}


def test_mains_do_not_move_without_their_optimizer(results: list[dict[str, Any]]) -> None:
    for res in results:
        got = res["optimizer_declaration"]
        assert got["unattached"] is not None and got["unattached"].startswith(
            "ValueError: layout change: ranks 0, 1, 2, 3: main instances move, but no optimizer "
            "is attached"), got["unattached"]
        assert got["wrong_optimizer"] is not None and (
            "the attached Adam does not hold the expert bank's w1, w3, w2") in \
            got["wrong_optimizer"], got["wrong_optimizer"]
        assert got["unchanged"]
        assert got["not_an_optimizer"] is not None and "expected a torch.optim.Optimizer or " \
            "None, got ExpertParallelMoE" in got["not_an_optimizer"]
        assert got["moves"] == rw.E


def test_ranks_with_different_placements_raise_together(results: list[dict[str, Any]]) -> None:
    for res in results:
        error = res["placement_disagreement"]["error"]
        assert error is not None and error.startswith("RuntimeError: ") and \
            "ranks hold different main placements" in error, error


def test_router_or_source_failing_on_one_rank_raises_everywhere(
        results: list[dict[str, Any]]) -> None:
    for rank, res in enumerate(results):
        got = res["one_rank_fails"]
        assert got["router"] is not None and (
            "rank 1: router returned (list, list), expected (topk_ids, weights) tensors"
        ) in got["router"], got["router"]
        assert got["source"] is not None and got["source"].startswith("ValueError: ") and (
            "rank 2: layout source 'raising' raised RuntimeError: planner crashed"
        ) in got["source"], got["source"]
        assert got["after_shape"] == (rw.TOKENS[rank], rw.H)


def test_a_bank_dtype_without_cpu_kernels_is_refused_before_the_exchange() -> None:
    # float16 has no CPU matmul in torch 1.13: ranks with tasks would raise in the expert compute
    # while ranks without any waited in the combine exchange. check_input's message is agreed on
    # every rank (gather_routing) before any exchange.
    x = torch.zeros(3, rw.H, dtype=torch.float16)
    try:
        torch.ones(2, 2, dtype=torch.float16) @ torch.ones(2, 2, dtype=torch.float16)
        has_kernel = True
    except RuntimeError:
        has_kernel = False
    error = check_input(x, rw.H, torch.float16)
    if has_kernel:
        assert error is None
    else:
        assert error is not None and "torch.float16 has no CPU matmul" in error, error
    assert check_input(x.float(), rw.H, torch.float32) is None
    assert check_input(x.to(torch.bfloat16), rw.H, torch.bfloat16) is None


def test_one_element_optimizer_state_shaped_like_its_row_moves_with_the_expert() -> None:
    # A bank of one slot of 1 x 1 experts: Adam's moments have one element each, like its step
    # count, and were taken for scalars (left behind by a migration).
    ep = EPGroup.from_sizes(0, rw.WORLD, rw.RANKS_PER_NODE)
    one_each = cobalt.ExpertLayout.from_rank_lists(cobalt.Topology(rw.NODES, rw.WORLD), rw.WORLD,
                                                   1, [[r] for r in range(rw.WORLD)])
    rt = ExpertParallelRuntime(ep, FixedLayoutSource(one_each, seed=rw.SEED))
    layer = ExpertParallelMoE(rt, 0, 1, 1, rw.WORLD, 1, seed=rw.SEED)
    optimizer = torch.optim.Adam(layer.experts.bank, lr=0.1)
    for p in layer.experts.bank:
        p.grad = torch.ones_like(p)
    optimizer.step()
    names = [name for name, _ in layer.experts._moving_tensors(optimizer)]
    for part in ("w1", "w3", "w2"):
        assert f"{part}.exp_avg" in names and f"{part}.exp_avg_sq" in names, names
        assert f"{part}.step" not in names, names
