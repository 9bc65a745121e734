"""Swap a model's ``nn.Linear`` layers for ``ProjectionLinear`` in one call, and say what was left alone and why.

    report = swap_linears(model, batches=(1, 8, 32, 64))
    print(report)                       # swapped layers, and the others with their reasons
    with report.record_rows():          # one eager step: which layers see more rows than a decode batch?
        model(**inputs)
    print(report.fallbacks())           # layers that fell back to F.linear, with rows per call
    report.restore_fallbacks(model)     # put nn.Linear back where the kernel never ran

A layer is swapped where the kernel can take its weight (``why_not_swappable``):
an exact ``nn.Linear`` (a subclass may be read by its parent directly, as
``nn.MultiheadAttention`` reads ``out_proj.weight``) with a BF16 weight on a
Hopper GPU, K % 8 == 0 and 16-byte rows (``check_weight``). A bias is taken
(``ProjectionLinear`` adds it to the rounded output). FP16 weights are left
alone unless the caller asks for an FP32 output: the kernel writes BF16 or
FP32, never the FP16 an FP16 ``nn.Linear`` returns, and a drop-in must not
change the model's dtypes.

Whether a layer sees decode-sized batches is known only at run time. Some
model code runs a projection over many more rows than the batch: transformers'
DeepseekV3 keeps the compressed KV latents in its cache and expands the whole
cache through ``kv_b_proj`` every step (batch x cache length rows). Those calls
have no tactic and fall back to ``F.linear`` (counted on the layer);
``SwapReport.fallbacks`` lists them after a step and ``restore_fallbacks`` hands
them back to ``nn.Linear``, whose cuBLAS GEMM is the right kernel at that size.
"""

from __future__ import annotations

import contextlib
import fnmatch
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
from torch import nn

from .layer import ProjectionLinear
from .projection import WEIGHT_DTYPES, check_weight
from .runtime import architecture

__all__ = ["SwapReport", "hopper_device_check", "replace_module", "swap_linears", "why_not_swappable"]


def hopper_device_check(weight: torch.Tensor) -> None:
    """Raise a ValueError unless ``weight`` lies on a Hopper (sm_90a) GPU."""
    if weight.device.type != "cuda":
        raise ValueError(f"weight on {weight.device.type}")
    architecture(weight.device)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def why_not_swappable(module: nn.Module, *,
                      device_check: Callable[[torch.Tensor], None] = hopper_device_check) -> str | None:
    """Why ``module`` cannot become a ``ProjectionLinear`` here, or None where it can.

    ``device_check`` raises a ValueError for a weight on a device the kernel cannot
    run on (default: anything but a Hopper GPU); tests pass their own.
    """
    if type(module) is not nn.Linear:
        if isinstance(module, nn.Linear):
            return f"a subclass of nn.Linear ({type(module).__name__}): its parent may read the weight itself"
        return f"not an nn.Linear ({type(module).__name__})"
    weight, bias = module.weight, module.bias
    try:
        device_check(weight)
    except ValueError as error:
        return str(error)
    if weight.dtype not in WEIGHT_DTYPES:
        return f"dtype {_dtype_name(weight.dtype)} (the kernel takes bfloat16 or float16 weights)"
    n, k = weight.shape
    if k % 8:
        return f"K = {k} is not a multiple of 8"
    try:
        check_weight(weight.data)
    except ValueError as error:
        return str(error)
    if bias is not None and (bias.dtype != weight.dtype or bias.device != weight.device):
        return f"bias is {_dtype_name(bias.dtype)} on {bias.device}, unlike its {_dtype_name(weight.dtype)} weight"
    return None


def replace_module(model: nn.Module, name: str, module: nn.Module) -> None:
    """Put ``module`` at the dotted path ``name`` of ``model`` (a child of a Module, ModuleList, Sequential...)."""
    parent_name, _, attribute = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, attribute, module)


def _layer_pattern(name: str) -> str:
    """``model.layers.3.mlp.up_proj`` -> ``model.layers.*.mlp.up_proj``: one line for a layer of every block."""
    return re.sub(r"(?:(?<=\.)|^)\d+(?=\.|$)", "*", name)


def _grouped(names: Iterable[str]) -> list[tuple[str, int]]:
    """``[(pattern, count)]`` in first-seen order."""
    return list(Counter(_layer_pattern(name) for name in names).items())


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0


@dataclass
class SwapReport:
    """What ``swap_linears`` did: the layers it swapped and those it left alone, with the reason for each.

    ``swapped`` maps each swapped layer's name to its ``ProjectionLinear``;
    ``left_alone`` maps every other ``nn.Linear``'s name to the reason.
    ``aliases`` lists further names of a layer that sits at several places in
    the model (every place got the same new layer). ``rows`` holds the rows per
    call each swapped layer saw under ``record_rows``. ``originals`` keeps each
    swapped ``nn.Linear`` (sharing its weight's storage) for ``restore``: after
    moving the model to another device, drop the report or it holds the old copies.
    """

    batches: tuple[int, ...]
    swapped: dict[str, nn.Module] = field(default_factory=dict)
    left_alone: dict[str, str] = field(default_factory=dict)
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False)
    rows: dict[str, Counter] = field(default_factory=dict, repr=False)
    originals: dict[str, nn.Module] = field(default_factory=dict, repr=False)

    @contextlib.contextmanager
    def record_rows(self):
        """Within the block, count the rows (batch x sequence) of every call of each swapped layer into ``rows``."""
        handles = []
        for name, layer in self.swapped.items():
            counter = self.rows.setdefault(name, Counter())

            def hook(module, args, counter=counter):
                if args and isinstance(args[0], torch.Tensor):
                    counter[_rows(args[0])] += 1

            handles.append(layer.register_forward_pre_hook(hook))
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def fallbacks(self, model: nn.Module | None = None) -> dict[str, str]:
        """``{name: why}`` for each swapped layer that fell back to ``F.linear`` (its ``fallbacks`` counter), or
        that saw more rows per call than its largest prepared batch under ``record_rows``.

        With ``model``, the layers are read from it (those no longer a ``ProjectionLinear`` there are skipped).
        """
        found = {}
        for name, layer in self.swapped.items():
            if model is not None:
                layer = model.get_submodule(name)
                if not isinstance(layer, ProjectionLinear) and layer is not self.swapped[name]:
                    continue
            counts = getattr(layer, "fallbacks", None) or Counter()
            rows = self.rows.get(name, Counter())
            largest = max(getattr(layer, "batches", self.batches) or self.batches)
            oversized = sorted(r for r in rows if r > largest)
            if not counts and not oversized:
                continue
            parts = []
            if counts:
                calls = sum(counts.values())
                parts.append(f"{calls} call{'s' * (calls != 1)} to F.linear: "
                             + ", ".join(f"{reason} ({count})" for reason, count in counts.items()))
            elif oversized:
                parts.append(f"ran in chunks of its batches (largest {largest})")
            if rows:
                seen = ", ".join(str(r) for r in sorted(rows))
                parts.append(f"rows per call {seen} vs prepared batches {', '.join(map(str, self.batches))}")
            found[name] = "; ".join(parts)
        return found

    def restore(self, model: nn.Module, names: Iterable[str] | dict[str, str], reason: str = "restored") -> list[str]:
        """Put ``nn.Linear`` back at each of ``names`` (and its aliases), now using the swapped layer's weight and
        bias; they move to ``left_alone`` with ``reason`` (or, for a dict, each name's own)."""
        reasons = dict(names) if isinstance(names, dict) else dict.fromkeys(names, reason)
        restored = []
        for name, why in reasons.items():
            layer, original = self.swapped.pop(name), self.originals.pop(name)
            # The layer's parameters are the weights as they are now (after any .to() of the model).
            original.weight = layer.weight
            original.bias = layer.bias
            for path in (name, *self.aliases.get(name, ())):
                replace_module(model, path, original)
            self.left_alone[name] = why
            restored.append(name)
        return restored

    def restore_fallbacks(self, model: nn.Module) -> dict[str, str]:
        """Restore ``nn.Linear`` wherever ``fallbacks`` finds a layer; returns those layers and why."""
        found = self.fallbacks(model)
        self.restore(model, {name: f"not a decode projection here: {why}" for name, why in found.items()})
        return found

    def summary(self) -> str:
        """A compact text: how many layers were swapped, by layer pattern, then those left alone with reasons."""
        total = len(self.swapped) + len(self.left_alone)
        lines = [f"swap_linears: {len(self.swapped)} of {total} nn.Linear layers on decode_projection "
                 f"(batches {', '.join(map(str, self.batches))})"]
        for pattern, count in _grouped(self.swapped):
            lines.append(f"  swapped      {pattern}" + (f"  x{count}" if count > 1 else ""))
        by_reason: dict[str, list[str]] = {}
        for name, reason in self.left_alone.items():
            by_reason.setdefault(reason, []).append(name)
        for reason, names in by_reason.items():
            for pattern, count in _grouped(names):
                lines.append(f"  left alone   {pattern}" + (f"  x{count}" if count > 1 else "") + f": {reason}")
        return "\n".join(lines)

    __str__ = summary


def _skip_reason(skip, name: str, module: nn.Module) -> str | None:
    """The caller's reason to leave ``name`` alone: a callable's answer, or the pattern that matched it."""
    if skip is None:
        return None
    if callable(skip):
        answer = skip(name, module)
        if not answer:
            return None
        return answer if isinstance(answer, str) else "skipped by the caller"
    patterns = (skip,) if isinstance(skip, str) else tuple(skip)
    for pattern in patterns:
        if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name.rpartition(".")[2], pattern):
            return f"skipped by the caller ({pattern})"
    return None


def swap_linears(model: nn.Module, batches=(1, 8, 32, 64), *, skip=None,
                 factory: Callable[..., nn.Module] = ProjectionLinear.from_linear,
                 device_check: Callable[[torch.Tensor], None] = hopper_device_check,
                 **layer_options) -> SwapReport:
    """Replace every eligible ``nn.Linear`` of ``model``, in place, by ``ProjectionLinear.from_linear(linear,
    batches=batches, **layer_options)``; return a ``SwapReport`` of what was swapped and what was left alone, why.

    ``skip`` leaves layers alone: dotted names or glob patterns (matched against the
    full name and its last part, e.g. ``"lm_head"`` or ``"*.kv_b_proj"``), or a
    callable ``(name, module)`` returning a reason (a str) or a truth value.
    ``layer_options`` go to ``ProjectionLinear`` (``output_dtype``,
    ``batch_invariant``, ``programmatic_launch``). A layer the factory builds but
    could not prepare (``ProjectionLinear.unsupported``) is left as it was, with
    that reason. ``factory`` and ``device_check`` are there for tests.
    """
    batches = tuple(batches)
    report = SwapReport(batches=batches)
    paths: dict[int, list[str]] = {}
    modules: dict[int, nn.Module] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if isinstance(module, nn.Linear):
            paths.setdefault(id(module), []).append(name)
            modules[id(module)] = module
    for key, names in paths.items():
        module, name = modules[key], names[0]
        reason = "the model itself: wrap it, or call ProjectionLinear.from_linear" if name == "" else None
        reason = reason or _skip_reason(skip, name, module)
        reason = reason or why_not_swappable(module, device_check=device_check)
        if reason is None:
            try:
                layer = factory(module, batches=batches, **layer_options)
            except ValueError as error:
                reason = f"refused: {error}"
            else:
                if getattr(layer, "prepared", True) is None:
                    reason = f"not prepared: {getattr(layer, 'unsupported', None) or 'no reason given'}"
        if reason is not None:
            report.left_alone[name] = reason
            continue
        for path in names:
            replace_module(model, path, layer)
        report.swapped[name] = layer
        report.originals[name] = module
        if len(names) > 1:
            report.aliases[name] = tuple(names[1:])
    return report
