"""cobalt.cuda and cobalt._cuda.

Everywhere: the pointer-level module reports errors through cobalt's exception classes and checks
shapes before it touches a device; the torch wrappers refuse CPU tensors with a clear message.
`make test-cuda-compile` runs this file with COBALT_EXPECT_CUDA_MODULE=1, so there the module must
have been built; `bench/gpu/run.sh` (COBALT_GPU_PYTHON=1) also sets COBALT_EXPECT_CUDA_DEVICE=1, so
on the GPU machine the device must be usable rather than the GPU tests skipped. Where a GPU and a
CUDA build of torch are present (not on the CPU machines this project's CI uses), the CUDA path of cobalt.torch.ops is compared bit for bit with the CPU path.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import cobalt
import cobalt.cuda
from cobalt.torch import ops
from op_inputs import demand_of, random_ids, random_layout, random_sources

needs_module = pytest.mark.skipif(not cobalt.cuda.is_built(),
                                  reason="Cobalt built without nvcc (no cobalt._cuda)")
needs_gpu = pytest.mark.skipif(not cobalt.cuda.is_available(),
                               reason="no CUDA device usable from torch here")


def test_module_built_where_expected() -> None:
    if os.environ.get("COBALT_EXPECT_CUDA_MODULE") == "1":
        assert cobalt.cuda.is_built(), "cobalt._cuda missing although nvcc built the CUDA targets"


def test_device_usable_where_expected() -> None:
    if os.environ.get("COBALT_EXPECT_CUDA_DEVICE") == "1":
        module = cobalt.cuda._cuda
        assert cobalt.cuda.is_available(), (
            "no usable CUDA device although one is expected: cobalt._cuda built "
            f"{module is not None}, torch {torch.__version__} CUDA {torch.cuda.is_available()}, "
            f"driver device {bool(module.device_available()) if module is not None else 'n/a'}")


def test_wrappers_refuse_cpu_tensors() -> None:
    ids = torch.zeros((4, 2), dtype=torch.int32)
    with pytest.raises(ValueError, match="topk_ids must be a CUDA tensor, got device cpu"):
        cobalt.cuda.count_routing(ids, 8)
    with pytest.raises(ValueError, match="exec_rank must be a CUDA tensor"):
        cobalt.cuda.dispatch_layout(ids, 1, 2)
    with pytest.raises(ValueError, match="demand must be a CUDA tensor"):
        cobalt.cuda.solve_topoep(ids.long(), 1, 2, token_bytes=1.0, expert_param_bytes=1.0)


def test_assignment_keys_out_of_range_are_named_as_on_the_cpu() -> None:
    # Checked before anything touches the device: int() then pybind11's TypeError before.
    ids = torch.tensor([[0, 1], [2, 3], [1, 2], [3, 0]], dtype=torch.int32)
    layout = cobalt.ExpertLayout.static_ep(cobalt.Topology(1, 2), 4, 2)
    batch = cobalt.RoutingBatch(ids.numpy(), None, 4, 2)
    for key, value in (("seed", -1), ("step", 2**63), ("layer", 2**31),
                       ("token_offset", -2**63 - 1)):
        messages = []
        for call in (cobalt.cuda.assign_node_cover, None):
            with pytest.raises(cobalt.InvalidArgumentError) as info:
                if call is None:
                    cobalt.assign_node_cover(batch, layout, **{key: value})
                else:
                    call(ids, ids[:, 0], layout, **{key: value})
            messages.append(str(info.value))
        assert messages[0] == messages[1] and messages[0].startswith(f"{key} {value} out of")
    with pytest.raises(TypeError):
        cobalt.cuda.assign_node_cover(ids, ids[:, 0], layout, step=1.5)


@pytest.mark.skipif(cobalt.cuda.is_available(), reason="a CUDA device is usable here")
def test_device_layout_without_a_device_says_why() -> None:
    layout = cobalt.ExpertLayout.static_ep(cobalt.Topology(1, 2), 4, 2)
    with pytest.raises(RuntimeError, match="no usable CUDA device"):
        cobalt.cuda.DeviceLayout(layout)


@needs_module
def test_importing_the_module_keeps_the_core_error_mapping(tmp_path) -> None:
    # _cuda's exception translator was global: registered after _core's, it turned _core's
    # file errors (IoError, an OSError) into plain InvalidArgumentErrors once _cuda was imported.
    from cobalt import _cuda  # noqa: F401

    with pytest.raises(FileNotFoundError):
        cobalt.TraceReader(str(tmp_path / "missing.safetensors"))


@needs_module
def test_pointer_module_errors() -> None:
    from cobalt import _cuda

    with pytest.raises(cobalt.InvalidArgumentError, match="unknown cover search 'x'"):
        _cuda.assign_workspace_bytes(10, 4, 2, "x")
    with pytest.raises(cobalt.InvalidArgumentError, match="unknown statistics method 'y'"):
        _cuda.routing_counts_supported(8, "y")
    # The layout is validated on the host before any device memory is asked for.
    slots = np.array([[0, 9], [1, 2]], dtype=np.int32)
    with pytest.raises(cobalt.InvalidArgumentError, match="out of range"):
        _cuda.DeviceLayout(1, 2, 4, slots)
    with pytest.raises(cobalt.InvalidArgumentError, match=r"slots must be \[G=2, S\]"):
        _cuda.DeviceLayout(1, 2, 4, np.zeros((3, 2), dtype=np.int32))
    # Shape errors of the launchers come before any CUDA call.
    with pytest.raises(cobalt.InvalidArgumentError, match="top_k"):
        _cuda.count_routing(0, 10, 0, 8, 0, 0, 0, 0, 0, "global")
    assert _cuda.topoep_quota_capacity(8, 3) == 8 * 8 * 3
    # The GPU solver refuses the sizes the CPU solver refuses, before any CUDA call.
    for token_bytes, param_bytes in ((-1.0, 8.0), (8.0, float("nan")), (8.0, float("inf"))):
        with pytest.raises(cobalt.InvalidArgumentError, match="finite and >= 0"):
            _cuda.solve_topoep(1, 2, 2, 1, token_bytes, param_bytes, 0, 1, 0, 0, 0, 0, 0, 0, 0,
                               0, 0, 0)
    if not _cuda.device_available():
        # No device: the runtime error names the CUDA call, as cobalt.InternalError.
        with pytest.raises(cobalt.InternalError, match="CUDA: "):
            _cuda.DeviceLayout(1, 2, 4, np.array([[0, 1], [2, 3]], dtype=np.int32))


# --- GPU: the CUDA path of cobalt.torch.ops equals the CPU path ----------------------------------

@needs_gpu
@pytest.mark.parametrize("nodes,per_node,experts,k", [(2, 4, 16, 2), (4, 8, 64, 8),
                                                      (12, 2, 48, 12), (3, 2, 12, 6)])
def test_gpu_assign_matches_cpu(nodes: int, per_node: int, experts: int, k: int) -> None:
    rng = np.random.default_rng(nodes + k)
    topo = cobalt.Topology(nodes, nodes * per_node)
    layout = random_layout(rng, topo, experts, experts // topo.num_ranks + 3)
    ids = random_ids(rng, 5000, experts, k, skew=1.0)
    src = random_sources(rng, 5000, topo.num_ranks)
    device_layout = cobalt.cuda.DeviceLayout(layout)
    for search in ("auto", "masks", "subset_dp"):
        if search == "masks" and nodes > 20:
            continue
        cpu = ops.assign_tasks(ids, src, layout, seed=9, step=4, layer=2, token_offset=77,
                               search=search)
        gpu = ops.assign_tasks(ids.cuda(), src.cuda(), device_layout, seed=9, step=4, layer=2,
                               token_offset=77, search=search, validate=True)
        assert torch.equal(gpu.cpu(), cpu), search


@needs_gpu
@pytest.mark.parametrize("method", ["auto", "shared", "shared_plain", "global"])
def test_gpu_routing_counts_match_cpu(method: str) -> None:
    rng = np.random.default_rng(1)
    for experts, k in [(16, 2), (64, 8), (128, 6), (40, 20)]:
        ids = random_ids(rng, 7000, experts, k, skew=2.0)
        counts, coact = ops.routing_counts(ids, experts)
        g_counts, g_coact = ops.routing_counts(ids.cuda(), experts, method=method)
        assert torch.equal(g_counts.cpu(), counts) and torch.equal(g_coact.cpu(), coact)


@needs_gpu
def test_gpu_dispatch_layout_matches_cpu() -> None:
    rng = np.random.default_rng(2)
    topo = cobalt.Topology(4, 32)
    exec_rank = torch.from_numpy(rng.integers(0, 32, (3000, 8), dtype=np.int32))
    src = random_sources(rng, 3000, 32)
    cpu = ops.dispatch_layout(exec_rank, src, topo)
    gpu = ops.dispatch_layout(exec_rank.cuda(), src.cuda(), topo)
    for name in ("rank_counts", "node_counts", "rank_offsets", "slot", "token_in_rank",
                 "pair_counts"):
        assert torch.equal(getattr(gpu, name).cpu(), getattr(cpu, name)), name


@needs_gpu
def test_gpu_topoep_matches_cpu() -> None:
    rng = np.random.default_rng(4)
    topo = cobalt.Topology(4, 32)
    ids = random_ids(rng, 8192, 128, 8, skew=1.2)
    src = random_sources(rng, 8192, 32)
    omega = demand_of(ids, src, 32, 128)
    cpu = ops.solve_topoep(omega, topo, 7, token_bytes=14336.0, expert_param_bytes=8.8e7)
    gpu = ops.solve_topoep(omega.cuda(), topo, 7, token_bytes=14336.0, expert_param_bytes=8.8e7)
    for name in ("slots", "source_offsets", "quota_expert", "quota_dst", "quota_count",
                 "rank_loads", "stats"):
        assert torch.equal(getattr(gpu, name).cpu(), getattr(cpu, name)), name
