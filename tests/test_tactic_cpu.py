"""CPU tests of tactics as data: keyword fields, field-name dicts and labels."""

import pytest

from decode_projection.tactic import SplitKTactic, as_tactic, stored_tactic
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
    assert SplitKTactic.from_label("(64,8,2,4)") == SplitKTactic.from_label("64,8,2,4,1,1,1") == SplitKTactic(64, 8, 2, 4)
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
