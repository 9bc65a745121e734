"""The compute-sanitizer cases (scripts/sanitize_cases.py) without a GPU: every case valid, every kernel feature
covered, every case compiled for sm_90a; and the kernel-source hash that tells scripts/gpu-check when to run them
(scripts/kernel_hash.py)."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

from decode_projection.runtime.sass import kernel_report
from decode_projection.kernel.tactic import SplitKTactic
from tests.test_scripts_cpu import SCRIPTS, load_script

cases = load_script("sanitize_cases")
kernel_hash = load_script("kernel_hash")
ROOT = SCRIPTS.parent

# What issue 43 asks the sanitizer to see, each a key of FEATURES or GLUE_FEATURES: every feature added to the
# kernel since the last sanitizer logs, and the glue kernels.
REQUIRED = [
    "K folded, fold 2", "K folded, fold 4",
    "split-K partials in a buffer of their own", "split-K partials in the drained stages",
    "own partials kept in registers", "own partials sent (three or more warpgroups)",
    "weight as B multicast to 2 activation tiles", "weight as B multicast to 3 activation tiles",
    "dependents let in at the start", "dependents let in once the weights stream",
    "padded weight tiles, direct stores", "padded weight tiles, staged", "padded weight tiles, split-K reduction",
    "staged output, 16-byte stores", "staged output, element stores",
    "FP32 output, direct stores", "FP32 output, split-K reduction", "FP32 output, folded",
    "FP16 weights, staged", "FP16 weights, split-K reduction",
    "last activation tile moved back", "a split rank with no K tiles",
    "PDL copy (glue.py), a partial last CTA", "rms_norm, fewer vectors than threads", "fused_add_rms_norm",
    "silu_and_mul, several CTAs a row, the last partial",
]
ALL_CASES = cases.CASES + cases.GLUE_CASES


def case_id(case):
    return case.label.replace(" ", "-")


def test_the_required_features_are_listed():
    assert set(REQUIRED) <= set(cases.FEATURES) | set(cases.GLUE_FEATURES)


@pytest.mark.parametrize("name", list(cases.FEATURES))
def test_every_kernel_feature_has_a_case(name):
    assert [case for case in cases.CASES if cases.FEATURES[name](case)], f"no sanitizer case has {name!r}"


@pytest.mark.parametrize("name", list(cases.GLUE_FEATURES))
def test_every_glue_feature_has_a_case(name):
    assert [case for case in cases.GLUE_CASES if cases.GLUE_FEATURES[name](case)], f"no glue case has {name!r}"


@pytest.mark.parametrize("case", cases.CASES, ids=case_id)
def test_every_projection_case_is_valid_and_small(case):
    tactic = case.tactic
    assert isinstance(tactic, SplitKTactic) and tactic.problems() == []
    assert case.k % 8 == 0 and case.n > 0 and case.batch > 0, "the projection takes K % 8 == 0"
    assert case.weight_dtype in (torch.bfloat16, torch.float16)
    assert case.output_dtype in (torch.bfloat16, torch.float16, torch.float32)
    assert case.bias_dtype in (None, torch.bfloat16, torch.float16, torch.float32)
    assert case.residual in ("none", "in place", "apart")
    # Small: a sanitizer runs kernels 10-100x slower.
    assert case.weight_rows * case.k <= 1 << 20 and case.batch <= 256
    assert tactic.grid_columns(case.weight_rows) * tactic.grid_rows(case.batch) <= 256, "a grid of at most 256 CTAs"


def test_cases_are_distinct():
    assert len(set(cases.CASES)) == len(cases.CASES) and len(set(cases.GLUE_CASES)) == len(cases.GLUE_CASES)


def test_the_features_follow_the_kernel():
    """A few features checked against the tactic properties and kernel rules that make them."""
    fp32, fp16, bf16 = torch.float32, torch.float16, torch.bfloat16
    Case = cases.Case
    # FP32 outputs are never staged (16-bit only); folded tiles take their own epilogue before staging.
    assert Case(SplitKTactic(64, 64, 1, 4), 328, 1000, 60).epilogue == "staged"
    assert Case(SplitKTactic(64, 64, 1, 4), 328, 1000, 60, bf16, fp32).epilogue == "direct"
    assert Case(SplitKTactic(64, 16, 1, 4), 328, 1000, 16).epilogue == "direct"  # fewer than 32 activation rows
    assert Case(SplitKTactic(24, 64, 1, 4, fold=2), 328, 1000, 60).epilogue == "folded"
    assert Case(SplitKTactic(64, 64, 2, 4), 328, 1000, 60, fp16).epilogue == "reduction"
    # 16-byte staged stores need an output pitch of whole 16 bytes, or a single row.
    assert Case(SplitKTactic(64, 64, 1, 4), 328, 1000, 60).vector_stores
    assert not Case(SplitKTactic(64, 64, 1, 4), 301, 1000, 60).vector_stores
    assert Case(SplitKTactic(64, 64, 1, 4), 301, 1000, 1).vector_stores
    # The last activation tile moves back where the batch covers a tile and is not a whole number of tiles.
    assert Case(SplitKTactic(64, 32, 2, 4), 200, 1000, 77).moved_back
    assert not Case(SplitKTactic(64, 32, 2, 4), 200, 1000, 64).moved_back
    assert not Case(SplitKTactic(64, 32, 2, 4), 200, 1000, 20).moved_back
    # 3 K tiles over 4 ranks leave the last with none.
    assert Case(SplitKTactic(64, 32, 4, 3), 200, 136, 20).empty_rank
    assert not Case(SplitKTactic(64, 32, 4, 3), 200, 1000, 20).empty_rank
    # Weight-as-A tiles are padded to whole warpgroups; weight-as-B and folded tiles are not.
    assert Case(SplitKTactic(56, 8, 1, 6), 300, 1000, 3).padded
    assert not Case(SplitKTactic(56, 64, 1, 4, weight_as_b=True), 300, 1000, 3).padded
    assert not Case(SplitKTactic(27, 8, 1, 5, fold=2), 300, 1000, 3).padded
    features = cases.case_features(Case(SplitKTactic(192, 8, 2, 4), 400, 1544, 6))
    assert "own partials sent, buffer of their own" in features and "three consumer warpgroups" in features


def test_selectors_pick_cases_by_index_kind_and_op():
    assert cases.select([]) == ALL_CASES
    assert cases.select(["projections"]) == cases.CASES
    assert cases.select(["glue"]) == cases.GLUE_CASES
    assert cases.select(["split"]) == [case for case in cases.CASES if case.tactic.split > 1]
    assert cases.select(["3", "0", "3"]) == [cases.CASES[3], cases.CASES[0]]
    assert [case.op for case in cases.select(["rms_norm"])] == ["rms_norm"] * 3
    assert cases.select(["chain", "1"]) == [cases.GLUE_CASES[-1], cases.CASES[1]]
    for wrong in (str(len(cases.CASES)), "-1", "splits"):
        with pytest.raises(SystemExit):
            cases.select([wrong])


def test_the_first_cases_keep_their_indices():
    """Earlier sanitizer records and ab-check runs name cases by index: new cases go at the end."""
    assert cases.CASES[0] == cases.Case(SplitKTactic(64, 8, 1, 4), 200, 1000, 5)
    assert cases.CASES[30] == cases.Case(SplitKTactic(64, 32, 2, 4), 200, 1000, 77)
    assert cases.CASES[35] == cases.Case(
        SplitKTactic(48, 64, 3, 6, k_boxes=2, multicast=2, weight_as_b=True), 136, 1544, 100)


def test_list_prints_every_case_with_its_features():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this tree's package, as scripts/gpu-check runs it
    listed = subprocess.run([sys.executable, str(SCRIPTS / "sanitize_cases.py"), "--list"], capture_output=True,
                            text=True, check=True, cwd=ROOT, env=env).stdout.splitlines()
    assert len(listed) == len(ALL_CASES)
    assert listed[0].startswith(cases.CASES[0].label + ": ")
    assert "glue and projections chained under PDL" in listed[-1]


@pytest.mark.slow
@pytest.mark.parametrize("case", ALL_CASES, ids=case_id)
def test_every_case_compiles_for_sm_90a(case):
    for compiled in cases.compile_case(case, "sm_90a"):
        report = kernel_report(compiled)
        assert report.arch == "sm_90a" and report.spills == 0 and report.local_bytes == 0, case.label
        if isinstance(case, cases.Case):
            assert report.hgmma > 0 and report.utmaldg > 0, case.label
            assert not report.wgmma_serialized, f"{case.label}: ptxas serialized the wgmmas (C7514)"


def copy_sources(root):
    for source in kernel_hash.SOURCES:
        (root / source).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / source, root / source)


def test_the_kernel_hash_changes_with_each_source_and_only_with_them(tmp_path):
    copy_sources(tmp_path)
    before = kernel_hash.kernel_hash(tmp_path)
    assert before == kernel_hash.kernel_hash(ROOT) and len(before) == 64
    # Anything else in the tree leaves it alone.
    (tmp_path / "README.md").write_text("changed")
    assert kernel_hash.kernel_hash(tmp_path) == before
    for source in ("decode_projection/kernel/splitk.py", "decode_projection/kernel/tactic.py",
                   "decode_projection/kernel/norm.py", "scripts/sanitize_cases.py"):
        path = tmp_path / source
        text = path.read_text()
        path.write_text(text + "\n# changed\n")
        assert kernel_hash.kernel_hash(tmp_path) != before, source
        path.write_text(text)
        assert kernel_hash.kernel_hash(tmp_path) == before, source
    # A source moved from one file to another is a change too.
    splitk, tactic = tmp_path / "decode_projection/kernel/splitk.py", tmp_path / "decode_projection/kernel/tactic.py"
    splitk_text, tactic_text = splitk.read_text(), tactic.read_text()
    splitk.write_text(splitk_text + tactic_text)
    tactic.write_text("")
    assert kernel_hash.kernel_hash(tmp_path) != before
    (tmp_path / "decode_projection/measure/glue.py").unlink()
    with pytest.raises(FileNotFoundError):
        kernel_hash.kernel_hash(tmp_path)


def test_the_record_says_whether_the_sources_changed_since_the_clean_run(tmp_path):
    copy_sources(tmp_path)
    record = tmp_path / "sanitizer-clean.txt"
    script = [sys.executable, str(SCRIPTS / "kernel_hash.py"), "--root", str(tmp_path)]

    def check():
        return subprocess.run(script + ["--check", str(record)], capture_output=True, text=True)

    assert check().returncode == 1  # no record yet
    record.write_text("# no clean run recorded\nhash: none\n")
    assert check().returncode == 1
    written = subprocess.run(script + ["--record", str(record), "--card", "NVIDIA H100 80GB HBM3",
                                       "--tools", "memcheck racecheck synccheck initcheck",
                                       "--summary", "memcheck: ERROR SUMMARY: 0 errors"],
                             capture_output=True, text=True, check=True)
    assert written.returncode == 0
    text = record.read_text()
    assert f"hash: {kernel_hash.kernel_hash(tmp_path)}" in text and "card: NVIDIA H100 80GB HBM3" in text
    assert "memcheck: ERROR SUMMARY: 0 errors" in text and "tools: memcheck racecheck synccheck initcheck" in text
    assert check().returncode == 0
    assert kernel_hash.recorded_hash(record) == kernel_hash.kernel_hash(tmp_path)
    splitk = tmp_path / "decode_projection/kernel/splitk.py"
    splitk.write_text(splitk.read_text() + "\n")
    changed = check()
    assert changed.returncode == 1 and "changed" in changed.stdout


def test_the_shipped_record_parses():
    record = ROOT / "docs/measurements/sanitizer-clean.txt"
    recorded = kernel_hash.recorded_hash(record)
    assert recorded == "none" or len(recorded) == 64
