"""GPU tests on a Hopper GPU: every tactic of the grid against a float64 reference."""

import pytest
import torch

from decode_projection import PreparedProjection, SplitKTactic
from decode_projection.measure.checks import assert_close_to_reference

from .guarded_output import run_guarded
from .tactic_grid import GRID, tactic_id

pytestmark = pytest.mark.gpu

DTYPES = [
    (torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.float32),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.bfloat16),
]


@pytest.mark.parametrize("tactic", GRID, ids=tactic_id)
def test_every_tactic_matches_float64(tactic):
    index = GRID.index(tactic)
    weight_dtype, out_dtype = DTYPES[index % len(DTYPES)]
    rows, acts = tactic.weight_rows, tactic.activation_rows
    cases = [
        # Ragged N, a K tail, a batch smaller than the activation tile.
        (2 * rows + 40, 1000, max(1, acts - 3)),
        # Batch spanning three activation tiles; K so short most split ranks get nothing.
        (rows + 8, 136, 2 * acts + 5),
    ]
    for n, k, batch in cases:
        weight = torch.randn(n, k, device="cuda").to(weight_dtype)
        x = torch.randn(batch, k, device="cuda").to(weight_dtype)
        projection = PreparedProjection(weight, {batch: tactic}, output_dtype=out_dtype).prepare()
        out = run_guarded(projection, x, n, out_dtype)
        assert_close_to_reference(out, x, weight, label=f"{tactic} N={n} K={k} M={batch} {weight_dtype}->{out_dtype}")


# Unsplit tactics of 32+ activation rows stage 16-bit outputs in shared memory and store 16 bytes at a time:
# one, two and three warpgroups, a padded tile, two column groups, multicast, the weight as B (multicast too).
STAGED = [
    SplitKTactic(64, 64, 1, 4), SplitKTactic(128, 32, 1, 4), SplitKTactic(192, 256, 1, 3),
    SplitKTactic(56, 48, 1, 4, k_boxes=2), SplitKTactic(64, 256, 1, 4, column_groups=2),
    SplitKTactic(64, 64, 1, 3, multicast=2), SplitKTactic(112, 128, 1, 4, weight_as_b=True),
    SplitKTactic(112, 128, 1, 4, multicast=2, weight_as_b=True),
]


# (extra N, first column, spare columns) of the output inside its guarded buffer; N = 2 x weight rows + extra.
# The pitch is N + spare columns; the base is 16-byte aligned where (pitch + first column) is a multiple of 8.
OUTPUT_LAYOUTS = {
    "aligned": (40, 8, 24),  # 16-byte stores throughout
    "odd-n": (37, 8, 27),  # 16-byte stores but for the last, partial chunk of each row
    "odd-base": (40, 3, 24),  # element stores: misaligned base
    "odd-pitch": (40, 8, 21),  # element stores: pitch not a multiple of 8 elements
}


@pytest.mark.parametrize("tactic", STAGED, ids=tactic_id)
@pytest.mark.parametrize("layout", OUTPUT_LAYOUTS)
def test_staged_epilogue_odd_outputs(tactic, layout):
    """16-byte stores where the output allows them, element stores where N, its base or its pitch do not."""
    extra, first_column, spare_columns = OUTPUT_LAYOUTS[layout]
    n, k, batch = 2 * tactic.weight_rows + extra, 520, tactic.activation_rows + 5
    weight = torch.randn(n, k, device="cuda").to(torch.bfloat16)
    x = torch.randn(batch, k, device="cuda").to(torch.bfloat16)
    projection = PreparedProjection(weight, {batch: tactic}).prepare()
    out = run_guarded(projection, x, n, torch.bfloat16, first_column=first_column, spare_columns=spare_columns)
    assert_close_to_reference(out, x, weight, label=f"{tactic} N={n} {layout} output")


@pytest.mark.parametrize("weight_dtype,out_dtype", DTYPES)
@pytest.mark.parametrize("batch", [1, 3, 64])
def test_decode_shape_every_dtype(weight_dtype, out_dtype, batch):
    n, k = 2112, 7168
    tactic = SplitKTactic(64, max(8, 1 << (batch - 1).bit_length()), 4, 6)
    weight = torch.randn(n, k, device="cuda").to(weight_dtype)
    x = torch.randn(batch, k, device="cuda").to(weight_dtype)
    projection = PreparedProjection(weight, {batch: tactic}, output_dtype=out_dtype).prepare()
    out = run_guarded(projection, x, n, out_dtype)
    assert_close_to_reference(out, x, weight, label=f"{n}x{k} M={batch}")


def test_weight_row_slice_of_wider_buffer():
    storage = torch.randn(700, 1536 + 64, device="cuda", dtype=torch.bfloat16)
    weight = storage[:, 32 : 32 + 1536]
    x = torch.randn(16, 1536, device="cuda", dtype=torch.bfloat16)
    projection = PreparedProjection(weight, {16: SplitKTactic(128, 16, 2, 4)}).prepare()
    out = run_guarded(projection, x, 700, torch.bfloat16)
    assert_close_to_reference(out, x, weight, label="weight slice")


@pytest.mark.parametrize("tactic", [SplitKTactic(64, 32, split, 4) for split in (1, 4, 8)]
                         + [SplitKTactic(96, 64, 4, 4, weight_as_b=True)], ids=tactic_id)
def test_bitwise_identical_run_to_run(tactic):
    weight = torch.randn(1536, 7168, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(32, 7168, device="cuda", dtype=torch.bfloat16)
    projection = PreparedProjection(weight, {32: tactic}).prepare()
    first = projection.run(x, torch.empty(32, 1536, device="cuda", dtype=torch.bfloat16)).clone()
    for _ in range(20):
        again = projection.run(x, torch.full_like(first, float("nan")))
        assert torch.equal(again, first)


def test_cuda_graph_capture_and_replay():
    weight = torch.randn(2304, 1536, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(8, 1536, device="cuda", dtype=torch.bfloat16)
    out = torch.full((8, 2304), float("nan"), device="cuda", dtype=torch.bfloat16)
    projection = PreparedProjection(weight, {8: SplitKTactic(64, 8, 2, 8)}).prepare()
    projection.run(x, out)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        projection.run(x, out)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        eager = projection.run(x, torch.empty_like(out))
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
        assert_close_to_reference(out, x, weight, label="graph replay")


@pytest.mark.parametrize("tactic", [SplitKTactic(64, 8, 2, 8), SplitKTactic(64, 64, 1, 4)], ids=tactic_id)
def test_without_programmatic_launch_gives_the_same_bits(tactic):
    """programmatic_launch=False launches the same code: the same bits eagerly and replayed after a torch kernel."""
    weight = torch.randn(2304, 1536, device="cuda", dtype=torch.bfloat16)
    batch = tactic.activation_rows - 3
    x = torch.randn(batch, 1536, device="cuda", dtype=torch.bfloat16)
    chained = PreparedProjection(weight, {batch: tactic}).prepare()
    plain = PreparedProjection(weight, {batch: tactic}, programmatic_launch=False).prepare()
    expected = chained.run(x, torch.empty(batch, 2304, device="cuda", dtype=torch.bfloat16))
    out = run_guarded(plain, x, 2304, torch.bfloat16)
    assert torch.equal(out, expected)
    assert_close_to_reference(out, x, weight, label=f"{tactic} without programmatic launch")
    scratch = torch.zeros(4096, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        scratch.add_(1.0)  # a kernel that never triggers its dependents, as in a model
        plain.run(x, out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)


@pytest.mark.parametrize("tactic", [SplitKTactic(64, 16, 1, 4),
                                    SplitKTactic(64, 8, 1, 6, k_boxes=4, dependents_at_start=True),
                                    SplitKTactic(56, 16, 1, 5, k_boxes=4, dependents_at_start=True),
                                    SplitKTactic(128, 16, 3, 4), SplitKTactic(64, 16, 2, 4, multicast=2)],
                         ids=tactic_id)
def test_chained_launches_read_what_the_previous_one_wrote(tactic):
    """Back to back, each launch reads the previous one's output and overwrites its input: the same
    bits as launches one at a time, eagerly and replayed in a CUDA graph, whichever way it lets the next in."""
    batch = tactic.activation_rows - 4
    up = (torch.randn(2048, 1536, device="cuda") / 1536**0.5).to(torch.bfloat16)
    down = (torch.randn(1536, 2048, device="cuda") / 2048**0.5).to(torch.bfloat16)
    up_projection = PreparedProjection(up, {batch: tactic}).prepare()
    down_projection = PreparedProjection(down, {batch: tactic}).prepare()
    start = torch.randn(batch, 1536, device="cuda", dtype=torch.bfloat16)

    def chain(x, hidden, one_at_a_time=False):
        for _ in range(6):
            for projection, source, target in ((up_projection, x, hidden), (down_projection, hidden, x)):
                projection.run(source, target)
                if one_at_a_time:
                    torch.cuda.synchronize()
        return x

    hidden = torch.full((batch, 2048), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert_close_to_reference(up_projection.run(start, hidden), start, up, label=f"{tactic} first link")
    expected = chain(start.clone(), hidden, one_at_a_time=True).clone()
    assert torch.isfinite(expected).all() and expected.abs().max() > 0.1
    x, hidden = start.clone(), torch.full_like(hidden, float("nan"))
    assert torch.equal(chain(x, hidden), expected)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain(x, hidden)
    x.copy_(start)
    hidden.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(x, expected)


def test_every_launch_takes_its_own_buffers_pitches_and_batch():
    """A kernel's first launch goes through the DSL's own call, later ones through reused argument slots: each
    reads its own x and writes its own out, at their row pitches and batch, and nothing past them."""
    weight = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)
    projection = PreparedProjection(weight, {4: SplitKTactic(64, 8, 2, 4), 16: SplitKTactic(64, 16, 2, 4)}).prepare()
    for batch, x_pitch, out_pitch in ((4, 2048, 1024), (16, 2112, 1032), (4, 4096, 1048), (16, 2048, 1024),
                                      (4, 2112, 1024)):
        x = torch.randn(batch, x_pitch, device="cuda", dtype=torch.bfloat16)[:, :2048]
        rows = torch.full((batch, out_pitch), float("nan"), device="cuda", dtype=torch.bfloat16)
        projection.run(x, rows[:, :1024])
        label = f"batch {batch}, pitches {x_pitch} and {out_pitch}"
        assert_close_to_reference(rows[:, :1024], x, weight, label=label)
        assert torch.isnan(rows[:, 1024:]).all(), label


def test_runs_on_current_stream_without_sync():
    """Behind a busy side stream, run reads what that stream wrote before it and returns before it is done."""
    weight = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)
    fresh = torch.randn(4, 2048, device="cuda", dtype=torch.bfloat16)
    projection = PreparedProjection(weight, {4: SplitKTactic(64, 8, 2, 4)}).prepare()
    projection.run(fresh, torch.empty(4, 1024, device="cuda", dtype=torch.bfloat16))  # loads the module first
    x = torch.full_like(fresh, float("nan"))  # stays NaN until the side stream writes it
    out = torch.full((4, 1024), float("nan"), device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # some 30 ms of spinning on the side stream
        x.copy_(fresh)
        projection.run(x, out)
        returned_early = not side.query()
    side.synchronize()
    assert returned_early, "run waited for its stream"
    assert_close_to_reference(out, fresh, weight, label="side stream")


def test_rejects_bad_inputs_on_gpu():
    weight = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    projection = PreparedProjection(weight, {4: SplitKTactic(64, 8, 1, 4)}).prepare()
    x = torch.randn(4, 512, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(4, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="prepared batches"):
        projection.run(x[:3], out[:3])
    with pytest.raises(ValueError, match="on cpu"):
        projection.run(x.cpu(), out)
    with pytest.raises(ValueError, match="16 B"):
        projection.run(torch.randn(4, 520, device="cuda", dtype=torch.bfloat16)[:, 4:516], out)
    with pytest.raises(ValueError, match="output must be"):
        projection.run(x, out[:, :200])
    projection.weight = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="changed after prepare"):
        projection.run(x, out)
