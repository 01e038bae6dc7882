"""Training state that does not depend on the world size or the bank capacity.

A checkpoint from ``model.state_dict()`` and ``optimizer.state_dict()`` holds each rank's own
bank rows, so it loads back only on the same world size and capacity. :func:`gather_training_state`
writes every expert as full ``[E, ...]`` tensors instead (its weights and the optimizer's state
rows, e.g. Adam's moments), with the other parameters, buffers and their optimizer state by name;
:func:`load_training_state` puts it into a model and optimizer of any world size, node shape or
capacity, each rank taking its main instances' rows. Both can run through one rank (``dst`` /
``src``), so that only it holds every expert. Optimizer hyperparameters (learning rate,
betas) and learning-rate schedulers are not part of it: they come from the new optimizer.
"""

from __future__ import annotations

import operator
from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from cobalt.torch.expert_store import ExpertStore
from cobalt.torch.reduce import all_reduce_disjoint_

__all__ = ["gather_training_state", "load_training_state"]

_FORMAT = "cobalt-training-state"
_NAMES = ("w1", "w3", "w2")


def _copy(value: Any) -> Any:
    return value.detach().clone() if torch.is_tensor(value) else value


def _is_scalar_state(value: Any, param: torch.Tensor) -> bool:
    """Optimizer state that is per bank tensor, not per slot (as ExpertStore._moving_tensors
    decides): non-tensors, 0-d tensors and one-element tensors not shaped like the parameter."""
    return (not torch.is_tensor(value) or value.dim() == 0
            or (value.numel() == 1 and value.shape != param.shape))


def _rank_arg(value: Any) -> Any:
    """A `dst` / `src` argument as every rank compares it: None, an int (numpy integers too), or
    for anything else (a bool, a float, a str) its repr, which is no rank, so that every rank
    refuses it together."""
    if value is None:
        return None
    if isinstance(value, bool):
        return repr(value)
    try:
        return operator.index(value)
    except TypeError:
        return repr(value)


def _rank_disagreement(values: list[Any], world: int, name: str) -> Optional[str]:
    """Why the ranks' `name` arguments (gathered, as _rank_arg gives them) are unusable, or None:
    they must be one rank of [0, world) on every rank, or None on every rank."""
    first = values[0]
    if all(v == first and type(v) is type(first) for v in values) and \
            (first is None or (isinstance(first, int) and 0 <= first < world)):
        return None
    return (f"{name} must be the same rank in [0, {world}) on every rank (or None on every "
            f"rank), got {values} by rank")


def _held(optimizer: Optional[torch.optim.Optimizer]) -> set[int]:
    if optimizer is None:
        return set()
    return {id(p) for group in optimizer.param_groups for p in group["params"]}


def _local_rows(store: ExpertStore) -> tuple[torch.Tensor, torch.Tensor]:
    """(experts, bank slots) of this rank's main instances."""
    local = store.local_experts()
    return (torch.as_tensor(local, dtype=torch.long),
            torch.as_tensor(store.main_slot[local], dtype=torch.long))


def _gather_rows(store: ExpertStore, tensor: torch.Tensor, experts: torch.Tensor,
                 slots: torch.Tensor, dst: Optional[int]) -> Optional[torch.Tensor]:
    """The [E, ...] tensor of every expert's main row of `tensor` (a [capacity, ...] bank
    tensor), bit for bit: on every rank when `dst` is None, else on rank `dst` only (None
    elsewhere), each other rank sending just its own main rows. A collective."""
    shape = (store.num_experts,) + tuple(tensor.shape[1:])
    ep = store.ep
    if dst is None:
        full = torch.zeros(shape, dtype=tensor.dtype)
        full[experts] = tensor[slots]
        return all_reduce_disjoint_(full, ep.group)  # each row from its main's rank, bit for bit
    if ep.rank != dst:
        if len(experts):  # gloo sends every dtype, bf16 included (it cannot gather bf16)
            dist.send(tensor[slots].contiguous(), dst=ep.global_rank(dst), group=ep.group)
        return None
    full = torch.empty(shape, dtype=tensor.dtype)  # every expert has one main: all written
    full[experts] = tensor[slots]
    for rank in range(ep.world_size):
        theirs = np.flatnonzero(store.main_rank == rank)
        if rank == dst or not len(theirs):
            continue
        received = torch.empty((len(theirs),) + shape[1:], dtype=tensor.dtype)
        dist.recv(received, src=ep.global_rank(rank), group=ep.group)
        full[torch.as_tensor(theirs, dtype=torch.long)] = received
    return full


def _gather_store(store: ExpertStore, optimizer: Optional[torch.optim.Optimizer],
                  where: str, dst: Optional[int]) -> Optional[dict[str, Any]]:
    """Every expert's main rows of `store` as [E, ...] tensors: "w1", "w3", "w2" and the
    optimizer's per-slot state ("w1.exp_avg", ...), listed under "rows"; the optimizer's other
    state ("w1.step", ...) as it is on this rank (every rank steps alike). A collective: on
    every rank when `dst` is None, else on rank `dst` (None elsewhere)."""
    experts, slots = _local_rows(store)
    held = _held(optimizer)
    rows: list[tuple[str, torch.Tensor]] = []
    out: dict[str, Any] = {}
    for name, param in zip(_NAMES, store.bank):
        rows.append((name, param.detach()))
        state = optimizer.state.get(param, {}) if id(param) in held else {}
        for key in sorted(state):
            value = state[key]
            if _is_scalar_state(value, param):
                out[f"{name}.{key}"] = _copy(value)
            elif value.shape[0] == store.capacity:
                rows.append((f"{name}.{key}", value.detach()))
            else:
                raise ValueError(f"gather_training_state: {where}: optimizer state '{key}' of "
                                 f"{name} has shape {list(value.shape)}, neither one row per "
                                 f"bank slot ([{store.capacity}, ...]) nor a scalar")
    # Every rank must gather the same tensors to the same place (checked before any transfer,
    # so a rank that disagrees fails every rank instead of leaving the others waiting).
    world = store.ep.world_size
    described = [(key, str(t.dtype), list(t.shape)) for key, t in rows]
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, (_rank_arg(dst), described), group=store.ep.group)
    problem = _rank_disagreement([d for d, _ in everyone], world, "dst")
    if problem is not None:
        raise ValueError(f"gather_training_state: {problem}")
    dst = everyone[0][0]  # an int from here on (a numpy integer was taken as one)
    if any(d != everyone[0][1] for _, d in everyone):
        raise ValueError(f"gather_training_state: {where}: the ranks' optimizer state differs: "
                         + "; ".join(f"rank {r}: {d}" for r, (_, d) in enumerate(everyone)))
    for key, tensor in rows:
        out[key] = _gather_rows(store, tensor, experts, slots, dst)
    if dst is not None and store.ep.rank != dst:
        return None
    out["rows"] = [key for key, _ in rows]
    return out


def _store_problem(store: ExpertStore, saved: Any) -> Optional[str]:
    """Why `saved` (one store's part) cannot load into `store`, or None."""
    if not isinstance(saved, dict) or "rows" not in saved:
        return "not a store's part of gather_training_state"
    missing = [key for key in saved["rows"] if key not in saved]
    missing += [name for name in _NAMES if name not in saved["rows"]]
    if missing:
        return f"lacks {', '.join(missing)}"
    params = dict(zip(_NAMES, store.bank))
    for key in saved["rows"]:
        value, param = saved[key], params.get(key.split(".")[0])
        if param is None or not torch.is_tensor(value) or value.dim() == 0:
            return f"{key} is not one row per expert"
        shape = list(value.shape)
        if key in _NAMES:  # the weights: [E, ...] of the bank's rows
            want = [store.num_experts] + list(param.shape[1:])
            if shape != want:
                return f"{key} has shape {shape}, expected {want}"
            if not value.dtype.is_floating_point:
                return f"{key} has dtype {value.dtype}, expected a floating dtype"
        elif shape[0] != store.num_experts:  # optimizer state: one row per expert
            return f"{key} has shape {shape}, expected [{store.num_experts}, ...]"
    return None


def _load_store(store: ExpertStore, saved: dict[str, Any], local: dict[str, torch.Tensor],
                optimizer: Optional[torch.optim.Optimizer]) -> None:
    """Loads one store's part: `local` holds its "rows" tensors' rows of this rank's main
    instances ([local experts, ...], in the order of store.local_experts()), `saved` the rest."""
    slots = torch.as_tensor(store.main_slot[store.local_experts()], dtype=torch.long)
    with torch.no_grad():  # replicas copy their mains at the next forward
        for name, param in zip(_NAMES, store.bank):
            param[slots] = local[name].to(dtype=param.dtype)
    held = _held(optimizer)
    for name, param in zip(_NAMES, store.bank):
        if id(param) not in held:
            continue
        state = optimizer.state[param]  # type: ignore[union-attr]
        prefix = name + "."
        for key in list(local) + [k for k in saved if k not in local and k != "rows"]:
            if not key.startswith(prefix):
                continue
            if key in local:
                value = local[key]
                rows = torch.zeros((store.capacity,) + tuple(value.shape[1:]), dtype=value.dtype)
                rows[slots] = value
                state[key[len(prefix):]] = rows
            else:
                state[key[len(prefix):]] = _copy(saved[key])


def _stores(model: nn.Module) -> dict[str, ExpertStore]:
    return {name: m for name, m in model.named_modules() if isinstance(m, ExpertStore)}


def _outside_stores(names: list[str], stores: dict[str, ExpertStore]) -> list[str]:
    prefixes = tuple(f"{s}." if s else "" for s in stores)
    return [n for n in names if not (prefixes and n.startswith(prefixes))]


def _runtimes(model: nn.Module) -> list[Any]:
    from cobalt.torch.moe import ExpertParallelMoE

    return [m.runtime for m in model.modules() if isinstance(m, ExpertParallelMoE)]


def gather_training_state(model: nn.Module,
                          optimizer: Optional[torch.optim.Optimizer] = None, *,
                          dst: Optional[int] = None) -> Optional[dict[str, Any]]:
    """The training state of `model` (and `optimizer`) without its world size and capacity:
    ``{"format", "step", "experts": {store name: {"w1": [E, H, F], ..., "w1.exp_avg": [E, H, F],
    ..., "w1.step": ..., "rows": [...]}}, "model": the rest of model.state_dict(), "optimizer":
    {parameter name: state}}``, all copies. A collective: call it on every rank between steps.

    With `dst=None` every rank gets the same dict, and holds every expert in full meanwhile. With
    `dst=r` (a rank of the expert-parallel group, the same on every rank) only rank r gets it and
    the others return None: each sends its own main rows to rank r and holds nothing more, so
    only rank r needs memory for the whole state. Raises ValueError on every rank when the ranks
    pass different `dst` or one outside [0, world size). torch.save / torch.load the dict as any
    state dict."""
    stores = _stores(model)
    experts = {name: _gather_store(store, optimizer, f"expert store '{name}'", dst)
               for name, store in stores.items()}
    if any(part is None for part in experts.values()):
        return None  # not rank dst: its rows went there
    if dst is not None and not stores and dist.is_initialized():
        # No expert store, so no collective: the dict goes to rank dst of the default group.
        rank = _rank_arg(dst)
        if _rank_disagreement([rank], dist.get_world_size(), "dst") is not None:
            raise ValueError(f"gather_training_state: dst {dst!r} is not a rank in "
                             f"[0, {dist.get_world_size()})")
        if dist.get_rank() != rank:
            return None
    full = model.state_dict()
    rest = {key: _copy(full[key]) for key in _outside_stores(list(full), stores)}
    params = dict(model.named_parameters())
    held = _held(optimizer)
    opt_state: dict[str, dict[str, Any]] = {}
    for name in _outside_stores(list(params), stores):
        param = params[name]
        if id(param) in held and optimizer.state.get(param):  # type: ignore[union-attr]
            opt_state[name] = {k: _copy(v) for k, v in optimizer.state[param].items()}
    runtimes = _runtimes(model)
    return {"format": _FORMAT, "step": runtimes[0].step if runtimes else 0, "experts": experts,
            "model": rest, "optimizer": opt_state}


def _state_problem(model: nn.Module, state: Any) -> Optional[str]:
    """Why `state` cannot load into `model` (whatever the world size), or None; a state whose
    parts are missing or of the wrong types is a problem too, not an exception."""
    try:
        return _checked_state_problem(model, state)
    except Exception as exc:  # noqa: BLE001 - malformed in a way the checks did not foresee
        return f"malformed state ({type(exc).__name__}: {exc})"


def _checked_state_problem(model: nn.Module, state: Any) -> Optional[str]:
    if not isinstance(state, dict) or state.get("format") != _FORMAT:
        return "not a dict from gather_training_state"
    stores = _stores(model)
    if set(stores) != set(state["experts"]):
        return (f"the model's expert stores {sorted(stores)} are not the saved ones "
                f"{sorted(state['experts'])}")
    for name, store in stores.items():
        problem = _store_problem(store, state["experts"][name])
        if problem is not None:
            return f"expert store '{name}': {problem}"
    current = model.state_dict()
    expected = set(_outside_stores(list(current), stores))
    if expected != set(state["model"]):
        return (f"the model's other state (missing: {sorted(expected - set(state['model']))}, "
                f"unexpected: {sorted(set(state['model']) - expected)}) does not match the "
                f"saved one")
    for key in sorted(expected):
        saved, here = state["model"][key], current[key]
        if torch.is_tensor(here) and (not torch.is_tensor(saved) or saved.shape != here.shape):
            shape = list(saved.shape) if torch.is_tensor(saved) else type(saved).__name__
            return f"{key} has shape {shape}, the model's {list(here.shape)}"
    unknown = sorted(set(state["optimizer"]) - set(dict(model.named_parameters())))
    if unknown:
        return f"optimizer state for parameters the model lacks: {unknown}"
    return None


def _pending_problem(model: nn.Module) -> Optional[str]:
    from cobalt.torch.moe import ExpertParallelMoE

    for module in model.modules():
        if isinstance(module, ExpertParallelMoE) and \
                module.experts.backward_pending(module.runtime.step):
            return "a forward waits for its backward pass (load between steps)"
    return None


def _without_rows(state: dict[str, Any]) -> dict[str, Any]:
    """`state` without its per-expert row tensors; each store part lists their dtypes and
    trailing shapes under "row_shapes" instead."""
    experts = {}
    for name, part in state["experts"].items():
        rows = part["rows"]
        experts[name] = {k: v for k, v in part.items() if k not in rows}
        experts[name]["row_shapes"] = {k: (part[k].dtype, tuple(part[k].shape[1:])) for k in rows}
    return {**state, "experts": experts}


def _scatter_rows(store: ExpertStore, part: dict[str, Any], full: Optional[dict[str, Any]],
                  src: int) -> dict[str, torch.Tensor]:
    """This rank's main rows of every "rows" tensor of one store part: rank `src` holds the full
    tensors (`full`) and sends each other rank its rows. A collective."""
    ep = store.ep
    local: dict[str, torch.Tensor] = {}
    mine = store.local_experts()
    for key in part["rows"]:
        if ep.rank == src:
            value = full[key]  # type: ignore[index]
            for rank in range(ep.world_size):
                theirs = torch.as_tensor(np.flatnonzero(store.main_rank == rank),
                                         dtype=torch.long)
                if rank == src:
                    local[key] = value[theirs]
                elif len(theirs):
                    dist.send(value[theirs].contiguous(), dst=ep.global_rank(rank),
                              group=ep.group)
        else:
            dtype, shape = part["row_shapes"][key]
            local[key] = torch.empty((len(mine),) + tuple(shape), dtype=dtype)
            if len(mine):
                dist.recv(local[key], src=ep.global_rank(src), group=ep.group)
    return local


def load_training_state(model: nn.Module, state: Optional[dict[str, Any]],
                        optimizer: Optional[torch.optim.Optimizer] = None, *,
                        src: Optional[int] = None) -> None:
    """Loads what :func:`gather_training_state` wrote into `model` (and `optimizer`, built for
    it), on any world size, node shape or bank capacity: each rank keeps its main instances'
    rows. The optimizer's state of every parameter it holds is replaced (parameters without
    saved state start afresh); parameters it does not hold are left alone, so a run with
    separate optimizers calls this once per optimizer. The runtimes' step counters are restored.
    Call on every rank between steps.

    With `src=None` every rank passes the whole state (no collective). With `src=r` (a rank of
    the expert-parallel group, the same on every rank; a collective) only rank r needs it, the
    others may pass None: rank r sends each rank its main instances' rows and everything else,
    so the other ranks never hold more than their own rows. Every rank passes `src`, or none
    does (a rank without it joins no collective). Raises ValueError, on every rank and before
    anything is loaded, when `state` does not fit the model (or, with `src`, when the ranks pass
    different `src` or one that is not a rank in [0, world size))."""
    stores = _stores(model)
    if src is None:  # every rank must pass src, or none: a rank without it joins no collective
        problem = _state_problem(model, state) or _pending_problem(model)
        if problem is not None:
            raise ValueError(f"load_training_state: {problem}")
        assert state is not None
        local = {name: {k: state["experts"][name][k][torch.as_tensor(
                            store.local_experts(), dtype=torch.long)]
                        for k in state["experts"][name]["rows"]}
                 for name, store in stores.items()}
        _load(model, state, local, optimizer)
        return
    if not dist.is_initialized():
        raise ValueError("load_training_state: src needs torch.distributed to be initialized")
    ep = next(iter(stores.values())).ep if stores else None
    group = ep.group if ep is not None else None
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    problem = _pending_problem(model)
    if rank == _rank_arg(src):
        problem = _state_problem(model, state) or problem
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, (_rank_arg(src), problem), group=group)
    disagreement = _rank_disagreement([s for s, _ in everyone], world, "src")
    if disagreement is not None:
        raise ValueError(f"load_training_state: {disagreement}")
    src = everyone[0][0]
    problems = [f"rank {r}: {p}" for r, (_, p) in enumerate(everyone) if p is not None]
    if problems:
        raise ValueError("load_training_state: " + "; ".join(problems))
    payload = [_without_rows(state) if rank == src else None]  # type: ignore[arg-type]
    global_src = ep.global_rank(src) if ep is not None else src
    dist.broadcast_object_list(payload, src=global_src, group=group)
    light = payload[0]
    local = {name: _scatter_rows(store, light["experts"][name],
                                 state["experts"][name] if rank == src else None, src)
             for name, store in stores.items()}
    _load(model, light, local, optimizer)


def _load(model: nn.Module, state: dict[str, Any], local: dict[str, dict[str, torch.Tensor]],
          optimizer: Optional[torch.optim.Optimizer]) -> None:
    """Loads a checked state: `local` holds each store's rows of this rank's main instances."""
    stores = _stores(model)
    params = dict(model.named_parameters())
    model.load_state_dict(state["model"], strict=False)  # checked: only the stores' keys
    held = _held(optimizer)
    for param in params.values():
        if id(param) in held:
            optimizer.state.pop(param, None)  # type: ignore[union-attr]
    for name, store in stores.items():
        _load_store(store, state["experts"][name], local[name], optimizer)
    for name, param_state in state["optimizer"].items():
        if id(params[name]) in held:
            optimizer.state[params[name]] = {  # type: ignore[union-attr]
                k: _copy(v) for k, v in param_state.items()}
    for runtime in _runtimes(model):
        runtime.step = int(state.get("step", runtime.step))
