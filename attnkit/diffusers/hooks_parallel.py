"""The hook on diffusers' context parallelism over gloo: installed on demand, by
``attnkit.diffusers.context_parallel.enable_parallelism`` (not by ``import attnkit``), and taken out by
``hooks.uninstall()`` like the others.

diffusers (0.42.1) assumes NCCL in two places of ``diffusers.hooks.context_parallel``:

- its "anything" split (``ring_anything=True`` / ``ulysses_anything=True``) gathers the
  model's output, unequal shards, with ``dist.all_gather``, which NCCL serves and gloo
  refuses. The hook wraps ``_all_gather_anything``: on a group served by gloo it pads to
  the longest shard, gathers and trims (the same tensor); every other group still goes
  to diffusers' own gather;
- its split hook logs through ``logger.warning_once``, a method transformers adds to
  ``logging.Logger`` when imported (every pipeline with a text encoder imports it);
  without transformers, that one logger gets it (its own ``warning``, once per message).

Like hooks.py, it imports nothing of attnkit but the other hooks modules.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from .hooks_base import WRAPPED, Hook, _replace, _restore

_SAVED: list = []  # what the hook replaced, for its uninstall


def _modules():
    from diffusers.hooks import context_parallel
    from diffusers.models import _modeling_parallel

    return context_parallel, _modeling_parallel


def _check() -> str | None:
    try:
        cp, parallel = _modules()
    except Exception as exc:  # noqa: BLE001  (an older diffusers: no context parallelism)
        return f"diffusers' context parallelism could not be imported ({type(exc).__name__}: {exc})"
    missing = [
        f"{mod.__name__}.{name}"
        for mod, name in ((cp, "_all_gather_anything"), (cp, "logger"), (parallel, "gather_size_by_comm"))
        if not hasattr(mod, name)
    ]
    return f"diffusers has no {', '.join(missing)}" if missing else None


def served_by_gloo(tensor: torch.Tensor, group) -> bool:
    backend = str(dist.get_backend(group))
    return backend == "gloo" or (tensor.device.type == "cpu" and "cpu:gloo" in backend)


def _install() -> None:
    cp, parallel = _modules()
    original = cp._all_gather_anything
    gather_size_by_comm = parallel.gather_size_by_comm

    @functools.wraps(original)
    def all_gather_anything(tensor: torch.Tensor, dim: int, group) -> torch.Tensor:
        if not served_by_gloo(tensor, group):
            return original(tensor, dim, group)
        tensor = tensor.contiguous()
        sizes = gather_size_by_comm(tensor.shape[dim], group)
        pad = [0, 0] * (tensor.dim() - 1 - dim) + [0, max(sizes) - tensor.shape[dim]]
        padded = torch.nn.functional.pad(tensor, pad)
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded, group=group)
        return torch.cat([p.narrow(dim, 0, n) for p, n in zip(parts, sizes)], dim=dim)

    setattr(all_gather_anything, WRAPPED, True)
    _replace(cp, "_all_gather_anything", all_gather_anything, _SAVED)
    if not hasattr(cp.logger, "warning_once"):
        _replace(cp.logger, "warning_once", functools.lru_cache(None)(cp.logger.warning), _SAVED)


GLOO = Hook(
    "context parallel over gloo",
    "diffusers.hooks.context_parallel._all_gather_anything (and its logger's warning_once where missing)",
    "attnkit.diffusers.context_parallel.enable_parallelism refuses: on GPUs with NCCL call model.enable_parallelism directly",
    _check,
    _install,
    lambda: _restore(_SAVED),
)
