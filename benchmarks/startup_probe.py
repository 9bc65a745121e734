"""Where a projection's start-up goes after another kernel: %globaltimer stamps and launch A/B variants.

In a model every projection follows some other kernel (a norm, an activation). This probe measures,
on a Hopper GPU, what the projection pays there and why:

1. ``launch``: an empty kernel after a small plain glue kernel, timed (cold, CUDA-graph replay, the
   glue's own time subtracted) and stamped (first and last CTA entry after the glue's last CTA ended),
   for each launch property the projection has: dynamic shared memory, a cluster, programmatic
   dependent launch, the block size; a few of them also after a glue asking for the most shared memory.
2. ``timeline``: the projection itself, a subclass of SplitKGemm writing ``%globaltimer`` at kernel entry,
   first weight TMA issued, producer past ``griddepcontrol.wait``, consumer start, first stage full,
   epilogue start and exit, per CTA, after the plain glue, after a PDL glue and after the plain glue then
   PyTorch's ``add_``; and the read ceiling's kernel stamped the same way (entry, its first and last chunk
   landed, exit), to set our streaming and tail beside a kernel that only reads. ``--compare-package NAME``
   stamps a changed copy's kernel next to ours. (The tile-contiguous, bulk-copied and weight-map variants of
   docs/launch-contexts.md were probed with this script as of commit fa6ce36.)
3. ``times``: the projection, the read ceiling and torch.matmul in the three launch contexts.

    python benchmarks/startup_probe.py --json startup.json
    python benchmarks/startup_probe.py --parts timeline,times --shape 1536x128 --shape 7168x768 --batches 1,32,64
    python benchmarks/startup_probe.py --parts timeline --compare-package decode_projection_changed --batches 1

Every stamp is relative to the end of the previous kernel's last CTA (the glue's), in microseconds, as
medians over replays of a CUDA graph of repeated pairs rotating through weight copies worth over 3x the L2 (the
last pair of each replay is read, its weight cold).
"""

import argparse
import importlib
import json
import statistics

import cutlass
import cutlass.cute as cute
import torch
from cutlass import pipeline
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

from decode_projection.cli_args import batch_list, shape
from decode_projection.kernel.launch import SplitKLaunch
from decode_projection.kernel.splitk import SplitKGemm
from decode_projection.measure.ceiling import StreamRead, byte_view, fake_bytes, stream_read
from decode_projection.measure.timing import cold_copies, foreign_kernel, interleaved_time_us
from decode_projection.policy.policies import resolve_policies
from decode_projection.projection import (
    PreparedProjection, kernel_arguments, launch_arguments, launch_values, matrix_view,
)
from decode_projection.runtime import architecture, current_stream, to_cute
from decode_projection.runtime.gpu import gpu_spec

EVENTS = ("glue_end", "entry", "first_weight_tma", "producer_waited", "consumer_start", "first_stage_full",
          "epilogue", "exit", "next_start", "glue_start")
# Each relative to glue_end. next_start: the first CTA of the kernel after the stamped one; glue_start: the first
# CTA of the glue before it (negative: about the glue's own run).
REPORTED = EVENTS[1:]
SLOTS = 4096  # CTAs stamped per event
GLUE_ELEMENTS = 4096  # what the benchmark's glue kernel touches (timing.foreign_kernel)
SHAPES = ((7168, 768), (7168, 1536), (2112, 7168), (20480, 7168))  # times; the timeline stamps the first three
BATCHES = (1, 64)


def stamp_pointer(address, event):
    """The stamp row of ``event`` in the buffer at the baked-in ``address``."""
    row = cute.make_ptr(cutlass.Int64, cutlass.Int64(address + event * SLOTS * 8),
                        cute.AddressSpace.gmem, assumed_align=8)
    return cute.make_tensor(row, cute.make_layout(SLOTS))


def write_stamp(address, event, slot):
    """``stamps[event, slot] = %globaltimer`` (CTAs past the buffer share its last slot)."""
    stamp_pointer(address, EVENTS.index(event))[cutlass.min(slot, SLOTS - 1)] = cute.arch.globaltimer()


@cute.jit
def stamp_if(condition, address: cutlass.Constexpr, event: cutlass.Constexpr):
    """``write_stamp`` for this CTA where ``condition`` holds (``event``: an index of EVENTS)."""
    if condition:
        stamp_pointer(address, event)[cutlass.min(cta_slot(), SLOTS - 1)] = cute.arch.globaltimer()


def cta_slot():
    """This CTA's linear index in its grid."""
    bx, by, _ = cute.arch.block_idx()
    gx, _, _ = cute.arch.grid_dim()
    return bx + by * gx


class StampedGlue:
    """``data += 1`` over fp32 ``data``, then its CTAs' end time into ``glue_end`` (maximum); ``pdl``: launched with
    programmatic dependent launch, waiting on its predecessor and triggering its dependents at once, as PDL-aware
    norms do. ``trailing``: stamps only its first CTA's start, as ``next_start``: the glue after a stamped kernel.
    ``carveout``: its launch's shared-memory carveout hint (percent; None: the driver's choice, most of the SM's
    memory as L1 for a kernel without shared memory)."""

    def __init__(self, address, pdl, trailing=False, carveout=None):
        self.address, self.pdl, self.trailing, self.carveout = address, pdl, trailing, carveout

    @cute.jit
    def __call__(self, data: cute.Tensor, stream):
        self.kernel(data).launch(grid=(cute.ceil_div(data.shape[0], 256), 1, 1), block=(256, 1, 1), stream=stream,
                                 use_pdl=self.pdl, preferred_smem_carveout=self.carveout)

    @cute.kernel
    def kernel(self, data: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        stamp_if((bidx == 0) & (tidx == 0), self.address, EVENTS.index("next_start" if self.trailing else "glue_start"))
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()
        i = bidx * 256 + tidx
        if i < data.shape[0]:
            data[i] = data[i] + cutlass.Float32(1.0)
        if cutlass.const_expr(not self.trailing):
            if tidx == 0:
                cute.arch.atomic_max(stamp_pointer(self.address, 0).iterator, cute.arch.globaltimer())


class LaunchProbe:
    """An empty kernel with the projection's launch properties: ``smem`` bytes of shared memory, clusters of
    ``cluster`` CTAs, ``threads`` per CTA, programmatic dependent launch (``pdl``, waiting before it exits)."""

    def __init__(self, address, smem, cluster, threads, pdl, carveout=None):
        self.address, self.smem, self.cluster, self.threads, self.pdl = address, smem, cluster, threads, pdl
        self.carveout = carveout

    @cute.jit
    def __call__(self, ctas: cutlass.Int32, stream):
        @cute.struct
        class Storage:
            bytes: cute.struct.MemRange[cutlass.Uint8, max(self.smem, 16)]

        self.storage = Storage
        self.kernel().launch(grid=(ctas, 1, 1), block=(self.threads, 1, 1), stream=stream, use_pdl=self.pdl,
                             cluster=(self.cluster, 1, 1) if self.cluster > 1 else None,
                             preferred_smem_carveout=self.carveout)

    @cute.kernel
    def kernel(self):
        tidx, _, _ = cute.arch.thread_idx()
        storage = cutlass.utils.SmemAllocator().allocate(self.storage)
        if tidx == 0:
            write_stamp(self.address, "entry", cta_slot())
            storage.bytes.data_ptr().store(cutlass.Uint8(1))
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()
            if tidx == 0:
                write_stamp(self.address, "producer_waited", cta_slot())
            cute.arch.griddepcontrol_launch_dependents()
        if tidx == 0:
            write_stamp(self.address, "exit", cta_slot())


def stamped_gemm(base):
    """A subclass of ``base`` (SplitKGemm, ours or a changed copy's) writing its timeline: entry (at the pipeline's
    set-up), the first weight TMA, the producer past ``griddepcontrol.wait``, consumer start, first stage full
    (weights and activations landed), epilogue start (past the consumers' wait) and exit."""

    class StampedGemm(base):
        def __init__(self, tactic, programmatic_launch, address):
            super().__init__(tactic, programmatic_launch)
            self.address = address

        def sharing_layout(self):
            # Traced inside the kernel at the pipeline's creation, a few instructions after entry.
            tidx, _, _ = cute.arch.thread_idx()
            stamp_if(tidx == 0, self.address, EVENTS.index("entry"))
            return super().sharing_layout()

        @cute.jit
        def load_weight(self, weight_tiles, state, descriptor, tiles, k_tile, fold_stride, weight_row, sharers_mask):
            if state.count == 0 and cute.arch.lane_idx() == 0:
                write_stamp(self.address, "first_weight_tma", cta_slot())
            base.load_weight(self, weight_tiles, state, descriptor, tiles, k_tile, fold_stride, weight_row,
                             sharers_mask)

        def activation_origin(self, m_tile, batch):
            # Called by the producer past its griddepcontrol.wait, and by the consumers at the epilogue.
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            lane = cute.arch.lane_idx()
            stamp_if((warp == self.producer_warp) & (lane == 0), self.address, EVENTS.index("producer_waited"))
            stamp_if((warp == 0) & (lane == 0), self.address, EVENTS.index("epilogue"))
            return super().activation_origin(m_tile, batch)

        @cute.jit
        def consume(self, tiled_mma, tiles, storage, s_weight, s_act, out, residual, bias, warp, tidx, work):
            if tidx == 0:
                write_stamp(self.address, "consumer_start", cta_slot())
            if work.k_count > 0:
                # Waiting on the first stage's phase here leaves the loop's own wait on it satisfied.
                tiles.consumer_wait(pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                                 self.tactic.stages))
                if tidx == 0:
                    write_stamp(self.address, "first_stage_full", cta_slot())
            base.consume(self, tiled_mma, tiles, storage, s_weight, s_act, out, residual, bias, warp, tidx, work)
            if tidx == 0:
                write_stamp(self.address, "exit", cta_slot())

    return StampedGemm


class StampedRead(StreamRead):
    """The read ceiling's kernel writing entry, its first chunk landed (as ``first_stage_full``), its last chunk
    landed (as ``epilogue``) and exit: the streaming and the tail of a kernel that only reads, next to ours."""

    def __init__(self, address):
        self.address = address

    @cute.kernel
    def kernel(self, data: cute.Tensor):
        lane = cute.arch.lane_idx()
        stamp_if(lane == 0, self.address, EVENTS.index("entry"))
        self.stream(data)
        stamp_if(lane == 0, self.address, EVENTS.index("exit"))

    @cute.jit
    def wait_chunk(self, storage, i, count):
        StreamRead.wait_chunk(self, storage, i, count)
        lane = cute.arch.lane_idx()
        stamp_if((lane == 0) & (i == 0), self.address, EVENTS.index("first_stage_full"))
        stamp_if((lane == 0) & (i == count - 1), self.address, EVENTS.index("epilogue"))


def stamped_read(address, weights):
    """``launch(i)``: the stamped read ceiling over weight copy ``i``, one CTA per SM as ``stream_read``."""
    device = weights[0].device
    code = cute.compile(StampedRead(address), fake_bytes(), cutlass.Int32(1), make_fake_stream(),
                        options=f"--gpu-arch={architecture(device)}")
    views = [byte_view(w) for w in weights]
    ctas = cutlass.Int32(torch.cuda.get_device_properties(device).multi_processor_count)
    return lambda i: code(views[i], ctas, current_stream(device))


def projection_launch(kernel, weights):
    """``launch(i, x, out)``: ``kernel`` (a SplitKGemm) compiled, on weight copy ``i`` (whose map each launch
    encodes)."""
    device = weights[0].device
    code = cute.compile(SplitKLaunch(kernel), *kernel_arguments(weights[0].dtype, torch.bfloat16),
                        options=f"--gpu-arch={architecture(device)}")
    views = [matrix_view(w) for w in weights]

    def launch(i, x, out):
        code(*launch_arguments(views[i], None, launch_values(x, out, None, out.shape[1], device), x.dtype, out.dtype))
    launch.keep = weights
    return launch


def stamped_projection(address, weights, tactic, programmatic, gemm=SplitKGemm):
    """``launch(i, x, out)``: ``tactic`` compiled with stamps, on weight copy ``i``; ``gemm``: the kernel class
    stamped (a changed copy's SplitKGemm of the same signature, say, which takes the tactic by field name)."""
    return projection_launch(stamped_gemm(gemm)(tactic.to_dict(), programmatic, address), weights)


def replay_stamps(stamps, pair, copies=1, repeats=20, after=None):
    """Per event, the medians over ``repeats`` replays of (first CTA, median CTA, last CTA) stamp minus glue end, us;
    ``pair(i)`` launches the previous kernel and the stamped one on weight copy ``i``. The graph rotates through the
    ``copies`` twice (at least 8 pairs), so the pair whose stamps stay reads a weight that is cold in L2; ``after``
    launches a kernel that stamps ``next_start`` once, after the last pair."""
    graph = torch.cuda.CUDAGraph()
    pair(0)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        for i in range(max(8, 2 * copies)):
            pair(i % copies)
        if after is not None:
            after()
    found = {event: [] for event in REPORTED}
    for _ in range(repeats):
        stamps.zero_()
        graph.replay()
        torch.cuda.synchronize()
        rows = stamps.cpu()
        glue_end = int(rows[0, 0])
        for e, event in enumerate(REPORTED, start=1):
            values = sorted(int(v) for v in rows[e] if v > 0)
            if values and glue_end:
                found[event].append(tuple((v - glue_end) / 1e3 for v in (values[0], values[len(values) // 2],
                                                                          values[-1])))
    return {event: tuple(statistics.median(s[i] for s in samples) for i in range(3))
            for event, samples in found.items() if samples}


LAUNCH_VARIANTS = {  # name: LaunchProbe options
    "bare": dict(smem=0, cluster=1, threads=128, pdl=False),
    "smem 200 KB": dict(smem=200 * 1024, cluster=1, threads=128, pdl=False),
    "smem 100 KB": dict(smem=100 * 1024, cluster=1, threads=128, pdl=False),
    "smem 200 KB carveout 100": dict(smem=200 * 1024, cluster=1, threads=128, pdl=False, carveout=100),
    "cluster 2": dict(smem=0, cluster=2, threads=128, pdl=False),
    "cluster 4": dict(smem=0, cluster=4, threads=128, pdl=False),
    "pdl": dict(smem=0, cluster=1, threads=128, pdl=True),
    "384 threads": dict(smem=0, cluster=1, threads=384, pdl=False),
    "projection-like (200 KB, cluster 4, pdl, 160 threads)":
        dict(smem=200 * 1024, cluster=4, threads=160, pdl=True),
}

# After a plain glue an empty kernel with 100-200 KB of shared memory entered 0.19 us later than one without, and
# not back to back (H100, docs/launch-contexts.md): if that is the SM's L1/shared split changing from the glue's,
# a glue asking for the most shared memory (carveout 100) should take it away. These variants run after that glue
# too; their results' names end in MAX_SHARED_GLUE.
AFTER_MAX_SHARED_GLUE = ("bare", "smem 200 KB", "projection-like (200 KB, cluster 4, pdl, 160 threads)")
MAX_SHARED_GLUE = ", after a carveout-100 glue"


def launch_probes(stamps, glue, ctas, max_shared_glue=None):
    """Stamps and times of the empty kernel per launch property, after the plain glue, and those of
    AFTER_MAX_SHARED_GLUE after ``max_shared_glue`` too (where given)."""
    address, stream = stamps.data_ptr(), lambda: current_stream(stamps.device)
    runs = [(name, options, glue, "") for name, options in LAUNCH_VARIANTS.items()]
    if max_shared_glue is not None:
        runs += [(name, LAUNCH_VARIANTS[name], max_shared_glue, MAX_SHARED_GLUE) for name in AFTER_MAX_SHARED_GLUE]
    results = {}
    for name, options, before, suffix in runs:
        code = cute.compile(LaunchProbe(address, **options), cutlass.Int32(1), make_fake_stream(),
                            options="--gpu-arch=sm_90a")
        launch = lambda i, code=code: code(cutlass.Int32(ctas), stream())  # noqa: E731
        key = name + suffix
        results[key] = {
            "stamps": replay_stamps(stamps, lambda i, before=before, launch=launch: (before(), launch(0))),
            "us_after_glue": interleaved_time_us({0: launch}, 2, separators={0: before})[0],
            "us_chain": interleaved_time_us({0: launch}, 2)[0],
        }
        print(f"launch {key:55s} after glue {results[key]['us_after_glue']:6.2f} us, chain "
              f"{results[key]['us_chain']:6.2f} us; entry after glue end (first, median, last) "
              f"{fmt(results[key]['stamps'].get('entry'))}", flush=True)
    return results


def fmt(triple):
    return "-" if triple is None else " ".join(f"{v:6.2f}" for v in triple)


def timelines(stamps, contexts, shapes=SHAPES[:3], batches=BATCHES, kernels=None):
    """Per shape, the read ceiling's stamped timeline in each context, then the projection's per batch, launch
    flag and context. ``contexts`` maps a name to (the glue before, the same glue after, stamping ``next_start``).
    ``kernels`` maps a suffix of the results' keys to a SplitKGemm class: by default ours alone; a changed copy's
    kernel next to ours is stamped in turn in each context."""
    device = stamps.device
    kernels = kernels or {"": SplitKGemm}
    results = {}
    for n, k in shapes:
        weights = [torch.randn(n, k, device=device).to(torch.bfloat16) for _ in range(cold_copies(n * k * 2, device))]
        policies, _ = resolve_policies(n, k, batches, gpu=gpu_spec(device), weight_dtype=torch.bfloat16,
                                       output_dtype=torch.bfloat16)
        read = stamped_read(stamps.data_ptr(), weights)
        for before, (glue, trailing) in contexts.items():
            key = f"{n}x{k} read ceiling after {before}"
            results[key] = replay_stamps(stamps, lambda i: (glue(), read(i)), len(weights), after=trailing)
            show(key, results[key])
        for batch in batches:
            tactic = policies[batch]
            x = torch.randn(batch, k, device=device).to(torch.bfloat16)
            out = torch.empty(batch, n, device=device, dtype=torch.bfloat16)
            reference = x.double() @ weights[0].double().T
            for programmatic in (True, False):
                launches = {}
                for suffix, gemm in kernels.items():
                    launch = stamped_projection(stamps.data_ptr(), weights, tactic, programmatic, gemm)
                    out.fill_(float("nan"))
                    launch(0, x, out)
                    torch.cuda.synchronize()
                    error = ((out.double() - reference).norm() / reference.norm()).item()
                    assert error < 1e-2, f"stamped projection{suffix} is off: {error}"
                    launches[suffix] = launch
                name = f"{n}x{k} M={batch} {tactic.label} {'pdl' if programmatic else 'plain'}"
                for before, (glue, trailing) in contexts.items():
                    for suffix, launch in launches.items():
                        key = f"{name}{suffix} after {before}"
                        results[key] = replay_stamps(stamps, lambda i: (glue(), launch(i, x, out)), len(weights),
                                                     after=trailing)
                        show(key, results[key])
    return results


def show(key, stamps):
    """Print one timeline: per event, (first, median, last) CTA."""
    print(key, flush=True)
    for event, triple in stamps.items():
        print(f"    {event:18s} {fmt(triple)}")


def glue_durations(stamps, plain_glue):
    """The glue kernel's own start-to-end time after itself, after a projection and after the read ceiling (cold
    weights): the benchmark subtracts the glue's time measured after itself."""
    device = stamps.device
    n, k = 7168, 768
    copies = cold_copies(n * k * 2, device)
    weights = [torch.randn(n, k, device=device).to(torch.bfloat16) for _ in range(copies)]
    projections = [PreparedProjection.for_weight(w, batches=(1,)) for w in weights]
    x = torch.randn(1, k, device=device).to(torch.bfloat16)
    outs = [torch.empty(1, n, device=device, dtype=torch.bfloat16) for _ in range(copies)]
    previous = {"glue": lambda i: plain_glue(), f"projection {n}x{k} M=1": lambda i: projections[i].run(x, outs[i]),
                f"read ceiling {n}x{k}": lambda i: stream_read(weights[i])}
    results = {}
    for name, launch in previous.items():
        for i in range(copies):
            launch(i)
            plain_glue()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(2 * copies):
                launch(i % copies)
                plain_glue()
        durations = []
        for _ in range(20):
            stamps.zero_()
            graph.replay()
            torch.cuda.synchronize()
            rows = stamps.cpu()
            durations.append((int(rows[0, 0]) - int(rows[EVENTS.index("glue_start"), 0])) / 1e3)
        results[name] = statistics.median(durations)
        print(f"glue kernel start to end after {name:32s} {results[name]:6.2f} us", flush=True)
    return results


def context_times(plain_glue_torch, shapes=SHAPES, batches=BATCHES):
    """Projection (PDL and plain), read ceiling and torch.matmul per shape and batch, chain and after glue."""
    device = torch.device("cuda")
    results = {}
    for n, k in shapes:
        copies = cold_copies(n * k * 2, device)
        weights = [torch.randn(n, k, device=device).to(torch.bfloat16) for _ in range(copies)]
        for batch in batches:
            x = torch.randn(batch, k, device=device).to(torch.bfloat16)
            outs = [torch.empty(batch, n, device=device, dtype=torch.bfloat16) for _ in range(copies)]
            launches = {"ceiling": lambda i: stream_read(weights[i]),
                        "torch.matmul": lambda i: torch.matmul(x, weights[i].T, out=outs[i])}
            for programmatic in (True, False):
                projections = [PreparedProjection.for_weight(w, batches=(batch,), programmatic_launch=programmatic)
                               for w in weights]
                launches[f"ours {'pdl' if programmatic else 'plain'}"] = \
                    lambda i, p=projections: p[i].run(x, outs[i])
            for context, separator in (("chain", None), ("glue", plain_glue_torch)):
                separators = None if separator is None else dict.fromkeys(launches, separator)
                times = interleaved_time_us(launches, copies, separators=separators)
                results[f"{n}x{k} M={batch} {context}"] = times
                print(f"{n}x{k} M={batch} {context:6s} " + "  ".join(f"{name} {us:7.2f}" for name, us in times.items()),
                      flush=True)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every result here")
    parser.add_argument("--parts", default="launch,glue,timeline,times")
    parser.add_argument("--shape", type=shape, action="append",
                        help="NxK (repeatable) for the timeline and the times (default: the first three of SHAPES "
                             "for the timeline, all four for the times)")
    parser.add_argument("--batches", type=batch_list, default=list(BATCHES), help="padded batches, comma-separated")
    parser.add_argument("--compare-package", metavar="NAME",
                        help="the timeline also stamps the kernel of a changed copy of the package importable as NAME "
                             "(its folder renamed), next to ours in each context")
    args = parser.parse_args()
    device = torch.device("cuda")
    print(torch.cuda.get_device_name(device), flush=True)
    stamps = torch.zeros(len(EVENTS), SLOTS, dtype=torch.int64, device=device)
    scratch = torch.zeros(GLUE_ELEMENTS, device=device)
    scratch_view = to_cute(scratch).mark_layout_dynamic()
    fake = make_fake_tensor(cutlass.Float32, (cute.sym_int(),), (1,), assumed_align=16)
    glues = {(pdl, trailing, carveout): cute.compile(StampedGlue(stamps.data_ptr(), pdl, trailing, carveout), fake,
                                                     make_fake_stream(), options="--gpu-arch=sm_90a")
             for pdl, trailing, carveout in ((False, False, None), (False, True, None), (True, False, None),
                                             (True, True, None), (False, False, 100))}

    def glue(pdl, trailing=False, carveout=None):
        return lambda: glues[pdl, trailing, carveout](scratch_view, current_stream(device))
    plain_glue = glue(False)
    ctas = torch.cuda.get_device_properties(device).multi_processor_count
    results = {"gpu": torch.cuda.get_device_name(device)}
    parts = args.parts.split(",")
    if "launch" in parts:
        results["launch"] = launch_probes(stamps, plain_glue, ctas, glue(False, carveout=100))
    if "glue" in parts:
        results["glue"] = glue_durations(stamps, plain_glue)
    if "timeline" in parts:
        # The benchmark's glue is PyTorch's add_, which the stamps cannot mark: it runs after the plain stamped glue.
        torch_glue = foreign_kernel(device)
        contexts = {"glue": (plain_glue, glue(False, True)), "pdl-glue": (glue(True), glue(True, True)),
                    "glue, then PyTorch's add_": (lambda: (plain_glue(), torch_glue()), glue(False, True))}
        kernels = {"": SplitKGemm}
        if args.compare_package:
            kernels[f" {args.compare_package}"] = importlib.import_module(
                f"{args.compare_package}.kernel.splitk").SplitKGemm
        results["timeline"] = timelines(stamps, contexts, args.shape or SHAPES[:3], args.batches, kernels)
    if "times" in parts:
        results["times"] = context_times(foreign_kernel(device), args.shape or SHAPES, args.batches)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=1)


if __name__ == "__main__":
    main()
