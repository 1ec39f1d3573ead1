"""``predict`` across ranks for the launcher (launcher.py): every rank's predictions put back in
the order one process would return them (Lightning's predict sampler deals samples to ranks in
turn), or rank by rank, with a warning, when they cannot be merged."""
from __future__ import annotations

import warnings


class _Unmergeable(Exception):
    pass


def merge_predictions(outputs: list):
    """All ranks' predictions in the order one process would return them.

    Lightning's predict sampler gives rank r the samples at positions r, r+R, r+2R, ... of the
    loader's own order, so rank r's k-th sample goes to position r + k*R; the merged samples are
    then cut into the loader's batch size again. Leaves must be tensors (or dicts / lists /
    tuples of them) with the batch as first dimension; anything else comes back rank by rank.
    """
    per_rank = [o.get("predictions") if o else None for o in outputs]
    if per_rank[0] is None:
        return None
    layout = outputs[0].get("layout") or []
    multi = len(layout) > 1
    merged_all = []
    for idx in range(max(1, len(layout))):
        ranks = [(p[idx] if multi else p) if p is not None else [] for p in per_rank]
        info = layout[idx] if idx < len(layout) else None
        if info is None:   # not split across ranks: every rank predicted everything
            merged_all.append(ranks[0])
            continue
        try:
            merged_all.append(_interleave(ranks, info[2]))
        except _Unmergeable as e:
            warnings.warn(f"RayStrategy.predict: returning predictions rank by rank (not in the loader's "
                          f"order): {e}", RuntimeWarning, stacklevel=4)
            merged_all.append([b for r in ranks for b in r])
    return merged_all if multi else merged_all[0]


def _interleave(ranks: list, batch_size):
    import torch
    if not batch_size:
        raise _Unmergeable("the predict loader has no fixed batch_size")
    num = len(ranks)
    cats, positions = [], []
    for r, batches in enumerate(ranks):
        if not batches:
            continue
        cat = _cat(batches)
        n = _rows(cat)
        cats.append(cat)
        positions.append(r + num * torch.arange(n))
    if not cats:
        return []
    pos = torch.cat(positions)
    order = torch.argsort(pos)
    if not torch.equal(pos[order], torch.arange(len(pos))):
        raise _Unmergeable("the ranks' sample counts do not match an even split")
    merged = _take(_cat(cats), order)
    return [_take(merged, torch.arange(i, min(i + batch_size, len(pos)))) for i in range(0, len(pos), batch_size)]


def _cat(items: list):
    import torch
    first = items[0]
    if isinstance(first, torch.Tensor):
        if any(not isinstance(t, torch.Tensor) or t.dim() == 0 for t in items):
            raise _Unmergeable("a prediction is a scalar, not a batch")
        return torch.cat(items)
    if isinstance(first, dict):
        if any(not isinstance(d, dict) or d.keys() != first.keys() for d in items):
            raise _Unmergeable("predictions are dicts with different keys")
        return type(first)((k, _cat([d[k] for d in items])) for k in first)
    if isinstance(first, (list, tuple)):
        if any(not isinstance(s, (list, tuple)) or len(s) != len(first) for s in items):
            raise _Unmergeable("predictions are sequences of different lengths")
        parts = [_cat([s[i] for s in items]) for i in range(len(first))]
        return type(first)(*parts) if hasattr(first, "_fields") else type(first)(parts)
    raise _Unmergeable(f"a prediction of type {type(first).__name__} cannot be split by sample")


def _rows(value) -> int:
    import torch
    if isinstance(value, torch.Tensor):
        return value.shape[0]
    children = list(value.values()) if isinstance(value, dict) else list(value)
    counts = {_rows(c) for c in children}
    if len(counts) != 1:
        raise _Unmergeable("a prediction's parts have different batch sizes")
    return counts.pop()


def _take(value, index):
    import torch
    if isinstance(value, torch.Tensor):
        return value[index]
    if isinstance(value, dict):
        return type(value)((k, _take(v, index)) for k, v in value.items())
    parts = [_take(v, index) for v in value]
    return type(value)(*parts) if hasattr(value, "_fields") else type(value)(parts)
