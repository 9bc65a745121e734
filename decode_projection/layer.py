"""A drop-in ``nn.Linear`` for decode: prepared projections behind a PyTorch custom op.

``ProjectionLinear`` prepares its weight for a set of padded batches and, in
``forward``, calls ``decode_projection::project``, a ``torch.library`` custom op
with a fake implementation, so ``torch.compile(fullgraph=True)`` traces it
without graph breaks and CUDA graphs capture it. The op finds the prepared
projection through a registry handle (an int: custom ops cannot take Python
objects) and dispatches by batch; batches without a tactic, CPU inputs and
dtypes the kernel does not take fall back to ``F.linear``. Every fallback is
counted on the layer (``fallbacks``), never silent. A batch-invariant layer
never falls back for a batch: it runs the rows in the batches it holds (the
largest, then the rest zero-padded), each of which sums in the one order.
"""

import itertools
import weakref
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

from .gpu import gpu_spec
from .policies import resolve_policies
from .projection import OUTPUT_DTYPES, WEIGHT_DTYPES, PreparedProjection, check_weight
from .runtime import architecture

# Layers by handle; weak, so a dropped layer does not live on here.
_registry = weakref.WeakValueDictionary()
_handles = itertools.count(1)


@torch.library.custom_op("decode_projection::project", mutates_args=())
def project(x: torch.Tensor, weight: torch.Tensor, handle: int, out_dtype: torch.dtype) -> torch.Tensor:
    """``x @ weight^T`` through the prepared projection ``handle``, else ``F.linear``."""
    layer = _registry[handle]
    rows = x.reshape(-1, x.shape[-1])
    prepared = layer.prepared
    if prepared is not None and prepared._storage(weight) != prepared._prepared_storage:
        # The weight was replaced behind the module's back (``layer.weight.data = ...``).
        if torch.cuda.is_current_stream_capturing():
            raise ValueError("ProjectionLinear's weight changed since it was prepared; call prepare() before capturing")
        layer.prepare()
        prepared = layer.prepared
    held = prepared.kernels if prepared is not None else {}
    if rows.shape[0] not in held and not (layer.batch_invariant and held and rows.shape[0] > 0):
        layer.fallbacks["batch without a tactic" if prepared is not None else "not prepared"] += 1
        return F.linear(x, weight).to(out_dtype)
    pitch = rows.stride(0) * rows.element_size()
    if rows.stride(1) != 1 or rows.data_ptr() % 16 or (rows.shape[0] > 1 and (pitch % 16 or rows.stride(0) < rows.shape[1])):
        rows = rows.clone(memory_format=torch.contiguous_format)  # TMA wants dense, 16-byte aligned rows
    out = torch.empty(rows.shape[0], weight.shape[0], device=x.device, dtype=out_dtype)
    if rows.shape[0] in held:
        prepared.run(rows, out)
    else:
        run_in_held_batches(prepared, rows, out)
    return out.reshape(*x.shape[:-1], weight.shape[0])


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
def _(x, weight, handle, out_dtype):
    return x.new_empty(*x.shape[:-1], weight.shape[0], dtype=out_dtype)


def default_output_dtype(weight_dtype: torch.dtype) -> torch.dtype:
    """FP32 for an FP16 weight (the kernel writes BF16 or FP32), else the weight's own dtype."""
    return torch.float32 if weight_dtype == torch.float16 else weight_dtype


def check_arguments(weight, bias, output_dtype, batch_invariant, programmatic_launch):
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
    if output_dtype is not None and output_dtype not in OUTPUT_DTYPES:
        raise ValueError(f"ProjectionLinear output dtype must be one of {list(OUTPUT_DTYPES)}, got {output_dtype}")
    for name, flag in (("batch_invariant", batch_invariant), ("programmatic_launch", programmatic_launch)):
        if not isinstance(flag, bool):
            raise TypeError(f"ProjectionLinear {name} must be a bool, got {flag!r}")


class ProjectionLinear(nn.Module):
    """``y = x @ W^T (+ b)`` with the split-K decode kernel for the prepared padded batches.

    The output is BF16 for BF16 weights and FP32 for FP16 weights (the kernel
    writes BF16 or FP32; other weights give their own dtype, as ``nn.Linear`` does,
    also after a cast such as ``.half()`` or ``.float()``) unless ``output_dtype`` says otherwise; a bias is added
    to the rounded output. On a GPU other than Hopper, or with a weight the kernel
    cannot take (``check_weight``), the layer is plain ``F.linear`` (``unsupported``
    says why). A fallback computes as ``F.linear`` in the weight's dtype, then
    casts, as the ``nn.Linear`` it replaces would. ``programmatic_launch=False``
    launches the kernel without programmatic dependent launch, which measured
    faster between kernels that never trigger their dependents (PreparedProjection).
    """

    def __init__(self, weight, bias=None, *, batches=(1, 2, 4, 8, 16, 32, 64), output_dtype=None,
                 batch_invariant=False, programmatic_launch=True):
        super().__init__()
        check_arguments(weight, bias, output_dtype, batch_invariant, programmatic_launch)
        self.weight = nn.Parameter(weight.detach(), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        self.batches = tuple(batches)
        if not all(isinstance(batch, int) and batch >= 1 for batch in self.batches):
            raise ValueError(f"ProjectionLinear batches must be positive ints, got {self.batches}")
        self.requested_output_dtype = output_dtype  # None: the weight's default, whatever dtype it is cast to
        self.output_dtype = output_dtype or default_output_dtype(weight.dtype)
        self.batch_invariant = batch_invariant
        self.programmatic_launch = programmatic_launch
        self.fallbacks = Counter()
        self.prepared = None
        self.unsupported = None
        self._register()
        self.prepare()

    def _register(self):
        """Take a fresh handle for the custom op to find this layer by."""
        self.handle = next(_handles)
        _registry[self.handle] = self

    def __getstate__(self):
        # Descriptors and compiled code belong to this process and this copy.
        state = dict(self.__dict__)
        state.update(prepared=None, handle=None)
        return state

    def __setstate__(self, state):
        state.setdefault("requested_output_dtype", state["output_dtype"])  # pickled before it was kept apart
        self.__dict__.update(state)
        self._register()
        self.prepare()

    @classmethod
    def from_linear(cls, linear: nn.Linear, **options):
        """A ProjectionLinear holding ``linear``'s weight and bias."""
        return cls(linear.weight, linear.bias, **options)

    def prepare(self):
        """(Re)build the prepared projection for the weight as it is now; CPU or unsupported: none."""
        if self.prepared is not None:
            # Launches on any stream may still read the old projection's descriptors, freed with it.
            torch.cuda.synchronize(self.prepared.device)
        self.prepared, self.unsupported = None, None
        weight = self.weight
        if weight.device.type != "cuda" or weight.dtype not in WEIGHT_DTYPES:
            return
        try:
            architecture(weight.device)
            check_weight(weight.data)
            n, k = weight.shape
            policies, _ = resolve_policies(
                n, k, self.batches, gpu=gpu_spec(weight.device), weight_dtype=weight.dtype,
                output_dtype=self.output_dtype, batch_invariant=self.batch_invariant,
            )
            # Also refuses a second GPU in one process (projection._claim_device): that layer falls back.
            self.prepared = PreparedProjection(weight.data, policies, output_dtype=self.output_dtype,
                                               programmatic_launch=self.programmatic_launch).prepare()
        except ValueError as error:
            self.unsupported = str(error)

    def _apply(self, fn, *args, **kwargs):
        """Moving or casting the module re-prepares the projection for the new weight; a cast takes a default
        output dtype along. (A weight replaced in place keeps the output dtype: the custom op has allocated it.)"""
        dtype = self.weight.dtype
        result = super()._apply(fn, *args, **kwargs)
        if self.weight.dtype != dtype and self.requested_output_dtype is None:
            self.output_dtype = default_output_dtype(self.weight.dtype)
        self.prepare()
        return result

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name == "weight" and "prepared" in self.__dict__:
            self.prepare()

    def forward(self, x):
        """``x @ W^T (+ b)`` by the prepared kernel where it can take ``x``, else ``F.linear`` (counted)."""
        if self.prepared is None or x.device != self.weight.device or x.dtype != self.weight.dtype:
            self.fallbacks["unsupported device or dtype"] += 1
            return F.linear(x, self.weight, self.bias).to(self.output_dtype)
        out = project(x, self.weight, self.handle, self.output_dtype)
        return out if self.bias is None else out + self.bias

    def extra_repr(self):
        """Shape, prepared batches and bias, for ``repr``."""
        n, k = self.weight.shape
        return f"in_features={k}, out_features={n}, batches={self.batches}, bias={self.bias is not None}"
