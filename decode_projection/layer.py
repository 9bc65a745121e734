"""A drop-in ``nn.Linear`` for decode: prepared projections behind a PyTorch custom op.

``ProjectionLinear`` prepares its weight for a set of padded batches and, in
``forward``, calls ``decode_projection::project``, a ``torch.library`` custom op
with a fake implementation, so ``torch.compile(fullgraph=True)`` traces it
without graph breaks and CUDA graphs capture it. The op finds the prepared
projection through a registry handle (an int: custom ops cannot take Python
objects) and dispatches by batch; batches without a tactic, CPU inputs and
dtypes the kernel does not take fall back to ``F.linear``. Every fallback is
counted on the layer (``fallbacks``), and the first one of each layer is logged
as a warning with its reason. A batch-invariant layer never falls back for a
batch: it runs the rows in the batches it holds (the largest, then the rest
zero-padded), each of which sums in the one order.
"""

import itertools
import logging
import warnings
import weakref
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

from .kernel.tactic import GATE_GROUP_ROWS
from .projection import (
    OUTPUT_DTYPES, WEIGHT_DTYPES, PreparedProjection, check_batches, check_weight, gated_policies, interleave_gate_up,
    policies_for,
)
from .runtime import architecture

logger = logging.getLogger(__name__)

# Layers by handle; weak, so a dropped layer does not live on here.
_registry = weakref.WeakValueDictionary()
_handles = itertools.count(1)

RECAPTURE_WARNING = (
    "ProjectionLinear prepared a new projection for a weight of new storage: CUDA graphs captured before keep "
    "computing with the old weight (the layer keeps it alive until it dies); capture them again to use the new one"
)


def registered_layer(handle: int) -> "ProjectionLinear":
    """The live layer ``handle`` names; a ValueError saying why where none does."""
    layer = _registry.get(handle)
    if layer is None:
        raise ValueError(
            f"decode_projection::project: handle {handle} names no live ProjectionLinear in this process (the layer "
            "was garbage-collected, or the graph calling the op was traced from another layer or process); "
            "trace it again from the live layer"
        )
    return layer


@torch.library.custom_op("decode_projection::project", mutates_args=())
def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, handle: int,
            out_dtype: torch.dtype, out_features: int) -> torch.Tensor:
    """``x @ weight^T + bias`` through the prepared projection ``handle`` (its epilogue adds the bias), or for a
    gated layer ``silu(gate) * up`` of its interleaved weight (``out_features`` gate rows); else ``F.linear``."""
    layer = registered_layer(handle)
    rows = x.reshape(-1, x.shape[-1])
    prepared = layer.prepared
    if prepared is not None and not prepared.is_prepared_for(weight, bias):
        # The weight or bias was replaced behind the module's back (``layer.weight.data = ...``).
        if torch.cuda.is_current_stream_capturing():
            raise ValueError("ProjectionLinear's weight changed since it was prepared; call prepare() before capturing")
        layer.prepare()
        prepared = layer.prepared
    held = prepared.kernels if prepared is not None else {}
    if rows.shape[0] not in held and not (layer.batch_invariant and held and rows.shape[0] > 0):
        if prepared is None:
            layer.fall_back("not prepared", lambda: layer.unsupported or "no prepared projection")
        else:
            layer.fall_back("batch without a tactic",
                            lambda: f"batch {rows.shape[0]} has no tactic (prepared batches {sorted(held)})")
        return layer.linear(x, weight, bias).to(out_dtype)
    pitch = rows.stride(0) * rows.element_size()
    if rows.stride(1) != 1 or rows.data_ptr() % 16 or (rows.shape[0] > 1 and (pitch % 16 or rows.stride(0) < rows.shape[1])):
        rows = rows.clone(memory_format=torch.contiguous_format)  # TMA wants dense, 16-byte aligned rows
    out = torch.empty(rows.shape[0], out_features, device=x.device, dtype=out_dtype)
    if rows.shape[0] in held:
        prepared.run(rows, out)
    else:
        run_in_held_batches(prepared, rows, out)
    return out.reshape(*x.shape[:-1], out_features)


def run_in_held_batches(prepared, rows, out):
    """``out = rows @ weight^T`` in chunks of the largest batch ``prepared`` holds, the last zero-padded up to the
    smallest held batch it fits in: bitwise what any batch gives where every batch sums in one order."""
    largest = max(prepared.kernels)
    for start in range(0, rows.shape[0], largest):
        count = min(largest, rows.shape[0] - start)
        batch = min(held for held in prepared.kernels if held >= count)
        if batch == count:
            prepared.run(rows[start : start + count], out[start : start + count])
            continue
        padded = rows.new_zeros(batch, rows.shape[1])
        padded[:count] = rows[start : start + count]
        out[start : start + count] = prepared.run(padded, out.new_empty(batch, out.shape[1]))[:count]


@project.register_fake
def _(x, weight, bias, handle, out_dtype, out_features):
    return x.new_empty(*x.shape[:-1], out_features, dtype=out_dtype)


def same_storage(a, b) -> bool:
    """Whether two optional tensors are both None or views of the same storage, shape and strides."""
    if a is None or b is None:
        return a is None and b is None
    return PreparedProjection._storage(a) == PreparedProjection._storage(b)


def gated_linear(x, weight, out_features):
    """``silu(x @ gate^T) * (x @ up^T)`` of a gate/up interleaved ``weight`` (projection.interleave_gate_up) with
    ``F.linear``, in the weight's dtype, as the two ``nn.Linear``s and ``F.silu(g) * u`` would compute it."""
    both = F.linear(x, weight).unflatten(-1, (-1, 2, GATE_GROUP_ROWS // 2))
    # Contiguous, as the op's fake says: the slice past a padded last group would leave a wider row pitch.
    return (F.silu(both[..., 0, :]) * both[..., 1, :]).flatten(-2)[..., :out_features].contiguous()


def check_arguments(weight, bias, batches, output_dtype, batch_invariant, programmatic_launch):
    """Raise a TypeError/ValueError naming what ProjectionLinear cannot take."""
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"ProjectionLinear weight must be a torch.Tensor, got {type(weight).__name__}")
    if weight.dim() != 2:
        raise ValueError(f"ProjectionLinear weight must be 2-D [N, K], got shape {tuple(weight.shape)}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"ProjectionLinear bias must be a torch.Tensor or None, got {type(bias).__name__}")
        if tuple(bias.shape) != (weight.shape[0],) or bias.dtype != weight.dtype or bias.device != weight.device:
            raise ValueError(f"ProjectionLinear bias must be ({weight.shape[0]},) {weight.dtype} on {weight.device} "
                             f"like the weight, got {tuple(bias.shape)} {bias.dtype} on {bias.device}")
    check_batches(batches, "ProjectionLinear")
    if output_dtype is not None and output_dtype not in OUTPUT_DTYPES:
        raise ValueError(f"ProjectionLinear output dtype must be one of {list(OUTPUT_DTYPES)}, got {output_dtype}")
    for name, flag in (("batch_invariant", batch_invariant), ("programmatic_launch", programmatic_launch)):
        if not isinstance(flag, bool):
            raise TypeError(f"ProjectionLinear {name} must be a bool, got {flag!r}")


class ProjectionLinear(nn.Module):
    """``y = x @ W^T (+ b)`` with the split-K decode kernel for the prepared padded batches.

    The output has the weight's dtype, as ``nn.Linear``'s does (also after a cast
    such as ``.half()`` or ``.float()``), unless ``output_dtype`` says otherwise; the
    kernel's epilogue adds the bias in FP32 before its one rounding. Under a
    row-parallel tensor split the output is a partial sum: give the bias to one
    rank only. On a GPU other than Hopper, or with a weight the kernel
    cannot take (``check_weight``), the layer is plain ``F.linear`` (``unsupported``
    says why). A fallback computes as ``F.linear`` in the weight's dtype, then
    casts, as the ``nn.Linear`` it replaces would. ``programmatic_launch=False``
    launches the kernel without programmatic dependent launch, which measured
    faster between kernels that never trigger their dependents (PreparedProjection).

    The layer prepares again on its own after ``.to()``, ``.half()``, weight
    assignment and ``load_state_dict(assign=True)``, and at its next eager call
    after ``weight.data = ...``. New values copied into the weight in place
    (``weight.data.copy_(...)``, ``load_state_dict`` without ``assign``) reach
    CUDA graphs captured before, as they do over ``nn.Linear``. A weight of new
    storage gets a new projection: CUDA graphs captured before keep computing
    with the old weight, which the layer keeps alive (it warns: capture them
    again). A ``DECODE_PROJECTION_TABLES`` that names no usable table raises.
    """

    def __init__(self, weight, bias=None, *, batches=(1, 2, 4, 8, 16, 32, 64), output_dtype=None,
                 batch_invariant=False, programmatic_launch=True, gated_rows=None):
        super().__init__()
        check_arguments(weight, bias, batches, output_dtype, batch_invariant, programmatic_launch)
        if gated_rows is not None and (bias is not None or batch_invariant):
            raise ValueError("a gated ProjectionLinear takes no bias and keeps no batch-invariant order")
        self.gated_rows = gated_rows  # N of a gate/up pair the weight interleaves (ProjectionLinear.gated), or None
        self.weight = nn.Parameter(weight.detach(), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        self.batches = tuple(batches)
        self.requested_output_dtype = output_dtype  # None: the weight's default, whatever dtype it is cast to
        self.output_dtype = output_dtype or weight.dtype
        self.batch_invariant = batch_invariant
        self.programmatic_launch = programmatic_launch
        self.fallbacks = Counter()
        self.prepared = None
        self.unsupported = None
        self._kept_for_graphs = []  # (weight, bias) that graphs captured from projections since replaced
        self._warned_fallback = False
        self._register()
        self.prepare()

    def _register(self):
        """Take a fresh handle for the custom op to find this layer by."""
        self.handle = next(_handles)
        _registry[self.handle] = self

    def __getstate__(self):
        # Descriptors and compiled code belong to this process and this copy.
        state = dict(self.__dict__)
        state.update(prepared=None, handle=None, _kept_for_graphs=[])
        return state

    def __setstate__(self, state):
        state.setdefault("requested_output_dtype", state["output_dtype"])  # pickled before it was kept apart
        state.setdefault("gated_rows", None)  # pickled before gated layers
        self.__dict__.update(state)
        self._warned_fallback = False
        self._kept_for_graphs = []  # a new layer: no graph captured it
        self._register()
        self.prepare()

    @classmethod
    def from_linear(cls, linear: nn.Linear, **options):
        """A ProjectionLinear holding ``linear``'s weight and bias."""
        return cls(linear.weight, linear.bias, **options)

    @classmethod
    def gated(cls, gate: nn.Linear, up: nn.Linear, **options):
        """A ProjectionLinear computing ``silu(gate(x)) * up(x)`` in one kernel, from a copy of both weights
        interleaved eight rows at a time (PreparedProjection.gated); bias-free layers only."""
        if gate.bias is not None or up.bias is not None:
            raise ValueError("ProjectionLinear.gated takes gate and up layers without a bias")
        weight = interleave_gate_up(gate.weight.detach(), up.weight.detach())
        return cls(weight, gated_rows=gate.out_features, **options)

    @property
    def out_features(self) -> int:
        """N of the output: the weight's rows, or a gated layer's gate rows."""
        return self.gated_rows or self.weight.shape[0]

    def linear(self, x, weight, bias):
        """What the layer computes, with ``F.linear`` (fallbacks)."""
        return F.linear(x, weight, bias) if self.gated_rows is None else gated_linear(x, weight, self.gated_rows)

    def prepare(self):
        """(Re)build the prepared projection for the weight as it is now; CPU or unsupported: none.

        The projection is prepared again in place where the weight and bias keep their storage (CUDA graphs
        captured before stay right), else replaced (see the class docstring).
        """
        weight = self.weight.data
        self.unsupported = None
        if weight.device.type != "cuda" or weight.dtype not in WEIGHT_DTYPES:
            self._replace_projection(None)
            return
        try:
            architecture(weight.device)
            check_weight(weight)
        except ValueError as error:
            self._replace_projection(None)
            self.unsupported = str(error)
            return
        # Outside the fallback below: a DECODE_PROJECTION_TABLES naming no usable table is the user's mistake, and
        # every layer quietly computing with F.linear would hide it.
        policies, _ = policies_for(weight, self.batches, output_dtype=self.output_dtype,
                                   batch_invariant=self.batch_invariant)
        bias = None if self.bias is None else self.bias.data
        current = self.prepared
        try:
            if self.gated_rows is not None:
                policies = gated_policies(policies, weight)
            # In place only where graphs captured before stay right: the same weight and bias storage (the weight's
            # map and the bias pointer are arguments of every captured launch).
            if (current is not None and same_storage(weight, current.weight)
                    and same_storage(bias, current.bias)):
                current.weight, current.policies, current.bias = weight, policies, bias
                current.output_dtype, current.programmatic_launch = self.output_dtype, self.programmatic_launch
                current.prepare()
            else:
                self._replace_projection(PreparedProjection(weight, policies, output_dtype=self.output_dtype,
                                                            programmatic_launch=self.programmatic_launch,
                                                            bias=bias, gated_rows=self.gated_rows).prepare())
        except ValueError as error:
            # Also refuses a second GPU in one process (projection._claim_device): that layer falls back.
            self._replace_projection(None)
            self.unsupported = str(error)

    def _replace_projection(self, replacement):
        """Drop the current projection for ``replacement`` (or None), keeping what CUDA graphs captured of it."""
        current = self.prepared
        if current is not None and current is not replacement:
            # What it owns (a gated layer's interleaved weight) goes back to the caching allocator with it, whatever
            # stream a queued launch reads it on.
            torch.cuda.synchronize(current.device)
            if current.captured_operands:
                self._kept_for_graphs.extend(current.captured_operands)
                warnings.warn(RECAPTURE_WARNING, stacklevel=2)
        self.prepared = replacement

    def fall_back(self, reason: str, describe):
        """Count a fallback to F.linear under ``reason``; the layer's first one is logged with ``describe()``.

        Code torch.compile traces only counts (a log call would break the graph); eager calls and the custom op,
        which runs outside the graph, log.
        """
        self.fallbacks[reason] += 1
        if not torch.compiler.is_compiling() and not self._warned_fallback:
            self._warned_fallback = True
            logger.warning("ProjectionLinear(in_features=%d, out_features=%d) computes with F.linear: %s (%s; "
                           "counted in .fallbacks, logged once per layer)", self.weight.shape[1], self.out_features,
                           reason, describe())

    def _apply(self, fn, *args, **kwargs):
        """Moving or casting the module re-prepares the projection for the new weight; a cast takes a default
        output dtype along. (A weight replaced in place keeps the output dtype: the custom op has allocated it.)"""
        dtype = self.weight.dtype
        result = super()._apply(fn, *args, **kwargs)
        if self.weight.dtype != dtype and self.requested_output_dtype is None:
            self.output_dtype = self.weight.dtype
        self.prepare()
        return result

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name in ("weight", "bias") and "prepared" in self.__dict__:
            self.prepare()

    def forward(self, x):
        """``x @ W^T (+ b)`` by the prepared kernel where it can take ``x``, else ``F.linear`` (counted)."""
        if self.prepared is None or x.device != self.weight.device or x.dtype != self.weight.dtype:
            weight = self.weight
            self.fall_back("unsupported device or dtype", lambda: self.unsupported or (
                f"weight {weight.dtype} on {weight.device}, input {x.dtype} on {x.device}; the kernel takes BF16/FP16 "
                "on a Hopper GPU, the input as the weight"))
            return self.linear(x, self.weight, self.bias).to(self.output_dtype)
        return project(x, self.weight, self.bias, self.handle, self.output_dtype, self.out_features)

    def extra_repr(self):
        """Shape, prepared batches and bias, for ``repr``."""
        gated = ", gated" if self.gated_rows is not None else ""
        return (f"in_features={self.weight.shape[1]}, out_features={self.out_features}, batches={self.batches}, "
                f"bias={self.bias is not None}{gated}")
