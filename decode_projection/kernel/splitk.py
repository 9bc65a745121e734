"""Split-K decode projection for Hopper (sm_90a), written in the CuTe DSL.

Computes ``out[m, n] = sum_k x[m, k] * W[n, k]`` (``out = x @ W^T``) for a small
padded batch ``M`` and a large BF16/FP16 weight ``W[N, K]``.

At decode the batch is tiny, so the product is bound by streaming ``W`` from HBM
once. The kernel is shaped around that:

* Swap AB: the weight is wgmma's A operand (its rows fill the instruction's
  M = 64) and the activations are B (the batch is wgmma's N, 8..256), so a
  batch of 1 wastes no weight bandwidth on zero rows.
* Weight tiles arrive by TMA through a descriptor built at launch and passed
  by value (a grid constant), with the L2 hint EVICT_FIRST: each weight byte is
  used once per step and must not push activations or KV out of L2.
  Activation tiles arrive by TMA with EVICT_LAST: every CTA re-reads them.
* A producer warp keeps ``stages`` tiles in flight through an mbarrier
  pipeline (a stage holds 1, 2 or 4 TMA boxes of 64 K); one consumer
  warpgroup per 64 rows of wgmma's A issues wgmma, keeping one group in flight
  (or two that split a large activation tile, so that one's barrier waits
  overlap the other's wgmmas).
  Where the accumulators outgrow an even share of the register file (three
  warpgroups of more than 192 columns of B, four of more than 128), the
  producer is a whole warpgroup that hands its registers to the consumers
  (setmaxnreg).
* At compute-bound batches the tactic may turn the operands back
  (``weight_as_b``): the activations are wgmma's A (64 rows per consumer
  warpgroup, up to four) and the weight is B, in tiles of any multiple of 8
  rows up to 256. A weight tile that need not be a multiple of 64 rows lets
  the grid fill the SMs (7168 rows: 64 tiles of 112 x 2 activation tiles =
  128 CTAs, where 64-row tiles give 112; 20480 rows at M=256: 128 tiles of
  160 x one 256-row activation tile, each weight byte read by one CTA), the
  trade cuBLAS makes at these batches. On the H200 it wins compute-bound
  cells of the shipped table (M = 96 to 256).
* With the weight as A a weight tile may be any multiple of 8 rows: its
  shared-memory tile is whole 64-row warpgroup tiles, the rows past the TMA box
  are never loaded and their results never stored, so the grid can fill the
  SMs at streaming batches without the weight as B.
* A tile of at most 32 (or 16) weight rows may fold K instead: its 64-row
  shared-memory tile holds 2 (or 4) K segments of its rows, the activation
  tile one slot per segment, so one wgmma sums every segment (the products
  across segments are discarded) and the epilogue adds the segments' partials
  in order. Narrow tiles that fill the SMs (3584 rows: 128 of 28) then keep a
  whole tile of weight bytes in flight with no cluster reduction, and sum as a
  split of as many ranks does.
* With the weight as B, a cluster of 2 to 4 neighbouring activation tiles may
  share each weight tile: every CTA loads a share of its rows by TMA multicast
  into all of them, so each weight byte leaves L2 once, whatever the batch.
* Split K across the ``split`` CTAs of a thread-block cluster (short N, long K
  needs more CTAs than N tiles to fill 132 SMs). Partial sums are reduced
  through distributed shared memory in a fixed rank order: no atomics, no
  workspace, no memset, and bitwise-identical results run to run. Where the
  stages leave room without lowering how many CTAs fit on an SM, the partials
  land in a buffer of their own and each rank sends them as its loop ends;
  otherwise they reuse the drained stages, after a cluster barrier.
* Without split K the epilogue stages 16-bit output tiles of 32 or more
  activation rows in the drained pipeline buffers and stores them 16 bytes per
  thread, whole 128-byte lines per warp (straight from wgmma's accumulators each
  warp store touches four output rows, 2 bytes per thread).
* Where the batch fills a whole activation tile, the last one starts early
  enough to end at the batch's last row, so no TMA box reaches past the
  activations (on the H200 boxes partly past the tensor ran compute-bound
  batches 1.2-2x slower); the rows it shares with the tile before it are not
  stored twice.
* Every output store carries the L2 policy EVICT_LAST (staged, direct, folded
  and split-K reduction epilogues alike): the output is the next kernel's
  input, and its lines then outlast the weight stream in L2.
* Programmatic dependent launch: the weight does not depend on the previous
  kernel, so the producer issues the first weight stages (as many as the
  pipeline holds, up to the CTA's K tiles) before ``griddepcontrol.wait``;
  the batch size, the activation loads and every write of ``out`` come after
  a wait (unsplit tiles wait before the epilogue, split ranks once their
  peers' partials have arrived). Each thread lets the next launch in
  (``griddepcontrol.launch_dependents``) at the end of its main loop (the
  producer after its last loads, the consumers after their last wgmma), or,
  where the tactic says so (``dependents_at_start``), as the kernel starts
  (docs/programmatic-launch.md).
"""

import math
from typing import NamedTuple, Optional

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm
from cutlass._mlir.dialects import nvvm as nvvm_dialect
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.experimental.cuda import TensorMap, TensorMapL2Promotion, TensorMapSwizzle, create_tensor_map_tiled
from cutlass.experimental.primitives import nvvm_wrapper as nvvm

from ..runtime.sm90 import WGMMA_ROWS
from .tactic import BOX_K, GATE_GROUP_ROWS, PRODUCER_REGISTERS, SplitKTactic, as_tactic, gated_problems

# TMA L2 cache-policy descriptors (createpolicy.fractional, fraction 1.0).
EVICT_FIRST = 0x12F0000000000000
EVICT_LAST = 0x14F0000000000000


# The unsplit epilogue stages 16-bit output tiles of this many activation rows or more in shared
# memory and stores them 16 bytes per thread (SplitKGemm.store_staged).
STAGED_STORE_ROWS = 32
STAGING_PAD = 8  # elements after each staged activation row: a warp's staging stores then hit distinct banks
STAGING_BARRIER = 1  # named barrier of the consumer warps (0 is the whole CTA's)
VECTOR = 8  # 16-bit outputs per 16-byte store


@cutlass.dsl_user_op
def store_async_dsmem(target, words, barrier, peer, *, loc=None, ip=None):
    """One ``st.async`` of 1, 2 or 4 32-bit ``words`` to ``target`` in cluster CTA ``peer``, whose copy of ``barrier``
    counts the bytes. ``cute.arch.store_async_dsmem`` of the DSL 4.7 stores one word only, and its libNVVM takes no
    ``nvvm.store_async`` (what the DSL 4.8's emits), hence the PTX inline: with 4.8 the SASS is the same either way."""
    dsmem = llvm.PointerType.get(cute.AddressSpace.dsmem)
    rank = cutlass.Int32(peer).ir_value(loc=loc, ip=ip)
    address = nvvm_dialect.mapa(dsmem, target.to_llvm_ptr(loc=loc, ip=ip), rank, loc=loc, ip=ip)
    peer_barrier = nvvm_dialect.mapa(dsmem, barrier.to_llvm_ptr(loc=loc, ip=ip), rank, loc=loc, ip=ip)
    values = [cutlass.Int32(word).ir_value(loc=loc, ip=ip) for word in words]
    n = len(values)
    operands = "$1" if n == 1 else "{" + ", ".join(f"${i + 1}" for i in range(n)) + "}"
    shape = "" if n == 1 else f".v{n}"
    llvm.inline_asm(
        None,
        [llvm.ptrtoint(ir.IntegerType.get_signless(32), address, loc=loc, ip=ip), *values,
         llvm.ptrtoint(ir.IntegerType.get_signless(32), peer_barrier, loc=loc, ip=ip)],
        f"st.async.shared::cluster.mbarrier::complete_tx::bytes{shape}.b32 [$0], {operands}, [${n + 1}];",
        ",".join(["r"] * (n + 2)),
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip,
    )


@cutlass.dsl_user_op
def held_until_here(value, *, loc=None, ip=None):
    """``value`` (a 16- or 32-bit number) through an empty inline ``mov``: nothing that uses it can be moved above
    this point, so the load it came from is waited for here rather than where it was issued (without it LLVM moved
    a conversion of the loaded value up to the load, by folding it into the branch that loads)."""
    word = cutlass.Int16 if value.width == 16 else cutlass.Int32
    constraint = "h" if value.width == 16 else "r"
    bits = llvm.inline_asm(
        word.mlir_type, [value.bitcast(word).ir_value(loc=loc, ip=ip)], f"mov.b{value.width} $0, $1;",
        f"={constraint},{constraint}", has_side_effects=True, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip,
    )
    return word(bits).bitcast(type(value))


class CtaWork(NamedTuple):
    """Where one CTA's consumers work: its weight and activation tiles, its place in the cluster, its K tiles."""

    n_tile: cutlass.Int32  # weight tile (of ``split`` ranks)
    m_tile: cutlass.Int32  # activation tile
    rank: cutlass.Int32  # split-K rank: which slice of K
    sharer: cutlass.Int32  # place among the CTAs that share a load (multicast)
    k_count: cutlass.Int32  # K tiles (stages) to consume


class Addends(NamedTuple):
    """The bias and residual values (as loaded, in registers) of the outputs one consumer thread stores: slot ``i`` of
    the residual for its ``i``-th output (SplitKGemm.thread_outputs), slot ``bias_slots[i]`` of the bias (the first
    output of its weight row); None where the epilogue has no such term."""

    bias: Optional[cute.Tensor]
    residual: Optional[cute.Tensor]
    bias_slots: tuple = ()


class SplitKGemm:
    """out (N, M, 1), N-major = weight (N, K, 1) K-major x activations (M, K, 1) K-major.

    Contracts: K % 8 == 0 and 16-byte row pitches for weight and activations
    (TMA); the weight descriptor has box {64, weight_load_rows} with 128-byte swizzle;
    any N and M (ragged tiles are zero-filled on load and masked on store, the last
    activation tile moved back to end at row M where M covers a tile);
    the output needs only unit stride along N.
    """

    def __init__(self, tactic: SplitKTactic, programmatic_launch: bool = True, gated: bool = False):
        self.tactic = as_tactic(tactic)
        # Gated: the weight interleaves gate and up rows eight at a time (interleave_gate_up), and the output
        # row (n // 16) * 8 + n % 8 of each tile is silu(gate) * up of its rows n and n + 8.
        problems = gated_problems(self.tactic) if gated else []
        if problems:
            raise ValueError(f"tactic {self.tactic} cannot gate: {'; '.join(problems)}")
        self.gated = gated
        # With programmatic dependent launch the weight streams while the previous kernel finishes
        # (1.2-1.5 us saved back to back on the H200); after a kernel that never triggers its
        # dependents, as torch's do not, the launch attribute cost 0.14-0.53 us (docs/programmatic-launch.md).
        self.programmatic_launch = programmatic_launch
        self.producer_warp = 4 * self.tactic.consumer_groups
        self.consumer_threads = 128 * self.tactic.consumer_groups

    @cute.jit
    def __call__(
        self,
        weight: cute.Tensor,
        activations: cute.Tensor,
        out: cute.Tensor,
        stream,
        residual: Optional[cute.Tensor] = None,
        bias: Optional[cute.Tensor] = None,
    ):
        """Build the MMA, TMA atoms and shared layouts for this tactic and launch the grid of clusters on ``stream``.
        An epilogue adds ``residual`` (laid out as ``out``) and ``bias`` (one value per weight row), where given."""
        t = self.tactic
        operand = weight.element_type
        if cutlass.const_expr(activations.element_type != operand):
            raise TypeError(f"activations {activations.element_type} != weight {operand}")
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            operand,
            operand,
            cute.nvgpu.OperandMajorMode.K,
            cute.nvgpu.OperandMajorMode.K,
            cutlass.Float32,
            (t.tile_mnk[0] // WGMMA_ROWS, t.column_groups, 1),
            tiler_mn=(WGMMA_ROWS, t.wgmma_columns),
        )
        k_major = utils.LayoutEnum.ROW_MAJOR
        a_smem = sm90_utils.make_smem_layout_a(k_major, t.tile_mnk, operand, t.stages)
        b_smem = sm90_utils.make_smem_layout_b(k_major, t.tile_mnk, operand, t.stages)
        weight_smem, act_smem = (b_smem, a_smem) if t.weight_as_b else (a_smem, b_smem)
        # The activation tile of each stage, one slot per folded K segment, as TMA fills it.
        act_slots = act_smem
        if cutlass.const_expr(t.fold > 1):
            # Slots one after another, each its K atoms one after another, so a slot is an unfolded tile.
            atom = sm90_utils.make_smem_layout_atom(
                sm90_utils.get_smem_layout_atom(k_major, operand, t.tile_k), operand
            )
            act_smem, act_slots = (
                cute.tile_to_shape(atom, shape, order=(1, 0, 2))
                for shape in ((t.fold * t.activation_rows, t.tile_k, t.stages),
                              (t.activation_rows, t.tile_k, t.fold * t.stages))
            )
        act_tma, act_coords = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SMulticastOp() if t.activation_sharers > 1
            else cpasync.CopyBulkTensorTileG2SOp(),
            activations,
            cute.slice_(act_slots, (None, None, 0)),
            (t.activation_rows, t.tile_k),
            num_multicast=t.activation_sharers,
        )

        self.shared_storage = self.shared_storage_type(operand, weight_smem, act_smem)
        grid = (t.grid_columns(weight.shape[0], cute.ceil_div), t.grid_rows(activations.shape[0], cute.ceil_div), 1)
        self.kernel(
            tiled_mma, act_tma, act_coords, weight_smem, act_smem, act_slots, weight, out,
            self.weight_map(weight), residual, bias
        ).launch(
            grid=grid,
            block=(t.threads, 1, 1),
            # A cluster of one CTA is launched as no cluster at all: the cluster launch cost
            # up to 0.5 us per launch after glue (docs/programmatic-launch.md).
            cluster=(t.split * t.activation_sharers, t.weight_sharers, 1) if t.split * t.multicast > 1 else None,
            stream=stream,
            use_pdl=self.programmatic_launch,
        )

    @cute.kernel
    def kernel(
        self,
        tiled_mma: cute.TiledMma,
        act_tma: cute.CopyAtom,
        act_coords: cute.Tensor,
        weight_smem: cute.ComposedLayout,
        act_smem: cute.ComposedLayout,
        act_slots: cute.ComposedLayout,
        weight: cute.Tensor,
        out: cute.Tensor,
        weight_map: cutlass.GridConstant[TensorMap],
        residual: Optional[cute.Tensor],
        bias: Optional[cute.Tensor],
    ):
        """One CTA: a producer warp streams weight and activation stages by TMA, consumer warpgroups run wgmma on
        them, then the CTA stores its tile or its split rank's share of the reduced sums."""
        t = self.tactic
        tidx, _, _ = cute.arch.thread_idx()
        bidx, m_tile, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        # A cluster is ``multicast`` neighbouring weight tiles (or activation tiles, with the weight as B) x ``split``
        # K slices, ranked sharer * split + rank either way.
        in_cluster = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        rank, sharer = in_cluster, 0
        if cutlass.const_expr(t.multicast > 1):
            rank, sharer = in_cluster % t.split, in_cluster // t.split
        n_tile = bidx // t.split
        if cutlass.const_expr(t.dependents_at_start):
            # The next launch's CTAs may take each SM as this launch's CTA there exits and stream their first
            # stages under this launch's tail: faster back to back only where one CTA fills an SM, and then not
            # always (docs/programmatic-launch.md), so the tuner chooses.
            cute.arch.griddepcontrol_launch_dependents()

        # This CTA's K tiles: a contiguous slice, the last ranks' possibly empty; folded, stage i holds tile
        # k_begin + i + segment * fold_stride of each segment (the tiles past K are zero fill and add nothing).
        k_begin, k_count, fold_stride = t.k_slice(
            weight.shape[1], rank, ceil_div=cute.ceil_div, minimum=cutlass.min, maximum=cutlass.max
        )

        if warp == self.producer_warp:
            # The weight's map first, before the pipeline's set-up and its CTA barrier: its prefetch then overlaps
            # the barrier initialisation instead of following it. The activations' map is prefetched
            # below, where its parameter address stays live for the loads that use it.
            self.prefetch_weight_map(weight_map)
        storage = cutlass.utils.SmemAllocator().allocate(self.shared_storage)
        if cutlass.const_expr(t.split > 1):
            if tidx == 0:
                # Peers signal this barrier remotely; a cluster barrier publishes it before any signal: the
                # reduction's, or with a buffer of its own the pipeline's (multicast) or one that starts below.
                cute.arch.mbarrier_init(storage.reduction_barrier.data_ptr(), 1)
                cute.arch.mbarrier_init_fence()
        tiles = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.barriers.data_ptr(),
            num_stages=t.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            # Multicast signalling takes the consumer threads and derives one release per
            # warp and sharer; a CTA-local pipeline counts one release per consumer warp.
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, self.consumer_threads if t.multicast > 1 else self.consumer_threads // 32
            ),
            tx_count=t.stage_load_bytes,
            cta_layout_vmnk=self.sharing_layout(),
            mcast_mode_mn=(0, 1),
            enable_multicast_signaling=t.multicast > 1,
        )
        if cutlass.const_expr(self.publishes_reduction_barrier_at_start):
            cute.arch.cluster_arrive_relaxed()
        s_weight = storage.weight_tiles.get_tensor(weight_smem.outer, swizzle=weight_smem.inner)
        s_act = storage.act_tiles.get_tensor(act_smem.outer, swizzle=act_smem.inner)
        s_act_slots = storage.act_tiles.get_tensor(act_slots.outer, swizzle=act_slots.inner)

        if warp >= self.producer_warp:
            if cutlass.const_expr(t.reallocates_registers):
                # Only the first warp loads; every producer warp's registers but PRODUCER_REGISTERS go to the consumers.
                cute.arch.setmaxregister_decrease(PRODUCER_REGISTERS)
            if warp == self.producer_warp:
                sharers_mask = None
                if cutlass.const_expr(t.multicast > 1):
                    sharers_mask = cutlass.Int16(sum(1 << (i * t.split) for i in range(t.multicast))) << rank
                activation_mask = sharers_mask if cutlass.const_expr(t.activation_sharers > 1) else None
                weight_mask = sharers_mask if cutlass.const_expr(t.weight_sharers > 1) else None
                descriptor = weight_map.get_ptr()
                cpasync.prefetch_descriptor(act_tma)
                # This CTA's share of the weight tile: its rows in global memory and in every sharer's stages.
                weight_row = n_tile * t.weight_rows
                weight_tiles = storage.weight_tiles.data_ptr()
                if cutlass.const_expr(t.weight_sharers > 1):
                    weight_row += sharer * t.weight_load_rows
                    weight_tiles += sharer * t.weight_load_rows * BOX_K

                # Weights do not depend on the previous kernel (programmatic dependent
                # launch), so the first stages stream while it finishes; activations do.
                prefetch = cutlass.min(t.stages, k_count)
                state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, t.stages)
                for i in cutlass.range(prefetch, unroll=1):
                    tiles.producer_acquire(state)
                    self.load_weight(
                        weight_tiles, state, descriptor, tiles, k_begin + i, fold_stride, weight_row, weight_mask
                    )
                    state.advance()
                cute.arch.griddepcontrol_wait()
                # Only now the batch: a kernel parameter read before the weights are issued (and before an early
                # trigger) cost up to 1.1 us after a glue kernel on the H200 (docs/programmatic-launch.md).
                act_row0, _ = self.activation_origin(m_tile, out.shape[1])
                tile_coords = cute.domain_offset((act_row0, 0, 0), act_coords)
                if cutlass.const_expr(t.weight_as_b):
                    g_act = cute.local_tile(tile_coords, t.tile_mnk, (0, n_tile, None, 0), proj=(1, None, 1))
                else:
                    # One fold slot's activation tile (the whole tile unfolded).
                    slot_mnk = (t.weight_smem_rows, t.activation_rows, t.tile_k)
                    g_act = cute.local_tile(tile_coords, slot_mnk, (n_tile, 0, None, 0), proj=(None, 1, 1))
                # Each sharer loads 1/multicast of the shared tile's rows into every sharer.
                activation_share = 0
                if cutlass.const_expr(t.activation_sharers > 1):
                    activation_share = sharer
                t_act_smem, t_act_global = cpasync.tma_partition(
                    act_tma,
                    activation_share,
                    cute.make_layout(t.activation_sharers),
                    cute.group_modes(s_act_slots, 0, 2),
                    cute.group_modes(g_act, 0, 2),
                )
                early = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, t.stages)
                for i in cutlass.range(prefetch, unroll=1):
                    self.load_activations(
                        act_tma, t_act_global, t_act_smem, early, tiles, k_begin + i, fold_stride, activation_mask
                    )
                    early.advance()
                for i in cutlass.range(prefetch, k_count, unroll=1):
                    tiles.producer_acquire(state)
                    self.load_weight(
                        weight_tiles, state, descriptor, tiles, k_begin + i, fold_stride, weight_row, weight_mask
                    )
                    self.load_activations(
                        act_tma, t_act_global, t_act_smem, state, tiles, k_begin + i, fold_stride, activation_mask
                    )
                    state.advance()
                if cutlass.const_expr(not t.dependents_at_start):
                    cute.arch.griddepcontrol_launch_dependents()
                if cutlass.const_expr(t.multicast > 1):
                    # Sharers' consumers release this CTA's stages remotely: stay until they have.
                    tiles.producer_tail(state)
            if cutlass.const_expr(t.split > 1):
                self.await_reduction_peers()  # the reduction's cluster barrier counts every thread
        else:
            self.consume(tiled_mma, tiles, storage, s_weight, s_act, out, residual, bias, warp, tidx,
                         CtaWork(n_tile, m_tile, rank, sharer, k_count))

    def weight_map(self, weight):
        """The weight's TMA map, encoded at launch and passed by value: boxes of 64 columns x the tactic's weight
        load rows, 128-byte swizzle, 128-byte L2 promotion, the row pitch kept. By value no CTA has to acquire it
        before its first load, which after another kernel lets every CTA start streaming at once
        (docs/launch-contexts.md)."""
        pitch = weight.stride[0]
        # 128-byte promotion, not 256: each box row is exactly 128 B, and the wider promotion streamed 2-8% slower
        # on the H200 with the same DRAM bytes (docs/measurements/2026-12-02-l2-promotion-h200.txt).
        return create_tensor_map_tiled(
            weight.iterator.toint(), weight.element_type, [weight.shape[1], weight.shape[0]],
            [pitch * weight.element_type.width // 128], [BOX_K, self.tactic.weight_load_rows],
            swizzle=TensorMapSwizzle.s128b, l2_promotion=TensorMapL2Promotion.l2_128b,
        )

    @cute.jit
    def prefetch_weight_map(self, weight_map):
        """The producer warp's prefetch of the weight's map among the kernel's parameters."""
        if nvvm.elect_sync():
            nvvm.prefetch_tensormap(weight_map.get_ptr())

    @cute.jit
    def consume(self, tiled_mma, tiles, storage, s_weight, s_act, out, residual, bias, warp, tidx, work):
        """A consumer warpgroup: one wgmma group in flight over the stages as they land, then the epilogue."""
        t = self.tactic
        if cutlass.const_expr(t.reallocates_registers):
            cute.arch.setmaxregister_increase(t.consumer_registers)
        group = warp // 4
        mma_group = tiled_mma.get_slice(group * 128)
        s_a, s_b = (s_act, s_weight) if t.weight_as_b else (s_weight, s_act)
        frag_a = tiled_mma.make_fragment_A(mma_group.partition_A(s_a))
        frag_b = tiled_mma.make_fragment_B(mma_group.partition_B(s_b))
        acc = cute.make_rmem_tensor(mma_group.partition_shape_C(t.tile_mnk[:2]), cutlass.Float32)
        acc.fill(0.0)
        addends = None
        if cutlass.const_expr(residual is not None or bias is not None):
            # Read as the loop starts, so that their loads overlap the weight stream: read beside the stores, each
            # load would wait for the store before it (the residual may be ``out``), a round trip per output
            # (docs/epilogues.md). The consumers have nothing to do before the first stage, which holds activations
            # and so waits for the previous kernel anyway; that kernel may write the residual or the bias.
            cute.arch.griddepcontrol_wait()
            addends = self.load_addends(tiled_mma, tidx, work, out, residual, bias)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        k_blocks = cute.size(frag_a, mode=[2])
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, t.stages)
        # One wgmma group stays in flight: a stage is released once the group
        # after it has been issued, so the tensor cores never wait on the
        # release round trip (what limits compute-bound batches).
        retired = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, t.stages)
        for i in cutlass.range(work.k_count, unroll=1):
            tiles.consumer_wait(state)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(k_blocks):
                cute.gemm(
                    tiled_mma,
                    acc,
                    frag_a[(None, None, kb, state.index)],
                    frag_b[(None, None, kb, state.index)],
                    acc,
                )
            warpgroup.commit_group()
            warpgroup.wait_group(1)
            if i > 0:
                tiles.consumer_release(retired)
                retired.advance()
            state.advance()
        warpgroup.wait_group(0)
        if work.k_count > 0:
            tiles.consumer_release(retired)
        # This CTA has streamed its weights: let the next launch in, unless it was let in at the start,
        # and wait for the previous launch before writing ``out``.
        if cutlass.const_expr(not t.dependents_at_start):
            cute.arch.griddepcontrol_launch_dependents()
        else:
            # Something must stand between the last wgmma wait (and the ``k_count > 0`` release) and
            # griddepcontrol.wait: with nothing there, ptxas serializes every wgmma of the main loop where the
            # epilogue is staged (warning C7514: it counts the staging's accumulator reads as inside the
            # pipeline stage), up to 50% slower; a fence keeps the stage closed. One per thread, harmless for
            # the other early tactics (docs/programmatic-launch.md).
            cute.arch.fence_acq_rel_cta()
        if cutlass.const_expr(t.split == 1):
            cute.arch.griddepcontrol_wait()  # the reduction waits once its partials are sent

        # Each accumulator's (A row, B row) in this CTA's tile.
        coords = tiled_mma.get_slice(tidx).partition_C(cute.make_identity_tensor(t.tile_mnk[:2]))
        row0 = work.n_tile * t.weight_rows
        col0, repeated = self.activation_origin(work.m_tile, out.shape[1])
        rows, cols = out.shape[0], out.shape[1]
        if cutlass.const_expr(t.fold > 1):
            self.store_folded(acc, coords, storage, out, addends, row0, col0, repeated)
        elif cutlass.const_expr(self.stages_output(out.element_type)):
            self.store_staged(acc, coords, storage, out, addends, row0, col0, repeated)
        elif cutlass.const_expr(self.gated and t.split == 1):
            for r in cutlass.range_constexpr(cute.size(acc)):
                if cutlass.const_expr(self.holds_gate(r)):
                    self.store_gated(out, acc[r], acc[r + self.up_offset], self.output_index(coords[r]), row0, col0,
                                     repeated)
        elif cutlass.const_expr(t.split == 1):
            for r in cutlass.range_constexpr(cute.size(acc)):
                n, m = self.output_index(coords[r])
                if self.stores(n, m, row0, col0, rows, cols, repeated):
                    value = acc[r]
                    if cutlass.const_expr(addends is not None):
                        value = self.finish(value, addends, r)
                    self.store_kept_in_l2(out, row0 + n, col0 + m, value.to(out.element_type))
        else:
            self.reduce_across_cluster(acc, coords, work.rank, work.sharer, storage, out, addends, row0, col0,
                                       repeated)

    @property
    def publishes_reduction_barrier_at_start(self) -> bool:
        """Whether the CTAs arrive at a cluster barrier as they start so that peers may signal the reduction's
        barrier: partials in a buffer of their own, without multicast (whose pipeline starts with a cluster barrier
        that publishes it)."""
        return self.tactic.reduction_buffered and self.tactic.multicast == 1

    @cute.jit
    def await_reduction_peers(self):
        """Every thread's part of the reduction's cluster barrier: with partials in the drained stages, arrive and wait
        until no rank still reads its stages; with a buffer of their own, wait for the arrival at the start that
        published every peer's barrier (none where the pipeline's cluster barrier did)."""
        if cutlass.const_expr(not self.tactic.reduction_buffered):
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
        if cutlass.const_expr(self.publishes_reduction_barrier_at_start):
            cute.arch.cluster_wait()

    def shared_storage_type(self, operand, weight_smem, act_smem):
        """The CTA's shared memory: pipeline barriers, the reduction's barrier, the stages' weight and activation
        tiles, and the split-K partials' own buffer where the tactic has one."""
        t = self.tactic
        fields = {
            "barriers": cute.struct.MemRange[cutlass.Int64, 2 * t.stages],
            "reduction_barrier": cute.struct.MemRange[cutlass.Int64, 1],
            "weight_tiles": cute.struct.Align[cute.struct.MemRange[operand, cute.cosize(weight_smem)], 1024],
            "act_tiles": cute.struct.Align[cute.struct.MemRange[operand, cute.cosize(act_smem)], 1024],
        }
        if t.reduction_buffered:
            fields["partials"] = cute.struct.Align[cute.struct.MemRange[cutlass.Float32, t.reduction_bytes // 4], 16]
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))

    def activation_origin(self, m_tile, batch):
        """(first activation row this tile loads, how many of its rows are the tile before's): the last tile moved
        back to end at row ``batch`` where the batch covers a whole tile."""
        first_row = m_tile * self.tactic.activation_rows
        origin = cutlass.min(first_row, cutlass.max(batch - self.tactic.activation_rows, 0))
        return origin, first_row - origin

    def output_index(self, coord):
        """(weight row, activation row) of an accumulator's (A row, B row) in the tile."""
        a_row, b_row = coord
        return (b_row, a_row) if self.tactic.weight_as_b else (a_row, b_row)

    @cute.jit
    def stores(self, n, m, row0, col0, rows, cols, repeated):
        """Whether tile element (n, m) is this tile's output: inside ``out``, not a row the weight tile was padded with,
        and not one of the ``repeated`` activation rows the tile before stores."""
        inside = row0 + n < rows and col0 + m < cols and m >= repeated
        if cutlass.const_expr(self.tactic.weight_smem_rows > self.tactic.weight_rows):
            # Padding rows hold whatever shared memory held; their sums belong to no weight row.
            inside = inside and n < self.tactic.weight_rows
        return inside

    @cute.jit
    def store_kept_in_l2(self, out, row, col, value):
        """``out[row, col] = value`` with the L2 policy EVICT_LAST (the module docstring says why)."""
        element = out.iterator + cute.crd2idx((row, col, 0), out.layout)
        # st.global with an L2 policy (nvvm.store_ext) takes no 16-bit float: store a bf16/fp16 as its bits.
        word = cutlass.Int16 if cutlass.const_expr(out.element_type.width == 16) else out.element_type
        nvvm.store_ext(value.bitcast(word).ir_value(), cute.recast_ptr(element, dtype=word), l2_cache_hint=EVICT_LAST)

    @cute.jit
    def thread_outputs(self, tiled_mma, tidx, work, out):
        """``[(row, col, stored)]``: the output element of each of this consumer thread's store slots, in the order
        its store path takes them (slot ``i`` for its ``i``-th), and whether it stores it (inside ``out``, not
        padding, not repeated, and with split K this rank's)."""
        t = self.tactic
        row0 = work.n_tile * t.weight_rows
        col0, repeated = self.activation_origin(work.m_tile, out.shape[1])
        rows, cols = out.shape[0], out.shape[1]
        if cutlass.const_expr(t.fold > 1):
            found = []
            for i in cutlass.range_constexpr(self.folded_slots):
                n, m, stored = self.folded_output(i, tidx, row0, col0, rows, cols, repeated)
                found.append((row0 + n, col0 + m, stored))
            return found
        coords = tiled_mma.get_slice(tidx).partition_C(cute.make_identity_tensor(t.tile_mnk[:2]))
        found = []
        for r in cutlass.range_constexpr(cute.size(coords)):
            n, m = self.output_index(coords[r])
            stored = self.stores(n, m, row0, col0, rows, cols, repeated)
            if cutlass.const_expr(t.split > 1):
                # Vector r // reduction_vector is summed and stored by rank (r // reduction_vector) % split.
                stored = stored and r // t.reduction_vector % t.split == work.rank
            found.append((row0 + n, col0 + m, stored))
        return found

    @cute.jit
    def load_addends(self, tiled_mma, tidx, work, out, residual, bias) -> Addends:
        """The bias and residual of every output this thread stores, in registers as loaded (Addends). Only outputs
        the CTA stores are read: a residual that is ``out`` is then read by its writer alone."""
        # Converted only in ``finish`` (held_until_here): waited for before the loop, the loads queue behind the
        # weight stages in flight and hold up the first wgmma (1.6 us at 7168x4224 M=1 after glue, H100).
        if cutlass.const_expr(self.gated):
            # Its outputs are not its accumulators' (thread_outputs); PreparedProjection refuses the pairing too.
            raise ValueError("a gated projection writes silu(gate) * up: it takes no bias or residual")
        outputs = self.thread_outputs(tiled_mma, tidx, work, out)
        bias_values = residual_values = None
        bias_slots = ()
        if cutlass.const_expr(bias is not None):
            bias_values = cute.make_rmem_tensor(len(outputs), bias.element_type)
            # One load per weight row: a thread's outputs span a few rows (two of a 64-column weight-as-A tile's 32).
            # Read where the row is inside the weight, whichever of its outputs this tile stores.
            bias_slots = self.bias_slots(tiled_mma, tidx, len(outputs))
            for i in cutlass.range_constexpr(len(outputs)):
                if cutlass.const_expr(bias_slots[i] == i):
                    row, _, _ = outputs[i]
                    if row < out.shape[0]:
                        bias_values[i] = bias[row]
        if cutlass.const_expr(residual is not None):
            residual_values = cute.make_rmem_tensor(len(outputs), residual.element_type)
            for i in cutlass.range_constexpr(len(outputs)):
                row, col, stored = outputs[i]
                if stored:
                    residual_values[i] = residual[(row, col, 0)]
        return Addends(bias_values, residual_values, bias_slots)

    def bias_slots(self, tiled_mma, tidx, count) -> tuple:
        """For each of a consumer thread's ``count`` output slots (SplitKGemm.thread_outputs), the first slot of the
        same weight row: the same for every thread, the rows' offsets from the thread's first being constants (the
        accumulator fragment's strides; a folded tile's slot ``i`` is ``i`` x the consumer threads rows on, modulo the
        tile's rows)."""
        t = self.tactic
        if cutlass.const_expr(t.fold > 1):
            offsets = [i * self.consumer_threads % self.folded_rows for i in range(count)]  # as folded_output
        else:
            coords = tiled_mma.get_slice(tidx).partition_C(cute.make_identity_tensor(t.tile_mnk[:2]))
            layout, mode = coords.layout, 1 if t.weight_as_b else 0
            offsets = [cute.crd2idx(cute.idx2crd(r, layout.shape), layout)[mode] for r in range(count)]
        return tuple(offsets.index(offset) for offset in offsets)

    @cute.jit
    def finish(self, value, addends, i):
        """``value`` (an FP32 sum) plus its output's bias, then its residual (slot ``i`` of ``addends``), still in
        FP32: the epilogue rounds once, as it stores."""
        if cutlass.const_expr(addends.bias is not None):
            value = value + held_until_here(addends.bias[addends.bias_slots[i]]).to(cutlass.Float32)
        if cutlass.const_expr(addends.residual is not None):
            value = value + held_until_here(addends.residual[i]).to(cutlass.Float32)
        return value

    @property
    def up_offset(self) -> int:
        """How far past a gate row's accumulator its up row's is (eight weight rows on): the fragment's second mode
        (rows r and r + 8 of A, stride 2) with the weight as A, its third (8-column blocks of B, stride 4) as B."""
        return 4 if self.tactic.weight_as_b else 2

    def holds_gate(self, r) -> bool:
        """Whether accumulator ``r`` is a gate row's (the first 8 of each 16 interleaved weight rows)."""
        return r // self.up_offset % 2 == 0

    @cute.jit
    def store_gated(self, out, gate, up, coord, row0, col0, repeated):
        """silu(gate) * up of the gate row at tile element ``coord`` (weight row, activation row; its up row eight
        below) to output row ``(n // 16) * 8 + n % 8`` of the tile's half as many, where this tile stores it
        (EVICT_LAST)."""
        n, m = coord
        out_n = n // 16 * 8 + n % 8
        if (n < self.tactic.weight_rows and row0 // 2 + out_n < out.shape[0] and col0 + m < out.shape[1]
                and m >= repeated):
            value = self.gate(gate, up)
            self.store_kept_in_l2(out, row0 // 2 + out_n, col0 + m, value.to(out.element_type))

    @cute.jit
    def gate(self, gate, up):
        """silu(gate) * up in FP32: gate * rcp(1 + exp(-gate)) * up. The reciprocal is approximate (rcp.approx), its
        error far under the output's one rounding: an IEEE division checks every quotient and calls a slow path on
        large or tiny operands, 0.2-2.9 us of a gated tile on the H100 (docs/epilogues.md)."""
        return gate * cute.arch.rcp_approx(cutlass.Float32(1.0) + cute.math.exp(-gate)) * up

    def stages_output(self, out_type) -> bool:
        """Whether the epilogue stages the output tile in shared memory (SplitKGemm.store_staged): unsplit
        tactics with 16-bit outputs and at least STAGED_STORE_ROWS activation rows."""
        t = self.tactic
        return t.split == 1 and out_type.width == 16 and t.activation_rows >= STAGED_STORE_ROWS

    @property
    def staging_bytes(self) -> int:
        """Shared memory of the staged output tile: the drained pipeline buffers, which always hold it for a valid
        tactic (tests/test_tactic_cpu.py)."""
        return self.tactic.activation_rows * (self.tactic.weight_smem_rows + STAGING_PAD) * 2

    @cute.jit
    def store_staged(self, acc, coords, storage, out, addends, row0, col0, repeated):
        """Store the tile through shared memory: each thread writes 16 contiguous output bytes at a time."""
        # Straight from the accumulators a warp's store touches four output rows with 2 bytes per thread; staged, a warp
        # writes whole 128-byte lines. Every store, the ragged tail's element stores too, has the L2 policy EVICT_LAST.
        # The tile is laid out as ``out`` is (weight rows contiguous), each activation row padded by STAGING_PAD
        # elements so that a warp's staging stores fall on distinct banks.
        t = self.tactic
        tidx, _, _ = cute.arch.thread_idx()
        # The tile's output rows: a gated tile's are half its weight rows.
        smem_rows, tile_rows = t.weight_smem_rows, t.weight_rows
        if cutlass.const_expr(self.gated):
            smem_rows, tile_rows, row0 = smem_rows // 2, tile_rows // 2, row0 // 2
        pitch = smem_rows + STAGING_PAD
        # The pipeline buffers, weight tiles then activation tiles, one contiguous span (as in the reduction).
        base = cute.recast_ptr(storage.weight_tiles.data_ptr(), dtype=out.element_type)
        staging = cute.make_tensor(base, cute.make_layout((smem_rows, t.activation_rows), stride=(1, pitch)))
        # Every warpgroup's wgmmas must be done reading the drained tiles before any overwrites them.
        cute.arch.barrier(barrier_id=STAGING_BARRIER, number_of_threads=self.consumer_threads)
        for r in cutlass.range_constexpr(cute.size(acc)):
            n, m = self.output_index(coords[r])
            if cutlass.const_expr(self.gated):
                if cutlass.const_expr(self.holds_gate(r)):  # a gate row and, 8 rows below, its up row
                    staging[n // 16 * 8 + n % 8, m] = self.gate(acc[r], acc[r + self.up_offset]).to(out.element_type)
            elif cutlass.const_expr(addends is None):
                staging[n, m] = acc[r].to(out.element_type)
            else:
                # Staged are the finished, rounded outputs; those this tile does not store have no addends.
                value = acc[r]
                if self.stores(n, m, row0, col0, out.shape[0], out.shape[1], repeated):
                    value = self.finish(value, addends, r)
                staging[n, m] = value.to(out.element_type)
        cute.arch.barrier(barrier_id=STAGING_BARRIER, number_of_threads=self.consumer_threads)

        rows, cols = out.shape[0], out.shape[1]
        pitch_out = out.stride[1]
        address = out.iterator.toint()
        # 16-byte stores need a 16-byte aligned base and row pitch (a single row's pitch is never used).
        vectors = address % 16 == 0 and (pitch_out % VECTOR == 0 or cols == 1)
        chunks_per_row = smem_rows // VECTOR
        chunks = t.activation_rows * chunks_per_row
        for i in cutlass.range_constexpr(math.ceil(chunks / self.consumer_threads)):
            chunk = tidx + i * self.consumer_threads
            m, n = chunk // chunks_per_row, chunk % chunks_per_row * VECTOR
            # ``stores``'s mask with its row test made per vector below, written out (calling it changed the SASS);
            # chunks past the last hold no output. The guarded outputs of tests/test_gpu.py check every store path.
            if chunk < chunks and n < tile_rows and col0 + m < cols and m >= repeated:
                if vectors and row0 + n + VECTOR <= rows:
                    source = cute.make_ptr(out.element_type, base.toint() + (m * pitch + n) * 2,
                                           cute.AddressSpace.smem, assumed_align=16)
                    target = cute.make_ptr(out.element_type, address + ((col0 + m) * pitch_out + row0 + n) * 2,
                                           cute.AddressSpace.gmem, assumed_align=16)
                    # The output is the next kernel's input: kept in L2 past the weight stream (EVICT_FIRST). On
                    # the H200, 0.1-1.6 us faster back to back at M = 32-64 (docs/l2-policies.md).
                    words = cute.arch.load(cute.recast_ptr(source, dtype=cutlass.Int32),
                                           ir.VectorType.get([VECTOR // 2], cutlass.Int32.mlir_type))
                    nvvm.store_ext(words, cute.recast_ptr(target, dtype=cutlass.Int32), l2_cache_hint=EVICT_LAST)
                else:
                    for e in cutlass.range_constexpr(VECTOR):
                        if row0 + n + e < rows:
                            self.store_kept_in_l2(out, row0 + n + e, col0 + m, staging[n + e, m])

    @cute.jit
    def store_folded(self, acc, coords, storage, out, addends, row0, col0, repeated):
        """Sum each output's K-segment partials in segment order through shared memory, and store them (EVICT_LAST)."""
        # Folded, A row ``segment * slot_rows + n`` times B row ``segment * activation_rows + m`` is segment
        # ``segment``'s partial of output (n, m); the products across segments are discarded. The partials are staged as
        # (n, m, segment), so the threads that sum them read, and store, consecutive output rows.
        t = self.tactic
        tidx, _, _ = cute.arch.thread_idx()
        base = cute.recast_ptr(storage.weight_tiles.data_ptr(), dtype=cutlass.Float32)
        partials = cute.make_tensor(base, cute.make_layout((t.slot_rows, t.activation_rows, t.fold)))
        # The consumers' wgmmas must be done reading the drained tiles before any overwrites them.
        cute.arch.barrier(barrier_id=STAGING_BARRIER, number_of_threads=self.consumer_threads)
        for r in cutlass.range_constexpr(cute.size(acc)):
            a_row, b_row = coords[r]
            segment = b_row // t.activation_rows
            if a_row // t.slot_rows == segment:
                partials[a_row % t.slot_rows, b_row % t.activation_rows, segment] = acc[r]
        cute.arch.barrier(barrier_id=STAGING_BARRIER, number_of_threads=self.consumer_threads)
        rows, cols = out.shape[0], out.shape[1]
        if cutlass.const_expr(self.gated):
            row0 = row0 // 2  # a gated tile's outputs are half its weight rows
        for i in cutlass.range_constexpr(self.folded_slots):
            n, m, stored = self.folded_output(i, tidx, row0, col0, rows, cols, repeated)
            if stored:
                if cutlass.const_expr(self.gated):
                    # Output n is gate row n of the tile's 8-row gate halves; its up row is eight below.
                    gate_row = n // 8 * GATE_GROUP_ROWS + n % 8
                    gate, up = self.segment_sum(partials, gate_row, m), self.segment_sum(partials, gate_row + 8, m)
                    total = self.gate(gate, up)
                else:
                    total = self.segment_sum(partials, n, m)
                if cutlass.const_expr(addends is not None):
                    total = self.finish(total, addends, i)
                self.store_kept_in_l2(out, row0 + n, col0 + m, total.to(out.element_type))

    @cute.jit
    def segment_sum(self, partials, n, m):
        """Output (n, m)'s K-segment partials of a folded tile, added in segment order."""
        total = partials[n, m, 0]
        for segment in cutlass.range_constexpr(1, self.tactic.fold):
            total = total + partials[n, m, segment]
        return total

    @property
    def folded_rows(self) -> int:
        """Output rows of a folded tile: its weight rows, or a gated tile's gate rows (half of them)."""
        return self.tactic.weight_rows // 2 if self.gated else self.tactic.weight_rows

    @property
    def folded_slots(self) -> int:
        """Outputs each consumer thread sums and stores in a folded tile (SplitKGemm.store_folded)."""
        return math.ceil(self.folded_rows * self.tactic.activation_rows / self.consumer_threads)

    @cute.jit
    def folded_output(self, i, tidx, row0, col0, rows, cols, repeated):
        """``(n, m, stored)``: the tile element of thread ``tidx``'s ``i``-th folded output (consecutive output rows
        across the threads; ``row0`` is the tile's first output row) and whether the tile stores it: ``stores``'s mask
        written out (calling it changed the SASS; a folded tile's n is never padding)."""
        t = self.tactic
        index = tidx + i * self.consumer_threads
        n, m = index % self.folded_rows, index // self.folded_rows
        return (n, m, index < self.folded_rows * t.activation_rows and row0 + n < rows and col0 + m < cols
                and m >= repeated)

    @cute.jit
    def send_partial(self, vector, buffer, offset, arrived, g, sharer):
        """One vector of partials to element ``offset`` of its owner's buffer, by ``st.async`` (DSMEM)."""
        t = self.tactic
        owner = g % t.split
        if cutlass.const_expr(t.multicast > 1):
            owner = sharer * t.split + owner
        target = cute.make_ptr(
            cutlass.Float32, buffer.toint() + offset * 4, cute.AddressSpace.smem, assumed_align=4 * len(vector)
        )
        store_async_dsmem(target, vector, arrived, owner)

    def sharing_layout(self):
        """Who fills whose pipeline stages, for the pipeline's release signals."""
        # Without multicast every CTA fills only its own stages (a CTA-local pipeline, whatever the split). With it,
        # sharers sit on the M mode (they hold different weight rows and receive the same activation tile, or with the
        # weight as B the other way round: the stages they fill are the same either way) and split
        # ranks on the K mode (they share nothing): cluster rank = sharer * split + rank.
        t = self.tactic
        if t.multicast == 1:
            return cute.make_layout((1, 1, 1, 1))
        return cute.make_layout((1, t.multicast, 1, t.split), stride=(0, t.split, 0, 1))

    @cute.jit
    def load_weight(self, weight_tiles, state, descriptor, tiles, k_tile, fold_stride, weight_row, sharers_mask):
        """This CTA's share of one weight tile by TMA through its map, to every sharer, evicted first
        from L2."""
        # A stage of ``k_boxes`` boxes asks for that many adjacent 128-byte pieces of every weight row at once (the
        # shared-memory layout keeps each box's rows x 64 block contiguous, one after another along K). Folded, each K
        # segment's rows fill their slot of every box (slots are whole 8-row swizzle atoms).
        # Shared (``sharers_mask``), every sharer's barrier at the same offset counts the bytes landing in its CTA.
        t = self.tactic
        if nvvm.elect_sync():
            for segment in cutlass.range_constexpr(t.fold):
                for box in cutlass.range_constexpr(t.k_boxes):
                    target = (weight_tiles + state.index * (t.weight_smem_rows * t.tile_k)
                              + box * (t.weight_smem_rows * BOX_K) + segment * (t.slot_rows * BOX_K))
                    coordinates = [(k_tile + segment * fold_stride) * t.tile_k + box * BOX_K, weight_row]
                    if cutlass.const_expr(sharers_mask is None):
                        nvvm.cp_async_bulk_tensor_shared_cta_global(
                            target, descriptor, coordinates, tiles.producer_get_barrier(state),
                            l2_cache_hint=EVICT_FIRST,
                        )
                    else:
                        nvvm.cp_async_bulk_tensor_shared_cluster_global(
                            target, descriptor, coordinates, tiles.producer_get_barrier(state), [],
                            multicast_mask=sharers_mask, l2_cache_hint=EVICT_FIRST,
                        )

    @cute.jit
    def load_activations(self, act_tma, t_act_global, t_act_smem, state, tiles, k_tile, fold_stride, sharers_mask):
        """This CTA's share of one activation tile (one per folded K segment) by TMA, to every sharer, kept in
        L2 for the other CTAs."""
        t = self.tactic
        for segment in cutlass.range_constexpr(t.fold):
            cute.copy(
                act_tma,
                t_act_global[(None, k_tile + segment * fold_stride)],
                t_act_smem[(None, state.index * t.fold + segment)],
                tma_bar_ptr=tiles.producer_get_barrier(state),
                mcast_mask=sharers_mask,  # None without multicast
                cache_policy=cutlass.Int64(EVICT_LAST),
            )

    @cute.jit
    def reduce_across_cluster(self, acc, coords, rank, sharer, storage, out, addends, row0, col0, repeated):
        """Sum the split partials through DSMEM in rank order; each rank stores a share (EVICT_LAST)."""
        # Each thread's accumulators go in vectors of ``reduction_vector``; vector ``g`` is owned by rank ``g % split``:
        # each peer sends it with one ``st.async`` to its slot of the owner's buffer; the owner waits on its mbarrier
        # for every byte, then adds the partials in rank order, so the sum never depends on timing. Where it keeps its
        # own in registers (``keeps_own_partials``) peer r's slot is (r - owner - 1) mod split; otherwise every rank,
        # the owner too, sends to slot r. With a buffer of its own (``reduction_buffered``) a rank sends as soon as
        # its loop ends (every peer's barrier was published as the CTAs started); otherwise the buffer is the drained
        # pipeline tiles, and a cluster barrier first waits until no rank still reads its own.
        t = self.tactic
        tidx, _, _ = cute.arch.thread_idx()
        width, groups, per_rank = t.reduction_vector, t.reduction_groups, t.reduction_groups_per_rank
        buffer = cute.recast_ptr(storage.weight_tiles.data_ptr(), dtype=cutlass.Float32)
        if cutlass.const_expr(t.reduction_buffered):
            buffer = storage.partials.data_ptr()
        slot = cute.make_layout(
            (width, self.consumer_threads, per_rank, t.reduction_slots),
            stride=(1, width, width * self.consumer_threads, width * self.consumer_threads * per_rank),
        )
        arrived = storage.reduction_barrier.data_ptr()
        if tidx == 0:
            # Peers' bytes may land before this: the barrier's transaction count may dip below zero, but its phase
            # cannot complete before this one arrival.
            owned = cutlass.max(groups - rank + t.split - 1, 0) // t.split
            cute.arch.mbarrier_arrive_and_expect_tx(
                arrived, owned * t.reduction_slots * self.consumer_threads * width * 4
            )
        self.await_reduction_peers()
        bits = cute.recast_tensor(acc, cutlass.Int32)
        for g in cutlass.range_constexpr(groups):
            vector = tuple(bits[g * width + j] for j in range(width))
            if cutlass.const_expr(t.keeps_own_partials):
                if g % t.split != rank:
                    target = slot((0, tidx, g // t.split, t.reduction_slot(rank, g % t.split)))
                    self.send_partial(vector, buffer, target, arrived, g, sharer)
            else:
                self.send_partial(vector, buffer, slot((0, tidx, g // t.split, rank)), arrived, g, sharer)
        cute.arch.mbarrier_wait(arrived, 0)
        cute.arch.griddepcontrol_wait()  # before writing ``out``: the previous launch may still read it
        sums = cute.make_tensor(buffer, slot)
        rows, cols = out.shape[0], out.shape[1]
        # Every vector at a constant index with the rank as a predicate: indexed by the rank, each store's coordinates
        # were computed at run time, about 60 instructions a store, 1 us of the H200's 2 us reduction at M=64
        # (docs/split-k-reduction.md).
        for g in cutlass.range_constexpr(groups):
            if g % t.split == rank:
                # Here the rank is g % split, a constant, as is every slot; one vector of partials at a time.
                own = g % t.split
                total = None
                for s in cutlass.range_constexpr(t.split):
                    if cutlass.const_expr(t.keeps_own_partials and s == own):
                        part = [acc[g * width + j] for j in range(width)]
                    else:
                        peer = sums[None, tidx, g // t.split, t.reduction_slot(s, own)].load()
                        part = [peer[j] for j in range(width)]
                    total = part if total is None else [a + b for a, b in zip(total, part)]
                if cutlass.const_expr(self.gated):
                    # A gated tactic's vectors are 4 wide (gated_problems): columns m and m + 1 of a gate row,
                    # then of its up row.
                    for j in cutlass.range_constexpr(2):
                        self.store_gated(out, total[j], total[j + 2], coords[g * width + j], row0, col0, repeated)
                else:
                    for j in cutlass.range_constexpr(width):
                        n, m = self.output_index(coords[g * width + j])
                        if cutlass.const_expr(addends is None):
                            value = total[j].to(out.element_type)
                            if self.stores(n, m, row0, col0, rows, cols, repeated):
                                self.store_kept_in_l2(out, row0 + n, col0 + m, value)
                        else:
                            # The residual and bias join the fixed-order sum once, on the rank that stores it.
                            if self.stores(n, m, row0, col0, rows, cols, repeated):
                                value = self.finish(total[j], addends, g * width + j)
                                self.store_kept_in_l2(out, row0 + n, col0 + m, value.to(out.element_type))
