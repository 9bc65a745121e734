"""CPU tests: argument validation, the code-only compile cache, and every tactic's SASS."""

import contextlib
import gc
import math
import re
import threading
import time
import weakref
from dataclasses import replace

import cutlass
import cutlass.cute as cute
import pytest
import torch

from decode_projection import PreparedProjection, SplitKTactic, compile_projection, projection
from decode_projection.projection import Epilogue
from decode_projection.kernel.splitk import EVICT_LAST, SplitKGemm
from decode_projection.kernel.tactic import PRODUCER_REGISTERS, as_tactic, max_stages
from decode_projection.policy.policies import default_tactic, grid_ctas
from decode_projection.policy.tables import shipped_tables
from decode_projection.policy.workload import DECODE_BATCHES, KIMI_K3_SHAPES
from decode_projection.runtime.call_slots import CallSlots
from decode_projection.runtime.sass import kernel_report

from .tactic_grid import EPILOGUE_CASES, EPILOGUE_PATHS, GATED_PATHS, GRID, code_path, tactic_id

TACTIC = SplitKTactic(64, 8, 2, 4)


def kernels_called_in_python(monkeypatch):
    """Every launch calls its kernel with the DSL-typed arguments (``launch_arguments``) on a stream handle of 0,
    never through the launch slots: tests swap kernels for Python functions that record their calls."""
    monkeypatch.setattr(projection, "current_stream_handle", lambda device: 0)
    monkeypatch.setattr(CallSlots, "launch", lambda slots, code, values, arguments: code(*arguments()))


def pretend_hopper(monkeypatch, events=None):
    """Let prepare() run on the CPU: real compile for sm_90a; synchronizes are recorded in ``events``."""
    events = [] if events is None else events
    monkeypatch.setattr(projection, "architecture", lambda device: "sm_90a")
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append("synchronized"))
    return events


@pytest.fixture
def prepared(monkeypatch):
    """A projection prepared on the CPU, ready for validation tests (never launched)."""
    pretend_hopper(monkeypatch)
    weight = torch.randn(256, 512, dtype=torch.bfloat16)
    return PreparedProjection(weight, {4: TACTIC, 16: SplitKTactic(64, 16, 1, 4)}).prepare()


def test_weight_validation_messages():
    with pytest.raises(ValueError, match=r"BF16/FP16 \[N, K\] matrix, got \(4, 4, 4\)"):
        PreparedProjection(torch.zeros(4, 4, 4, dtype=torch.bfloat16), {})
    with pytest.raises(ValueError, match="torch.float32"):
        PreparedProjection(torch.zeros(4, 8), {})
    with pytest.raises(ValueError, match="unit stride and a 16 B TMA pitch"):
        PreparedProjection(torch.zeros(8, 16, dtype=torch.bfloat16).T, {})
    with pytest.raises(ValueError, match="unit stride and a 16 B TMA pitch"):
        PreparedProjection(torch.zeros(8, 12, dtype=torch.bfloat16), {})  # 24-byte pitch
    with pytest.raises(ValueError, match="K % 8 == 0"):
        PreparedProjection(torch.zeros(8, 1024, dtype=torch.bfloat16)[:, :1004], {})
    with pytest.raises(ValueError, match="rows overlap"):
        PreparedProjection(torch.zeros(1, 64, dtype=torch.bfloat16).expand(8, 64), {})
    with pytest.raises(ValueError, match="unsupported projection output dtype"):
        PreparedProjection(torch.zeros(8, 16, dtype=torch.bfloat16), {}, output_dtype=torch.float64)
    with pytest.raises(TypeError):
        PreparedProjection([[1.0]], {})


def test_policy_validation():
    weight = torch.zeros(8, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="activation rows 12"):
        PreparedProjection(weight, {1: (64, 12, 1, 4)})
    with pytest.raises(ValueError, match="shared memory"):
        PreparedProjection(weight, {1: (128, 256, 1, 8)})
    with pytest.raises(ValueError, match="positive int"):
        PreparedProjection(weight, {0: TACTIC})
    # A launch holds at most 65535 activation tiles (the grid's y).
    PreparedProjection(weight, {65535 * 8: (64, 8, 1, 4)})
    with pytest.raises(ValueError, match="65536 activation tiles of 8 rows"):
        PreparedProjection(weight, {65535 * 8 + 1: (64, 8, 1, 4)})
    # Tactic fields are Python ints and bools: NumPy integers or floats failed only inside the compiler.
    with pytest.raises(ValueError, match="stages 4.5 is not int"):
        PreparedProjection(weight, {1: (64, 8, 1, 4.5)})
    with pytest.raises(ValueError, match="weight_as_b 1 is not bool"):
        PreparedProjection(weight, {1: (64, 8, 1, 4, 1, 1, 1, 1)})


def test_small_input_gaps_are_refused_with_the_reason():
    weight = torch.zeros(8, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="at least one batch"):
        PreparedProjection(weight, {})
    for empty in (torch.zeros(8, 0, dtype=torch.bfloat16), torch.zeros(0, 16, dtype=torch.bfloat16)):
        with pytest.raises(ValueError, match="weight is empty"):
            PreparedProjection(empty, {1: TACTIC})
    for batches, error in [((True,), ValueError), ((), ValueError), ((1, 2.0), ValueError), (4, TypeError)]:
        with pytest.raises(error, match="for_weight batches must be"):
            PreparedProjection.for_weight(weight, batches)


def test_a_grid_wider_than_a_launch_is_refused():
    """8-row weight tiles split 8 ways: 2^31 - 1 rows need 2^31 CTAs along x, one more than a launch has."""
    tactic = (8, 8, 8, 4)
    PreparedProjection(torch.empty(2**31 - 8, 8, dtype=torch.bfloat16, device="meta"), {1: tactic})
    with pytest.raises(ValueError, match="2147483648 CTAs wide"):
        PreparedProjection(torch.empty(2**31 - 1, 8, dtype=torch.bfloat16, device="meta"), {1: tactic})


@pytest.mark.parametrize("tactic", GRID, ids=tactic_id)
def test_grid_columns_times_grid_rows_is_the_grid(tactic):
    """Whole groups of activation sharers along x, each weight tile ``split`` CTAs wide; as the cost model counts."""
    for n, batch in ((130, 1), (2112, 77), (7168, 256)):
        tiles = -(-n // tactic.weight_rows)
        columns = -(-tiles // tactic.activation_sharers) * tactic.activation_sharers * tactic.split
        assert tactic.grid_columns(n) == columns
        assert columns * tactic.grid_rows(batch) == grid_ctas(tactic, n, batch)


def test_prepare_refuses_cpu_weight():
    weight = torch.zeros(64, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA devices"):
        PreparedProjection(weight, {1: TACTIC}).prepare()


def test_run_rejects_bad_arguments(prepared):
    x = torch.randn(4, 512, dtype=torch.bfloat16)
    out = torch.empty(4, 256, dtype=torch.bfloat16)
    cases = [
        (x[:3], out[:3], ValueError, r"prepared batches \[4, 16\], K 512"),
        (torch.randn(4, 256, dtype=torch.bfloat16), out, ValueError, "K 512"),
        (x.half(), out, ValueError, "input dtype torch.float16"),
        (x, out.float(), ValueError, "output dtype torch.float32"),
        (x, out[:, :128], ValueError, r"output must be \(4, 256\)"),
        (x, torch.empty(256, 4, dtype=torch.bfloat16).T, ValueError, "output rows need unit stride"),
        (x.T.contiguous().T, out, ValueError, "input rows need unit stride"),
        (torch.randn(4, 520, dtype=torch.bfloat16)[:, 4:516], out, ValueError, "16 B aligned"),
        (x[None], out, ValueError, "must be 2-D"),
        ("x", out, TypeError, "torch.Tensor"),
        (x, x[:, :256], ValueError, "overlaps"),
        (torch.randn(1, 512, dtype=torch.bfloat16).expand(4, 512), out, ValueError, "input rows overlap"),
        (torch.randn(4, 516, dtype=torch.bfloat16)[:, :512], out, ValueError, "16 B aligned base and row pitch"),
        (x, torch.empty(1, 256, dtype=torch.bfloat16).expand(4, 256), ValueError, "output rows overlap"),
        (x, prepared.weight[:4, :256], ValueError, "overlaps its input or weight"),
        (x, torch._neg_view(out), ValueError, "output is a negated view"),
        (x, out.clone().requires_grad_(), ValueError, "output requires grad"),
    ]
    for bad_x, bad_out, error, message in cases:
        with pytest.raises(error, match=message):
            prepared.run(bad_x, bad_out)


def test_run_rejects_changed_weight(prepared):
    prepared.weight = torch.randn(256, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="changed after prepare"):
        prepared.run(torch.randn(4, 512, dtype=torch.bfloat16), torch.empty(4, 256, dtype=torch.bfloat16))


def test_a_weight_a_graph_captured_stays_alive_with_its_projection(monkeypatch):
    """A graph captured before a weight of new storage was prepared holds the old weight's map (encoded at its
    launch): that weight's memory must stay valid while the projection lives. A weight no graph captured is not
    kept, so re-preparing for weight after weight holds no memory, and nothing waits for the device."""
    events = pretend_hopper(monkeypatch)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
    kernels_called_in_python(monkeypatch)
    graph_capturing = [False]
    monkeypatch.setattr(projection, "capturing", lambda: graph_capturing[0])
    x, out = torch.randn(4, 512, dtype=torch.bfloat16), torch.empty(4, 256, dtype=torch.bfloat16)

    def run_with(weight, captured):
        prepared.weight = weight
        prepared.prepare()
        prepared.kernels.update({batch: (lambda *args: None) for batch in prepared.kernels})
        graph_capturing[0] = captured
        prepared.run(x, out)
        prepared.run(x, out)
        graph_capturing[0] = False

    captured, eager_only = torch.randn(256, 512, dtype=torch.bfloat16), torch.randn(256, 512, dtype=torch.bfloat16)
    alive = {"captured": weakref.ref(captured), "eager only": weakref.ref(eager_only)}
    prepared = PreparedProjection(captured, {4: TACTIC})
    run_with(captured, True)
    run_with(eager_only, False)
    run_with(torch.randn(256, 512, dtype=torch.bfloat16), False)
    del captured, eager_only
    gc.collect()
    assert alive["captured"]() is not None and alive["eager only"]() is None and events == []
    assert [weight.shape for weight, bias in prepared._captured_operands] == [(256, 512)]
    del prepared
    gc.collect()
    assert alive["captured"]() is None


def test_prepare_in_another_thread_waits_for_a_launch_under_way(prepared, monkeypatch):
    """A run that has checked its arguments launches with the kernels it checked against."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
    kernels_called_in_python(monkeypatch)
    launched = []
    prepared.kernels.update({batch: (lambda *args, batch=batch: launched.append(batch)) for batch in prepared.kernels})
    checked = projection.overlaps

    def prepare_elsewhere_once_checked(tensor, *others):
        # Another thread re-prepares without batch 4 between this run's checks and its launch.
        monkeypatch.setattr(projection, "overlaps", checked)
        prepared.policies = {16: SplitKTactic(64, 16, 1, 4)}
        preparing = threading.Thread(target=prepared.prepare)
        preparing.start()
        preparing.join(timeout=0.5)
        return checked(tensor, *others)

    monkeypatch.setattr(projection, "overlaps", prepare_elsewhere_once_checked)
    x, out = torch.randn(4, 512, dtype=torch.bfloat16), torch.empty(4, 256, dtype=torch.bfloat16)
    assert prepared.run(x, out) is out and launched == [4]
    for _ in range(200):  # the other thread goes on once the launch is done
        if sorted(prepared.kernels) == [16]:
            break
        time.sleep(0.05)
    with pytest.raises(ValueError, match=r"prepared batches \[16\]"):
        prepared.run(x, out)


def test_prepare_refuses_while_capturing(prepared, monkeypatch):
    monkeypatch.setattr(projection, "capturing", lambda: True)
    with pytest.raises(RuntimeError, match="captures a CUDA graph"):
        prepared.prepare()


def test_tensors_that_require_grad_are_taken_as_they_are(monkeypatch):
    """An nn.Linear's weight, and tensors that require grad under no_grad: the kernel gets their own memory."""

    def address_shape_stride(view):
        return view.iterator._pointer, tuple(view.shape), tuple(view.stride)  # the DSL has no public address

    pretend_hopper(monkeypatch)
    weight = torch.randn(256, 512, dtype=torch.bfloat16, requires_grad=True)  # an nn.Linear's weight
    prepared = PreparedProjection(weight, {4: TACTIC}).prepare()
    assert address_shape_stride(prepared.weight_view) == (weight.data_ptr(), (256, 512, 1), (512, 1, 0))
    x = torch.randn(4, 512, dtype=torch.bfloat16, requires_grad=True)
    assert address_shape_stride(projection.matrix_view(x)) == (x.data_ptr(), (4, 512, 1), (512, 1, 0))
    out = torch.empty(4, 256, dtype=torch.bfloat16, requires_grad=True)
    assert address_shape_stride(projection.matrix_view(out, output=True)) == (out.data_ptr(), (256, 4, 1), (1, 256, 0))


def test_run_says_autograd_does_not_flow_through_it(prepared, monkeypatch):
    x, out = torch.randn(4, 512, dtype=torch.bfloat16, requires_grad=True), torch.empty(4, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="autograd does not flow through run"):
        prepared.run(x, out)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
    kernels_called_in_python(monkeypatch)
    prepared.kernels[4] = lambda *args: None
    with torch.no_grad():  # nothing to flow: taken as it is
        assert prepared.run(x, out) is out


def test_overlap_is_exact_for_equally_pitched_rows():
    """Column slices of one buffer are disjoint; compare with the set of bytes each view covers."""

    def covered(view):
        start = view.data_ptr()
        pitch = view.stride(0) * view.element_size()
        return {start + row * pitch + byte for row in range(view.shape[0])
                for byte in range(view.shape[1] * view.element_size())}

    generator = torch.Generator().manual_seed(0)
    buffer = torch.empty(12, 96, dtype=torch.bfloat16)
    flat = torch.empty(12 * 96, dtype=torch.bfloat16)
    views = []
    for _ in range(60):
        rows, first_row, first_col = (int(v) for v in torch.randint(1, 5, (3,), generator=generator))
        cols = int(torch.randint(8, 96 - first_col, (1,), generator=generator))
        views.append(buffer[first_row : first_row + rows, first_col : first_col + cols])
        # The same bytes at another pitch: the span test decides those.
        pitch = cols + int(torch.randint(0, 24, (1,), generator=generator))
        views.append(flat[first_col :].as_strided((rows, cols), (pitch, 1)))
    for a in views:
        for b in views:
            if a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr():
                truth = bool(covered(a) & covered(b))
                assert projection.overlaps(a, b) == truth or (not truth and a.stride(0) != b.stride(0)), (
                    a.stride(), a.storage_offset(), a.shape, b.stride(), b.storage_offset(), b.shape)
    x_and_out = torch.empty(4, 768, dtype=torch.bfloat16)
    assert not projection.overlaps(x_and_out[:, :512], x_and_out[:, 512:])
    assert projection.overlaps(x_and_out[:, :513], x_and_out[:, 512:])
    # A 1-D tensor is one row; several others: whether any of them overlaps.
    elements = x_and_out.view(-1)
    assert projection.overlaps(x_and_out[1:2, :8], elements[768:776])
    assert not projection.overlaps(x_and_out[1:2], elements[:768], elements[1536:])
    assert projection.overlaps(x_and_out[1:2], elements[:768], elements[1535:1543])


def test_reprepare_checks_what_was_replaced_as_the_constructor_does(prepared):
    x, out = torch.randn(4, 512, dtype=torch.bfloat16), torch.empty(4, 256, dtype=torch.bfloat16)
    strided = torch.randn(256, 1024, dtype=torch.bfloat16)[:, ::2]  # columns two elements apart
    for attribute, value, error, message in [
        ("weight", strided, ValueError, "unit stride"),
        ("weight", torch.randn(256, 512), ValueError, "torch.float32"),
        ("policies", {0: TACTIC}, ValueError, "positive int"),
        ("policies", {65535 * 8 + 1: (64, 8, 1, 4)}, ValueError, "activation tiles"),
        ("output_dtype", torch.float64, ValueError, "output dtype"),
        ("bias", torch.zeros(255), ValueError, r"bias must be a \[256\] vector"),
        ("residual", 1, TypeError, "residual must be a bool"),
        ("programmatic_launch", "no", TypeError, "must be a bool"),
    ]:
        kept = getattr(prepared, attribute)
        setattr(prepared, attribute, value)
        with pytest.raises(error, match=message):
            prepared.prepare()
        setattr(prepared, attribute, kept)
        # A refused re-prepare leaves nothing to launch, as a failed one does.
        with pytest.raises(ValueError, match="not prepared"):
            prepared.run(x, out)
        prepared.prepare()


def test_reprepare_follows_the_weight_to_its_device(prepared):
    moved = torch.randn(256, 512, dtype=torch.bfloat16, device="meta")
    prepared.weight = moved
    with pytest.raises(ValueError, match="several GPUs"):  # the kernels are claimed for the new weight's device
        prepared.prepare()
    assert prepared.device == moved.device


def test_a_run_tells_autograd_that_it_wrote_the_output(prepared, monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
    kernels_called_in_python(monkeypatch)
    prepared.kernels.update({batch: (lambda *args: None) for batch in prepared.kernels})
    x, out = torch.randn(4, 512, dtype=torch.bfloat16), torch.empty(4, 256, dtype=torch.bfloat16)
    version = out._version
    prepared.run(x, out)
    assert out._version > version  # a backward that saved ``out`` before the write fails instead of using it


def test_public_compile_names_what_it_cannot_take():
    with pytest.raises(ValueError, match="weight dtype"):
        compile_projection(TACTIC, torch.bfloat16, "sm_90a", torch.float32)
    with pytest.raises(ValueError, match="output dtype"):
        compile_projection(TACTIC, torch.float64, "sm_90a")
    with pytest.raises(TypeError, match="must be a bool"):
        compile_projection(TACTIC, torch.bfloat16, "sm_90a", torch.bfloat16, "no")


def test_reprepare_drops_the_batches_its_policies_no_longer_hold(prepared):
    prepared.policies = {4: TACTIC}
    prepared.prepare()
    with pytest.raises(ValueError, match=r"prepared batches \[4\]"):
        prepared.run(torch.randn(16, 512, dtype=torch.bfloat16), torch.empty(16, 256, dtype=torch.bfloat16))


def test_a_failed_reprepare_leaves_nothing_to_launch(prepared, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("compiler failure")

    monkeypatch.setattr(projection, "compile_projection", broken)
    with pytest.raises(RuntimeError):
        prepared.prepare()
    # The earlier kernels this attempt dropped must not launch.
    with pytest.raises(ValueError, match="not prepared"):
        prepared.run(torch.randn(4, 512, dtype=torch.bfloat16), torch.empty(4, 256, dtype=torch.bfloat16))
    assert not prepared.kernels


def test_negated_views_are_refused(prepared):
    x, out = torch.randn(4, 512, dtype=torch.bfloat16), torch.empty(4, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="input is a negated view"):
        prepared.run(torch._neg_view(x), out)
    with pytest.raises(ValueError, match="weight is a negated view"):
        PreparedProjection(torch._neg_view(torch.randn(8, 16, dtype=torch.bfloat16)), {})


def test_for_weight_names_what_is_wrong_with_the_weight():
    with pytest.raises(TypeError, match="torch.Tensor"):
        PreparedProjection.for_weight([[1.0] * 8])
    with pytest.raises(ValueError, match=r"\[N, K\] matrix, got \(2, 4, 8\)"):
        PreparedProjection.for_weight(torch.zeros(2, 4, 8, dtype=torch.bfloat16))


def test_a_kernel_is_bound_to_one_device():
    code = object()
    projection._claim_device(code, torch.device("cuda", 0))
    projection._claim_device(code, torch.device("cuda", 0))
    with pytest.raises(ValueError, match="several GPUs"):
        projection._claim_device(code, torch.device("cuda", 1))


def test_unprepared_run_is_an_error():
    weight = torch.randn(64, 64, dtype=torch.bfloat16)
    fresh = PreparedProjection(weight, {4: TACTIC})
    with pytest.raises(ValueError, match="not prepared"):
        fresh.run(torch.randn(4, 64, dtype=torch.bfloat16), torch.empty(4, 64, dtype=torch.bfloat16))


def test_cache_is_keyed_on_code_only(monkeypatch):
    pretend_hopper(monkeypatch)
    compile_projection.cache_clear()
    small = PreparedProjection(torch.randn(64, 128, dtype=torch.bfloat16), {4: TACTIC}).prepare()
    large = PreparedProjection(torch.randn(2112, 7168, dtype=torch.bfloat16), {4: TACTIC}).prepare()
    assert small.kernels[4] is large.kernels[4]
    # A tuple and its SplitKTactic, an implicit and an explicit weight dtype: one entry.
    assert compile_projection((64, 8, 2, 4), torch.bfloat16, "sm_90a", torch.bfloat16) is small.kernels[4]
    assert compile_projection.cache_info().currsize == 1
    variants = [
        compile_projection(SplitKTactic(64, 8, 4, 4), torch.bfloat16, "sm_90a"),
        compile_projection(TACTIC, torch.float32, "sm_90a"),
        compile_projection(TACTIC, torch.bfloat16, "sm_90a", torch.float16),
    ]
    assert compile_projection.cache_info().currsize == 4
    # Different codegen inputs give different code: the fp32 kernel stores 4-byte values.
    reports = [kernel_report(code) for code in (small.kernels[4], *variants)]
    assert len({report.sass for report in reports}) == 4
    # Programmatic dependent launch is a launch attribute: an entry of its own, the same device code.
    plain = PreparedProjection(torch.randn(64, 128, dtype=torch.bfloat16), {4: TACTIC}, programmatic_launch=False)
    plain = plain.prepare().kernels[4]
    assert plain is not small.kernels[4] and compile_projection.cache_info().currsize == 5
    assert kernel_report(plain).sass == reports[0].sass
    with pytest.raises(TypeError, match="programmatic_launch must be a bool"):
        PreparedProjection(torch.randn(64, 128, dtype=torch.bfloat16), {4: TACTIC}, programmatic_launch="no")


def test_tactic_predicate_is_shared():
    assert as_tactic((64, 8, 2, 4)) == TACTIC
    assert SplitKTactic(64, 8, 16, 4).problems() == ["split 16 not in (1, 2, 3, 4, 5, 6, 7, 8)"]
    deepest = max_stages(128, 256, 1)
    assert SplitKTactic(128, 256, 1, deepest).valid
    assert not SplitKTactic(128, 256, 1, deepest + 1).valid


def test_register_handover_rules():
    """Four warpgroups of activations take a producer warpgroup's registers past 128 weight rows, halving wgmma N."""
    four = SplitKTactic(160, 256, 1, 4, weight_as_b=True)
    assert (four.consumer_groups, four.threads, four.consumer_registers, four.wgmma_columns) == (4, 640, 112, 80)
    assert not SplitKTactic(128, 256, 1, 4, weight_as_b=True).reallocates_registers
    assert SplitKTactic(136, 256, 1, 4, weight_as_b=True).problems() == [
        "136 columns of B do not halve into wgmma's N (a multiple of 8) where registers are reallocated"]
    assert SplitKTactic(200, 192, 1, 3, weight_as_b=True).problems() == [
        "200 columns of B do not halve into wgmma's N (a multiple of 8) where registers are reallocated"]
    assert SplitKTactic(176, 256, 1, 4, weight_as_b=True).problems() == [
        "four consumer warpgroups hold at most 80 accumulators per thread, not 88"]


def test_weight_multicast_shares_the_weight_tile_between_activation_tiles():
    """With the weight as B, multicast splits each weight tile's load between neighbouring activation tiles."""
    shared = SplitKTactic(144, 128, 4, 6, multicast=2, weight_as_b=True)
    assert (shared.weight_sharers, shared.activation_sharers, shared.weight_load_rows) == (2, 1, 72)
    # Every CTA's stage still receives the whole weight tile and its own activation tile.
    assert shared.stage_load_bytes == (144 + 128) * 64 * 2
    as_a = SplitKTactic(64, 128, 2, 9, multicast=4)
    assert (as_a.weight_sharers, as_a.activation_sharers, as_a.weight_load_rows) == (1, 4, 64)
    assert SplitKTactic(40, 128, 1, 5, multicast=4, weight_as_b=True).problems() == [
        "40 weight rows do not split into 4 loads of 8n rows"]
    assert SplitKTactic(96, 64, 1, 11, multicast=3, weight_as_b=True).valid
    assert SplitKTactic(64, 48, 1, 4, multicast=3).problems() == [
        "three CTAs share only a weight tile (the weight as B), not an activation tile"]
    # The loads: the weight's multicast into the pair, each CTA's own activation tile alone.
    sass = kernel_report(compile_projection(shared, torch.bfloat16, "sm_90a")).sass
    loads = [line.split()[1] for line in sass.splitlines() if "UTMALDG" in line]
    assert {"UTMALDG.2D.MULTICAST", "UTMALDG.2D"} == set(loads)


def test_padded_weight_tile_loads_its_rows_into_whole_warpgroup_tiles():
    padded = SplitKTactic(56, 8, 1, 4, k_boxes=2)
    assert padded.valid and padded.consumer_groups == 1 and padded.tile_mnk == (64, 8, 128)
    # Shared memory holds 64 rows per box; the TMA boxes (the barrier's byte count) carry 56.
    assert padded.stage_bytes == (64 + 8) * 128 * 2 and padded.stage_load_bytes == (56 + 8) * 128 * 2
    assert SplitKTactic(160, 32, 1, 4).consumer_groups == 3
    assert SplitKTactic(60, 8, 1, 4).problems()[0].startswith("weight rows 60 not in")
    assert SplitKTactic(200, 8, 1, 4).problems()[0].startswith("weight rows 200 not in")
    # The weight as B is not padded: its tile is wgmma's N.
    as_b = SplitKTactic(56, 64, 1, 4, weight_as_b=True)
    assert as_b.weight_smem_rows == 56 and as_b.stage_bytes == as_b.stage_load_bytes
    assert max_stages(56, 64, 1, weight_as_b=True) > max_stages(56, 64, 1)


def test_which_epilogues_stage_the_output_tile():
    def staged(tactic, out_type=cutlass.BFloat16):
        return SplitKGemm(tactic).stages_output(out_type)

    assert staged(SplitKTactic(64, 64, 1, 4)) and staged(SplitKTactic(56, 48, 1, 4, k_boxes=2))
    assert staged(SplitKTactic(112, 128, 1, 4, weight_as_b=True)) and staged(SplitKTactic(192, 256, 1, 3))
    # Split K, small activation tiles and FP32 outputs store straight from the accumulators.
    assert not staged(SplitKTactic(64, 64, 3, 4)) and not staged(SplitKTactic(64, 16, 1, 4))
    assert not staged(SplitKTactic(64, 64, 1, 4), cutlass.Float32)


def test_a_folded_tile_reads_each_weight_rows_bias_once():
    """A folded tile's output slot i of a thread is i x the consumer threads rows on, modulo the tile's rows
    (SplitKGemm.folded_output): slots share a bias where those rows agree, whatever the thread."""
    for tactic in [SplitKTactic(32, 16, 1, 6, k_boxes=2, fold=2), SplitKTactic(24, 16, 1, 4, k_boxes=2, fold=2),
                   SplitKTactic(16, 8, 1, 4, k_boxes=4, fold=4)]:
        gemm = SplitKGemm(tactic)
        count = gemm.folded_slots
        slots = gemm.bias_slots(None, None, count)
        for thread in range(gemm.consumer_threads):
            rows = [(thread + i * gemm.consumer_threads) % tactic.weight_rows for i in range(count)]
            assert [rows[slot] for slot in slots] == rows, tactic  # each slot's representative holds its row
            assert all(slots[slots[i]] == slots[i] <= i for i in range(count))  # the first of its row
    assert SplitKGemm(SplitKTactic(32, 16, 1, 6, k_boxes=2, fold=2)).bias_slots(None, None, 4) == (0, 0, 0, 0)
    assert SplitKGemm(SplitKTactic(24, 16, 1, 4, k_boxes=2, fold=2)).bias_slots(None, None, 3) == (0, 1, 2)


def test_activation_tiles_store_every_batch_row_once_without_reading_past_the_batch():
    """Every batch row is stored by exactly one activation tile: the last tile is moved back to end at row M where
    the batch covers a tile, so no box reaches past the batch then (groups rounded up to whole clusters included)."""
    for tactic in [SplitKTactic(64, 8, 1, 4), SplitKTactic(64, 48, 1, 4), SplitKTactic(64, 96, 1, 4, multicast=2),
                   SplitKTactic(96, 64, 1, 11, multicast=2, weight_as_b=True),
                   SplitKTactic(168, 64, 1, 7, multicast=3, weight_as_b=True),
                   SplitKTactic(64, 64, 2, 4, k_boxes=2, multicast=4, weight_as_b=True),
                   SplitKTactic(112, 128, 1, 7, multicast=2, weight_as_b=True)]:
        assert tactic.valid, tactic
        gemm, rows = SplitKGemm(tactic), tactic.activation_rows
        for batch in range(1, 3 * rows + 2):
            tiles = math.ceil(math.ceil(batch / rows) / tactic.weight_sharers) * tactic.weight_sharers
            stored = []
            for m_tile in range(tiles):
                origin, repeated = gemm.activation_origin(m_tile, batch)
                assert origin >= 0 and (origin + rows <= batch or origin == 0), (tactic, batch, m_tile)
                stored += [row for row in range(origin + repeated, origin + rows) if row < batch]
            assert sorted(stored) == list(range(batch)), (tactic, batch)


# One tactic per epilogue, and the global stores each must compile to: 16-bit scalars where the output is bf16
# (the staged epilogue's ragged tail too), 32-bit with an FP32 output (which no epilogue stages).
HINTED = "st.global.L2::cache_hint"
EPILOGUES = [
    pytest.param(SplitKTactic(56, 64, 1, 7, k_boxes=2), torch.bfloat16, {f"{HINTED}.v4.b32", f"{HINTED}.b16"},
                 id="staged"),
    pytest.param(SplitKTactic(64, 16, 1, 5, k_boxes=4, dependents_at_start=True), torch.bfloat16, {f"{HINTED}.b16"},
                 id="direct"),
    pytest.param(SplitKTactic(56, 64, 1, 7, k_boxes=2), torch.float32, {f"{HINTED}.b32"}, id="direct-fp32"),
    pytest.param(SplitKTactic(28, 8, 1, 5, k_boxes=4, dependents_at_start=True, fold=2), torch.bfloat16,
                 {f"{HINTED}.b16"}, id="folded"),
    pytest.param(SplitKTactic(128, 8, 4, 13), torch.bfloat16, {f"{HINTED}.b16"}, id="split-k"),
    pytest.param(SplitKTactic(64, 128, 2, 9, multicast=4), torch.float32, {f"{HINTED}.b32"},
                 id="split-k-multicast-fp32"),
]


@pytest.mark.parametrize("tactic, output_dtype, instructions", EPILOGUES)
def test_every_output_store_keeps_the_output_in_l2(tmp_path, tactic, output_dtype, instructions):
    """Every global store of the output carries the L2 policy EVICT_LAST: the output is the next kernel's input."""
    projection.compile_kernel(tactic, output_dtype, options=f"--gpu-arch=sm_90a --keep-ptx --dump-dir={tmp_path}")
    (ptx,) = tmp_path.glob("*.ptx")
    lines = [line.strip().rstrip(";") for line in ptx.read_text().splitlines()]
    # The output is the kernel's only global store; a predicated store starts with its predicate.
    stores = [line for line in lines if re.match(r"(@!?%p\d+\s+)?st\.global", line)]
    assert {re.search(r"st\.global\S*", store).group() for store in stores} == instructions
    for store in stores:
        policy = store.split(",")[-1].strip()
        assert f"mov.b64 \t{policy}, {EVICT_LAST}" in lines, f"{store}: its policy is not EVICT_LAST"


def test_where_a_launch_lets_the_next_one_in():
    def triggers(tactic):
        """Offsets of the SASS's launch-dependents instructions, and of its first TMA load."""
        lines = kernel_report(compile_projection(tactic, torch.bfloat16, "sm_90a")).sass.splitlines()
        offsets = [i for i, line in enumerate(lines) if "PREEXIT" in line]
        return offsets, next(i for i, line in enumerate(lines) if "UTMALDG" in line)

    offsets, first_load = triggers(SplitKTactic(64, 8, 1, 6, k_boxes=4, dependents_at_start=True))
    assert len(offsets) == 1 and offsets[0] < first_load
    # Otherwise once the weights are streamed: the producer and the consumers.
    for streamed in (SplitKTactic(64, 8, 1, 6, k_boxes=4), SplitKTactic(128, 8, 3, 13),
                     SplitKTactic(128, 64, 4, 9, multicast=2)):
        offsets, first_load = triggers(streamed)
        assert len(offsets) == 2 and min(offsets) > first_load
    assert SplitKTactic(128, 8, 3, 13, dependents_at_start=True).problems() == [
        "only unclustered launches (split 1, multicast 1) let the next launch in as they start"]


# The shipped tables' tactics outside the grid: a table entry whose wgmmas ptxas serializes would lose up to
# half its speed and still pass every float64 check (docs/programmatic-launch.md).
SHIPPED = sorted({t for batches in shipped_tables().values() for t in batches.values()} - set(GRID), key=tactic_id)
# And the heuristic's picks for the Kimi-K3 shapes, what every batch and GPU without a table gets.
HEURISTIC = sorted({default_tactic(n, k, batch) for n, k in KIMI_K3_SHAPES for batch in DECODE_BATCHES}
                   - set(GRID) - set(SHIPPED), key=tactic_id)


COMPILED = GRID + SHIPPED + HEURISTIC
# The first tactic of each code path, marked path_sample: the quick compile check on the oldest DSL release we
# allow (scripts/test-dsl47).
PATH_SAMPLE = set({code_path(t): t for t in reversed(COMPILED)}.values())


@pytest.mark.slow
@pytest.mark.parametrize(
    "tactic", [pytest.param(t, marks=pytest.mark.path_sample) if t in PATH_SAMPLE else t for t in COMPILED],
    ids=tactic_id,
)
def test_every_tactic_compiles_to_wgmma_and_tma_without_spills(tactic):
    report = kernel_report(compile_projection(tactic, torch.bfloat16, "sm_90a"))
    assert report.arch == "sm_90a"
    assert report.hgmma > 0, "no wgmma in the SASS"
    assert report.utmaldg > 0, "no TMA loads in the SASS"
    assert report.spills == 0 and report.local_bytes == 0, f"{report.spills} spill instructions"
    assert not report.wgmma_serialized, "ptxas serialized the wgmmas (C7514)"


@pytest.mark.slow
@pytest.mark.parametrize("tactic", [t for t in COMPILED if t.reallocates_registers], ids=tactic_id)
def test_register_handover_stays_within_what_the_cta_holds(tactic):
    """setmaxnreg.inc waits for registers the CTA holds: asking past them hangs the launch (docs/compute-bound-tiling.md)."""
    report = kernel_report(compile_projection(tactic, torch.bfloat16, "sm_90a"))
    requests = dict(re.findall(r"USETMAXREG\.(DEALLOC|TRY_ALLOC)\.CTAPOOL (?:UP\d+, )?(0x[0-9a-f]+)", report.sass))
    requests = {kind: int(value, 16) for kind, value in requests.items()}
    assert requests == {"DEALLOC": PRODUCER_REGISTERS, "TRY_ALLOC": tactic.consumer_registers}
    # Per SM quarter: one warp of every warpgroup, each thread holding the launch's registers.
    held_per_lane = math.ceil(tactic.threads / 128) * report.registers
    assert PRODUCER_REGISTERS + tactic.consumer_groups * tactic.consumer_registers <= held_per_lane


@pytest.mark.parametrize("split", range(2, 9))
def test_each_peer_has_a_reduction_slot_of_its_own(split):
    keeping, sending = SplitKTactic(64, 64, split, 4), SplitKTactic(192, 192, split, 2)
    assert keeping.keeps_own_partials and not sending.keeps_own_partials
    for owner in range(split):
        peers = [keeping.reduction_slot(sender, owner) for sender in range(split) if sender != owner]
        assert sorted(peers) == list(range(keeping.reduction_slots))
        assert [sending.reduction_slot(sender, owner) for sender in range(split)] == list(range(sending.reduction_slots))


def test_run_under_inference_mode(prepared, monkeypatch):
    """Engines decode under torch.inference_mode(): run() takes inference tensors and bumps no version of theirs."""
    kernels_called_in_python(monkeypatch)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: prepared.device.index)
    launched = []
    prepared.kernels[4] = lambda *args: launched.append(args)
    with torch.inference_mode():
        x = torch.randn(4, 512, dtype=torch.bfloat16)
        out = torch.empty(4, 256, dtype=torch.bfloat16)
        assert prepared.run(x, out) is out and out.is_inference()
    assert len(launched) == 1


def test_bias_validation_messages():
    weight = torch.zeros(8, 16, dtype=torch.bfloat16)
    cases = [
        ([0.0] * 8, TypeError, "bias must be a torch.Tensor or None"),
        (torch.zeros(7), ValueError, r"bias must be a \[8\] vector"),
        (torch.zeros(8, 1), ValueError, r"bias must be a \[8\] vector"),
        (torch.zeros(8, dtype=torch.int32), ValueError, r"bias must be a \[8\] vector"),
        (torch.zeros(8, dtype=torch.float64), ValueError, r"bias must be a \[8\] vector"),
        (torch.zeros(16)[::2], ValueError, "bias needs unit stride"),
        (torch.zeros(8, device="meta"), ValueError, "bias is on meta, the weight on cpu"),
        (torch._neg_view(torch.zeros(8)), ValueError, "negated view"),
    ]
    for bias, error, message in cases:
        with pytest.raises(error, match=message):
            PreparedProjection(weight, {1: TACTIC}, bias=bias)
    with pytest.raises(TypeError, match="residual must be a bool"):
        PreparedProjection(weight, {1: TACTIC}, residual="yes")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        PreparedProjection(weight, {1: TACTIC}, bias=torch.zeros(8, dtype=dtype))


def prepared_with_epilogue(monkeypatch, bias):
    """``(projection, launches)``: a projection with ``bias`` and a residual, prepared on the CPU; its launches are
    recorded in ``launches``, never run."""
    pretend_hopper(monkeypatch)
    weight = torch.randn(256, 512, dtype=torch.bfloat16)
    projection = PreparedProjection(weight, {4: TACTIC}, bias=bias, residual=True).prepare()
    launches = []
    projection._launchable.kernels[4] = lambda *args: launches.append(args)
    kernels_called_in_python(monkeypatch)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: projection.device.index)
    return projection, launches


def test_run_rejects_bad_residuals(monkeypatch):
    projection, launches = prepared_with_epilogue(monkeypatch, torch.randn(256))
    x = torch.randn(4, 512, dtype=torch.bfloat16)
    out = torch.empty(4, 256, dtype=torch.bfloat16)
    wide = torch.empty(4, 512, dtype=torch.bfloat16)
    cases = [
        (out, None, ValueError, r"adds a residual: run\(x, out, residual=r\)"),
        (out, "r", TypeError, "residual must be a torch.Tensor"),
        (out, out[:3], ValueError, "residual must be shaped and typed as the output"),
        (out, out.float(), ValueError, "residual must be shaped and typed as the output"),
        (out, torch.empty(4, 256, dtype=torch.bfloat16, device="meta"), ValueError, "residual is on meta"),
        (out, torch.empty(256, 4, dtype=torch.bfloat16).T, ValueError, "residual rows need unit stride"),
        (out, torch.empty(1, 256, dtype=torch.bfloat16).expand(4, 256), ValueError, "residual rows overlap"),
        (out, torch._neg_view(out.clone()), ValueError, "residual is a negated view"),
        (out, out.clone().requires_grad_(), ValueError, "residual requires grad"),
        (out, x[:, :256], ValueError, "residual overlaps its input or weight"),
        (out, projection.weight[:4, :256], ValueError, "residual overlaps its input or weight"),
        # Overlapping the output without being it races; out itself, or apart from it, is fine.
        (wide[:, :256], wide[:, 128:384], ValueError, "overlaps the output without being it"),
    ]
    for target, residual, error, message in cases:
        with pytest.raises(error, match=message):
            projection.run(x, target, residual=residual)
    assert not launches
    projection.run(x, out, residual=out)
    projection.run(x, out, residual=torch.randn(4, 256, dtype=torch.bfloat16))
    projection.run(x, wide[:, :256], residual=wide[:, 256:])
    assert len(launches) == 3
    for args in launches:
        assert args[1] is not None and args[4] is not None  # the bias's view and the residual's pointer


def test_run_refuses_an_output_over_its_bias(monkeypatch):
    buffer = torch.zeros(5 * 256, dtype=torch.bfloat16)
    projection, launches = prepared_with_epilogue(monkeypatch, buffer[3 * 256 : 4 * 256])
    x = torch.randn(4, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="output overlaps its bias"):
        projection.run(x, buffer[: 4 * 256].view(4, 256), residual=torch.zeros(4, 256, dtype=torch.bfloat16))
    projection.run(x, torch.empty(4, 256, dtype=torch.bfloat16), residual=torch.zeros(4, 256, dtype=torch.bfloat16))
    assert len(launches) == 1


def test_run_refuses_a_residual_it_was_not_prepared_for(prepared):
    x, out = torch.randn(4, 512, dtype=torch.bfloat16), torch.empty(4, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="prepared without a residual"):
        prepared.run(x, out, residual=out)


def test_bias_or_residual_replaced_after_prepare_is_refused(monkeypatch):
    projection, launches = prepared_with_epilogue(monkeypatch, torch.randn(256))
    x, out = torch.randn(4, 512, dtype=torch.bfloat16), torch.empty(4, 256, dtype=torch.bfloat16)
    projection.bias.data = torch.randn(256)  # new storage behind the same tensor: the kernel holds the old pointer
    with pytest.raises(ValueError, match="bias or residual changed after prepare"):
        projection.run(x, out, residual=out)
    projection.bias = torch.randn(256)
    with pytest.raises(ValueError, match="bias or residual changed after prepare"):
        projection.run(x, out, residual=out)
    projection.residual = False
    with pytest.raises(ValueError, match="bias or residual changed after prepare"):
        projection.run(x, out)
    assert not launches


@pytest.mark.slow
@pytest.mark.parametrize("case", EPILOGUE_CASES, ids=str)
@pytest.mark.parametrize("tactic", EPILOGUE_PATHS, ids=tactic_id)
def test_every_epilogue_compiles_on_every_store_path(tactic, case):
    weight_dtype, output_dtype, bias_dtype, residual = case
    epilogue = Epilogue(residual != "none", bias_dtype)
    report = kernel_report(compile_projection(tactic, output_dtype, "sm_90a", weight_dtype, True, epilogue))
    assert report.hgmma > 0 and report.utmaldg > 0, "no wgmma or no TMA loads in the SASS"
    assert report.spills == 0 and report.local_bytes == 0, f"{report.spills} spill instructions"
    assert not report.wgmma_serialized, "ptxas serialized the wgmmas (C7514)"


def test_an_epilogue_is_a_kernel_of_its_own():
    plain = compile_projection(TACTIC, torch.bfloat16, "sm_90a")
    assert compile_projection(TACTIC, torch.bfloat16, "sm_90a", epilogue=Epilogue()) is plain
    with_residual = compile_projection(TACTIC, torch.bfloat16, "sm_90a", epilogue=Epilogue(residual=True))
    with_bias = compile_projection(TACTIC, torch.bfloat16, "sm_90a", epilogue=Epilogue(bias_dtype=torch.float32))
    assert len({id(plain), id(with_residual), id(with_bias)}) == 3
    # Each reads what it adds: a global load per accumulator more than the plain kernel's.
    loads = {name: len(re.findall(r"\bLDG\.", kernel_report(code).sass))
             for name, code in (("plain", plain), ("residual", with_residual), ("bias", with_bias))}
    assert loads["residual"] > loads["plain"] and loads["bias"] > loads["plain"], loads
    with pytest.raises(TypeError, match="epilogue must be an Epilogue"):
        compile_projection(TACTIC, torch.bfloat16, "sm_90a", epilogue=("residual",))
    with pytest.raises(ValueError, match="bias dtype"):
        compile_projection(TACTIC, torch.bfloat16, "sm_90a", epilogue=Epilogue(bias_dtype=torch.int8))


def test_gate_and_up_interleave_eight_rows_at_a_time():
    gate = torch.arange(20 * 8, dtype=torch.bfloat16).view(20, 8)
    up = -1 - gate
    weight = projection.interleave_gate_up(gate, up)
    assert weight.shape == (48, 8)  # three groups of 8 gate and 8 up rows, the last padded with zeros
    for group in range(3):
        rows = range(group * 8, min(group * 8 + 8, 20))
        assert torch.equal(weight[group * 16 : group * 16 + len(rows)], gate[rows.start : rows.stop])
        assert torch.equal(weight[group * 16 + 8 : group * 16 + 8 + len(rows)], up[rows.start : rows.stop])
    assert not weight[36:40].any() and not weight[44:48].any()
    with pytest.raises(ValueError, match="gate and up weights must match"):
        projection.interleave_gate_up(gate, up[:16])
    with pytest.raises(ValueError, match="torch.float32"):
        projection.interleave_gate_up(gate.float(), up.float())


def test_a_gated_projection_says_what_it_cannot_take(monkeypatch):
    pretend_hopper(monkeypatch)
    gate, up = torch.randn(40, 512, dtype=torch.bfloat16), torch.randn(40, 512, dtype=torch.bfloat16)
    weight = projection.interleave_gate_up(gate, up)  # 80 rows
    tactic = SplitKTactic(64, 8, 1, 6)
    with pytest.raises(ValueError, match="a gated weight of 41 gate rows interleaves 96 rows"):
        PreparedProjection(weight, {1: tactic}, gated_rows=41)
    with pytest.raises(TypeError, match="gated_rows must be a positive int"):
        PreparedProjection(weight, {1: tactic}, gated_rows=True)
    with pytest.raises(ValueError, match="takes no bias or residual"):
        PreparedProjection(weight, {1: tactic}, gated_rows=40, residual=True)
    for cannot, reason in [(SplitKTactic(64, 8, 2, 6), "split K reduces vectors of 2 accumulators"),
                           (SplitKTactic(24, 8, 1, 6, k_boxes=2, fold=2), "not whole groups of 16"),
                           (SplitKTactic(56, 8, 1, 6), "not whole groups of 16"),
                           (SplitKTactic(64, 128, 2, 4, weight_as_b=True), "split K with the weight as B")]:
        with pytest.raises(ValueError, match=f"policy batch 1: .* cannot gate: .*{reason}"):
            PreparedProjection(weight, {1: cannot}, gated_rows=40)
    gated = PreparedProjection(weight, {4: tactic}, gated_rows=40).prepare()
    x = torch.randn(4, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"output must be \(4, 40\)"):
        gated.run(x, torch.empty(4, 80, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="prepared without a residual"):
        gated.run(x, torch.empty(4, 40, dtype=torch.bfloat16), residual=torch.empty(4, 40, dtype=torch.bfloat16))


def test_the_nearest_gated_tactic_keeps_what_it_can():
    from decode_projection.kernel.tactic import gated_problems
    from decode_projection.policy.policies import gated_tactic
    from decode_projection.runtime.gpu import H100, H200

    assert gated_tactic(SplitKTactic(64, 8, 1, 6, k_boxes=4), 3072, 7168, 8) == SplitKTactic(64, 8, 1, 6, k_boxes=4)
    # Split K gates where its reduction vectors are 4 wide.
    split = SplitKTactic(128, 64, 4, 4, k_boxes=2)
    assert gated_tactic(split, 3072, 7168, 64) == split
    # A streaming folded tile rounded up to whole groups stays folded (its slot holds them); a compute-bound one
    # unfolds, to split K where that fills a wave. (8448 rows: twice an odd tile's rows split in two run past a wave.)
    for tactic, fold in [(SplitKTactic(24, 8, 1, 11, k_boxes=2, fold=2), 2), (SplitKTactic(64, 8, 2, 6, k_boxes=2), 1),
                         (SplitKTactic(56, 16, 1, 6), 1), (SplitKTactic(8, 8, 1, 4, k_boxes=4, fold=4), 4),
                         (SplitKTactic(24, 8, 1, 4, k_boxes=4, fold=2), 2), (SplitKTactic(24, 128, 1, 4, fold=2), 1)]:
        nearest = gated_tactic(tactic, 8448, 7168, tactic.activation_rows)
        assert not gated_problems(nearest) and nearest.valid and nearest.split == 1 and nearest.fold == fold
        assert nearest.activation_rows == tactic.activation_rows and nearest.weight_rows % 16 == 0
        assert nearest.stages == max_stages(nearest.weight_rows, nearest.activation_rows, 1, nearest.k_boxes,
                                            fold=fold)
    # An early start survives where the nearest tile may start early, on either card.
    for gpu in (H100, H200):
        early = gated_tactic(SplitKTactic(24, 8, 1, 11, k_boxes=2, dependents_at_start=True, fold=2), 8448, 7168, 8,
                             gpu)
        assert early == SplitKTactic(32, 8, 1, 11, k_boxes=2, dependents_at_start=True, fold=2)
        assert not gated_tactic(SplitKTactic(48, 64, 2, 6, k_boxes=2), 3072, 7168, 64, gpu).dependents_at_start


def test_a_streaming_tile_of_odd_halves_gates_as_twice_its_rows_split_in_two():
    from decode_projection.kernel.tactic import gated_problems
    from decode_projection.policy import policies
    from decode_projection.policy.policies import gated_tactic
    from decode_projection.runtime.gpu import H100, H200

    # 3072 x 7168's 24-row folded tiles (the shared expert's pair): rounded up to 32 rows they would leave 96 CTAs of
    # 128; twice their rows split in two keep 128, each streaming as many bytes, over 16 activation rows.
    for gpu in (H100, H200):
        for batch, plain in [(1, SplitKTactic(24, 8, 1, 11, k_boxes=2, dependents_at_start=True, fold=2)),
                             (16, SplitKTactic(24, 16, 1, 9, k_boxes=2, dependents_at_start=True, fold=2))]:
            nearest = gated_tactic(plain, 3072, 7168, batch, gpu)
            assert nearest == SplitKTactic(48, 16, 2, max_stages(48, 16, 2, 2), k_boxes=2) and nearest.stages >= 3
            assert nearest.grid_columns(3072) == plain.grid_columns(3072) == 128 and not gated_problems(nearest)
    # In 2-box stages whatever the plain tile's (4-box ones ran slower); 8 activation rows would part a gate pair
    # from its up pair in the reduction.
    four_boxes = SplitKTactic(24, 8, 1, 5, k_boxes=4, dependents_at_start=True, fold=2)
    assert gated_tactic(four_boxes, 3072, 7168, 3, H200) == SplitKTactic(48, 16, 2, 11, k_boxes=2)
    assert gated_problems(SplitKTactic(48, 8, 2, 12, k_boxes=2)) and policies.GATED_SPLIT_ACTIVATION_ROWS == 16
    # Not where the rank's K is under two stages (rounded up instead), nor from a tactic already split (its CTAs
    # would halve), nor past one wave (8448 rows: 352 CTAs).
    plain = SplitKTactic(24, 8, 1, 11, k_boxes=2, dependents_at_start=True, fold=2)
    assert gated_tactic(plain, 3072, 128, 1, H100).split == 1
    assert gated_tactic(SplitKTactic(56, 8, 4, 6, k_boxes=4), 1536, 7168, 1, H100).weight_rows == 64
    assert gated_tactic(plain, 8448, 7168, 1, H100).split == 1


@pytest.mark.parametrize("tactic", [
    SplitKTactic(128, 128, 1, 7, multicast=2, weight_as_b=True),
    SplitKTactic(48, 128, 1, 5, k_boxes=2, multicast=2, weight_as_b=True),
    SplitKTactic(96, 64, 1, 11, multicast=3, weight_as_b=True),
    SplitKTactic(64, 192, 1, 7, weight_as_b=True),
])
def test_the_tables_weight_as_b_tactics_gate_as_they_are(tactic):
    from decode_projection.policy.policies import gated_tactic
    from decode_projection.runtime.gpu import H100

    # Columns c and c + 8 of B, a gate row and its up row, meet in one thread (kernel.tactic.GATE_GROUP_ROWS).
    assert gated_tactic(tactic, 8448, 7168, 256, H100) == tactic


@pytest.mark.parametrize("n, batch, tactic", [
    (8448, 256, SplitKTactic(72, 128, 1, 9, multicast=3, weight_as_b=True)),
    (3072, 192, SplitKTactic(72, 64, 1, 13, multicast=3, weight_as_b=True)),
    (8448, 128, SplitKTactic(64, 64, 2, 14, multicast=2, weight_as_b=True)),
    (3072, 256, SplitKTactic(48, 128, 2, 5, k_boxes=2, multicast=2, weight_as_b=True)),
])
def test_a_weight_as_b_tactic_that_cannot_gate_still_reads_the_weight_once(n, batch, tactic):
    from decode_projection.kernel.tactic import gated_problems
    from decode_projection.policy.policies import gated_tactic, waves
    from decode_projection.runtime.gpu import H100

    # Its activation tiles shared each weight load (multicast): the nearest's one activation tile covers them, and
    # the tiles of a compute-bound batch split K as far as one wave holds them.
    assert tactic.valid and gated_problems(tactic)
    nearest = gated_tactic(tactic, n, 7168, batch, H100)
    assert not gated_problems(nearest) and nearest.valid and not nearest.weight_as_b
    assert nearest.activation_rows >= min(tactic.activation_rows * tactic.multicast, batch)
    assert nearest.grid_rows(batch) == 1
    assert waves(nearest, n, batch, H100) == 1 and nearest.stages >= 3
    doubled = replace(nearest, split=2 * nearest.split, stages=max_stages(64, nearest.activation_rows,
                                                                          2 * nearest.split, nearest.k_boxes))
    assert not doubled.valid or gated_problems(doubled) or waves(doubled, n, batch, H100) > 1 or doubled.stages < 3


@pytest.mark.slow
@pytest.mark.parametrize("tactic", GATED_PATHS, ids=tactic_id)
def test_every_gated_tactic_compiles_with_its_exponentials(tactic):
    for output_dtype in (torch.bfloat16, torch.float32):
        report = kernel_report(compile_projection(tactic, output_dtype, "sm_90a", epilogue=Epilogue(gated=True)))
        assert report.hgmma > 0 and report.spills == 0 and report.local_bytes == 0
        assert not report.wgmma_serialized, "ptxas serialized the wgmmas (C7514)"
        assert "MUFU.EX2" in report.sass, "no exponential: the gated epilogue is not in the kernel"


@pytest.mark.slow
@pytest.mark.parametrize("rows", [16, 32])
def test_gated_candidates_compile_with_their_exponentials(rows):
    from decode_projection.policy.policies import ctas_per_sm, gated_candidates
    from decode_projection.runtime.gpu import H100

    # The shared expert's pair on the H100: 16-row tiles two to an SM, and unfolded 32-row tiles (the tiles
    # gated_tactic maps to compile in test_every_gated_tactic_compiles_with_its_exponentials).
    found = gated_candidates(3072, 7168, 8, H100)
    tactic = next(t for t in found if t.weight_rows == rows and ctas_per_sm(t, H100) == (2 if rows == 16 else 1))
    report = kernel_report(compile_projection(tactic, torch.bfloat16, "sm_90a", epilogue=Epilogue(gated=True)))
    assert report.hgmma > 0 and report.spills == 0 and report.local_bytes == 0
    assert not report.wgmma_serialized, "ptxas serialized the wgmmas (C7514)"
    assert "MUFU.EX2" in report.sass, "no exponential: the gated epilogue is not in the kernel"
