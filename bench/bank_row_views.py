#!/usr/bin/env python3
"""What the expert bank's row views cost in the backward pass, in one run: the runtime's forward
takes one [H, F] view per local slot of each bank tensor [S, H, F]. Indexed row by row
(bank[s]), each view's backward writes a zero tensor the size of the whole bank and autograd adds
them up (O(S^2) bank-sized work per pass); split by one unbind (what
cobalt.torch.ExpertStore.fetch_replicas does since 2026-12-05), the rows' gradients are stacked
once. The same per-slot SwiGLU-style matmuls run either way, and both give the same gradient
(checked bitwise). Median of --repeats forward + backward passes.

    /usr/bin/python3 bench/bank_row_views.py [--slots 48 --hidden 256 --ffn 512 --rows 64
        --repeats 5]
"""
import argparse
import time

import torch


def pass_ms(bank: list[torch.Tensor], x: torch.Tensor, by_unbind: bool) -> float:
    for p in bank:
        p.grad = None
    start = time.perf_counter()
    rows = [p.unbind(0) for p in bank] if by_unbind else None
    out = x.new_zeros(())
    for s in range(bank[0].shape[0]):
        w1, w3, w2 = (r[s] for r in rows) if rows is not None else (p[s] for p in bank)
        out = out + ((torch.nn.functional.silu(x @ w1) * (x @ w3)) @ w2).sum()
    out.backward()
    return (time.perf_counter() - start) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, default=48)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--rows", type=int, default=64, help="tokens per slot")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    shapes = [(args.slots, args.hidden, args.ffn)] * 2 + [(args.slots, args.ffn, args.hidden)]
    bank = [(torch.randn(*s, generator=g) * 0.05).requires_grad_() for s in shapes]
    x = torch.randn(args.rows, args.hidden, generator=g)
    grads = {}
    for by_unbind in (False, True):
        pass_ms(bank, x, by_unbind)
        grads[by_unbind] = [p.grad.clone() for p in bank]
    assert all(torch.equal(a, b) for a, b in zip(grads[False], grads[True]))
    times = {False: [], True: []}
    for _ in range(args.repeats):  # alternated, so that drift hits both alike
        for by_unbind in (False, True):
            times[by_unbind].append(pass_ms(bank, x, by_unbind))
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    print(f"{args.slots} slots of [{args.hidden}, {args.ffn}], {args.rows} rows each, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads: forward + backward "
          f"{med[False]:.1f} ms indexed row by row, {med[True]:.1f} ms by unbind "
          f"({med[False] / med[True]:.2f}x); gradients equal")


if __name__ == "__main__":
    main()
