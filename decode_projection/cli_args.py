"""Argument types of the command line, shared by ``__main__`` and the scripts: shapes, batches, contexts, orders."""

import argparse

from .kernel.tactic import K_BOXES
from .policy.workload import DECODE_BATCHES

LARGEST_BATCH = max(DECODE_BATCHES)  # the CLI works on padded decode batches; the API takes any


def shape(text):
    """``"2112x7168"`` -> ``(2112, 7168)``."""
    try:
        n, k = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must look like 2112x7168, got {text!r}") from None
    if n < 1 or k < 1:
        raise argparse.ArgumentTypeError(f"shape extents must be positive, got {text!r}")
    if k % 8 or max(n, k) >= 2**31:  # what PreparedProjection takes (check_weight)
        raise argparse.ArgumentTypeError(f"shape needs K % 8 == 0 and N, K < 2^31, got {text!r}")
    return n, k


SHIPPED_ORDERS = "shipped"  # --invariant-order's value that pins every tuned shape to its shipped order


def pinned_order(text):
    """``"3072x7168=2,1"`` -> ``((3072, 7168), (2, 1))``: a shape and its summation order (split, K boxes);
    ``"shipped"`` is kept as is."""
    if text == SHIPPED_ORDERS:
        return text
    try:
        weight, order = text.split("=")
        split, k_boxes = (int(part) for part in order.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"an order must look like 3072x7168=2,1, got {text!r}") from None
    if split < 1 or k_boxes not in K_BOXES:
        raise argparse.ArgumentTypeError(f"split must be positive and K boxes one of {K_BOXES}, got {text!r}")
    return shape(weight), (split, k_boxes)


def batch_list(text):
    """``"1,2,4"`` -> ``[1, 2, 4]``."""
    try:
        batches = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"batches must look like 1,2,4, got {text!r}") from None
    if not all(1 <= b <= LARGEST_BATCH for b in batches):
        raise argparse.ArgumentTypeError(f"batches must be 1..{LARGEST_BATCH} (padded decode batches), got {text!r}")
    return batches


def context_list(text):
    """``"chain,glue"`` -> ``["chain", "glue"]``: launch contexts, each a name of timing.CONTEXTS, each once."""
    from .measure.timing import CONTEXTS

    contexts = text.split(",")
    if not set(contexts) <= set(CONTEXTS) or len(set(contexts)) < len(contexts):
        raise argparse.ArgumentTypeError(f"contexts must be some of {','.join(CONTEXTS)}, each once, got {text!r}")
    return contexts


def epilogue_list(text):
    """``"residual,bias"`` -> ``["residual", "bias"]``: epilogues of the epilogue benchmark, each once."""
    from .measure.epilogue_bench import EPILOGUES

    epilogues = text.split(",")
    if not set(epilogues) <= set(EPILOGUES) or len(set(epilogues)) < len(epilogues):
        raise argparse.ArgumentTypeError(f"epilogues must be some of {','.join(EPILOGUES)}, each once, got {text!r}")
    return epilogues


def positive_int(text):
    """``"4"`` -> ``4``; zero and negatives are refused."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value
