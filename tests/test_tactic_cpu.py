"""CPU tests of tactics as data: keyword fields, field-name dicts and labels."""

import itertools

import pytest

from decode_projection.kernel.splitk import STAGED_STORE_ROWS, SplitKGemm
from decode_projection.kernel.tactic import (
    ACTIVATION_ROWS, COLUMN_GROUPS, FOLDS, MULTICASTS, WEIGHT_ROWS_AS_A, WEIGHT_ROWS_AS_B, WEIGHT_ROWS_FOLDED,
    SplitKTactic, as_tactic, stored_tactic,
)
from tests.tactic_grid import GRID


def test_fields_after_the_stages_are_given_by_name():
    with pytest.raises(TypeError):
        SplitKTactic(64, 8, 1, 4, 2)
    assert SplitKTactic(64, 8, 1, 4, k_boxes=2).k_boxes == 2


@pytest.mark.parametrize("tactic", GRID, ids=lambda tactic: tactic.label)
def test_a_tactic_round_trips_through_its_field_names_and_its_label(tactic):
    assert SplitKTactic.from_dict(tactic.to_dict()) == tactic
    assert SplitKTactic.from_label(tactic.label) == tactic
    assert SplitKTactic.from_label(tactic.label.strip("()")) == tactic
    assert stored_tactic(tactic.to_dict()) == stored_tactic(list(tactic.to_dict().values())) == tactic


def test_left_out_fields_take_their_defaults():
    assert SplitKTactic.from_dict({"weight_rows": 64, "activation_rows": 8, "split": 2, "stages": 4}) == \
        SplitKTactic(64, 8, 2, 4)
    assert SplitKTactic.from_label("(64,8,2,4)") == SplitKTactic.from_label("64,8,2,4,1,1,1") == \
        SplitKTactic(64, 8, 2, 4)
    assert SplitKTactic.from_label("(28,8,1,5,4,1,1,E,F2)") == SplitKTactic(28, 8, 1, 5, k_boxes=4,
                                                                           dependents_at_start=True, fold=2)
    # The tuples of explicit policies, in field order, and the lists of older tables.
    assert as_tactic((64, 8, 2, 4)) == stored_tactic([64, 8, 2, 4, 1, 1, 1, False, False]) == SplitKTactic(64, 8, 2, 4)


@pytest.mark.parametrize("named", [
    {"weight_rows": 64, "activation_rows": 8, "split": 2},  # no stages
    {"weight_rows": 64, "activation_rows": 8, "split": 2, "stages": 4, "kboxes": 2},  # a misspelt field
])
def test_a_dict_with_unknown_or_missing_fields_is_refused(named):
    with pytest.raises(ValueError, match="unknown fields|lacks"):
        SplitKTactic.from_dict(named)


@pytest.mark.parametrize("label", ["(64,8,1", "64,8,1", "(64,8,1,8,1,1,1,1)", "(64,8,1,8,E,B)", "(64,8,1,8", "x"])
def test_a_malformed_label_is_refused(label):
    with pytest.raises(ValueError, match="not a tactic label"):
        SplitKTactic.from_label(label)


def test_stored_tactics_are_not_checked_but_as_tactic_checks_them():
    stale = {"weight_rows": 64, "activation_rows": 8, "split": 16, "stages": 4}
    assert stored_tactic(stale).split == 16
    with pytest.raises(ValueError, match="split 16"):
        as_tactic(stale)
    with pytest.raises(TypeError):
        stored_tactic("64,8,2,4")


@pytest.mark.parametrize("tactic", [SplitKTactic(64, 8, split, 4, k_boxes=boxes) for split in (1, 2, 3, 5, 8)
                                    for boxes in (1, 4)] + [SplitKTactic(28, 8, 1, 5, k_boxes=4, fold=2),
                                                            SplitKTactic(16, 8, 1, 4, k_boxes=2, fold=4)],
                         ids=lambda tactic: tactic.label)
def test_the_k_slices_cover_every_k_tile_once(tactic):
    for k in range(8, 6000, 104):
        covered = []
        for rank in range(tactic.split):
            first, stages, fold_stride = tactic.k_slice(k, rank)
            segments = range(tactic.fold) if tactic.fold > 1 else [0]
            covered += [first + stage + segment * fold_stride for stage in range(stages) for segment in segments]
        assert sorted(tile for tile in covered if tile < tactic.k_tiles(k)) == list(range(tactic.k_tiles(k))), k
        assert len(covered) == len(set(covered)), k


def test_the_kernels_integer_operations_give_the_host_formulas():
    # The kernel evaluates these formulas with the DSL's operations on its own integers; on Python integers those
    # give what the host computes.
    import cutlass
    import cutlass.cute as cute

    kernel_ops = {"ceil_div": cute.ceil_div, "minimum": cutlass.min, "maximum": cutlass.max}
    for tactic in GRID:
        for k, n, batch in [(8, 1, 1), (1000, 2112, 3), (7168, 7168, 64), (14336, 20480, 256), (136, 9, 300)]:
            assert all(tactic.k_slice(k, rank, **kernel_ops) == tactic.k_slice(k, rank) for rank in range(8))
            assert tactic.grid_columns(n, cute.ceil_div) == tactic.grid_columns(n)
            assert tactic.grid_rows(batch, cute.ceil_div) == tactic.grid_rows(batch)


# One tactic per rule of the validity predicate, each breaking that rule alone.
BROKEN_RULES = {
    "a field of the wrong type": (SplitKTactic(64, 8, 1, 4.0), "stages 4.0 is not int"),
    "a value outside its choices": (SplitKTactic(64, 8, 16, 4), "split 16 not in"),
    "one stage": (SplitKTactic(64, 8, 1, 1), "stages 1 < 2"),
    "a cluster past the portable size": (SplitKTactic(64, 64, 4, 3, multicast=4), "cluster of split 4 x multicast 4"),
    "an early launch of a cluster": (SplitKTactic(64, 8, 2, 4, dependents_at_start=True), "only unclustered"),
    "three activation sharers": (SplitKTactic(64, 48, 1, 4, multicast=3), "three CTAs share only a weight tile"),
    "an activation tile that does not split": (SplitKTactic(64, 8, 1, 4, multicast=2), "8 activation rows do not"),
    "a weight tile that does not split": (SplitKTactic(8, 128, 1, 4, multicast=2, weight_as_b=True),
                                          "8 weight rows do not"),
    "column groups of a narrow activation tile": (SplitKTactic(64, 64, 1, 4, column_groups=2), "column groups split"),
    "a split fold": (SplitKTactic(28, 8, 2, 4, fold=2), "a fold of 2"),
    "reallocated registers of an odd N": (SplitKTactic(136, 256, 1, 3, weight_as_b=True), "do not halve"),
    "four warpgroups of too many accumulators": (SplitKTactic(176, 256, 1, 2, weight_as_b=True),
                                                 "at most 80 accumulators"),
    "too much shared memory": (SplitKTactic(128, 256, 1, 9), "B of shared memory >"),
    "a reduction the drained stages cannot hold": (SplitKTactic(128, 256, 2, 2, weight_as_b=True),
                                                   "split-K reduction needs"),
}


@pytest.mark.parametrize("rule", BROKEN_RULES)
def test_every_rule_of_the_validity_predicate_is_reached(rule):
    tactic, message = BROKEN_RULES[rule]
    (problem,) = tactic.problems()
    assert message in problem


def smallest_unsplit_pipelines():
    """Every valid unsplit tactic of two one-box stages (dependents let in late): an unsplit tactic of the same tile and
    sharing has at least that pipeline, and its stages and boxes break no rule but shared memory's."""
    weight_rows = sorted(set(WEIGHT_ROWS_AS_A) | set(WEIGHT_ROWS_AS_B) | set(WEIGHT_ROWS_FOLDED))
    for rows, acts, multicast, column_groups, weight_as_b, fold in itertools.product(
            weight_rows, ACTIVATION_ROWS, MULTICASTS, COLUMN_GROUPS, (False, True), FOLDS):
        tactic = SplitKTactic(rows, acts, 1, 2, multicast=multicast, column_groups=column_groups,
                              weight_as_b=weight_as_b, fold=fold)
        if tactic.valid:
            yield tactic


def test_the_epilogues_that_reuse_the_drained_stages_fit_in_them():
    # Which is why the validity predicate has no rule for them: the folded partials and the staged output tile
    # (SplitKGemm.store_folded, store_staged) always fit where the other rules hold.
    unsplit = list(smallest_unsplit_pipelines())
    assert sum(tactic.fold > 1 for tactic in unsplit) > 100 and len(unsplit) > 500
    for tactic in unsplit:
        pipeline = tactic.stages * tactic.stage_bytes
        assert tactic.fold_bytes <= pipeline, tactic
        if tactic.activation_rows >= STAGED_STORE_ROWS:
            assert SplitKGemm(tactic).staging_bytes <= pipeline, tactic
