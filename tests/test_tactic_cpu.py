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
