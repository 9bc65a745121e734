"""One decode step of Hugging Face transformers' DeepseekV3 (the Kimi-K2 family), nn.Linear vs decode_projection.

The model is transformers' own DeepseekV3ForCausalLM, configured as one GPU's
slice of an 8-way tensor-parallel deployment at DeepSeek-V3/Kimi sizes: hidden
7168, q LoRA rank 1536, KV LoRA rank 512, 16 local heads (128 / 8),
intermediate 18432 / 8, vocabulary 16384, 8 dense layers, random BF16 weights.
A StaticCache of 1024 or 4096 tokens is filled with random latents up to 16
tokens before its end, and one decode step (input_ids [batch, 1]) is captured
in a CUDA graph per batch. The same model runs it with its nn.Linear layers
(cuBLAS) and with them swapped by one call,
``decode_projection.swap.swap_linears(model, batches=...)``, whose layers launch
with programmatic dependent launch (PDL), and, with ``--pdl both`` (the
default), with the same layers launched without it. A cell's graphs are
replayed alternately and the median step time of each is printed.

What the swap leaves alone is printed with the reason. This transformers
version keeps the compressed KV latents in the cache and expands the whole
cache through ``kv_b_proj`` every step: that layer sees batch x cache-length
rows (a prefill-sized GEMM), finds no tactic and falls back to F.linear. One
eager step with ``report.record_rows()`` finds such layers and
``report.restore_fallbacks`` hands them back to nn.Linear before timing.

A profile of a few graph replays per cell splits each step's kernel time into
this package's kernels (names containing SplitKGemm), cuBLAS/CUTLASS GEMMs,
attention and the rest; nn.Linear's projection time is its GEMM time less the
GEMMs both steps share (those left to cuBLAS in the swapped step: kv_b_proj's
cache expansion and the rotary embedding's small matmul).

    python examples/deepseek_decode_step.py                      # H100/H200, transformers >= 5
    python examples/deepseek_decode_step.py --json step.json     # also keep the numbers
    python examples/deepseek_decode_step.py --tiny --device cpu  # CPU check of the model plumbing and the swap

A further variant (``--no-glue`` skips it) adds this package's PDL-aware glue
(``decode_projection.ops``) where the model's code lets it in by module: every RMSNorm by
``ops.rms_norm``, and each MLP as one projection of its stacked gate and up weights,
``ops.silu_and_mul`` and its ``down_proj`` (``glue_modules``). The residual adds stay the
model's: ``fused_add_rms_norm`` would need the decoder layer's forward rewritten.
"""

import argparse
import contextlib
import functools
import importlib
import inspect
import json
import statistics
import sys
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

from decode_projection.swap import replace_module, swap_linears

BATCHES = (1, 8, 32, 64)
CACHE_LENS = (1024, 4096)
FREE_SLOTS = 16  # the step writes this many tokens before the end of the cache

# One GPU's slice of DeepSeek-V3 / Kimi-K2 under 8-way tensor parallelism: 128 / 8 heads, 18432 / 8 MLP rows.
FULL = dict(hidden_size=7168, q_lora_rank=1536, kv_lora_rank=512, num_attention_heads=16, num_key_value_heads=16,
            intermediate_size=18432 // 8, vocab_size=16384, qk_nope_head_dim=128, qk_rope_head_dim=64,
            v_head_dim=128, num_hidden_layers=8)
TINY = dict(hidden_size=256, q_lora_rank=64, kv_lora_rank=32, num_attention_heads=2, num_key_value_heads=2,
            intermediate_size=128, vocab_size=512, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
            num_hidden_layers=2)
TINY_BATCHES, TINY_CACHE_LENS = (1, 4), (32, 64)


def load_transformers():
    """transformers' DeepseekV3 classes and StaticCache, or SystemExit saying what is missing."""
    try:
        transformers = importlib.import_module("transformers")
    except ImportError:
        raise SystemExit("this example needs Hugging Face transformers (pip install transformers)") from None
    major = int(transformers.__version__.split(".")[0])
    missing = [name for name in ("DeepseekV3Config", "DeepseekV3ForCausalLM", "StaticCache")
               if not hasattr(transformers, name)]
    if missing or major < 5:
        raise SystemExit(f"transformers {transformers.__version__}: this example drives the DeepseekV3 model and "
                         f"StaticCache of transformers >= 5 (cache layers holding keys, values and a device-side "
                         f"cumulative_length); missing here: {', '.join(missing) or 'that cache layout'}")
    return transformers


def build_config(transformers, sizes, max_cache_len, attention="sdpa"):
    """A DeepseekV3Config of ``sizes`` whose layers are all dense (no MoE), at most ``max_cache_len`` positions."""
    layers = sizes["num_hidden_layers"]
    return transformers.DeepseekV3Config(
        **sizes,
        first_k_dense_replace=layers,  # layer i is MoE from i >= first_k_dense_replace on: none here
        n_routed_experts=8, n_group=1, topk_group=1, num_experts_per_tok=2, moe_intermediate_size=64,  # unused
        max_position_embeddings=max_cache_len, tie_word_embeddings=False, attn_implementation=attention,
    )


def build_model(transformers, config, device, dtype):
    """transformers' DeepseekV3ForCausalLM with random weights, cast to ``dtype`` on ``device``, for inference."""
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.DeepseekV3ForCausalLM(config)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


class DecodeCache:
    """A transformers StaticCache at one batch, filled with random latents up to ``position``; ``reset`` sets
    every layer's write position back to it (the step advances it on the device, in the graph too)."""

    def __init__(self, transformers, config, max_cache_len, batch, device, dtype):
        parameters = inspect.signature(transformers.StaticCache.__init__).parameters
        options = {"config": config, "max_cache_len": max_cache_len}
        # Older signatures took the batch, device and dtype up front; newer ones allocate lazily.
        for name, value in (("max_batch_size", batch), ("batch_size", batch), ("device", device), ("dtype", dtype)):
            if name in parameters:
                options[name] = value
        self.cache = transformers.StaticCache(**options)
        self.position = max_cache_len - FREE_SLOTS
        self.batch, self.device = batch, device

    def fill(self, step):
        """Run ``step`` once (allocating the cache), then fill it with random latents and set the position."""
        step()
        layers = getattr(self.cache, "layers", None)
        needed = ("keys", "values", "cumulative_length")
        if not layers or not all(hasattr(layer, name) for layer in layers for name in needed):
            raise SystemExit(f"StaticCache here has no layers with {', '.join(needed)}: this transformers version "
                             "lays its cache out differently from the one this example drives (>= 5)")
        generator = torch.Generator(device=self.device).manual_seed(1)
        for layer in layers:
            layer.keys.normal_(generator=generator)
            layer.values.normal_(generator=generator)
        self.reset()

    def reset(self):
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(self.position)


class StandIn(nn.Module):
    """A CPU stand-in for ProjectionLinear (``--device cpu``): F.linear, counting calls whose rows have no batch."""

    def __init__(self, linear, batches, **options):
        super().__init__()
        self.weight, self.bias, self.batches = linear.weight, linear.bias, tuple(batches)
        self.fallbacks = Counter()

    @classmethod
    def from_linear(cls, linear, *, batches, **options):
        return cls(linear, batches, **options)

    def forward(self, x):
        if x.numel() // x.shape[-1] not in self.batches:
            self.fallbacks["batch without a tactic"] += 1
        return F.linear(x, self.weight, self.bias)


class GlueRMSNorm(nn.Module):
    """The model's RMSNorm by ``decode_projection.ops.rms_norm`` (one rounding where transformers' rounds twice)."""

    def __init__(self, ops, weight, eps):
        super().__init__()
        self.ops, self.weight, self.eps = ops, weight, eps

    def forward(self, x):
        return self.ops.rms_norm(x, self.weight, self.eps)


class GlueMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))`` as one projection of the stacked gate and up weights, then
    ``decode_projection.ops.silu_and_mul``, then the model's (swapped) ``down_proj``."""

    def __init__(self, ops, gate_up, down_proj):
        super().__init__()
        self.ops, self.gate_up, self.down_proj = ops, gate_up, down_proj

    def forward(self, x):
        return self.down_proj(self.ops.silu_and_mul(self.gate_up(x)))


def glue_modules(model, ops, batches, factory=None):
    """``({name: module}, notes)``: where this package's PDL-aware glue goes in the model without changing its
    code, as modules to put in place of the model's own. Every RMSNorm (input_layernorm, q_a_layernorm,
    kv_a_layernorm, post_attention_layernorm, norm) becomes ``ops.rms_norm``; an MLP of SiLU becomes one
    projection of its stacked gate and up weights (``factory(weight)``, default a ProjectionLinear with PDL),
    ``ops.silu_and_mul`` and its ``down_proj``. The residual adds stay the model's: ``fused_add_rms_norm`` would
    need the decoder layer's forward rewritten."""
    if factory is None:
        from decode_projection.layer import ProjectionLinear

        factory = functools.partial(ProjectionLinear, batches=batches)
    modules, norms, mlps = {}, 0, 0
    for name, module in model.named_modules():
        kind = type(module).__name__
        if kind.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            modules[name] = GlueRMSNorm(ops, module.weight, module.variance_epsilon)
            norms += 1
        elif kind.endswith("MLP") and all(hasattr(module, part) for part in ("gate_proj", "up_proj", "down_proj")):
            if "silu" not in type(getattr(module, "act_fn", None)).__name__.lower():
                continue
            gate_up = factory(torch.cat([module.gate_proj.weight, module.up_proj.weight]))
            if getattr(gate_up, "prepared", True) is None:
                raise SystemExit(f"glue: {name}'s stacked gate/up projection did not prepare: {gate_up.unsupported}")
            modules[name] = GlueMLP(ops, gate_up, module.down_proj)
            mlps += 1
    notes = (f"{norms} RMSNorms by ops.rms_norm; {mlps} MLPs as one gate+up projection, ops.silu_and_mul and "
             f"down_proj; residual adds left to the model (fused_add_rms_norm needs its layer's forward rewritten)")
    return modules, notes


@contextlib.contextmanager
def layers_of(model, modules):
    """Within the block, ``model`` holds ``modules`` ({name: module}) at those names; restored afterwards."""
    before = {name: model.get_submodule(name) for name in modules}
    for name, module in modules.items():
        replace_module(model, name, module)
    try:
        yield model
    finally:
        for name, module in before.items():
            replace_module(model, name, module)


def capture(step, reset):
    """A CUDA graph of ``step`` after two warm-up runs on a side stream (each from the cache's position)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            reset()
            step()
    torch.cuda.current_stream().wait_stream(side)
    reset()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def time_graphs(graphs, reset, replays, warmup=5):
    """Median microseconds per replay of each graph, replayed alternately, the cache position reset untimed."""
    pairs = {name: [] for name in graphs}
    for index in range(warmup + replays):
        for name, graph in graphs.items():
            reset()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            stop.record()
            if index >= warmup:
                pairs[name].append((start, stop))
    torch.cuda.synchronize()
    return {name: statistics.median(a.elapsed_time(b) * 1e3 for a, b in events) for name, events in pairs.items()}


def kernel_category(name):
    """Where a kernel's time goes: this package, another GEMM (cuBLAS/CUTLASS), attention, or the rest."""
    lowered = name.lower()
    if "splitkgemm" in lowered:
        return "decode_projection"
    if "rmsnorm" in lowered or "siluandmul" in lowered:
        return "glue"
    if any(word in lowered for word in ("fmha", "flash", "attention", "attn")):
        return "attention"
    if any(word in lowered for word in ("gemm", "gemv", "nvjet", "cutlass", "xmma", "cublas", "splitkreduce")):
        return "other GEMM"
    return "other"


def profile_graph(graph, reset, replays=5):
    """Kernel microseconds per step by category over ``replays`` profiled replays (empty if none were seen)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    assert replays <= FREE_SLOTS  # each replay writes the next slot: no reset (and its kernels) in the profile
    reset()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    totals = Counter()
    for event in prof.events():
        if (event.device_type == DeviceType.CUDA and not getattr(event, "is_user_annotation", False)
                and not event.name.startswith(("Memset", "Memcpy"))):
            totals[kernel_category(event.name)] += event.device_time_total / replays
    return totals


def cpu_check(transformers, sizes, batches, cache_lens):
    """``--device cpu``: the config, cache and swap plumbing (best with ``--tiny``), with StandIn layers; no timing."""
    config = build_config(transformers, sizes, max(cache_lens))
    model = build_model(transformers, config, "cpu", torch.bfloat16)
    report = swap_linears(model, batches, factory=StandIn.from_linear, device_check=lambda weight: None)
    cache = DecodeCache(transformers, config, cache_lens[0], batches[0], "cpu", torch.bfloat16)
    ids = torch.randint(0, config.vocab_size, (batches[0], 1))
    with torch.no_grad():
        cache.fill(lambda: model(input_ids=ids, past_key_values=cache.cache, use_cache=True))
        with report.record_rows():
            logits = model(input_ids=ids, past_key_values=cache.cache, use_cache=True).logits
    found = report.restore_fallbacks(model)
    print(f"eager step at batch {batches[0]}, cache {cache_lens[0]}: logits {tuple(logits.shape)}; "
          f"handed back to nn.Linear: {len(found)}")
    for name, why in found.items():
        print(f"  {name}: {why}")
    print(report)
    print("CPU check only (StandIn layers, not the kernel): timing needs a Hopper GPU")
    return {"report": report, "fallbacks": found, "logits": logits}


def projection_variants(report, linears, batches, pdl):
    """``{variant: {name: layer}}`` of this package's layers for the names ``report`` swapped: the swap's own
    (with PDL) and/or ProjectionLinear layers of the same weights launched without PDL."""
    from decode_projection.layer import ProjectionLinear

    variants = {}
    if pdl in ("on", "both"):
        variants["ours, PDL"] = dict(report.swapped)
    if pdl in ("off", "both"):
        layers = {name: ProjectionLinear.from_linear(linears[name], batches=batches, programmatic_launch=False)
                  for name in report.swapped}
        unprepared = [name for name, layer in layers.items() if layer.prepared is None]
        if unprepared:
            raise SystemExit(f"without PDL, these layers did not prepare: {unprepared}")
        variants["ours, no PDL"] = layers
    return variants


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=None, help=f"default {BATCHES}")
    parser.add_argument("--cache-lens", type=int, nargs="+", default=None, help=f"default {CACHE_LENS}")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default 8)")
    parser.add_argument("--replays", type=int, default=100, help="timed replays per variant and cell")
    parser.add_argument("--pdl", choices=("on", "off", "both"), default="both",
                        help="this package's layers with programmatic dependent launch, without, or both variants")
    parser.add_argument("--no-profile", action="store_true", help="skip the profile of kernel time by category")
    parser.add_argument("--no-glue", dest="glue", action="store_false",
                        help="skip the variant with this package's PDL-aware glue (decode_projection.ops)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--tiny", action="store_true", help="a tiny model (sizes for a CPU check)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args(argv)

    transformers = load_transformers()
    batches = tuple(args.batches or (TINY_BATCHES if args.tiny else BATCHES))
    cache_lens = tuple(args.cache_lens or (TINY_CACHE_LENS if args.tiny else CACHE_LENS))
    sizes = dict(TINY if args.tiny else FULL)
    if args.layers:
        sizes["num_hidden_layers"] = args.layers
    if args.device == "cpu":
        return cpu_check(transformers, sizes, batches, cache_lens)
    return benchmark(transformers, args, sizes, batches, cache_lens)


def benchmark(transformers, args, sizes, batches, cache_lens, device="cuda"):
    """The timed comparison on a GPU: swap, hand back layers that see no decode batch, capture, replay, profile."""
    dtype = torch.bfloat16
    config = build_config(transformers, sizes, max(cache_lens))
    model = build_model(transformers, config, device, dtype)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    gpu = torch.cuda.get_device_name()
    print(f"{gpu}; transformers {transformers.__version__}, torch {torch.__version__}; DeepseekV3 "
          f"{sizes['num_hidden_layers']} dense layers, hidden {sizes['hidden_size']}, "
          f"{sizes['num_attention_heads']} heads, {weight_bytes / 2**30:.2f} GiB of BF16 weights")

    linears = {name: module for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    report = swap_linears(model, batches)

    # One eager step finds the layers that see more rows than a decode batch; nn.Linear gets them back.
    probe = DecodeCache(transformers, config, cache_lens[0], batches[0], device, dtype)
    ids = torch.randint(0, config.vocab_size, (batches[0], 1), device=device)
    with torch.no_grad():
        probe.fill(lambda: model(input_ids=ids, past_key_values=probe.cache, use_cache=True))
        with report.record_rows():
            model(input_ids=ids, past_key_values=probe.cache, use_cache=True)
    del probe
    found = report.restore_fallbacks(model)
    print(f"after one eager step (batch {batches[0]}, cache {cache_lens[0]}), handed back to nn.Linear "
          f"(their rows are not a decode batch): {len(found)}")
    for name, why in found.items():
        print(f"  {name}: {why}")
    print(report)

    variants = {"nn.Linear": {name: linears[name] for name in report.swapped}}
    variants.update(projection_variants(report, linears, batches, args.pdl))
    if args.glue:
        from decode_projection import ops

        if "ours, PDL" not in variants:
            print("glue: the glue variant builds on this package's layers with PDL (--pdl on or both); skipped")
        else:
            glue, notes = glue_modules(model, ops, batches)
            variants["ours, PDL + glue"] = glue  # in the model as it stands: its projections those with PDL
            print(f"glue: {notes}")
    ours = [name for name in variants if name != "nn.Linear"]

    def fallback_count():
        layers = {id(sub): sub for name in ours for module in variants[name].values() for sub in module.modules()}
        counters = [getattr(layer, "fallbacks", None) for layer in layers.values()]
        return sum(sum(counter.values()) for counter in counters if isinstance(counter, Counter))

    results = []
    print(f"\none decode step, CUDA-graph replay, median us of {args.replays} replays (variants alternating)")
    print(f"{'cache':>5} {'batch':>5} {'nn.Linear':>10} " + " ".join(f"{name:>16} {'speedup':>7}" for name in ours)
          + f" {'fallbacks':>9}")
    for cache_len in cache_lens:
        for batch in batches:
            cache = DecodeCache(transformers, config, cache_len, batch, device, dtype)
            ids = torch.randint(0, config.vocab_size, (batch, 1), device=device)

            def step():
                return model(input_ids=ids, past_key_values=cache.cache, use_cache=True).logits

            with torch.no_grad():
                cache.fill(step)
                before = fallback_count()
                graphs = {}
                for name, modules in variants.items():
                    with layers_of(model, modules):
                        graphs[name] = capture(step, cache.reset)
                fallbacks = fallback_count() - before  # in the warm-up and captured steps of this cell
                times = time_graphs(graphs, cache.reset, args.replays)
                profiles = {} if args.no_profile else {
                    name: profile_graph(graph, cache.reset) for name, graph in graphs.items()}
            base = times["nn.Linear"]
            print(f"{cache_len:>5} {batch:>5} {base:10.1f} "
                  + " ".join(f"{times[name]:16.1f} {base / times[name]:6.3f}x" for name in ours) + f" {fallbacks:>9}")
            results.append({"cache_len": cache_len, "batch": batch, "us": times,
                            "speedup": {name: base / times[name] for name in ours},
                            "fallbacks": fallbacks, "profile_us": {name: dict(p) for name, p in profiles.items()}})
            del graphs, cache
            torch.cuda.empty_cache()

    if not args.no_profile:
        print_profiles(results, ours)
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"gpu": gpu, "transformers": transformers.__version__, "torch": torch.__version__,
                       "sizes": sizes, "batches": batches, "cache_lens": cache_lens, "replays": args.replays,
                       "swapped": sorted(report.swapped), "left_alone": report.left_alone,
                       "results": results}, file, indent=1)
        print(f"wrote {args.json}")
    return results


def print_profiles(results, ours):
    """Per cell and variant: kernel us per step by category, and the projections' share of the step."""
    print("\nprofile of 5 graph replays per cell and variant, kernel us per step. projections: this package's "
          "kernels (SplitKGemm);\nfor nn.Linear, its GEMMs less those both steps share: the swapped step's other "
          "GEMMs (kv_b_proj expanding the cache,\nthe rotary embedding's matmul, SDPA's if it takes its math path). "
          "glue: this package's RMSNorm and SiLU-and-mul kernels")
    print(f"{'cache':>5} {'batch':>5} {'variant':>16} {'step us':>9} {'projections':>11} {'share':>6} "
          f"{'other GEMM':>10} {'attention':>9} {'glue':>6} {'other':>8} {'kernels':>8}")
    for cell in results:
        profiles = cell["profile_us"]
        if not any(profiles.values()):
            print(f"{cell['cache_len']:>5} {cell['batch']:>5}  no kernels seen in the profiled graph replays")
            continue
        shared = profiles[ours[0]].get("other GEMM", 0.0) if ours else 0.0
        for name, totals in profiles.items():
            if name == "nn.Linear":
                projections = totals.get("other GEMM", 0.0) - shared
                other_gemm = shared
            else:
                projections, other_gemm = totals.get("decode_projection", 0.0), totals.get("other GEMM", 0.0)
            step = cell["us"][name]
            print(f"{cell['cache_len']:>5} {cell['batch']:>5} {name:>16} {step:9.1f} {projections:11.1f} "
                  f"{projections / step:6.1%} {other_gemm:10.1f} {totals.get('attention', 0.0):9.1f} "
                  f"{totals.get('glue', 0.0):6.1f} {totals.get('other', 0.0):8.1f} {sum(totals.values()):8.1f}")


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
