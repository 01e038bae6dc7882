"""cobalt._core: error translation, zero-copy views, and agreement with the C++ semantics."""

from __future__ import annotations

import pickle
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

import cobalt


def _batch(num_tokens: int = 64, experts: int = 16, k: int = 2, ranks: int = 8,
           seed: int = 0) -> cobalt.RoutingBatch:
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.choice(experts, k, replace=False) for _ in range(num_tokens)])
    return cobalt.RoutingBatch(ids.astype(np.int32), None, experts, ranks)


def test_errors_map_to_value_and_runtime_errors() -> None:
    with pytest.raises(ValueError, match="not divisible by the number of nodes 3"):
        cobalt.Topology(3, 4)
    assert issubclass(cobalt.InvalidArgumentError, ValueError)
    assert issubclass(cobalt.FailedPreconditionError, RuntimeError)
    assert issubclass(cobalt.InternalError, RuntimeError)
    with pytest.raises(cobalt.InvalidArgumentError, match=r"expert id 17 out of range \[0, 16\)"):
        cobalt.RoutingBatch(np.array([[0, 17]], dtype=np.int32), None, 16, 8)
    with pytest.raises(cobalt.FailedPreconditionError, match="replica budget too small"):
        cobalt.make_policy("static", cobalt.PolicyConfig(cobalt.Topology(2, 8), 64, 2,
                                                         slots_per_rank=2))
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        cobalt.make_policy("nope", cobalt.PolicyConfig(cobalt.Topology(2, 8), 16, 2,
                                                       slots_per_rank=3))
    layout = cobalt.ExpertLayout.static_ep(cobalt.Topology(2, 8), 16, 2)
    batch = _batch()
    with pytest.raises(ValueError, match="does not hold"):
        cobalt.validate_assignment(batch, layout, np.zeros((64, 2), dtype=np.int32))
    with pytest.raises(ValueError, match="exec_rank holds 2 ranks, the batch has 128 tasks"):
        cobalt.validate_assignment(batch, layout, np.zeros(2, dtype=np.int32))


def test_integer_inputs_are_never_silently_changed() -> None:
    """ids are checked, not wrapped or truncated; a batch owns read-only copies of its arrays
    (changing the caller's array after validation cannot reach the C++ side)."""
    with pytest.raises(ValueError, match=r"values \[2, 4294967297\] out of range"):
        cobalt.RoutingBatch(np.array([[2**32 + 1, 2]]), None, 8, 2)
    with pytest.raises(ValueError, match="expected an integer array, got dtype float64"):
        cobalt.RoutingBatch(np.array([[1.9, 2.7]]), None, 8, 2)
    with pytest.raises(ValueError, match="got dtype bool"):
        cobalt.RoutingBatch(np.array([[True, False]]), None, 8, 2)
    assert cobalt.RoutingBatch(np.array([[1, 2]], dtype=np.uint64), None, 8, 2).num_tokens == 1
    ids = np.array([[1, 2], [3, 4]], dtype=np.int32)
    batch = cobalt.RoutingBatch(ids, None, 8, 2)
    ids[:] = 50_000_000
    assert batch.topk_ids.tolist() == [[1, 2], [3, 4]]
    with pytest.raises(ValueError, match="read-only"):
        batch.topk_ids[0, 0] = 5
    loads, _ = cobalt.count_routing(batch)
    assert loads.tolist() == [0, 1, 1, 1, 1, 0, 0, 0]


def test_topology_and_layout_views() -> None:
    topo = cobalt.Topology.parse("2x4")
    assert (topo.num_nodes, topo.num_ranks, topo.ranks_per_node) == (2, 8, 4)
    assert topo.node_of(5) == 1 and str(topo) == "2x4"
    assert pickle.loads(pickle.dumps(topo)) == topo
    layout = cobalt.ExpertLayout.static_ep(topo, 16, 3)
    slots = layout.slots
    assert slots.shape == (8, 3) and slots.dtype == np.int32 and not slots.flags.writeable
    np.testing.assert_array_equal(slots[:, :2].ravel(), np.arange(16))
    assert (slots[:, 2] == cobalt.EMPTY_SLOT).all()
    assert list(layout.ranks_of(5)) == [2] and list(layout.ranks_of(9, 1)) == [4]
    assert list(layout.ranks_of(9, 0)) == []
    assert layout.node_masks.dtype == np.uint64 and int(layout.node_masks[9]) == 2
    again = cobalt.ExpertLayout(topo, 16, slots)
    assert again == layout and pickle.loads(pickle.dumps(layout)) == layout
    lists = [list(map(int, slots[r][slots[r] >= 0])) for r in range(8)]
    lists[0].append(15)
    moved = cobalt.ExpertLayout.from_rank_lists(topo, 16, 3, lists)
    d = cobalt.diff(layout, moved)
    assert d.num_cross_node == 1 and d.moves[0].expert == 15 and d.moves[0].dst_rank == 0
    with pytest.raises(ValueError, match="out of range"):
        layout.ranks_of(16)


def test_routing_batch_owns_copies_of_torch_and_numpy_inputs() -> None:
    ids = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32)
    src = torch.tensor([0, 1, 7], dtype=torch.int32)
    batch = cobalt.RoutingBatch(ids, src, 8, 8)
    assert batch.topk_ids.__array_interface__["data"][0] != ids.data_ptr()
    assert not batch.topk_ids.flags.writeable and not batch.source_rank.flags.writeable
    ids[0, 0] = 7  # the validated batch does not see it
    assert batch.topk_ids.tolist() == [[0, 1], [2, 3], [4, 5]]
    np.testing.assert_array_equal(batch.source_rank, src.numpy())
    converted = cobalt.RoutingBatch(ids.to(torch.int64), None, 8, 8)  # copied once to int32
    np.testing.assert_array_equal(converted.topk_ids, ids.numpy())
    np.testing.assert_array_equal(converted.source_rank, [0, 2, 5])  # floor(i * G / T)
    with pytest.raises(ValueError, match="token 1"):
        cobalt.RoutingBatch(np.array([[0, 1], [3, 3]], dtype=np.int32), None, 8, 8)
    # Private means numpy cannot make them writeable again either (their memory is not theirs).
    for kept in (batch, converted):
        for array in (kept.topk_ids, kept.source_rank):
            with pytest.raises(ValueError, match="cannot set WRITEABLE flag"):
                array.setflags(write=True)
    with pytest.raises(TypeError, match="topk_ids .* is required"):
        cobalt.RoutingBatch(None, None, 8, 8)


def test_balanced_assignment_with_a_kept_workspace_and_output() -> None:
    """A BalancedCoverWorkspace reused across batches of changing sizes and layouts (with and
    without the spill), and `out`, give the ranks of a fresh call; calls from several threads
    sharing one workspace take turns (its lock) and still agree."""
    rng = np.random.default_rng(21)
    workspace = cobalt.BalancedCoverWorkspace()
    assert workspace.capacity_bytes == 0
    expected = []
    calls = []
    for trial, (nodes, tokens, k) in enumerate([(2, 900, 2), (4, 3000, 4), (3, 200, 3),
                                               (4, 5000, 6)]):
        topo = cobalt.Topology(nodes, 4 * nodes)
        experts = 2 * topo.num_ranks
        lists = [[2 * r, 2 * r + 1] + [int(e) for e in rng.permutation(experts)[:2]
                                       if e not in (2 * r, 2 * r + 1)]
                 for r in range(topo.num_ranks)]
        layout = cobalt.ExpertLayout.from_rank_lists(topo, experts, 4, lists)
        ids = np.stack([rng.choice(experts, k, replace=False) for _ in range(tokens)])
        batch = cobalt.RoutingBatch(ids, rng.integers(0, topo.num_ranks, tokens), experts,
                                    topo.num_ranks)
        tolerance = 0.05 if trial % 2 else -1.0
        fresh = cobalt.assign_balanced_cover(batch, layout, spill_tolerance=tolerance)
        kept = cobalt.assign_balanced_cover(batch, layout, spill_tolerance=tolerance,
                                            workspace=workspace)
        np.testing.assert_array_equal(kept, fresh)
        assert workspace.capacity_bytes >= 4 * tokens * k
        out = np.full((tokens, k), -7, dtype=np.int32)
        written = cobalt.assign_balanced_cover(batch, layout, spill_tolerance=tolerance,
                                               out=out, workspace=workspace)
        assert written is out or np.shares_memory(written, out)
        np.testing.assert_array_equal(out, fresh)
        expected.append(fresh)
        calls.append((batch, layout, tolerance))
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(
            lambda i: cobalt.assign_balanced_cover(calls[i % 4][0], calls[i % 4][1],
                                                   spill_tolerance=calls[i % 4][2],
                                                   workspace=workspace), range(16)))
    for i, ranks in enumerate(results):
        np.testing.assert_array_equal(ranks, expected[i % 4])
    batch, layout, _ = calls[0]
    with pytest.raises(ValueError, match=r"out has shape \[5\], the batch needs \[900, 2\] "
                                         r"\(or \[1800\]\)"):
        cobalt.assign_balanced_cover(batch, layout, out=np.zeros(5, dtype=np.int32))
    with pytest.raises(ValueError, match=r"out has shape \[2, 900\]"):  # the right size, transposed
        cobalt.assign_node_cover(batch, layout, out=np.zeros((2, 900), dtype=np.int32))
    read_only = np.zeros((900, 2), dtype=np.int32)
    read_only.setflags(write=False)
    with pytest.raises(ValueError, match="out is read-only"):
        cobalt.assign_node_cover(batch, layout, out=read_only)
    with pytest.raises(TypeError, match="out must be a numpy int32 array, got Tensor"):
        cobalt.assign_node_cover(batch, layout, out=torch.zeros((900, 2), dtype=torch.int32))
    # An `out` the call could only fill through a converted copy is refused, not left unwritten.
    for wrong in (np.asfortranarray(np.full((900, 2), -7, np.int32)),
                  np.full((900, 4), -7, np.int32)[:, :2], np.full((900, 2), -7, np.int64)):
        for assign in (cobalt.assign_balanced_cover, cobalt.assign_node_cover):
            with pytest.raises(TypeError, match="out must be (an int32 array|C-contiguous)"):
                assign(batch, layout, out=wrong)
        assert (wrong == -7).all()
    with pytest.raises(TypeError):
        cobalt.assign_balanced_cover(batch, layout, workspace=object())


def test_int_inputs_are_narrowed_in_one_checked_pass_like_numpy() -> None:
    """IntArray's one-pass narrowing (C-contiguous native int64/uint64/int32/uint32 into an int32
    argument) against numpy's checked cast: the same values where every one fits, the same error
    where one does not, and the batch's arrays never share memory with the input."""
    rng = np.random.default_rng(11)
    int32_min, int32_max = np.iinfo(np.int32).min, np.iinfo(np.int32).max
    for trial in range(300):
        dtype = [np.int64, np.uint64, np.uint32, np.int32, np.int16][trial % 5]
        tokens, k = int(rng.integers(1, 40)), int(rng.integers(1, 5))
        ids = np.stack([rng.permutation(16)[:k] for _ in range(tokens)]).astype(dtype)
        bad = trial % 3 == 0 and np.iinfo(dtype).max > int32_max
        if bad:  # one value that int32 cannot hold (possibly < 0 after wrapping)
            info = np.iinfo(dtype)
            choices = [v for v in (int32_max + 1, 2**32 + 1, info.max, int32_min - 1, info.min)
                       if info.min <= v <= info.max and not int32_min <= v <= int32_max]
            value = choices[int(rng.integers(len(choices)))]
            ids[rng.integers(tokens), rng.integers(k)] = value
        layouts = [ids, np.asfortranarray(ids), ids[::-1].copy()[::-1]]  # strided: slow path
        for source in layouts:
            if bad:
                with pytest.raises(ValueError, match=r"RoutingBatch topk_ids: integer array values "
                                   r"\[-?\d+, \d+\] out of range \[-2147483648, 2147483647\]"):
                    cobalt.RoutingBatch(source, None, 16, 2)
                continue
            batch = cobalt.RoutingBatch(source, np.zeros(tokens, dtype=dtype), 16, 2)
            np.testing.assert_array_equal(batch.topk_ids, ids.astype(np.int32))
            assert batch.topk_ids.dtype == np.int32 and batch.topk_ids.flags.c_contiguous
            assert not batch.topk_ids.flags.writeable and not batch.source_rank.flags.writeable
            assert not np.shares_memory(batch.topk_ids, source)
    # The sign counts: uint32 2^31 has int32's bits of -2^31 but is not that value.
    with pytest.raises(ValueError, match="out of range"):
        cobalt.RoutingBatch(np.array([[2**31]], dtype=np.uint32), None, 16, 2)
    with pytest.raises(ValueError, match="RoutingBatch source_rank: integer array values"):
        cobalt.RoutingBatch(np.array([[1]], dtype=np.int64), np.array([2**40]), 16, 2)
    with pytest.raises(ValueError, match="expected an integer array, got dtype float64"):
        cobalt.RoutingBatch(np.array([[1.0]]), None, 16, 2)


def test_every_cpu_kernel_writes_the_same_ranks() -> None:
    rng = np.random.default_rng(4)
    # K = 5: three unused lanes; 12 nodes: the subset search (its set list in byte lanes)
    for nodes, k in ((4, 8), (3, 5), (12, 6)):
        topo = cobalt.Topology(nodes, 4 * nodes)
        ranks = topo.num_ranks
        lists = []  # rank r: experts 2r and 2r + 1, then two random others (replicas)
        for r in range(ranks):
            others = [int(e) for e in rng.permutation(2 * ranks) if e not in (2 * r, 2 * r + 1)]
            lists.append([2 * r, 2 * r + 1] + others[:2])
        layout = cobalt.ExpertLayout.from_rank_lists(topo, 2 * ranks, 4, lists)
        batch = _batch(num_tokens=500, experts=2 * ranks, k=k, ranks=ranks, seed=nodes)
        portable = cobalt.assign_node_cover(batch, layout, seed=9, step=2,
                                            kernel=cobalt.CpuKernel.PORTABLE)
        np.testing.assert_array_equal(cobalt.assign_node_cover(batch, layout, seed=9, step=2),
                                      portable)
        if cobalt.avx512_kernel_available():
            avx = cobalt.assign_node_cover(batch, layout, seed=9, step=2,
                                           kernel=cobalt.CpuKernel.AVX512)
            np.testing.assert_array_equal(avx, portable)
        else:
            with pytest.raises(cobalt.FailedPreconditionError, match="AVX-512"):
                cobalt.assign_node_cover(batch, layout, kernel=cobalt.CpuKernel.AVX512)
    with pytest.raises(ValueError, match="top-k in \\[1, 8\\]"):  # K = 9: more tasks than lanes
        cobalt.assign_node_cover(_batch(num_tokens=4, experts=2 * ranks, k=9, ranks=ranks), layout,
                                 kernel=cobalt.CpuKernel.AVX512)


def test_dispatch_layout_into_a_kept_workspace() -> None:
    rng = np.random.default_rng(11)
    topo = cobalt.Topology(2, 8)
    ws = cobalt.DispatchLayoutWorkspace(topo, max_tokens=300, max_top_k=4)
    addresses = None
    for tokens, k in ((300, 4), (120, 3), (0, 2), (300, 4)):
        exec_rank = rng.integers(0, 8, size=(tokens, k), dtype=np.int32)
        source = rng.integers(0, 8, size=tokens, dtype=np.int32)
        fresh = cobalt.dispatch_layout(exec_rank, source, topo)
        kept = cobalt.dispatch_layout(exec_rank, source, topo, workspace=ws)
        assert set(kept) == set(fresh)
        for name, value in fresh.items():
            np.testing.assert_array_equal(kept[name], value, err_msg=name)
            assert kept[name].size == 0 or not kept[name].flags.writeable
        if tokens == 300:  # the same buffers every call: nothing reallocated
            now = {n: v.__array_interface__["data"][0] for n, v in kept.items()}
            assert addresses is None or now == addresses
            addresses = now
    with pytest.raises(ValueError, match="exceed the workspace's 300 x 4"):
        cobalt.dispatch_layout(np.zeros((301, 2), np.int32), np.zeros(301, np.int32), topo,
                               workspace=ws)
    with pytest.raises(ValueError, match="exceed the workspace's 300 x 4"):
        cobalt.dispatch_layout(np.zeros((3, 5), np.int32), np.zeros(3, np.int32), topo,
                               workspace=ws)
    with pytest.raises(ValueError, match="the workspace is for"):
        cobalt.dispatch_layout(np.zeros((3, 2), np.int32), np.zeros(3, np.int32),
                               cobalt.Topology(4, 8), workspace=ws)
    with pytest.raises(ValueError, match="out of range"):
        cobalt.DispatchLayoutWorkspace(topo, max_tokens=-1, max_top_k=4)


def test_imbalance_floor_of_a_layout() -> None:
    topo = cobalt.Topology(2, 4)
    # Expert 0 on ranks 0 and 1, expert 1 on rank 2, expert 2 on rank 3.
    layout = cobalt.ExpertLayout.from_rank_lists(topo, 3, 1, [[0], [0], [1], [2]])
    counts = np.array([9, 2, 1], dtype=np.int64)  # expert 0's 9 tasks split 5 / 4 at best
    assert cobalt.min_max_rank_load(counts, layout) == 5
    assert cobalt.imbalance_floor(counts, layout) == pytest.approx(5 * 4 / 12)
    assert cobalt.imbalance_floor(np.zeros(3, dtype=np.int64), layout) == 1.0
    batch = cobalt.RoutingBatch(np.array([[0], [0], [1]], dtype=np.int32),
                                np.zeros(3, dtype=np.int32), 3, 4)
    metrics = cobalt.step_metrics(batch, np.array([[0], [1], [2]], dtype=np.int32), topo)
    np.testing.assert_array_equal(metrics.expert_counts, [2, 1, 0])
    with pytest.raises(ValueError, match="2 expert counts for a layout of 3 experts"):
        cobalt.min_max_rank_load(np.array([1, 2], dtype=np.int64), layout)
    with pytest.raises(ValueError, match="must be >= 0"):
        cobalt.imbalance_floor(np.array([1, -2, 0], dtype=np.int64), layout)


def test_balanced_assignment_and_floor_swaps() -> None:
    rng = np.random.default_rng(3)
    topo = cobalt.Topology(2, 8)
    experts = 16
    layout = cobalt.ExpertLayout.static_ep(topo, experts, 3)
    ids = np.argsort(rng.random((600, experts)), axis=1)[:, :2].astype(np.int32)
    ids[:, 0] = 0  # expert 0 in every token: the static layout's single replica is the floor
    ids[ids[:, 1] == 0, 1] = 1
    src = rng.integers(0, topo.num_ranks, 600, dtype=np.int32)
    batch = cobalt.RoutingBatch(ids, src, experts, topo.num_ranks)
    balanced = cobalt.assign_balanced_cover(batch, layout)
    cobalt.validate_assignment(batch, layout, balanced)
    faithful = cobalt.assign_node_cover(batch, layout)
    assert (cobalt.cross_node_transfers(batch, balanced, topo).dedup ==
            cobalt.cross_node_transfers(batch, faithful, topo).dedup)
    counts = np.bincount(ids.ravel(), minlength=experts).astype(np.int64)
    loads = cobalt.rank_loads(balanced, topo.num_ranks)
    floor = cobalt.min_max_rank_load(counts, layout)
    assert loads.max() == floor == 600 + counts[1]  # rank 0 holds experts 0 and 1 only
    swapped = cobalt.swap_toward_floor(layout, counts, np.zeros((2, experts)), tolerance=0.05,
                                       max_swaps=8)
    assert swapped.floor_before == floor
    assert swapped.floor_after < floor and len(swapped.swaps) >= 1
    previous_floor = floor
    for rank, slot, removed, added, floor_after, exchange_rank, _ in swapped.swaps:
        assert exchange_rank == -1  # free slots and replicas of expert 1 are there
        assert added == 0 and swapped.layout.slots[rank, slot] == 0
        assert removed == layout.slots[rank, slot]
        assert floor_after < previous_floor
        previous_floor = floor_after
    assert previous_floor == swapped.floor_after
    assert swapped.floor_after == cobalt.min_max_rank_load(counts, swapped.layout)
    spilled = cobalt.assign_balanced_cover(batch, swapped.layout, spill_tolerance=0.05)
    cobalt.validate_assignment(batch, swapped.layout, spilled)
    assert cobalt.rank_loads(spilled, topo.num_ranks).max() < floor
    with pytest.raises(ValueError, match="spill_tolerance nan must be finite"):
        cobalt.assign_balanced_cover(batch, layout, spill_tolerance=float("nan"))
    with pytest.raises(ValueError, match="removal costs, expected N x E"):
        cobalt.swap_toward_floor(layout, counts, np.zeros(experts))
    grouped = cobalt.swap_toward_floor(layout, counts, np.zeros((2, experts)), tolerance=0.05,
                                       max_swaps=8, max_group_swaps=3)
    assert grouped.floor_after <= swapped.floor_after
    assert grouped.floor_after == cobalt.min_max_rank_load(counts, grouped.layout)
    with pytest.raises(ValueError, match="max_group_swaps -1 must be >= 0"):
        cobalt.swap_toward_floor(layout, counts, np.zeros((2, experts)), max_group_swaps=-1)


def test_tied_covers_are_drawn_from_the_key() -> None:
    """Expert 0 lives on nodes 1, 2 and 3 alone; tokens from node 0 reach one of them, drawn from
    (seed, step, layer, token): both assignments draw the same covers, spread over the three."""
    topo = cobalt.Topology(4, 8)
    slots = np.full((8, 1), 1, dtype=np.int32)
    slots[[2, 4, 6], 0] = 0
    layout = cobalt.ExpertLayout(topo, 2, slots)
    ids = np.zeros((3000, 1), dtype=np.int32)
    batch = cobalt.RoutingBatch(ids, np.zeros(3000, dtype=np.int32), 2, 8)
    for key in ({}, {"seed": 3, "step": 2, "layer": 1, "token_offset": 7}):
        plain = cobalt.assign_node_cover(batch, layout, **key)
        balanced = cobalt.assign_balanced_cover(batch, layout, **key)
        assert np.array_equal(plain // 2, balanced // 2)  # the same node for every token
        per_node = np.bincount(plain.ravel() // 2, minlength=4)
        assert per_node[0] == 0 and all(abs(n - 1000) < 100 for n in per_node[1:])
    other = cobalt.assign_balanced_cover(batch, layout, seed=4)
    assert not np.array_equal(other, cobalt.assign_balanced_cover(batch, layout))
    with pytest.raises(ValueError, match="seed"):
        cobalt.assign_balanced_cover(batch, layout, seed=-1)


def test_assignment_metrics_and_policies_agree() -> None:
    topo = cobalt.Topology(2, 8)
    batch = _batch()
    layout = cobalt.ExpertLayout.static_ep(topo, 16, 3)
    out = np.empty((64, 2), dtype=np.int32)
    exe = cobalt.assign_node_cover(batch, layout, seed=3, out=out)
    assert exe is out or np.shares_memory(exe, out)
    np.testing.assert_array_equal(out, (batch.topk_ids * 8) // 16)  # one replica: its rank
    v = cobalt.cross_node_transfers(batch, out, topo)
    src_node = batch.source_rank // 4
    expect = sum(len({int(r) // 4 for r in out[t]} - {int(src_node[t])}) for t in range(64))
    assert v.dedup == expect and v.no_dedup >= v.dedup
    loads = cobalt.rank_loads(out, 8)
    assert loads.sum() == 128 and cobalt.imbalance(loads) == pytest.approx(loads.max() / 16)
    with pytest.raises(ValueError, match="out of range"):
        cobalt.cross_node_transfers(batch, np.full((64, 2), 9, dtype=np.int32), topo)
    cfg = cobalt.PolicyConfig(topo, 16, 2, slots_per_rank=3, steps_per_global_plan=2)
    for name in cobalt.policy_names():
        policy = cobalt.make_policy(name, cfg)
        assert policy.name == name
        for step in range(3):
            layout_s, exe_s = policy.run(step, 0, batch)
            assert exe_s.shape == (64, 2)
            cobalt.validate_assignment(batch, layout_s, exe_s)
    with pytest.raises(ValueError, match="made for E=16"):
        cobalt.make_policy("static", cfg).run(0, 0, _batch(experts=32))


def test_step_timing_rows_match_the_policies() -> None:
    topo = cobalt.Topology(2, 8)
    batch = _batch(num_tokens=256)
    rows = cobalt.time_step_operations(batch, topo, slots_per_rank=3, step=4, layer=1, reps=2)
    names = [r["name"] for r in rows]
    assert names[:3] == ["copy_bound", "stats_update", "plan_heuristic"]
    assert names[-5:] == ["cobalt_plan_step", "cobalt_step", "cobalt+_plan_step", "cobalt+_step",
                          "topoep_step"]
    assert all(r["reps"] == 2 and 0 <= r["min_ms"] <= r["median_ms"] for r in rows)
    assign = rows[names.index("assign")]
    assert assign["copy_ratio"] > 0 and assign["items"] == 256 and assign["unit"] == "tokens"
    # The plan-step row is the policy's second step, as the simulator runs it.
    config = cobalt.PolicyConfig(topo, 16, 2, slots_per_rank=3)
    config.num_layers = 2
    policy = cobalt.make_policy("cobalt", config)
    policy.run(4, 1, batch)
    _, exe = policy.run(5, 1, batch)
    v = cobalt.cross_node_transfers(batch, exe, topo).dedup
    assert rows[names.index("cobalt_plan_step")]["note"].startswith(f"V {v},")
    with pytest.raises(ValueError, match="slots per rank out of range"):
        cobalt.time_step_operations(batch, topo, slots_per_rank=1)
    with pytest.raises(ValueError, match="reps 0 out of range"):
        cobalt.time_step_operations(batch, topo, slots_per_rank=3, reps=0)


def test_micro_batches_fold_into_their_step() -> None:
    rng = np.random.default_rng(5)
    ids = np.argsort(rng.random((400, 16)), axis=1)[:, :4].astype(np.int32)
    src = rng.integers(0, 8, 400, dtype=np.int32)
    whole, halves = cobalt.RoutingStats(16, 0.5), cobalt.RoutingStats(16, 0.5)
    for _ in range(2):
        whole.update(cobalt.RoutingBatch(ids, src, 16, 8))
        halves.update(cobalt.RoutingBatch(ids[:150], src[:150], 16, 8))
        halves.fold_into_last_update(cobalt.RoutingBatch(ids[150:], src[150:], 16, 8))
    assert halves.num_updates == whole.num_updates == 2
    assert np.array_equal(halves.coactivation, whole.coactivation)  # decay 0.5: exact sums
    assert np.array_equal(halves.expert_load, whole.expert_load)


def test_stats_planner_and_rebalance() -> None:
    topo = cobalt.Topology(2, 8)
    batch = _batch(num_tokens=256)
    stats = cobalt.RoutingStats.exact_counts(16)
    stats.update(batch)
    counts, coact = cobalt.count_routing(batch)
    np.testing.assert_array_equal(stats.expert_load, counts)
    np.testing.assert_array_equal(stats.coactivation, coact)
    view = stats.expert_load
    stats.update(batch)  # live view
    np.testing.assert_array_equal(view, 2 * counts)
    summary = stats.ochiai_summary()
    direct = cobalt.summarize_ochiai(stats.expert_load, stats.coactivation)
    assert summary.top_partner == direct.top_partner > 0
    plan_in = cobalt.GlobalPlanInput(topo, 16, 3, stats.expert_load, stats.coactivation, eps=0.2)
    result = cobalt.plan_global_heuristic(plan_in, num_restarts=2, seed=1)
    assert result.within_cap == (cobalt.check_node_plan(plan_in, result.plan) == "")
    assert result.restart_within_cap == [cobalt.check_node_plan(plan_in, p) == ""
                                         for p in result.restart_plans]
    # Counts no count_routing could make, and a co-activation the planner cannot use: ValueError.
    lopsided = np.array(coact)
    lopsided[1, 2] += 1
    with pytest.raises(ValueError, match="symmetric"):
        stats.update_counts(counts, lopsided)
    with pytest.raises(ValueError, match="symmetric"):
        cobalt.plan_global_heuristic(
            cobalt.GlobalPlanInput(topo, 16, 3, stats.expert_load, lopsided.astype(float),
                                   eps=0.2))
    assert cobalt.check_node_plan(plan_in, result.plan) == ""
    assert result.plan.replicas.shape == (16, 2)
    layout, loads = cobalt.pack_ranks(plan_in, result.plan)
    assert layout.num_experts == 16 and loads.shape == (8, 3)
    rebalanced = cobalt.rebalance_intra_node(layout, loads)
    assert rebalanced.layout.num_replicas == layout.num_replicas
    with pytest.raises(ValueError, match="slot loads"):
        cobalt.rebalance_intra_node(layout, np.zeros(3))


def test_trace_round_trip(tmp_path) -> None:
    rng = np.random.default_rng(1)
    ids = np.stack([np.stack([rng.choice(8, 2, replace=False) for _ in range(10)])
                    for _ in range(3)]).astype(np.int32)
    data = cobalt.TraceData(8, topk_ids=ids, step_offsets=np.array([0, 4, 10]),
                            source_rank=np.arange(10, dtype=np.int32) % 4, num_sources=4,
                            metadata={"model": "toy"})
    path = str(tmp_path / "t.safetensors")
    cobalt.write_trace(path, data)
    reader = cobalt.TraceReader(path)
    assert (reader.num_experts, reader.top_k, reader.num_layers, reader.num_tokens,
            reader.num_steps, reader.num_sources) == (8, 2, 3, 10, 2, 4)
    np.testing.assert_array_equal(reader.topk_ids(1), ids[1])
    np.testing.assert_array_equal(reader.topk_ids(2, 4, 10), ids[2, 4:])
    np.testing.assert_array_equal(reader.source_rank(), np.arange(10) % 4)
    assert not reader.topk_ids(0).flags.writeable
    assert reader.metadata["model"] == "toy" and reader.metadata["format"] == "cobalt-trace"
    loaded = reader.load()
    np.testing.assert_array_equal(loaded.topk_ids, ids)
    stats = cobalt.compute_trace_stats(reader)
    assert stats.num_layers == 3 and stats.ochiai_top_partner is not None
    bad = ids.copy()
    bad[0, 0, 0] = 8
    with pytest.raises(ValueError, match="topk_ids"):
        cobalt.write_trace(str(tmp_path / "bad.safetensors"), cobalt.TraceData(8, topk_ids=bad))
    (tmp_path / "junk.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    with pytest.raises(ValueError, match="junk.safetensors"):
        cobalt.TraceReader(str(tmp_path / "junk.safetensors"))


def test_cobalt_plus_prices_layouts_with_a_cost_model() -> None:
    topo = cobalt.Topology(2, 16)
    cost = cobalt.CostParams.from_presets("4x8-b200", "glm-4.5-air")
    assert cost.token_bytes == 4096 * 2 and cost.expert_param_bytes == 3 * 4096 * 1408 * 2
    # Experts so large, and compute so cheap, that no replica, re-layout or move can pay.
    cost.expert_ffn_size = 1 << 20
    cost.achievable_flops = 1e30
    config = cobalt.PolicyConfig(topo, 32, 4, slots_per_rank=3, steps_per_global_plan=2,
                                 planner_restarts=2, cost_model=cost)
    assert config.cost_model is not None and config.cost_model.expert_ffn_size == 1 << 20
    copy = cobalt.PolicyConfig(topo, 32, 4, slots_per_rank=3, cost_model=cost)
    held = copy.cost_model  # a copy: stays valid when the config drops its cost model
    copy.cost_model = None
    assert copy.cost_model is None and held.expert_ffn_size == 1 << 20
    policy = cobalt.make_policy("cobalt+", config)
    static = cobalt.ExpertLayout.static_ep(topo, 32, 3)
    for step in range(6):
        layout, exec_rank = policy.run(step, 0, _batch(400, 32, 4, 16, seed=step))
        assert layout == static
    assert policy.counters.num_global_plans == 0 and policy.counters.intra_node_moves == 0
    bad = cobalt.CostParams()
    bad.ib_bytes_per_s_per_node = -1.0
    with pytest.raises(ValueError, match="IB bandwidth"):
        cobalt.make_policy("cobalt+", cobalt.PolicyConfig(topo, 32, 4, slots_per_rank=3,
                                                          cost_model=bad))
    with pytest.raises(ValueError, match="unknown"):
        cobalt.CostParams.from_presets("nope")


def test_one_policy_driven_from_two_threads() -> None:
    """Policy.run releases the GIL; calls from several threads are serialised on the policy
    (its state is not thread-safe: cobalt+'s layers share one assignment workspace), so two
    layers driven from two threads get the ranks of a serial run. Without the lock this run
    crashed or corrupted ranks (checked by removing it: 8192-token batches make calls overlap)."""
    import threading

    cfg = cobalt.PolicyConfig(cobalt.Topology(2, 16), 64, 4, num_layers=2, slots_per_rank=6)
    num_steps = 12
    batches = {}
    for layer in (0, 1):
        rng = np.random.default_rng(layer)
        for step in range(num_steps):
            ids = np.argsort(rng.random((8192, 64)), axis=1)[:, :4].astype(np.int32)
            batches[layer, step] = cobalt.RoutingBatch(ids, None, 64, 16)
    serial = cobalt.make_policy("cobalt+", cfg)  # layers are independent: any order will do
    expected = {key: serial.run(key[1], key[0], batches[key])[1] for key in sorted(batches)}
    policy = cobalt.make_policy("cobalt+", cfg)
    got: dict[tuple[int, int], np.ndarray] = {}
    errors: list[BaseException] = []

    def drive(layer: int) -> None:
        try:
            for step in range(num_steps):
                layout, exec_rank = policy.run(step, layer, batches[layer, step])
                cobalt.validate_assignment(batches[layer, step], layout, exec_rank)
                got[layer, step] = exec_rank
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(layer,)) for layer in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for key, ranks in expected.items():
        np.testing.assert_array_equal(got[key], ranks, err_msg=f"layer, step {key}")
    assert policy.counters.num_global_plans >= 2


def test_environment_is_read_at_load_and_on_reload(monkeypatch) -> None:
    # COBALT_CPU_KERNEL is read when the library loads and by reload_environment(), not per call:
    # a call may run on worker threads, where getenv races with os.environ's writes.
    topo = cobalt.Topology(2, 4)
    layout = cobalt.ExpertLayout.static_ep(topo, 8, 2)
    batch = cobalt.RoutingBatch(np.array([[0, 5]], np.int32), np.array([0], np.int32), 8, 4)
    try:
        with monkeypatch.context() as env:
            env.setenv("COBALT_CPU_KERNEL", "bogus")
            cobalt.assign_node_cover(batch, layout)  # the snapshot: no error yet
            cobalt.reload_environment()
            with pytest.raises(cobalt.InvalidArgumentError, match="COBALT_CPU_KERNEL=bogus"):
                cobalt.assign_node_cover(batch, layout)
    finally:
        cobalt.reload_environment()  # the environment as it was before the test
    cobalt.assign_node_cover(batch, layout)


def test_outputs_sized_by_the_input_are_checked_against_the_memory_budget(monkeypatch) -> None:
    """count_routing's [E, E] matrix and a dispatch workspace's [T, G] flags: a one-line error
    naming the size, not a bare MemoryError from std::bad_alloc."""
    ids = np.array([[0, 1]], np.int32)
    batch = cobalt.RoutingBatch(ids, np.array([0], np.int32), 4096, 4)
    topo = cobalt.Topology(2, 16)
    try:
        with monkeypatch.context() as env:
            env.setenv("COBALT_MEMORY_LIMIT", "64M")  # the 4096 x 4096 matrix needs 128 MiB
            cobalt.reload_environment()
            with pytest.raises(cobalt.FailedPreconditionError,
                               match="count_routing: the 4096 x 4096 co-activation matrix needs"):
                cobalt.count_routing(batch)
            with pytest.raises(cobalt.FailedPreconditionError,
                               match="dispatch workspace: 8388608 tokens x 16 ranks"):
                cobalt.DispatchLayoutWorkspace(topo, 2**23, 8)
            # Broadcast arrays take no memory until they are copied into contiguous ones.
            wide = np.broadcast_to(np.int32(1), (2**24, 2))
            with pytest.raises(cobalt.FailedPreconditionError,
                               match=r"a C-contiguous copy of the int32 array of shape "
                                     r"\(16777216, 2\)"):
                cobalt.RoutingBatch(wide, np.zeros(2**24, np.int32), 4, 4)
            loads = np.broadcast_to(np.float64(1), (2**24,))
            with pytest.raises(cobalt.FailedPreconditionError, match="float64 array of shape"):
                cobalt.GlobalPlanInput(topo, 2**24, 1, loads, np.zeros((1, 1)))
    finally:
        cobalt.reload_environment()
    loads, coact = cobalt.count_routing(batch)
    assert loads[:2].tolist() == [1, 1] and coact[0, 1] == 1
    assert cobalt.DispatchLayoutWorkspace(topo, 1024, 8).max_tokens == 1024


def test_float_arguments_take_real_numbers_only() -> None:
    # A plain forcecast read the string '1' as 1.0 and dropped imaginary parts.
    topo = cobalt.Topology(2, 8)
    e = 16
    for bad in (np.array(["1"] * e), np.ones(e, np.complex128), np.ones(e, bool),
                np.array([object()] * e)):
        with pytest.raises(cobalt.InvalidArgumentError, match="real-valued numeric array"):
            cobalt.GlobalPlanInput(topo, e, 3, bad, np.zeros((e, e)))
    # Integers and lists of numbers still convert.
    cobalt.GlobalPlanInput(topo, e, 3, np.arange(e), [[0.0] * e] * e)


def test_paths_with_a_nul_byte_are_refused(tmp_path) -> None:
    # The kernel would read the path only up to the NUL: another file than the one named.
    data = cobalt.TraceData(8, np.array([[[0, 1], [2, 3]]], np.int32))
    with pytest.raises(cobalt.InvalidArgumentError, match="NUL byte"):
        cobalt.write_trace(str(tmp_path / "a\x00b"), data)
    assert not (tmp_path / "a").exists()
    with pytest.raises(cobalt.InvalidArgumentError, match="NUL byte"):
        cobalt.TraceReader(str(tmp_path / "a\x00b"))


def test_planner_restarts_are_bounded() -> None:
    # 10^7 restarts ran for ever, 2^31 - 1 ran out of memory.
    topo = cobalt.Topology(2, 8)
    with pytest.raises(cobalt.InvalidArgumentError, match=r"out of range \[1, 4096\]"):
        cobalt.make_policy("cobalt", cobalt.PolicyConfig(topo, 16, 2, slots_per_rank=3,
                                                         planner_restarts=10**7))
    gi = cobalt.GlobalPlanInput(topo, 16, 3, np.ones(16), np.zeros((16, 16)))
    with pytest.raises(cobalt.InvalidArgumentError, match=r"out of range \[1, 4096\]"):
        cobalt.plan_global_heuristic(gi, num_restarts=2**31 - 1)


def test_destroying_a_policy_lets_other_threads_run_while_its_plan_finishes() -> None:
    """A cobalt policy with async_planning launches stage 1 on a thread of its own; destroying
    the policy waits for that plan. It waits without the GIL, so another Python thread runs
    meanwhile at a good part of its own speed (it used to stop for the whole wait, apart from a
    switch interval's worth). Checked only when the wait lasted (a plan that ended before the
    del leaves nothing to wait for)."""
    import threading
    import time

    rng = np.random.default_rng(5)
    num_experts, num_tokens = 1024, 4096
    ids = np.argpartition(rng.random((num_tokens, num_experts)), 8, axis=1)[:, :8]
    batch = cobalt.RoutingBatch(ids.astype(np.int32), None, num_experts, 64)
    config = cobalt.PolicyConfig(cobalt.Topology(8, 64), num_experts, 8, slots_per_rank=24,
                                 steps_per_global_plan=1, async_planning=True,
                                 planner_restarts=1, num_threads=1)
    policy = cobalt.make_policy("cobalt", config)
    policy.run(0, 0, batch)  # the first observation
    counter = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            counter[0] += 1

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        start, first = time.perf_counter(), counter[0]
        time.sleep(0.1)  # the spinner's own speed, with this thread asleep
        per_second = (counter[0] - first) / (time.perf_counter() - start)
        policy.run(1, 0, batch)  # launches the plan in the background
        before = counter[0]
        start = time.perf_counter()
        del policy  # waits for the plan
        waited = time.perf_counter() - start
        during = counter[0] - before
    finally:
        stop.set()
        spinner.join()
    if waited > 0.05:
        assert during > 0.2 * per_second * waited, (waited, during, per_second)
