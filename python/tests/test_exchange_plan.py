"""The exchange plan in one process: simulate every rank's all-to-alls with numpy and check that
dispatch delivers the right tokens, combine returns the right sums, and the rows crossing node
boundaries equal the C++ metric V (cross_node_transfers.dedup), for the C++ plan and its numpy
reference; and the two are equal field for field on random routings."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import cobalt
from cobalt.torch.exchange_plan import (
    ExchangePlan,
    RoutingGlobal,
    build_exchange_plan,
    build_exchange_plan_reference,
)

BUILDERS = {"cpp": build_exchange_plan, "reference": build_exchange_plan_reference}


def _all_to_all(send: list[np.ndarray], send_splits: list[list[int]]) -> list[np.ndarray]:
    """Simulated all_to_all_single: rank i's rows for rank j arrive at j ordered by sender."""
    g = len(send)
    chunks = [np.split(send[i], np.cumsum(send_splits[i])[:-1]) for i in range(g)]
    return [np.concatenate([chunks[i][j] for i in range(g)], axis=0) for j in range(g)]


def _cross_rows(send_splits: list[list[int]], m: int) -> tuple[int, int]:
    cross = intra = 0
    for i, splits in enumerate(send_splits):
        for j, n in enumerate(splits):
            assert not (i == j and n), "a rank never sends to itself"
            if i // m != j // m:
                cross += n
            else:
                intra += n
    return cross, intra


def _random_case(rng: np.random.Generator, nodes: int, m: int, experts: int, k: int, slots: int):
    g = nodes * m
    topo = cobalt.Topology(nodes, g)
    lists: list[list[int]] = [[] for _ in range(g)]
    for e in range(experts):  # one replica each, then random extra replicas
        lists[e * g // experts].append(e)
    for r in range(g):
        extra = [e for e in rng.permutation(experts) if e not in lists[r]]
        lists[r] += extra[: max(0, slots - len(lists[r]) - int(rng.integers(0, 2)))]
    layout = cobalt.ExpertLayout.from_rank_lists(topo, experts, slots, lists)
    per_rank = rng.integers(0, 9, size=g)
    offsets = np.r_[0, np.cumsum(per_rank)]
    t = int(offsets[-1])
    ids = np.stack([rng.choice(experts, size=k, replace=False) for _ in range(t)]).astype(np.int32)
    src = np.repeat(np.arange(g, dtype=np.int32), per_rank)
    batch = cobalt.RoutingBatch(ids.reshape(t, k), src, experts, g)
    exe = cobalt.assign_node_cover(batch, layout, seed=int(rng.integers(1 << 30)))
    return topo, layout, batch, ids, src, exe, offsets


@pytest.mark.parametrize("builder", list(BUILDERS))
@pytest.mark.parametrize("nodes,m", [(2, 2), (2, 4), (4, 2), (3, 1)])
def test_plan_routes_tokens_and_sums(nodes: int, m: int, builder: str) -> None:
    rng = np.random.default_rng(nodes * 10 + m)
    experts, k, h = 12, 3, 5
    g = nodes * m
    slots = -(-experts // g) + 2
    for _ in range(5):
        topo, layout, batch, ids, src, exe, offsets = _random_case(rng, nodes, m, experts, k, slots)
        routing = RoutingGlobal(ids, exe, src, offsets, np.asarray(layout.slots), m)
        plans: list[ExchangePlan] = [BUILDERS[builder](routing, r) for r in range(g)]
        x_all = rng.standard_normal((batch.num_tokens, h))
        xs = [x_all[offsets[r] : offsets[r + 1]] for r in range(g)]
        # Dispatch.
        recv1 = _all_to_all([xs[r][plans[r].s1_send_idx] for r in range(g)],
                            [p.s1_send_splits for p in plans])
        recv2 = _all_to_all([recv1[r][plans[r].s2_send_idx] for r in range(g)],
                            [p.s2_send_splits for p in plans])
        tables = [np.concatenate([xs[r], recv1[r], recv2[r]])[plans[r].table_idx] for r in range(g)]
        # Expert e multiplies by (e + 1); partial sums per table row.
        partial = []
        for r in range(g):
            p = plans[r]
            out = np.zeros_like(tables[r])
            for j, (rows, kk) in enumerate(zip(p.slot_rows, p.slot_k)):
                e = int(layout.slots[r][j])
                for row, kpos in zip(rows, kk):
                    out[row] += (e + 1) * tables[r][row] * (kpos + 1)
            partial.append(out)
        # Combine.
        recv_a = _all_to_all([partial[r][plans[r].ca_send_idx] for r in range(g)],
                             [p.ca_send_splits for p in plans])
        rail = []
        for r in range(g):
            p = plans[r]
            q = np.zeros((sum(p.cb_send_splits), h))
            np.add.at(q, p.q_own_dst, partial[r][p.q_own_src])
            np.add.at(q, p.q_recv_dst, recv_a[r][p.q_recv_src])
            rail.append(q)
        recv_b = _all_to_all(rail, [p.cb_send_splits for p in plans])
        for r in range(g):
            p = plans[r]
            y = np.zeros_like(xs[r])
            np.add.at(y, p.y_own_dst, partial[r][p.y_own_src])
            np.add.at(y, p.y_recv_a_dst, recv_a[r][p.y_recv_a_src])
            np.add.at(y, p.y_recv_b_dst, recv_b[r])
            tok = np.arange(offsets[r], offsets[r + 1])
            scale = ((ids[tok] + 1) * (np.arange(k) + 1)).sum(axis=1)
            np.testing.assert_allclose(y, xs[r] * scale[:, None], rtol=1e-12, atol=1e-12)
        # Rows crossing nodes = the C++ metric, in both directions.
        v = cobalt.cross_node_transfers(batch, exe, topo)
        d_cross, d_intra = _cross_rows([p.s1_send_splits for p in plans], m)
        s2_cross, s2_intra = _cross_rows([p.s2_send_splits for p in plans], m)
        a_cross, a_intra = _cross_rows([p.ca_send_splits for p in plans], m)
        b_cross, b_intra = _cross_rows([p.cb_send_splits for p in plans], m)
        assert d_cross + s2_cross == v.dedup
        assert a_cross + b_cross == v.dedup
        assert s2_cross == 0 and a_cross == 0 and b_intra == 0
        assert plans[0].totals["dispatch_cross_rows"] == v.dedup
        assert d_intra + s2_intra == a_intra == plans[0].totals["dispatch_intra_rows"]


def _assert_plans_equal(a: ExchangePlan, b: ExchangePlan, where: str) -> None:
    for f in dataclasses.fields(ExchangePlan):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == np.int64 and np.asarray(y).dtype == np.int64, f"{where}: {f.name}"
            np.testing.assert_array_equal(x, y, err_msg=f"{where}: {f.name}")
        elif f.name in ("slot_rows", "slot_k"):
            assert len(x) == len(y), f"{where}: {f.name}"
            for j, (u, v) in enumerate(zip(x, y)):
                assert u.dtype == np.int64 and v.dtype == np.int64, f"{where}: {f.name}[{j}]"
                np.testing.assert_array_equal(u, v, err_msg=f"{where}: {f.name}[{j}]")
        else:
            assert x == y, f"{where}: {f.name}: {x!r} != {y!r}"


@pytest.mark.parametrize("nodes,m", [(1, 4), (2, 2), (2, 4), (4, 2), (3, 1), (3, 3), (8, 1)])
def test_cpp_plan_equals_numpy_reference(nodes: int, m: int) -> None:
    """Field for field on random routings: skewed token counts (ranks without tokens), K from 1 to
    6, several tasks of a token on one rank, layouts with many replicas."""
    rng = np.random.default_rng(1000 + nodes * 10 + m)
    g = nodes * m
    for case in range(12):
        experts = int(rng.integers(max(2, g // 2), 3 * g + 2))
        k = 1 if case == 0 else int(rng.integers(1, min(6, experts) + 1))  # case 0: K = 1
        slots = -(-experts // g) + int(rng.integers(0, 4))
        _, layout, batch, ids, src, exe, offsets = _random_case(rng, nodes, m, experts, k, slots)
        routing = RoutingGlobal(ids, exe, src, offsets, np.asarray(layout.slots), m)
        for r in range(g):
            _assert_plans_equal(build_exchange_plan(routing, r),
                                build_exchange_plan_reference(routing, r),
                                f"{nodes}x{m} case {case} rank {r}")


def test_cpp_plan_rejects_bad_routing() -> None:
    topo = cobalt.Topology(2, 4)
    ids = np.array([[0, 1], [2, 3], [1, 2]], dtype=np.int32)
    exe = np.array([[0, 1], [2, 3], [1, 2]], dtype=np.int32)
    slots = np.array([0, -1], dtype=np.int32)
    with pytest.raises(ValueError, match="source ranks must be non-decreasing"):
        cobalt.exchange_plan(ids, exe, np.array([1, 0, 2], dtype=np.int32), topo, slots, 0)
    with pytest.raises(ValueError, match=r"execution rank 7 of token 1 \(position 0\) out of range"):
        cobalt.exchange_plan(ids, np.array([[0, 1], [7, 3], [1, 2]], dtype=np.int32),
                             np.array([0, 0, 1], dtype=np.int32), topo, slots, 0)
    with pytest.raises(ValueError, match=r"rank 4 out of range \[0, 4\)"):
        cobalt.exchange_plan(ids, exe, np.array([0, 0, 1], dtype=np.int32), topo, slots, 4)
    with pytest.raises(ValueError, match="rank 1 executes expert 1 .token 0. but does not hold it"):
        cobalt.exchange_plan(ids, exe, np.array([0, 0, 1], dtype=np.int32), topo,
                             np.array([0, -1], dtype=np.int32), 1)
    with pytest.raises(ValueError, match="disagree"):
        cobalt.exchange_plan(ids, exe[:2], np.array([0, 0, 1], dtype=np.int32), topo, slots, 0)


def test_cpp_plan_of_an_empty_step_equals_reference() -> None:
    topo = cobalt.Topology(2, 4)
    layout = cobalt.ExpertLayout.static_ep(topo, 8, 2)
    empty = np.zeros((0, 2), dtype=np.int32)
    routing = RoutingGlobal(empty, empty, np.zeros(0, dtype=np.int32), np.zeros(5, dtype=np.int64),
                            np.asarray(layout.slots), 2)
    for r in range(4):
        plan = build_exchange_plan(routing, r)
        _assert_plans_equal(plan, build_exchange_plan_reference(routing, r), f"rank {r}")
        assert plan.num_table_rows == 0 and sum(plan.s1_send_splits) == 0

