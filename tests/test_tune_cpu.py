"""CPU tests of the tuner's bookkeeping: a fake timer stands in for the GPU."""

import contextlib
import dataclasses
import json
import logging
import math

import pytest
import torch

from decode_projection.kernel.tactic import SplitKTactic, stored_tactic
from decode_projection.policy.policies import predicted_time_us
from decode_projection.policy.tables import TableKey, load_table, read_entries
from decode_projection.runtime.gpu import H200
from decode_projection.tuning import tune as tuning


def timed(tactic, chain, glue=None):
    """A candidate timed back to back and after a plain glue kernel (``glue``: as back to back)."""
    return tuning.Timed(tactic, {"chain": chain, "glue": chain if glue is None else glue})


class FakeTimer:
    """Times from the cost model, slower after glue for deep split-1 grids (as measured)."""

    shapes = []  # every shape a timer was made for, in order

    def __init__(self, n, k, *, contexts, **_):
        self.n, self.k, self.contexts = n, k, contexts
        FakeTimer.shapes.append((n, k))

    def time(self, batch, tactics, progress):
        assert tactics, "the GPU timer interleaves at least one tactic"
        found = []
        for t in tactics:
            chained = predicted_time_us(self.n, self.k, batch, t)
            slower = {"chain": 1.0, "pdl-glue": 1.1 if t.split == 1 else 1.0, "glue": 1.3 if t.split == 1 else 1.0}
            found.append(tuning.Timed(t, {context: chained * slower[context] for context in self.contexts}))
            progress.update()
        return found


class FakeClockLog:
    """A clock log that always read one sample at full clock."""

    def __init__(self, index):
        self.index = index

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def summary(self):
        return {"samples": 1, "sm_mhz_median": 1980.0, "power_w_max": 650.0}


@pytest.fixture
def fake_gpu(monkeypatch):
    """The tuner with FakeTimer, no compiling, and an H200 as the current device."""
    monkeypatch.setattr(tuning, "ShapeTimer", FakeTimer)
    monkeypatch.setattr(FakeTimer, "shapes", [])
    monkeypatch.setattr(tuning, "compile_all", lambda jobs, failed, processes: len(list(jobs)))
    monkeypatch.setattr(tuning, "compiling_processes", contextlib.nullcontext)
    monkeypatch.setattr(tuning, "architecture", lambda device: "sm_90a")
    monkeypatch.setattr(tuning, "gpu_spec", lambda device=None, **measure: H200)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(tuning, "ClockLog", FakeClockLog)


def test_one_pass_writes_both_tables_and_every_timing(fake_gpu, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="decode_projection")
    shapes, batches = [(2112, 7168), (7168, 1536)], [1, 16, 64, 256]
    paths = {name: tmp_path / f"{name}.json" for name in ("free", "invariant", "timings")}
    entries, invariant = tuning.tune(shapes, batches, limit=6, invariant_limit=4, out_path=paths["free"],
                                     invariant_out_path=paths["invariant"], timings_path=paths["timings"])
    assert len(entries) == len(invariant) == len(shapes) * len(batches)
    free_table, invariant_table = load_table(paths["free"]), load_table(paths["invariant"])
    assert len(free_table) == len(invariant_table) == len(shapes)
    for tactics in invariant_table.values():
        assert len({t.summation_order for t in tactics.values()}) == 1
    free_us = {(e["n"], e["k"], e["batch"]): e["us"] for e in entries}
    assert all(free_us[e["n"], e["k"], e["batch"]] <= e["us"] for e in invariant)
    timings = json.loads(paths["timings"].read_text())
    assert {(row["n"], row["k"], row["batch"]) for row in timings} == set(free_us)
    # Every cell says what the GPU ran at while each of the two passes timed its shape.
    # (A third where the order pass timed the shape too.)
    assert all(row["clocks"] in ([FakeClockLog(0).summary()] * 2, [FakeClockLog(0).summary()] * 3) for row in timings)
    assert "lowest median SM clock while timing a shape: 1980 MHz" in caplog.text
    # Each cell's winner has the best geometric mean of its times in the three launch contexts.
    assert all(row["contexts"] == ["chain", "pdl-glue", "glue"] for row in timings)
    for row in timings:
        best = min(row["timed"], key=lambda timed: math.prod(timed[1:]))
        assert abs(free_us[row["n"], row["k"], row["batch"]] - math.prod(best[1:]) ** (1 / 3)) < 2e-3


def test_without_an_invariant_limit_only_the_free_table_is_written(fake_gpu, tmp_path):
    entries, invariant = tuning.tune([(1536, 128)], [1, 8], limit=3, out_path=tmp_path / "free.json",
                                     invariant_out_path=tmp_path / "invariant.json")
    assert len(entries) == 2 and invariant == []
    assert (tmp_path / "free.json").exists() and not (tmp_path / "invariant.json").exists()


def test_a_candidate_that_does_not_compile_is_left_out_with_a_warning(fake_gpu, monkeypatch, tmp_path, caplog):
    broken, working = SplitKTactic(64, 8, 1, 12), SplitKTactic(128, 8, 1, 13)
    monkeypatch.setattr(tuning, "candidate_tactics", lambda *args, **kwargs: [broken, working])

    def compile_all(jobs, failed, processes):
        for job in jobs:
            if job[0] == broken:
                failed[job] = RuntimeError("ptxas: out of registers")

    monkeypatch.setattr(tuning, "compile_all", compile_all)
    tuning.tune([(1536, 128)], [1, 8], limit=2, timings_path=tmp_path / "timings.json")
    assert f"{broken} does not compile, left out of the tune: RuntimeError" in caplog.text
    timed = {stored_tactic(t[0]) for row in json.loads((tmp_path / "timings.json").read_text()) for t in row["timed"]}
    assert working in timed and broken not in timed
    # A cell left with nothing to time stops the tune, naming it.
    monkeypatch.setattr(tuning, "candidate_tactics", lambda *args, **kwargs: [broken])
    with pytest.raises(RuntimeError, match="no candidate compiled for 1536x128 M=1, 1536x128 M=8"):
        tuning.tune([(1536, 128)], [1, 8], limit=1)


def test_an_update_replaces_only_the_tuned_cells(fake_gpu, tmp_path):
    path = tmp_path / "free.json"
    tuning.tune([(1536, 128), (3072, 128)], [1, 8], limit=2, out_path=path)
    before = {(e["n"], e["batch"]): e for e in read_entries(path)}
    entries, _ = tuning.tune([(1536, 128)], [8], limit=1, out_path=path, kept_entries=list(before.values()))
    after = {(e["n"], e["batch"]): e for e in read_entries(path)}
    assert set(after) == set(before)
    assert after[1536, 8] == entries[0]
    assert all(after[cell] == before[cell] for cell in after if cell != (1536, 8))


def test_every_order_that_won_a_streaming_batch_is_timed_at_every_batch(fake_gpu, monkeypatch, tmp_path):
    # Free candidates: split 2 at batch 1, split 4 at batch 16. The order pass times each split where the free
    # candidates left it out, so either can be shared; the invariant table holds one order per shape.
    def candidates(n, k, batch, gpu, *, limit, order=None):
        split = order[0] if order else (2 if batch == 1 else 4)
        return [SplitKTactic(64, 8 if batch == 1 else 16, split, 4)]

    monkeypatch.setattr(tuning, "candidate_tactics", candidates)
    _, invariant = tuning.tune([(2112, 7168), (7168, 1536)], [1, 16], limit=1, invariant_limit=1,
                               timings_path=tmp_path / "timings.json", invariant_out_path=tmp_path / "invariant.json")
    rows = json.loads((tmp_path / "timings.json").read_text())
    assert all(sorted(stored_tactic(t[0]).split for t in row["timed"]) == [2, 4] for row in rows)
    assert all(len({stored_tactic(e["tactic"]).split for e in invariant if e["n"] == n}) == 1 for n in (2112, 7168))
    assert len(load_table(tmp_path / "invariant.json")) == 2


def test_an_order_with_no_tactic_at_some_batch_is_not_probed_there(fake_gpu, monkeypatch, tmp_path):
    # Split 2 won batch 1 but has no tactic at batch 16 (as 4-box stages at 256 rows): it cannot be shared.
    def candidates(n, k, batch, gpu, *, limit, order=None):
        if order and order[0] == 2 and batch == 16:
            raise ValueError("no tactic sums in that order")
        split = order[0] if order else (2 if batch == 1 else 4)
        return [SplitKTactic(64, 8 if batch == 1 else 16, split, 4)]

    monkeypatch.setattr(tuning, "candidate_tactics", candidates)
    _, invariant = tuning.tune([(2112, 7168)], [1, 16], limit=1, invariant_limit=1,
                               invariant_out_path=tmp_path / "invariant.json")
    assert {stored_tactic(e["tactic"]).split for e in invariant} == {4}


def test_the_invariant_pass_also_times_early_twins_of_its_pinned_candidates(fake_gpu, monkeypatch, tmp_path):
    # The free candidate shares an SM with another CTA (no twin); the pinned order's candidate has one to itself.
    def candidates(n, k, batch, gpu, *, limit, order=None):
        if order:
            split, k_boxes = order
            return [SplitKTactic(64, 8, split, 12, k_boxes=k_boxes)]
        return [SplitKTactic(64, 32, 1, 4, k_boxes=2)]

    monkeypatch.setattr(tuning, "candidate_tactics", candidates)
    _, invariant = tuning.tune([(7168, 1536)], [1], limit=1, invariant_limit=1,
                               timings_path=tmp_path / "timings.json", invariant_out_path=tmp_path / "invariant.json")
    (row,) = json.loads((tmp_path / "timings.json").read_text())
    assert [stored_tactic(t[0]) for t in row["timed"]] == [
        SplitKTactic(64, 32, 1, 4, k_boxes=2), SplitKTactic(64, 8, 1, 12, k_boxes=2),
        SplitKTactic(64, 8, 1, 12, k_boxes=2, dependents_at_start=True)]
    assert {stored_tactic(e["tactic"]).summation_order for e in invariant} == {(1, 2)}


def test_a_cell_whose_pinned_candidates_were_all_timed_is_not_timed_again(fake_gpu, monkeypatch, tmp_path):
    # The free pass already timed the pinned order's only candidate (and its early twin).
    monkeypatch.setattr(tuning, "candidate_tactics", lambda *args, **kwargs: [SplitKTactic(64, 8, 1, 12, k_boxes=2)])
    _, invariant = tuning.tune([(7168, 1536)], [1, 8], limit=1, invariant_limit=1,
                               timings_path=tmp_path / "timings.json", invariant_out_path=tmp_path / "invariant.json")
    rows = json.loads((tmp_path / "timings.json").read_text())
    assert all(len(row["timed"]) == 2 for row in rows)
    assert len(invariant) == 2


def test_the_current_tables_tactics_are_timed_too(fake_gpu, monkeypatch, tmp_path):
    # The new candidate list misses what the current tables hold; a re-tune must still time it.
    incumbent = SplitKTactic(128, 8, 1, 13)
    invariant_incumbent = SplitKTactic(64, 8, 2, 4)
    monkeypatch.setattr(tuning, "candidate_tactics", lambda *args, **kwargs: [SplitKTactic(64, 8, 8, 3)])
    tables = {}
    for invariant, tactic in ((False, incumbent), (True, invariant_incumbent)):
        key = TableKey(H200.name, H200.sm_count, 1536, 128, "bfloat16", "bfloat16", invariant)
        tables[key] = {1: tactic}
    tuning.tune([(1536, 128)], [1, 2], limit=1, timings_path=tmp_path / "timings.json", incumbents=tables)
    rows = json.loads((tmp_path / "timings.json").read_text())
    timed = {row["batch"]: {stored_tactic(t[0]) for t in row["timed"]} for row in rows}
    # The unclustered incumbent is also timed letting the next launch in as it starts.
    early = SplitKTactic(128, 8, 1, 13, dependents_at_start=True)
    assert timed[1] == {SplitKTactic(64, 8, 8, 3), incumbent, invariant_incumbent, early}
    assert timed[2] == {SplitKTactic(64, 8, 8, 3)}  # no table entry for batch 2
    # The free table's tactic for the next larger batch covers this one too: it is timed here.
    larger = SplitKTactic(64, 16, 4, 4)
    tables[TableKey(H200.name, H200.sm_count, 1536, 128, "bfloat16", "bfloat16", False)][16] = larger
    tuning.tune([(1536, 128)], [1, 2], limit=1, timings_path=tmp_path / "timings.json", incumbents=tables)
    rows = json.loads((tmp_path / "timings.json").read_text())
    timed = {row["batch"]: {stored_tactic(t[0]) for t in row["timed"]} for row in rows}
    assert timed[1] == {SplitKTactic(64, 8, 8, 3), incumbent, invariant_incumbent, early, larger}
    assert timed[2] == {SplitKTactic(64, 8, 8, 3), larger}


def test_a_retune_keeps_the_held_tactic_unless_a_challenger_beats_it_by_the_margin(fake_gpu, monkeypatch):
    held, challenger = SplitKTactic(128, 8, 1, 13), SplitKTactic(64, 8, 8, 3)
    monkeypatch.setattr(tuning, "candidate_tactics", lambda *args, **kwargs: [challenger])
    key = TableKey(H200.name, H200.sm_count, 1536, 128, "bfloat16", "bfloat16", False)

    def picks(held_us, challenger_us, incumbents):
        class Timer(FakeTimer):
            def time(self, batch, tactics, progress):
                us = {held: held_us, challenger: challenger_us}
                # Back to back and after glue differ: the margin applies to their geometric mean.
                return [tuning.Timed(t, {context: us.get(t, 99.0) + offset
                                         for context, offset in zip(self.contexts, (-1, 0, 1))}) for t in tactics]

        monkeypatch.setattr(tuning, "ShapeTimer", Timer)
        (entry,), _ = tuning.tune([(1536, 128)], [1], limit=1, incumbents=incumbents)
        return stored_tactic(entry["tactic"])

    holding = {key: {1: held}}
    assert picks(10.1, 10.0, holding) == held  # 1% behind: a near-tie, which flips between runs
    assert picks(10.2, 10.0, holding) == challenger  # 2% behind: replaced
    # Held only by the invariant table, or not held at all: the fastest wins.
    assert picks(10.1, 10.0, {dataclasses.replace(key, batch_invariant=True): {1: held}, key: {1: challenger}}) == challenger
    assert picks(10.1, 10.0, None) == challenger


def test_the_held_tactic_does_not_hide_a_faster_order_from_the_invariant_pass(fake_gpu, monkeypatch, tmp_path):
    # The orders probed at every batch are those of each streaming batch's fastest tactic, held or not.
    held, challenger = SplitKTactic(64, 8, 2, 4), SplitKTactic(64, 8, 8, 3)
    # The challenger is a free candidate at batch 1 only: batch 2 times its order only if the order pass probes it.
    monkeypatch.setattr(tuning, "candidate_tactics", lambda n, k, b, gpu, limit, order=None:
                        [challenger] if order == (8, 1) or (order is None and b == 1) else [held])

    class Timer(FakeTimer):
        def time(self, batch, tactics, progress):
            return [tuning.Timed(t, dict.fromkeys(self.contexts, 10.1 if t == held else 10.0)) for t in tactics]

    monkeypatch.setattr(tuning, "ShapeTimer", Timer)
    key = TableKey(H200.name, H200.sm_count, 1536, 128, "bfloat16", "bfloat16", False)
    tuning.tune([(1536, 128)], [1, 2], limit=1, invariant_limit=1, incumbents={key: {1: held}},
                timings_path=tmp_path / "timings.json")
    rows = json.loads((tmp_path / "timings.json").read_text())
    timed = {row["batch"]: {stored_tactic(t[0]) for t in row["timed"]} for row in rows}
    assert challenger in timed[2]


def test_the_invariant_order_keeps_streaming_batches_within_ten_percent_then_costs_least():
    # Batch 1's winner (4 boxes) is 1% ahead at batch 1 but 3x behind at batch 256: the order
    # chosen for every batch is the one that costs least over all of them.
    def timed_order(split, k_boxes, us, chained=None):
        return timed(SplitKTactic(128, 8, split, 3, k_boxes=k_boxes), us if chained is None else chained, us)

    batch_1 = [timed_order(4, 4, 10.0), timed_order(2, 1, 10.1), timed_order(8, 1, 9.95)]
    batch_256 = [timed_order(4, 4, 60.0), timed_order(2, 1, 20.0)]
    assert tuning.shared_order({1: batch_1, 256: batch_256}) == (2, 1)  # (8, 1) was not timed at batch 256
    # With no order timed at every batch, batch 1's winner decides.
    assert tuning.shared_order({1: batch_1, 256: [timed_order(1, 2, 20.0)]}) == (8, 1)
    # A tie goes to batch 1's winner.
    tied = {1: [timed_order(2, 1, 11.0), timed_order(4, 4, 10.0)], 256: [timed_order(4, 4, 22.0), timed_order(2, 1, 20.0)]}
    assert tuning.shared_order(tied) == (4, 4)
    # (2, 1) costs less over both batches, but runs 15% over the free pick back to back at batch 16.
    over = {16: [timed_order(4, 4, 10.0, chained=8.0), timed_order(2, 1, 10.2, chained=9.2)],
            256: [timed_order(4, 4, 22.0), timed_order(2, 1, 20.0)]}
    assert tuning.shared_order(over) == (4, 4)
    # The weight as B never becomes the order, even where it is fastest at every batch timed.
    as_b = timed(SplitKTactic(112, 128, 1, 4, weight_as_b=True), 10.0)
    assert tuning.shared_order({128: [as_b, timed_order(2, 1, 12.0)], 256: [as_b, timed_order(2, 1, 20.0)]}) == (2, 1)
    with pytest.raises(ValueError, match="weight as A"):
        tuning.shared_order({128: [as_b], 256: [as_b]})
    # A padded weight tile sums in the order of the whole tile (verified on the GPU), so its order may win.
    padded = timed(SplitKTactic(56, 32, 1, 9, k_boxes=2), 10.0)
    assert padded.tactic.summation_order == (1, 2) and not padded.tactic.weight_as_b
    assert tuning.shared_order({16: [padded, timed_order(2, 1, 12.0)], 32: [padded, timed_order(2, 1, 13.0)]}) == (1, 2)


def test_the_invariant_pick_keeps_a_streaming_batch_within_ten_percent_in_every_context():
    # Two tactics sum in (1, 1): the better score runs 18% over the free pick back to back, the other 4-6%.
    free = timed(SplitKTactic(56, 48, 1, 8, k_boxes=2), 6.6, 8.8)
    over = timed(SplitKTactic(64, 48, 1, 8, k_boxes=1), 7.8, 8.2)
    within = timed(SplitKTactic(128, 48, 1, 10, k_boxes=1), 6.9, 9.3)
    assert over.score < within.score and free.score < over.score
    assert tuning.invariant_pick([free, over, within], (1, 1), 48) == within
    # Within 10% back to back but 12% over after glue: outside the allowance too.
    after_glue = timed(SplitKTactic(128, 48, 1, 10, k_boxes=1), 6.9, 9.9)
    assert tuning.invariant_pick([free, over, after_glue], (1, 1), 48) == over
    # Where no tactic of the order stays within the allowance, the best score; at a compute-bound batch too.
    assert tuning.invariant_pick([free, over], (1, 1), 48) == over
    assert tuning.invariant_pick([free, over, within], (1, 1), 256) == over
    assert tuning.invariant_pick([free], (1, 1), 48) is None
    # An order is judged by what its table would ship: with ``within`` (1, 1) keeps batch 48 inside the
    # allowance, and then costs less than (2, 1); judged by its best score it would have lost to (2, 1).
    as_b = timed(SplitKTactic(112, 128, 1, 4, weight_as_b=True), 6.6, 8.8)
    split = timed(SplitKTactic(128, 48, 2, 10, k_boxes=1), 7.1, 9.9)
    assert tuning.shared_order({48: [as_b, over, within, split], 256: [as_b, over, split]}) == (1, 1)
    assert tuning.shared_order({48: [as_b, over, split], 256: [as_b, over, split]}) == (2, 1)


def test_a_pinned_order_replaces_the_rules_choice(fake_gpu, tmp_path):
    shape, batches = (3072, 7168), [1, 16, 64, 128]
    _, chosen = tuning.tune([shape], batches, limit=4, invariant_limit=3)
    rule = {stored_tactic(e["tactic"]).summation_order for e in chosen}
    pinned = next(order for order in [(2, 1), (4, 1), (1, 2)] if {order} != rule)
    _, invariant = tuning.tune([shape], batches, limit=4, invariant_limit=3, pinned_orders={shape: pinned},
                               invariant_out_path=tmp_path / "invariant.json")
    assert {stored_tactic(e["tactic"]).summation_order for e in invariant} == {pinned}
    assert len(invariant) == len(batches) and len(load_table(tmp_path / "invariant.json")) == 1


def test_a_pinned_order_with_no_tactic_at_some_batch_fails_before_any_timing(fake_gpu, monkeypatch, tmp_path):
    monkeypatch.setattr(tuning, "ShapeTimer", None)  # timing anything would fail
    with pytest.raises(tuning.UnusableOrder, match="1536x128"):  # no cluster holds a split of 9
        tuning.tune([(1536, 128)], [1, 8], limit=2, invariant_limit=2, pinned_orders={(1536, 128): (9, 1)},
                    out_path=tmp_path / "free.json")
    assert not (tmp_path / "free.json").exists()


def test_the_contexts_asked_for_are_the_ones_timed_and_scored(fake_gpu, tmp_path):
    entries, _ = tuning.tune([(1536, 128)], [1, 8], limit=3, timings_path=tmp_path / "timings.json",
                             contexts=["chain", "glue"])
    rows = json.loads((tmp_path / "timings.json").read_text())
    assert all(row["contexts"] == ["chain", "glue"] and all(len(t) == 3 for t in row["timed"]) for row in rows)
    for row, found in zip(rows, entries):
        assert abs(found["us"] - min(math.sqrt(t[1] * t[2]) for t in row["timed"])) < 2e-3


def test_rows_of_timings_files_read_with_their_contexts():
    assert tuning.row_times({"contexts": ["chain", "pdl-glue", "glue"], "timed": [[[64, 8, 1, 4], 1.0, 2.0, 3.0]]}) \
        == [([64, 8, 1, 4], {"chain": 1.0, "pdl-glue": 2.0, "glue": 3.0})]
    # Written before rows named their contexts: back to back, then after glue.
    assert tuning.row_times({"timed": [[[64, 8, 1, 4], 1.0, 2.0]]}) == [([64, 8, 1, 4], {"chain": 1.0, "glue": 2.0})]


def tune_paths(tmp_path):
    return dict(out_path=tmp_path / "free.json", invariant_out_path=tmp_path / "invariant.json",
                timings_path=tmp_path / "timings.json")


def test_a_tune_cut_short_keeps_its_finished_shapes_and_a_resume_tunes_only_the_rest(fake_gpu, monkeypatch, tmp_path):
    shapes, batches = [(1536, 128), (3072, 128), (2304, 1536)], [1, 8, 64]
    paths = tune_paths(tmp_path)

    class CutShort(FakeTimer):
        def __init__(self, n, k, **kinds):
            if (n, k) == shapes[1]:
                raise TimeoutError("the device call's time is up")
            super().__init__(n, k, **kinds)

    monkeypatch.setattr(tuning, "ShapeTimer", CutShort)
    with pytest.raises(TimeoutError):
        tuning.tune(shapes, batches, limit=2, invariant_limit=2, **paths)
    # Each shape went through every pass before the next began: the first is in both tables at every batch.
    assert [set(table) for table in (load_table(paths["out_path"]), load_table(paths["invariant_out_path"]))] == [
        {TableKey(H200.name, H200.sm_count, 1536, 128, "bfloat16", "bfloat16", invariant)} for invariant in (False, True)]
    before = {name: path.read_text() for name, path in paths.items()}
    monkeypatch.setattr(tuning, "ShapeTimer", FakeTimer)
    FakeTimer.shapes.clear()
    entries, invariant = tuning.tune(shapes, batches, limit=2, invariant_limit=2, resume=True, **paths)
    assert FakeTimer.shapes == shapes[1:]  # the finished shape is not timed again
    assert {(e["n"], e["k"]) for e in entries} == {(e["n"], e["k"]) for e in invariant} == set(shapes[1:])
    def first_shape(text):  # the entries (or timings rows) of the first shape in a table (or timings) file
        document = json.loads(text)
        return [e for e in (document["entries"] if isinstance(document, dict) else document) if e["n"] == 1536]

    for name, path in paths.items():  # the finished shape's entries and timings rows, as the cut run wrote them
        assert first_shape(path.read_text()) == first_shape(before[name]) != []
    for table in (load_table(paths["out_path"]), load_table(paths["invariant_out_path"])):
        assert len(table) == 3 and all(set(tactics) == set(batches) for tactics in table.values())
    timings = json.loads(paths["timings_path"].read_text())
    assert sorted((row["n"], row["k"], row["batch"]) for row in timings) == sorted(
        (n, k, b) for n, k in shapes for b in batches)
    # Resumed again, there is nothing left to tune; a shape only the free table holds is tuned again.
    FakeTimer.shapes.clear()
    assert tuning.tune(shapes, batches, limit=2, invariant_limit=2, resume=True, **paths) == ([], [])
    assert FakeTimer.shapes == []
    tuning.tune(shapes, batches, limit=2, invariant_limit=2, resume=True, out_path=paths["out_path"],
                invariant_out_path=tmp_path / "fresh-invariant.json")
    assert FakeTimer.shapes == shapes


def test_a_resume_without_files_is_a_fresh_tune_and_refuses_other_contexts(fake_gpu, tmp_path):
    paths = tune_paths(tmp_path)
    entries, _ = tuning.tune([(1536, 128)], [1, 8], limit=2, resume=True, **paths)
    assert len(entries) == 2 and FakeTimer.shapes == [(1536, 128)]
    with pytest.raises(ValueError, match="contexts"):
        tuning.tune([(1536, 128)], [1, 8], limit=2, resume=True, contexts=["chain"], **paths)
