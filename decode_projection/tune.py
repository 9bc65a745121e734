"""Autotuner: time the cost model's best candidates on the GPU and keep the fastest.

For each (N, K, padded batch) the tuner takes the heuristic's pick plus the
tactics the cost model ranks best (``candidates.candidate_tactics``), checks each one's
output against a float64 reference (judged against torch.matmul's own error)
before it may win, and times the cell's candidates with cold L2 and CUDA-graph
replay, interleaved round by round as the benchmark times them, twice: back to
back (each launch's weight prefetch overlaps the previous launch, as in a chain
of projections with programmatic dependent launch) and after a foreign
kernel (as after a norm or an activation, where nothing overlaps). The winner
has the best mean of the two: a tactic that only wins by overlapping itself
would leave a model with glue between its projections slower. Pruning is
what makes a full table fit in minutes of GPU time: the tactic space has
hundreds of valid points, the model keeps a handful.

The batch-invariant table comes from the same pass: each shape gets one
summation order (split and K boxes per stage): among those that keep every
batch up to 64 within 10% of the free table back to back (the benchmark's
reading), the one whose best time at each batch is closest to that batch's
best over all orders (geometric mean of the ratios, over the orders timed at
every batch; batch 1's winner where none is). The mean alone let nine cells
run 11-16% over the free table back to back (v12).
Batch 1's winner alone is not enough: on 3072 x 7168 it took 4-box stages,
which leave no shared memory for large activation tiles, and ran up to 3x
behind at M >= 96. Before choosing, every order that won a streaming batch is
timed (ORDER_PROBE_CANDIDATES per cell) at the batches the free candidates
left it out, so that it can be chosen. The tactics with the chosen order are
timed at every batch next to the free candidates, and each table keeps its
own best (the invariant table's within the 10% back to back at M <= 64 where
one is: the mean alone took a tactic 17% over on 7168 x 1536 M=48, v31); so a
row is summed in the same order whatever the batch, and the free table may
also pick an invariant candidate. An order can also be pinned
per shape (``tune --invariant-order``), where a probe found a better one than
the candidates let the rule see.

Unclustered candidates with an SM to themselves and streaming activation
tiles, in both passes, are also timed letting the next launch in as they start
(``early_dependents_tactics``): which way wins could not be predicted
(docs/performance.md, v21, v22).

The tactics the current tables hold for a cell (``incumbents``) are timed
next to the new candidates, with the free table's for the next larger batch:
candidate lists change with the cost model, and a re-tune of the free table
must not lose a tactic that already won (it keeps the one it holds unless a
challenger beats it by more than REPLACE_MARGIN: near-ties flip between runs); split incumbents are also timed in
fewer stages that give their partials a buffer (``buffered_partials_tactics``). (The
batch-invariant table keeps an incumbent only if this run fixes the same
summation order.)
"""

import datetime
import json
import math
import time
from dataclasses import astuple, dataclass
from pathlib import Path

import cutlass
import torch
from tqdm import tqdm

from .checks import Reference
from .clocks import ClockLog
from .candidates import buffered_partials_tactics, candidate_tactics, early_dependents_tactics
from .gpu import gpu_spec
from .policies import COMPUTE_BOUND_ROWS, activation_rows_for
from .projection import PreparedProjection
from .runtime import architecture
from .tactic import SplitKTactic
from .tables import TableKey, dtype_name, key_of, table_policies, write_table
from .timing import cold_copies, foreign_kernel, interleaved_time_us
from .warmup import compile_all

# Issue 5's allowance: a batch-invariant cell may run this much over the free table at M <= 64.
INVARIANT_EXCESS = 1.10
# Candidates timed per cell for each order that won a streaming batch but was not timed at every batch.
ORDER_PROBE_CANDIDATES = 2
TIMING_ROUNDS = 7  # median of this many replays per candidate and context
# A re-tune replaces the free table's tactic for a cell only if a challenger's mean beats it by more than this
# share: near-ties flip from run to run (v39: on 3584 x 7168 at M = 1, 3, 4 the re-tune's new pick won by
# 0.4-1.0% and lost a same-process probe by 0.4-1.2%, 0.35-0.45 us slower back to back), and a flip ships a
# tactic that no benchmark has seen.
REPLACE_MARGIN = 0.015


@dataclass(frozen=True)
class Timed:
    """One candidate's median microseconds back to back and after a foreign kernel."""

    tactic: SplitKTactic
    chained_us: float
    alone_us: float

    @property
    def score(self) -> float:
        """What the tuner minimizes: the mean of the two launch contexts."""
        return (self.chained_us + self.alone_us) / 2


class ShapeTimer:
    """Cold-L2 weight copies of one shape and the means to time candidates on them."""

    def __init__(self, n, k, *, weight_dtype, output_dtype):
        self.n, self.k, self.output_dtype = n, k, output_dtype
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.copies = cold_copies(n * k * 2, self.device)
        self.glue = foreign_kernel(self.device)
        self.weight_dtype = weight_dtype
        self.weights = [torch.randn(n, k, device=self.device).to(weight_dtype) for _ in range(self.copies)]

    def time(self, batch, tactics, progress) -> list[Timed]:
        """Check each tactic against float64, then time them all interleaved in both launch contexts."""
        # Interleaved as the benchmark times them, so that drift and what ran before fall on every candidate
        # alike (one after the other, a launch's time moved by up to 12% with what preceded it).
        x = torch.randn(batch, self.k, device=self.device).to(self.weight_dtype)
        outs = [torch.empty(batch, self.n, device=self.device, dtype=self.output_dtype) for _ in range(self.copies)]
        reference = Reference(x, self.weights[0], self.output_dtype)
        launches = {}
        for tactic in tactics:
            projections = [
                PreparedProjection(w, {batch: tactic}, output_dtype=self.output_dtype).prepare() for w in self.weights
            ]
            outs[0].fill_(float("nan"))
            projections[0].run(x, outs[0])
            reference.check(outs[0], label=f"{self.n}x{self.k} M={batch} {tactic}")
            launches[tactic] = lambda i, projections=projections: projections[i].run(x, outs[i])
        chained = interleaved_time_us(launches, self.copies, repeats=TIMING_ROUNDS)
        alone = interleaved_time_us(launches, self.copies, repeats=TIMING_ROUNDS, separator=self.glue)
        progress.update(len(tactics))
        return [Timed(tactic, chained[tactic], alone[tactic]) for tactic in tactics]


class UnusableOrder(ValueError):
    """A summation order given with ``pinned_orders`` that no tactic of some tuned cell sums in."""


def invariant_pick(found: list[Timed], order: tuple, batch: int) -> Timed | None:
    """What a batch-invariant table summing in ``order`` ships for a cell: the best score among the
    order's tactics that stay within INVARIANT_EXCESS of the cell's best back to back at a streaming
    batch (the allowance is judged as the benchmark reads it), else among all of them."""
    own = [t for t in found if not t.tactic.weight_as_b and t.tactic.summation_order == order]
    if own and activation_rows_for(batch) < COMPUTE_BOUND_ROWS:
        allowed = INVARIANT_EXCESS * min(found, key=lambda t: t.score).chained_us
        own = [t for t in own if t.chained_us <= allowed] or own
    return min(own, key=lambda t: t.score, default=None)


def shared_order(timed_by_batch: dict[int, list[Timed]]) -> tuple:
    """The summation order for every batch of a shape, among the orders timed at every batch."""
    # Orders that keep each streaming batch (M <= 64) within INVARIANT_EXCESS of the free table back to back, as
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
        excess = max((best[b, order].chained_us / free[b].chained_us for b in streaming), default=1.0)
        cost = sum(math.log(best[b, order].score / free[b].score) for b in batches)
        return (max(excess, INVARIANT_EXCESS), cost, order != first_winner)

    return min(everywhere, key=rank)


def incumbent_tactics(tables, n, k, batch, gpu, *, weight_dtype, output_dtype) -> list[SplitKTactic]:
    """The tactics ``tables`` hold for this cell (free table first, then batch-invariant), then the free
    table's for the next larger batch whose activation tile covers this one (the rows past the batch read
    zeros): in the v15 benchmark the next batch's tactic ran this batch faster than this batch's own in 21 cells.
    Weight as A only, as measured there; weight-as-B tactics have a candidate group of their own."""
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
        "us": round(winner.score, 3),  # mean of back to back and after glue
    }


class Tuner:
    """One tuning run: every candidate timed so far, and the tables and timings written from them."""

    def __init__(self, shapes, batches, *, weight_dtype, output_dtype, out_path, invariant_out_path, timings_path,
                 kept_entries, incumbents=None):
        self.shapes, self.batches = shapes, batches
        self.gpu = gpu_spec(torch.cuda.current_device(), measure_clusters=True)
        self.arch = architecture(torch.device("cuda", torch.cuda.current_device()))
        self.kinds = dict(weight_dtype=weight_dtype, output_dtype=output_dtype)
        self.out_path, self.invariant_out_path, self.timings_path = out_path, invariant_out_path, timings_path
        self.kept_entries = kept_entries
        self.timed = {}  # (n, k, batch): every candidate timed there, in every pass
        self.orders = {}  # (n, k): the batch-invariant table's summation order
        self.settled = set()  # shapes whose chosen order's candidates are timed
        self.clocks = {}  # (n, k): what the GPU ran at while each pass timed the shape
        self.incumbents = incumbents or {}

    def held(self, cell) -> SplitKTactic | None:
        """The free table's current tactic for ``cell``, if the incumbent tables hold one."""
        n, k, batch = cell
        key = TableKey(self.gpu.name, self.gpu.sm_count, n, k, dtype_name(self.kinds["weight_dtype"]),
                       dtype_name(self.kinds["output_dtype"]), False)
        return self.incumbents.get(key, {}).get(batch)

    def fastest(self, cell) -> Timed:
        """The best mean of the two launch contexts at ``cell``."""
        return min(self.timed[cell], key=lambda t: t.score)

    def best(self, cell) -> Timed:
        """The free table's pick: the fastest, unless the tactic the table holds comes within REPLACE_MARGIN."""
        fastest, tactic = self.fastest(cell), self.held(cell)
        held = next((t for t in self.timed[cell] if t.tactic == tactic), None)
        if held is not None and held.score <= fastest.score * (1 + REPLACE_MARGIN):
            return held
        return fastest

    def run_pass(self, candidates, description, done=None):
        """Time ``candidates`` ({(n, k, batch): [tactic]}) shape by shape, writing everything after each."""
        # Every candidate compiled up front, in parallel, so timing never waits on the compiler. One that does not
        # compile is left out with a warning (a wrong result still stops the tune: ShapeTimer checks each one).
        failed = {}
        compile_all(((t, self.kinds["output_dtype"], self.arch, self.kinds["weight_dtype"])
                     for found in candidates.values() for t in found), failed=failed)
        for job, error in failed.items():
            print(f"warning: {job[0]} does not compile, left out of the tune: {type(error).__name__}: {error}")
        broken = {job[0] for job in failed}
        candidates = {cell: [t for t in found if t not in broken] for cell, found in candidates.items()}
        with tqdm(total=sum(map(len, candidates.values())), desc=description, unit="tactic") as progress:
            for n, k in self.shapes:
                # The invariant pass may find every candidate of the chosen order timed already at a cell.
                batches = [b for b in self.batches if candidates[n, k, b]]
                if not batches:
                    if done is not None:
                        done.add((n, k))
                    continue
                timer = ShapeTimer(n, k, **self.kinds)
                # Sampled per shape: a long tune heats the GPU, and a clock drop shows up here.
                with ClockLog(torch.cuda.current_device()) as log:
                    for b in batches:
                        self.timed.setdefault((n, k, b), []).extend(timer.time(b, candidates[n, k, b], progress))
                self.clocks.setdefault((n, k), []).append(log.summary())
                del timer  # frees this shape's weight copies before the next shape allocates its own
                if done is not None:
                    done.add((n, k))
                self.write()

    def write(self):
        """Write the tables and timings measured so far; ``(entries, invariant entries)``."""
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
        if self.invariant_out_path is not None and invariant:
            write_table(self.invariant_out_path, invariant, **stamp)
        if self.timings_path is not None:
            rows = [{"n": n, "k": k, "batch": b,
                     "timed": [[list(astuple(t.tactic)), round(t.chained_us, 3), round(t.alone_us, 3)]
                               for t in found],
                     "clocks": self.clocks.get((n, k), [])}
                    for (n, k, b), found in self.timed.items()]
            Path(self.timings_path).write_text(json.dumps(rows, indent=0) + "\n")
        return entries, invariant

    def report_clocks(self):
        """Print the lowest SM clock any shape was timed at, and the highest power drawn."""
        sampled = [(summary, shape) for shape, passes in self.clocks.items() for summary in passes
                   if summary.get("samples")]
        if sampled:
            slowest, (n, k) = min(sampled, key=lambda found: found[0]["sm_mhz_median"])
            print(f"lowest median SM clock while timing a shape: {slowest['sm_mhz_median']:.0f} MHz ({n}x{k}); "
                  f"up to {max(summary['power_w_max'] for summary, _ in sampled):.0f} W")


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


def tune(shapes, batches, *, weight_dtype=torch.bfloat16, output_dtype=torch.bfloat16, limit=8,
         invariant_limit=None, out_path=None, invariant_out_path=None, timings_path=None, incumbents=None,
         kept_entries=(), pinned_orders=None):
    """Tune every (shape, batch): ``(entries, invariant entries)``, the latter where ``invariant_limit`` is set."""
    # Tables and every candidate's times (with the GPU's clocks while each shape was timed) are written as JSON
    # where a path is given, after every shape, so an interrupted run keeps what it measured. ``incumbents``
    # (tables as ``load_table`` returns them) add their tactics for each cell to its candidates. ``kept_entries``
    # (a table's entries) are written to ``out_path`` too, except the cells this run tunes. ``pinned_orders``
    # ({(n, k): (split, k boxes)}) replace the invariant table's choice of order for those shapes.
    if pinned_orders and invariant_limit is None:
        raise ValueError("pinned orders are the batch-invariant table's: set invariant_limit")
    started = time.perf_counter()
    batches = sorted(batches)
    tuner = Tuner(shapes, batches, weight_dtype=weight_dtype, output_dtype=output_dtype, out_path=out_path,
                  invariant_out_path=invariant_out_path, timings_path=timings_path, kept_entries=kept_entries,
                  incumbents=incumbents)
    gpu = tuner.gpu
    pinned_orders = dict(pinned_orders or {})
    for (n, k), order in pinned_orders.items():
        for b in batches:  # before any timing: a pinned order must have a tactic at every batch
            try:
                candidate_tactics(n, k, b, gpu, limit=1, order=order)
            except ValueError as error:
                raise UnusableOrder(str(error)) from None
    print(f"clusters of 1..{len(gpu.cluster_slots)} CTAs at once, one CTA per SM: {gpu.cluster_slots}")
    cells = [(n, k, b) for n, k in shapes for b in batches]

    tuner.run_pass({(n, k, b): free_candidates(n, k, b, gpu, limit=limit, incumbents=incumbents, kinds=tuner.kinds)
                    for n, k, b in cells}, "tune")
    untimed = [f"{n}x{k} M={b}" for n, k, b in cells if not tuner.timed.get((n, k, b))]
    if untimed:
        raise RuntimeError(f"no candidate compiled for {', '.join(untimed)}: nothing to choose from there")
    if invariant_limit is not None:
        # An order can only be shared if it was timed at every batch: give each order that won a streaming batch
        # a chance where the free candidates did not time it (6288 x 7168's 48-row orders won every batch up to
        # 64, were never timed at 96 and up, and the order chosen instead lost there; docs/performance.md, v23).
        # A pinned order needs no choosing.
        streaming = [b for b in batches if activation_rows_for(b) < COMPUTE_BOUND_ROWS]
        winning = {(n, k): set() if (n, k) in pinned_orders else
                   {t.summation_order for t in (tuner.fastest((n, k, b)).tactic for b in streaming)
                    if not t.weight_as_b}
                   for n, k in shapes}
        tuner.run_pass({(n, k, b): order_candidates(n, k, b, gpu, timed=tuner.timed[n, k, b], winning=winning[n, k])
                        for n, k, b in cells}, "tune orders")
        tuner.orders.update({
            (n, k): pinned_orders.get((n, k)) or shared_order({b: tuner.timed[n, k, b] for b in batches})
            for n, k in shapes
        })
        tuner.run_pass({(n, k, b): chosen_order_candidates(n, k, b, gpu, order=tuner.orders[n, k],
                                                           limit=invariant_limit, timed=tuner.timed[n, k, b])
                        for n, k, b in cells}, "tune batch-invariant", done=tuner.settled)
    entries, invariant = tuner.write()
    print(f"tuned {len(shapes)} shapes x {len(batches)} batches in {time.perf_counter() - started:.0f} s")
    tuner.report_clocks()
    return entries, invariant
