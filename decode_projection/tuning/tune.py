"""Autotuner: time the cost model's best candidates on the GPU and keep the fastest.

For each (N, K, padded batch) the tuner takes the heuristic's pick plus the
tactics the cost model ranks best (``candidates.candidate_tactics``), checks each one's
output against a float64 reference (judged against torch.matmul's own error) in
every launch context before it may win, and times the cell's candidates with
cold L2 and CUDA-graph replay, interleaved round by round as the benchmark times
them, in each launch context asked for (``timing.CONTEXTS``; all three by
default): back to back (each launch's weight prefetch overlaps the previous
launch, as in a chain of projections with programmatic dependent launch), after
a PDL-aware glue kernel (as after the norms of current inference engines), and
after a plain PyTorch kernel (where nothing overlaps). The winner has the lowest
geometric mean of its times in them: a tactic that only wins by overlapping
itself would leave a model with glue between its projections slower. Pruning is
what makes a full table fit in minutes of GPU time: the tactic space has
hundreds of valid points, the model keeps a handful.

The batch-invariant table comes from the same pass: each shape gets one
summation order (split and K boxes per stage): among those that keep every
batch up to 64 within 10% of the free table in every context (as the benchmark
reads it), the one whose best time at each batch is closest to that batch's
best over all orders (geometric mean of the ratios, over the orders timed at
every batch; batch 1's winner where none is). The mean alone let nine cells
run 11-16% over the free table back to back (H200, 2026-12-03).
Batch 1's winner alone is not enough: on 3072 x 7168 it took 4-box stages,
which leave no shared memory for large activation tiles, and ran up to 3x
behind at M >= 96. Before choosing, every order that won a streaming batch is
timed (ORDER_PROBE_CANDIDATES per cell) at the batches the free candidates
left it out, so that it can be chosen. The tactics with the chosen order are
timed at every batch next to the free candidates, and each table keeps its
own best (the invariant table's within the 10% in every context at M <= 64 where
one is: the mean alone took a tactic 17% over on 7168 x 1536 M=48, H200,
2026-12-04); so a row is summed in the same order whatever the batch, and the
free table may also pick an invariant candidate. An order can also be pinned
per shape (``tune --invariant-order``), where a probe found a better one than
the candidates let the rule see.

Unclustered candidates with an SM to themselves and streaming activation
tiles, in both passes, are also timed letting the next launch in as they start
(``early_dependents_tactics``): which way wins could not be predicted
(docs/programmatic-launch.md).

The tactics the current tables hold for a cell (``incumbents``) are timed
next to the new candidates, with the free table's for the next larger batch:
candidate lists change with the cost model, and a re-tune of the free table
must not lose a tactic that already won (it keeps the one it holds unless a
challenger beats it by more than REPLACE_MARGIN: near-ties flip between runs); split incumbents are also timed in
fewer stages that give their partials a buffer (``buffered_partials_tactics``). (The
batch-invariant table keeps an incumbent only if this run fixes the same
summation order.)

Shapes are tuned one after the other, each through every pass, and both tables
and the timings are written after each: a tune cut short (a device call's time
limit) keeps its finished shapes, and ``resume`` goes on from there, skipping
the shapes both tables already hold at every batch.
"""

import datetime
import json
import logging
import math
import time
from dataclasses import astuple, dataclass
from pathlib import Path

import cutlass
import torch
from tqdm import tqdm

from ..kernel.tactic import SplitKTactic
from ..measure.checks import Reference
from ..measure.clocks import ClockLog
from ..measure.timing import CHAIN, CONTEXTS, GLUE, LaunchContexts, cold_copies, geometric_mean
from ..policy.policies import COMPUTE_BOUND_ROWS, activation_rows_for
from ..policy.tables import TableKey, dtype_name, key_of, load_table, read_entries, table_policies, write_table
from ..projection import PreparedProjection
from ..runtime import architecture
from ..runtime.gpu import gpu_spec
from ..warmup import compile_all, compiling_processes, tactic_jobs
from .candidates import buffered_partials_tactics, candidate_tactics, early_dependents_tactics

logger = logging.getLogger(__name__)

# Issue 5's allowance: a batch-invariant cell may run this much over the free table at M <= 64.
INVARIANT_EXCESS = 1.10
# Candidates timed per cell for each order that won a streaming batch but was not timed at every batch.
ORDER_PROBE_CANDIDATES = 2
TIMING_ROUNDS = 7  # median of this many replays per candidate and context
# A re-tune replaces the free table's tactic for a cell only if a challenger's mean beats it by more than this
# share: near-ties flip from run to run (H200, 2026-12-05: on 3584 x 7168 at M = 1, 3, 4 the re-tune's new
# pick won by 0.4-1.0% and lost a same-process probe by 0.4-1.2%, 0.35-0.45 us slower back to back), and a
# flip ships a tactic that no benchmark has seen.
REPLACE_MARGIN = 0.015


@dataclass(frozen=True)
class Timed:
    """One candidate's median microseconds in each launch context it was timed in."""

    tactic: SplitKTactic
    us: dict  # {context: microseconds}, a context named as in timing.CONTEXTS

    @property
    def score(self) -> float:
        """What the tuner minimizes: the geometric mean of the times in every context."""
        return geometric_mean(self.us.values())

    def excess_over(self, other: "Timed") -> float:
        """This candidate's time over ``other``'s in the context where that ratio is largest."""
        return max(us / other.us[context] for context, us in self.us.items())


class ShapeTimer:
    """Cold-L2 weight copies of one shape and the means to time candidates on them."""

    def __init__(self, n, k, *, weight_dtype, output_dtype, contexts):
        self.n, self.k, self.output_dtype, self.contexts = n, k, output_dtype, contexts
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.copies = cold_copies(n * k * 2, self.device)
        self.weight_dtype = weight_dtype
        self.weights = [torch.randn(n, k, device=self.device).to(weight_dtype) for _ in range(self.copies)]

    def time(self, batch, tactics, progress) -> list[Timed]:
        """Check each tactic against float64 in every launch context, then time them all interleaved in all."""
        # Interleaved as the benchmark times them, so that drift and what ran before fall on every candidate
        # alike (one after the other, a launch's time moved by up to 12% with what preceded it).
        x = torch.randn(batch, self.k, device=self.device).to(self.weight_dtype)
        around = LaunchContexts(self.contexts, x)
        outs = [torch.empty(batch, self.n, device=self.device, dtype=self.output_dtype) for _ in range(self.copies)]
        reference = Reference(x, self.weights[0], self.output_dtype)
        launches = {}
        for tactic in tactics:
            projections = [
                PreparedProjection(w, {batch: tactic}, output_dtype=self.output_dtype).prepare() for w in self.weights
            ]
            launches[tactic] = lambda i, projections=projections: projections[i].run(x, outs[i])
            around.check(launches[tactic], outs[0], reference, label=f"{self.n}x{self.k} M={batch} {tactic}")
        times = around.time_us(launches, self.copies, repeats=TIMING_ROUNDS)
        progress.update(len(tactics))
        return [Timed(tactic, {context: times[context, tactic] for context in self.contexts}) for tactic in tactics]


class UnusableOrder(ValueError):
    """A summation order given with ``pinned_orders`` that no tactic of some tuned cell sums in."""


def invariant_pick(found: list[Timed], order: tuple, batch: int) -> Timed | None:
    """What a batch-invariant table summing in ``order`` ships for a cell: the best score among the
    order's tactics that stay within INVARIANT_EXCESS of the cell's best in every context at a streaming
    batch (the allowance is judged as the benchmark reads it, context by context), else among all of them."""
    own = [t for t in found if not t.tactic.weight_as_b and t.tactic.summation_order == order]
    if own and activation_rows_for(batch) < COMPUTE_BOUND_ROWS:
        fastest = min(found, key=lambda t: t.score)
        own = [t for t in own if t.excess_over(fastest) <= INVARIANT_EXCESS] or own
    return min(own, key=lambda t: t.score, default=None)


def shared_order(timed_by_batch: dict[int, list[Timed]]) -> tuple:
    """The summation order for every batch of a shape, among the orders timed at every batch."""
    # Orders that keep each streaming batch (M <= 64) within INVARIANT_EXCESS of the free table in every context, as
    # the benchmark reads it, rank first (else the smallest worst excess); then the lowest geometric mean over all
    # batches of the order's pick (``invariant_pick``) over the batch's best. Where no order was timed at every
    # batch, the smallest batch's winner's; ties go to it too. Only tactics with the weight as A count (the GPU
    # tests verify invariance for those); the free table's best, whatever its kind, is what each order is
    # measured against.
    batches = sorted(timed_by_batch)
    free = {batch: min(timed_by_batch[batch], key=lambda t: t.score) for batch in batches}
    orders = {t.tactic.summation_order for found in timed_by_batch.values() for t in found
              if not t.tactic.weight_as_b}
    best = {(batch, order): pick for batch in batches for order in orders  # what a table with that order ships
            if (pick := invariant_pick(timed_by_batch[batch], order, batch)) is not None}
    if not best:
        raise ValueError("no tactic with the weight as A was timed: "
                         "no batch-invariant summation order to choose")
    first_winner = min(best.items(), key=lambda found: (found[0][0], found[1].score))[0][1]
    everywhere = set.intersection(*({order for b, order in best if b == batch} for batch in batches))
    if not everywhere:
        return first_winner
    streaming = [b for b in batches if activation_rows_for(b) < COMPUTE_BOUND_ROWS]

    def rank(order):
        excess = max((best[b, order].excess_over(free[b]) for b in streaming), default=1.0)
        cost = sum(math.log(best[b, order].score / free[b].score) for b in batches)
        return (max(excess, INVARIANT_EXCESS), cost, order != first_winner)

    return min(everywhere, key=rank)


def incumbent_tactics(tables, n, k, batch, gpu, *, weight_dtype, output_dtype) -> list[SplitKTactic]:
    """The tactics ``tables`` hold for this cell (free table first, then batch-invariant), then the free
    table's for the next larger batch whose activation tile covers this one (the rows past the batch read
    zeros): in an H200 benchmark (2026-12-03) the next batch's tactic ran this batch faster than its own in
    21 cells. Weight as A only, as measured there; weight-as-B tactics have a candidate group of their own."""
    def key(invariant):
        return TableKey(gpu.name, gpu.sm_count, n, k, dtype_name(weight_dtype), dtype_name(output_dtype), invariant)

    found = [t for invariant in (False, True) for t in table_policies(key(invariant), [batch], tables).values()]
    free = tables.get(key(False), {})
    covering = [free[b] for b in sorted(free)
                if b > batch and free[b].activation_rows >= batch and not free[b].weight_as_b]
    if covering:
        found.append(covering[0])
    return list(dict.fromkeys(found))


def entry(n, k, batch, winner: Timed, *, gpu, batch_invariant, weight_dtype, output_dtype) -> dict:
    """One table entry."""
    return {
        "gpu": gpu.name, "sm_count": gpu.sm_count, "n": n, "k": k,
        "weight_dtype": dtype_name(weight_dtype), "output_dtype": dtype_name(output_dtype),
        "batch_invariant": batch_invariant, "batch": batch,
        "tactic": winner.tactic.to_dict(),
        "us": round(winner.score, 3),  # geometric mean of the times in every context tuned
    }


class Tuner:
    """One tuning run: every candidate timed so far, and the tables and timings written from them."""

    def __init__(self, shapes, batches, *, weight_dtype, output_dtype, out_path, invariant_out_path, timings_path,
                 kept_entries, incumbents=None, contexts=tuple(CONTEXTS)):
        self.shapes, self.batches, self.contexts = shapes, batches, list(contexts)
        self.gpu = gpu_spec(torch.cuda.current_device(), measure_clusters=True)
        self.arch = architecture(torch.device("cuda", torch.cuda.current_device()))
        self.kinds = dict(weight_dtype=weight_dtype, output_dtype=output_dtype)
        self.out_path, self.invariant_out_path, self.timings_path = out_path, invariant_out_path, timings_path
        self.kept_entries = kept_entries
        self.kept_invariant_entries = []  # of shapes this run does not tune (resume)
        self.kept_timings = []  # rows of the timings file for the shapes this run does not tune (resume)
        self.timed = {}  # (n, k, batch): every candidate timed there, in every pass
        self.orders = {}  # (n, k): the batch-invariant table's summation order
        self.settled = set()  # shapes whose chosen order's candidates are timed
        self.clocks = {}  # (n, k): what the GPU ran at while each pass timed the shape
        self.incumbents = incumbents or {}
        self.compiled, self.broken = set(), set()  # compile jobs done; tactics that did not compile
        self.processes = None  # compiling worker processes shared by every pass (warmup.compiling_processes)

    def key(self, n, k, batch_invariant) -> TableKey:
        """The table key of shape ``n`` x ``k`` on this GPU with this run's dtypes."""
        return TableKey(self.gpu.name, self.gpu.sm_count, n, k, dtype_name(self.kinds["weight_dtype"]),
                        dtype_name(self.kinds["output_dtype"]), batch_invariant)

    def held(self, cell) -> SplitKTactic | None:
        """The free table's current tactic for ``cell``, if the incumbent tables hold one."""
        n, k, batch = cell
        return self.incumbents.get(self.key(n, k, False), {}).get(batch)

    def fastest(self, cell) -> Timed:
        """The best score (over every launch context) at ``cell``."""
        return min(self.timed[cell], key=lambda t: t.score)

    def best(self, cell) -> Timed:
        """The free table's pick: the fastest, unless the tactic the table holds comes within REPLACE_MARGIN."""
        fastest, tactic = self.fastest(cell), self.held(cell)
        held = next((t for t in self.timed[cell] if t.tactic == tactic), None)
        if held is not None and held.score <= fastest.score * (1 + REPLACE_MARGIN):
            return held
        return fastest

    def resume(self, shapes, batch_invariant) -> list:
        """Keep what this run's tables and timings files hold; returns ``shapes`` less those finished there: held at
        every batch by the free table and, where this run writes one (``batch_invariant``), the batch-invariant one."""
        tables = {invariant: path for invariant, path in ((False, self.out_path), (True, self.invariant_out_path))
                  if path is not None and (batch_invariant or not invariant)}
        held = {invariant: load_table(path) for invariant, path in tables.items() if Path(path).is_file()}
        if self.out_path is not None and Path(self.out_path).is_file():
            self.kept_entries = read_entries(self.out_path)
        if self.invariant_out_path is not None and Path(self.invariant_out_path).is_file():
            self.kept_invariant_entries = read_entries(self.invariant_out_path)
        finished = [(n, k) for n, k in shapes if tables and all(
            set(self.batches) <= set(held.get(invariant, {}).get(self.key(n, k, invariant), {})) for invariant in tables
        )]
        if self.timings_path is not None and Path(self.timings_path).is_file():
            rows = json.loads(Path(self.timings_path).read_text())
            self.kept_timings = [row for row in rows if (row["n"], row["k"]) in finished]
            other = {tuple(timed_contexts(row)) for row in self.kept_timings} - {tuple(self.contexts)}
            if other:
                raise ValueError(f"{self.timings_path} holds times in the contexts {sorted(other)}, this run's are "
                                 f"{self.contexts}: resume with the contexts of the run it goes on with")
        return [shape for shape in shapes if shape not in finished]

    def compile(self, candidates):
        """Compile the ``candidates`` ({cell: [tactic]}) not compiled yet, in parallel."""
        # Compiled before timing, so timing never waits on the compiler. One that does not compile is left out with a
        # warning (a wrong result still stops the tune: ShapeTimer checks each one).
        tactics = {t for found in candidates.values() for t in found}
        jobs = tactic_jobs(tactics, self.kinds["output_dtype"], self.arch, self.kinds["weight_dtype"]) - self.compiled
        failed = {}
        compile_all(jobs, failed=failed, processes=self.processes)
        for job, error in failed.items():
            logger.warning("%s does not compile, left out of the tune: %s: %s", job[0], type(error).__name__, error)
        self.compiled |= jobs
        self.broken |= {job[0] for job in failed}

    def run_pass(self, timer, candidates, description):
        """Time ``candidates`` ({batch: [tactic]}) of the timer's shape, then write everything measured so far."""
        self.compile(candidates)
        n, k = timer.n, timer.k
        candidates = {b: [t for t in found if t not in self.broken] for b, found in candidates.items()}
        # The invariant pass may find every candidate of the chosen order timed already at a cell.
        batches = [b for b in self.batches if candidates[b]]
        if batches:
            # Sampled per shape and pass: a long tune heats the GPU, and a clock drop shows up here.
            with tqdm(total=sum(len(candidates[b]) for b in batches), desc=f"{description} {n}x{k}",
                      unit="tactic") as progress, ClockLog(torch.cuda.current_device()) as log:
                for b in batches:
                    self.timed.setdefault((n, k, b), []).extend(timer.time(b, candidates[b], progress))
            self.clocks.setdefault((n, k), []).append(log.summary())
        self.write()

    def tune_shape(self, n, k, free, *, invariant_limit, pinned_order):
        """Every pass over one shape: its ``free`` candidates ({(n, k, batch): [tactic]}) and, with
        ``invariant_limit``, the batch-invariant table's order (``pinned_order``, else the rule's) and candidates."""
        timer = ShapeTimer(n, k, contexts=self.contexts, **self.kinds)
        self.run_pass(timer, {b: free[n, k, b] for b in self.batches}, "tune")
        untimed = [f"{n}x{k} M={b}" for b in self.batches if not self.timed.get((n, k, b))]
        if untimed:
            raise RuntimeError(f"no candidate compiled for {', '.join(untimed)}: nothing to choose from there")
        if invariant_limit is None:
            return
        # An order can only be shared if it was timed at every batch: give each order that won a streaming batch a
        # chance where the free candidates did not time it (6288 x 7168's 48-row orders won every batch up to 64,
        # were never timed at 96 and up, and the order chosen instead lost there; docs/tactics-and-heuristic.md). A
        # pinned order needs no choosing.
        streaming = [b for b in self.batches if activation_rows_for(b) < COMPUTE_BOUND_ROWS]
        winning = set() if pinned_order else {
            t.summation_order for t in (self.fastest((n, k, b)).tactic for b in streaming) if not t.weight_as_b}
        self.run_pass(timer, {b: order_candidates(n, k, b, self.gpu, timed=self.timed[n, k, b], winning=winning)
                              for b in self.batches}, "tune orders")
        self.orders[n, k] = pinned_order or shared_order({b: self.timed[n, k, b] for b in self.batches})
        self.run_pass(timer, {b: chosen_order_candidates(n, k, b, self.gpu, order=self.orders[n, k],
                                                         limit=invariant_limit, timed=self.timed[n, k, b])
                              for b in self.batches}, "tune batch-invariant")
        self.settled.add((n, k))
        self.write()

    def write(self):
        """Write the tables and timings measured so far; ``(entries, invariant entries)`` of the cells tuned."""
        stamp = dict(dsl_version=cutlass.__version__, measured=datetime.date.today().isoformat())
        stamped = dict(gpu=self.gpu, **self.kinds)
        entries = [entry(*cell, self.best(cell), batch_invariant=False, **stamped) for cell in self.timed]
        if self.out_path is not None:
            tuned = {(key_of(e), e["batch"]) for e in entries}
            kept = [e for e in self.kept_entries if (key_of(e), e["batch"]) not in tuned]
            write_table(self.out_path, kept + entries, **stamp)
        invariant = [
            entry(n, k, b, invariant_pick(found, self.orders[n, k], b), batch_invariant=True, **stamped)
            for (n, k, b), found in self.timed.items() if (n, k) in self.settled
        ]
        # A batch-invariant table sums each shape in one order: a shape this run tunes replaces all its entries.
        tuned_shapes = {self.key(n, k, True) for n, k, _ in self.timed}
        kept_invariant = [e for e in self.kept_invariant_entries if key_of(e) not in tuned_shapes]
        if self.invariant_out_path is not None and (kept_invariant or invariant):
            write_table(self.invariant_out_path, kept_invariant + invariant, **stamp)
        if self.timings_path is not None:
            rows = [{"n": n, "k": k, "batch": b, "contexts": self.contexts,
                     "timed": [[t.tactic.to_dict(), *(round(t.us[c], 3) for c in self.contexts)] for t in found],
                     "clocks": self.clocks.get((n, k), [])}
                    for (n, k, b), found in self.timed.items()]
            Path(self.timings_path).write_text(json.dumps(self.kept_timings + rows, indent=0) + "\n")
        return entries, invariant

    def report_clocks(self):
        """Print the lowest SM clock any shape was timed at, and the highest power drawn."""
        sampled = [(summary, shape) for shape, passes in self.clocks.items() for summary in passes
                   if summary.get("samples")]
        if sampled:
            slowest, (n, k) = min(sampled, key=lambda found: found[0]["sm_mhz_median"])
            logger.info("lowest median SM clock while timing a shape: %.0f MHz (%dx%d); up to %.0f W",
                        slowest["sm_mhz_median"], n, k, max(summary["power_w_max"] for summary, _ in sampled))


def free_candidates(n, k, batch, gpu, *, limit, incumbents, kinds) -> list[SplitKTactic]:
    """The cost model's best, the incumbents, the early twins of both and the buffered twins of the incumbents."""
    fresh = candidate_tactics(n, k, batch, gpu, limit=limit)
    kept = incumbent_tactics(incumbents, n, k, batch, gpu, **kinds) if incumbents else []
    found = fresh + [t for t in kept if t not in fresh]
    # The incumbents first: the tactics that already won are the likeliest to win letting the next launch in, or
    # with a buffer for their partials.
    twins = early_dependents_tactics(kept + fresh, gpu) + buffered_partials_tactics(kept, gpu)
    return found + [t for t in dict.fromkeys(twins) if t not in found]


def order_candidates(n, k, batch, gpu, *, timed, winning) -> list[SplitKTactic]:
    """A few tactics of each order in ``winning`` that the cell has not timed yet."""
    timed_orders = {t.tactic.summation_order for t in timed}
    found = []
    for order in sorted(winning - timed_orders):
        try:
            found += candidate_tactics(n, k, batch, gpu, limit=ORDER_PROBE_CANDIDATES, order=order)
        except ValueError:  # no tactic sums in that order at this batch: the order cannot be shared
            pass
    return found


def chosen_order_candidates(n, k, batch, gpu, *, order, limit, timed) -> list[SplitKTactic]:
    """The best tactics summing in ``order`` and their early twins, less those already timed."""
    chosen = candidate_tactics(n, k, batch, gpu, limit=limit, order=order)
    # Letting the next launch in early does not change the sums: the twins keep the order.
    found = chosen + early_dependents_tactics(chosen, gpu)
    already = {done.tactic for done in timed}
    return [t for t in found if t not in already]


def timed_contexts(row) -> list:
    """The launch contexts of the times in a row of a ``--timings`` file, in their order (rows written before rows
    named them hold two: back to back, then after glue)."""
    return row.get("contexts", [CHAIN, GLUE])


def row_times(row) -> list[tuple[list, dict]]:
    """``[(tactic fields, {context: us})]`` of one row of a ``--timings`` file."""
    return [(fields, dict(zip(timed_contexts(row), times))) for fields, *times in row["timed"]]


def tune(shapes, batches, *, weight_dtype=torch.bfloat16, output_dtype=torch.bfloat16, limit=8,
         invariant_limit=None, out_path=None, invariant_out_path=None, timings_path=None, incumbents=None,
         kept_entries=(), pinned_orders=None, contexts=tuple(CONTEXTS), resume=False):
    """Tune every (shape, batch): ``(entries, invariant entries)``, the latter where ``invariant_limit`` is set."""
    # Tables and every candidate's times in every context (with the GPU's clocks while each shape was timed) are
    # written as JSON where a path is given, after every shape and pass, so an interrupted run keeps what it
    # measured; ``resume`` goes on with the shapes these files do not hold yet (Tuner.resume). ``incumbents``
    # (tables as ``load_table`` returns them) add their tactics for each cell to its candidates. ``kept_entries``
    # (a table's entries) are written to ``out_path`` too, except the cells this run tunes. ``pinned_orders``
    # ({(n, k): (split, k boxes)}) replace the invariant table's choice of order for those shapes.
    if pinned_orders and invariant_limit is None:
        raise ValueError("pinned orders are the batch-invariant table's: set invariant_limit")
    started = time.perf_counter()
    batches = sorted(batches)
    tuner = Tuner(shapes, batches, weight_dtype=weight_dtype, output_dtype=output_dtype, out_path=out_path,
                  invariant_out_path=invariant_out_path, timings_path=timings_path, kept_entries=kept_entries,
                  incumbents=incumbents, contexts=contexts)
    gpu = tuner.gpu
    pinned_orders = dict(pinned_orders or {})
    for (n, k), order in pinned_orders.items():
        for b in batches:  # before any timing: a pinned order must have a tactic at every batch
            try:
                candidate_tactics(n, k, b, gpu, limit=1, order=order)
            except ValueError as error:
                raise UnusableOrder(str(error)) from None
    logger.info("clusters of 1..%d CTAs at once, one CTA per SM: %s", len(gpu.cluster_slots), gpu.cluster_slots)
    if resume:
        remaining = tuner.resume(shapes, batch_invariant=invariant_limit is not None)
        finished = [f"{n}x{k}" for n, k in shapes if (n, k) not in remaining]
        logger.info("resumed: %s already tuned, %d shapes to go", ", ".join(finished) or "no shape", len(remaining))
        shapes = remaining
    # Every free candidate compiled up front, in parallel; each shape's later passes compile their own candidates
    # (which depend on the free pass's times) in the same worker processes.
    free = {(n, k, b): free_candidates(n, k, b, gpu, limit=limit, incumbents=incumbents, kinds=tuner.kinds)
            for n, k in shapes for b in batches}
    with compiling_processes() as processes:
        tuner.processes = processes
        tuner.compile(free)
        for n, k in shapes:
            tuner.tune_shape(n, k, free, invariant_limit=invariant_limit, pinned_order=pinned_orders.get((n, k)))
    entries, invariant = tuner.write()
    logger.info("tuned %d shapes x %d batches in %.0f s", len(shapes), len(batches), time.perf_counter() - started)
    tuner.report_clocks()
    return entries, invariant
