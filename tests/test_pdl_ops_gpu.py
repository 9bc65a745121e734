"""GPU tests of the decode glue ops: float64-referenced (every element within one ulp, the whole within twice
PyTorch's own error), outputs in NaN-poisoned guarded buffers, bitwise repeatable and batch invariant, in place,
chained with projections under programmatic dependent launch, in CUDA graphs and under torch.compile."""

import pytest
import torch

from decode_projection import ops
from decode_projection.kernel import activation, norm
from decode_projection.measure.ops_reference import (
    GlueReference,
    rms_norm_float64,
    silu_and_mul_float64,
    torch_rms_norm,
    torch_silu_and_mul,
)
from decode_projection.projection import PreparedProjection

pytestmark = pytest.mark.gpu

DTYPES = (torch.bfloat16, torch.float16)
NORM_WIDTHS = (7168, 1536, 512, 520, 8)  # Kimi-K3's hidden, q and kv latents; a ragged last vector pass; one vector
SILU_WIDTHS = (4224, 1536, 2304, 8)  # N: dense and shared MLPs, a width of 18 CTAs, one vector
BATCHES = (1, 3, 64, 256)
FIRST_COLUMN, SPARE = 8, 24  # where a guarded output sits in its buffer: 16-byte aligned, a pitch of width + 24


@pytest.fixture(autouse=True)
def poisoned_allocations():
    """Every ``torch.empty`` starts as NaN, the ops' own outputs included: an element the kernel skips shows."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)  # fills uninitialized memory; warns, never refuses
    assert torch.isnan(torch.empty(4, device="cuda", dtype=torch.bfloat16)).all()
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def rows(batch, width, dtype, *, scales=True, scale=1.0, wide=False):
    """Fresh random rows (never zeros) times ``scale``, with ``scales`` each row of its own magnitude; ``wide``: a
    16-byte aligned column slice of a wider buffer (a row pitch other than the width)."""
    x = torch.randn(batch, width + (32 if wide else 0), device="cuda", dtype=torch.float32) * scale
    if scales:
        x *= torch.logspace(-2, 2, batch, device="cuda")[:, None]  # 0.01 to 100: each row normalized on its own
    x = x.to(dtype)
    return x[:, 16 : 16 + width] if wide else x


class Guarded:
    """A NaN-poisoned output [rows, cols] inside a wider buffer whose rest must stay NaN."""

    def __init__(self, batch, cols, dtype):
        self.buffer = torch.full((batch + 2, cols + SPARE), float("nan"), device="cuda", dtype=dtype)
        self.out = self.buffer[1 : batch + 1, FIRST_COLUMN : FIRST_COLUMN + cols]

    def check(self):
        """Raise if the kernel wrote outside ``out``."""
        torch.cuda.synchronize()
        guard = self.buffer.clone()
        guard[1:-1, FIRST_COLUMN : FIRST_COLUMN + self.out.shape[1]] = float("nan")
        assert torch.isnan(guard).all(), "the kernel wrote outside its output"
        return self.out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", NORM_WIDTHS)
@pytest.mark.parametrize("batch", BATCHES)
def test_rms_norm_matches_float64_and_repeats_bitwise(dtype, width, batch):
    x = rows(batch, width, dtype, wide=batch == 3)
    weight = torch.randn(width, device="cuda", dtype=dtype)
    eps = 1e-6 if width > 8 else 1e-5
    guarded = Guarded(batch, width, dtype)
    norm.rms_norm(x, weight, eps, out=guarded.out)
    out = guarded.check()
    label = f"rms_norm {dtype} {batch}x{width}"
    GlueReference(rms_norm_float64(x, weight, eps), torch_rms_norm(x, weight, eps)).check(out, label)
    assert torch.equal(norm.rms_norm(x, weight, eps), out), f"{label}: a second run differs"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", NORM_WIDTHS)
@pytest.mark.parametrize("batch", BATCHES)
def test_fused_add_rms_norm_writes_the_sum_and_its_norm(dtype, width, batch):
    x = rows(batch, width, dtype, wide=batch == 3)
    residual = rows(batch, width, dtype, scales=False)
    weight = torch.randn(width, device="cuda", dtype=dtype)
    out, total = Guarded(batch, width, dtype), Guarded(batch, width, dtype)
    norm.fused_add_rms_norm(x, residual, weight, 1e-6, out=out.out, residual_out=total.out)
    y, s = out.check(), total.check()
    label = f"fused_add_rms_norm {dtype} {batch}x{width}"
    # The sum is rounded once, as PyTorch's own addition rounds it; the norm is of that rounded sum.
    assert torch.equal(s, x + residual), f"{label}: residual_out != x + residual"
    GlueReference(rms_norm_float64(s, weight, 1e-6), torch_rms_norm(s, weight, 1e-6)).check(y, label)
    assert torch.equal(norm.rms_norm(s, weight, 1e-6), y), f"{label}: differs from rms_norm of its own sum"
    again, again_total = norm.fused_add_rms_norm(x, residual, weight, 1e-6)
    assert torch.equal(again, y) and torch.equal(again_total, s), f"{label}: a second run differs"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SILU_WIDTHS)
@pytest.mark.parametrize("batch", BATCHES)
def test_silu_and_mul_matches_float64_and_repeats_bitwise(dtype, n, batch):
    x = rows(batch, 2 * n, dtype, scales=False, scale=3.0, wide=batch == 3)
    # The exponential's far ends in the gate: silu(-100) underflows to -0, silu(100) is 100.
    x[0, :4] = torch.tensor([-100.0, -30.0, 30.0, 100.0], dtype=dtype)
    guarded = Guarded(batch, n, dtype)
    activation.silu_and_mul(x, out=guarded.out)
    out = guarded.check()
    label = f"silu_and_mul {dtype} {batch}x{n}"
    GlueReference(silu_and_mul_float64(x), torch_silu_and_mul(x)).check(out, label)
    assert torch.equal(activation.silu_and_mul(x), out), f"{label}: a second run differs"


def test_rows_do_not_depend_on_the_batch():
    """Each row alone gives the bits it gets among 64 others (norms, fused norms and SiLU-and-mul alike)."""
    x, residual = rows(64, 7168, torch.bfloat16), rows(64, 7168, torch.bfloat16)
    weight = torch.randn(7168, device="cuda", dtype=torch.bfloat16)
    together = norm.rms_norm(x, weight), *norm.fused_add_rms_norm(x, residual, weight), activation.silu_and_mul(x)
    for row in (0, 17, 63):
        alone = (norm.rms_norm(x[row : row + 1], weight), *norm.fused_add_rms_norm(
            x[row : row + 1], residual[row : row + 1], weight), activation.silu_and_mul(x[row : row + 1]))
        for a, b in zip(alone, together):
            assert torch.equal(a[0], b[row]), f"row {row}"


def test_zero_rows_normalize_to_zeros():
    x = rows(4, 1536, torch.bfloat16)
    x[2] = 0
    weight = torch.randn(1536, device="cuda", dtype=torch.bfloat16)
    out = norm.rms_norm(x, weight)
    assert torch.equal(out[2], torch.zeros_like(out[2])) and torch.isfinite(out).all()


def test_in_place_matches_out_of_place_bitwise():
    x, residual = rows(16, 7168, torch.bfloat16), rows(16, 7168, torch.bfloat16)
    weight = torch.randn(7168, device="cuda", dtype=torch.bfloat16)
    y, s = norm.fused_add_rms_norm(x, residual, weight)
    x_in, residual_in = x.clone(), residual.clone()
    # vLLM's in-place form: the normalized rows over the input, the sum over the residual.
    norm.fused_add_rms_norm(x_in, residual_in, weight, out=x_in, residual_out=residual_in)
    assert torch.equal(x_in, y) and torch.equal(residual_in, s)
    x_in = x.clone()
    norm.fused_add_rms_norm(x_in, residual, weight, out=residual_in, residual_out=x_in)
    assert torch.equal(x_in, s) and torch.equal(residual_in, y)
    x_in = x.clone()
    assert torch.equal(norm.rms_norm(x_in, weight, out=x_in), norm.rms_norm(x, weight))


def test_plain_launch_matches_programmatic_launch():
    x, residual = rows(8, 7168, torch.bfloat16), rows(8, 7168, torch.bfloat16)
    weight = torch.randn(7168, device="cuda", dtype=torch.bfloat16)
    for launch in (norm.rms_norm, activation.silu_and_mul):
        args = (x, weight) if launch is norm.rms_norm else (x,)
        assert torch.equal(launch(*args, programmatic_launch=False), launch(*args))
    plain = norm.fused_add_rms_norm(x, residual, weight, programmatic_launch=False)
    for a, b in zip(plain, norm.fused_add_rms_norm(x, residual, weight)):
        assert torch.equal(a, b)


class Chain:
    """Decoder-block shaped steps on fixed buffers, each kernel reading what the one before it wrote:
    fused_add_rms_norm -> gate_up projection -> silu_and_mul -> down projection -> (next step's norm)."""

    def __init__(self, batch=8, hidden=7168, inner=1536):
        def weight(n, k):
            return (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)

        self.up = PreparedProjection.for_weight(weight(2 * inner, hidden), batches=(batch,))
        self.down = PreparedProjection.for_weight(weight(hidden, inner), batches=(batch,))
        self.norm_weight = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        self.h, self.residual, self.y = (torch.empty(batch, hidden, device="cuda", dtype=torch.bfloat16)
                                         for _ in range(3))
        self.gate_up = torch.empty(batch, 2 * inner, device="cuda", dtype=torch.bfloat16)
        self.act = torch.empty(batch, inner, device="cuda", dtype=torch.bfloat16)
        self.start = rows(batch, hidden, torch.bfloat16, scales=False), rows(batch, hidden, torch.bfloat16)

    def reset(self):
        self.h.copy_(self.start[0])
        self.residual.copy_(self.start[1])

    def run(self, steps, *, synchronize=False):
        """``steps`` steps; with ``synchronize`` the host waits after every kernel (no overlap at all)."""
        pause = torch.cuda.synchronize if synchronize else (lambda: None)
        for _ in range(steps):
            norm.fused_add_rms_norm(self.h, self.residual, self.norm_weight, out=self.y, residual_out=self.residual)
            pause()
            self.up.run(self.y, self.gate_up)
            pause()
            activation.silu_and_mul(self.gate_up, out=self.act)
            pause()
            self.down.run(self.act, self.h)
            pause()

    def state(self):
        return [t.clone() for t in (self.h, self.residual, self.y, self.gate_up, self.act)]


def test_chain_with_projections_under_pdl_matches_a_synchronized_chain():
    """Back-to-back PDL launches (each glue kernel triggers its dependents at its start) give the bits of the
    same kernels run one at a time: nobody read an input before its producer had finished."""
    chain = Chain()
    chain.reset()
    chain.run(1, synchronize=True)
    torch.cuda.synchronize()
    # The first step, judged on its own: the norm against float64, the activation against float64 of its input.
    h0, residual0 = chain.start
    s = h0 + residual0
    assert torch.equal(chain.residual, s)
    GlueReference(rms_norm_float64(s, chain.norm_weight, 1e-6),
                  torch_rms_norm(s, chain.norm_weight, 1e-6)).check(chain.y, "chain norm")
    GlueReference(silu_and_mul_float64(chain.gate_up), torch_silu_and_mul(chain.gate_up)).check(chain.act, "chain silu")

    chain.reset()
    chain.run(6, synchronize=True)
    expected = chain.state()
    assert all(torch.isfinite(t).all() for t in expected)
    chain.reset()
    chain.run(6)
    torch.cuda.synchronize()
    for name, got, want in zip(("h", "residual", "y", "gate_up", "act"), chain.state(), expected):
        assert torch.equal(got, want), f"chained {name} differs from the synchronized chain"

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain.run(6)
    for _ in range(3):
        chain.reset()
        graph.replay()
        torch.cuda.synchronize()
        for name, got, want in zip(("h", "residual", "y", "gate_up", "act"), chain.state(), expected):
            assert torch.equal(got, want), f"graph-replayed {name} differs from the synchronized chain"


def block(h, residual, norm_weight, gate_up, down):
    """The custom ops between two matmuls."""
    y, residual = ops.fused_add_rms_norm(h, residual, norm_weight)
    h = ops.silu_and_mul(y @ gate_up.T) @ down.T
    return ops.rms_norm(h, norm_weight), residual


def block_inputs(batch=4):
    h = rows(batch, 1536, torch.bfloat16, scales=False).reshape(2, batch // 2, 1536)
    residual = torch.randn_like(h)
    norm_weight = torch.randn(1536, device="cuda", dtype=torch.bfloat16)
    gate_up = (torch.randn(2 * 2304, 1536, device="cuda") / 40).to(torch.bfloat16)
    down = (torch.randn(1536, 2304, device="cuda") / 50).to(torch.bfloat16)
    return h, residual, norm_weight, gate_up, down


def test_custom_ops_match_the_kernels_and_their_references():
    h, residual, norm_weight, gate_up, down = block_inputs()
    y, s = ops.fused_add_rms_norm(h, residual, norm_weight)
    assert y.shape == s.shape == h.shape and torch.equal(s, h + residual)
    assert torch.equal(y.reshape(4, -1), norm.rms_norm(s.reshape(4, -1), norm_weight))
    product = y @ gate_up.T
    GlueReference(silu_and_mul_float64(product), torch_silu_and_mul(product)).check(ops.silu_and_mul(product),
                                                                                    "op silu_and_mul")
    # Rows that are not 16-byte vectors as they are get copied, not refused.
    odd = rows(3, 1536 + 4, torch.bfloat16)[:, 4:]
    GlueReference(rms_norm_float64(odd, norm_weight, 1e-6), torch_rms_norm(odd, norm_weight, 1e-6)).check(
        ops.rms_norm(odd, norm_weight), "op on unaligned rows")


def test_custom_ops_under_torch_compile_fullgraph():
    torch._dynamo.reset()
    inputs = block_inputs()
    eager = block(*inputs)
    compiled = torch.compile(block, fullgraph=True)(*inputs)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b)


def test_custom_ops_in_a_cuda_graph():
    h, residual, norm_weight, _, _ = block_inputs()

    def glue():
        y, s = ops.fused_add_rms_norm(h, residual, norm_weight)
        return ops.silu_and_mul(y), ops.rms_norm(s, norm_weight)

    glue()  # compiles the kernels and loads their modules before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = glue()
    for _ in range(3):
        h.copy_(torch.randn_like(h))
        residual.copy_(torch.randn_like(residual))
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip(captured, glue()):
            assert torch.equal(a, b)


def test_calls_reusing_the_call_slots_compute_on_their_own_operands():
    """After a kernel's first launch every call writes its own addresses, extents and pitches into the kernel's
    call slots: calls alternating batch, width, row pitch and in place or not each match float64, and a CUDA graph
    keeps the values of the launches it captured, whatever later calls wrote into the slots."""
    dtype = torch.bfloat16
    cells = [(1, 7168, False), (64, 1536, True), (3, 520, False), (256, 8, True), (5, 7168, True)]
    for batch, width, wide in cells * 2:
        x, residual = rows(batch, width, dtype, wide=wide), rows(batch, width, dtype, scales=False, wide=not wide)
        weight = torch.randn(width, device="cuda", dtype=dtype)
        label, eps = f"{batch}x{width} wide={wide}", 1e-6 if width > 8 else 1e-5
        y = norm.rms_norm(x, weight, eps)
        GlueReference(rms_norm_float64(x, weight, eps), torch_rms_norm(x, weight, eps)).check(y, f"norm {label}")
        in_place = x.clone()
        assert torch.equal(norm.rms_norm(in_place, weight, eps, out=in_place), y), f"in-place norm {label}"
        out, total = Guarded(batch, width, dtype), Guarded(batch, width, dtype)
        norm.fused_add_rms_norm(x, residual, weight, out=out.out, residual_out=total.out)
        s = total.check()
        assert torch.equal(s, x + residual), f"fused sum {label}"
        assert torch.equal(out.check(), norm.rms_norm(s, weight)), f"fused norm {label}"
        x_in, residual_in = x.clone(), residual.clone()
        norm.fused_add_rms_norm(x_in, residual_in, weight, out=x_in, residual_out=residual_in)
        assert torch.equal(x_in, out.out) and torch.equal(residual_in, s), f"in-place fused norm {label}"
        gate_up = rows(batch, 2 * width, dtype, scales=False, scale=3.0, wide=wide)
        activated = Guarded(batch, width, dtype)
        activation.silu_and_mul(gate_up, out=activated.out)
        GlueReference(silu_and_mul_float64(gate_up), torch_silu_and_mul(gate_up)).check(activated.check(),
                                                                                        f"silu {label}")

    captured_x, captured_residual = rows(8, 1536, dtype), rows(8, 1536, dtype, wide=True)
    weight = torch.randn(1536, device="cuda", dtype=dtype)
    y, fused_y, s, act = (torch.empty(8, 1536, device="cuda", dtype=dtype) for _ in range(4))
    gate_up = rows(8, 3072, dtype, scales=False, wide=True)

    def glue():
        norm.rms_norm(captured_x, weight, out=y)
        norm.fused_add_rms_norm(captured_x, captured_residual, weight, out=fused_y, residual_out=s)
        activation.silu_and_mul(gate_up, out=act)

    glue()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        glue()
    # Eager calls on other operands after the capture rewrite every slot.
    other = rows(3, 7168, dtype)
    other_weight = torch.randn(7168, device="cuda", dtype=dtype)
    other_y = norm.rms_norm(other, other_weight)
    norm.fused_add_rms_norm(other, other, other_weight)
    activation.silu_and_mul(other)
    for _ in range(2):
        for tensor in (captured_x, captured_residual, gate_up):
            tensor.copy_(torch.randn_like(tensor))
        for output in (y, fused_y, s, act):
            output.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, norm.rms_norm(captured_x, weight)), "replayed rms_norm"
        assert torch.equal(s, captured_x + captured_residual), "replayed fused sum"
        assert torch.equal(fused_y, norm.rms_norm(s, weight)), "replayed fused norm"
        assert torch.equal(act, activation.silu_and_mul(gate_up)), "replayed silu_and_mul"
    assert torch.equal(norm.rms_norm(other, other_weight), other_y)
