#!/usr/bin/env bash
# test/emu/check_breakages.sh: proof that the emulated suite (test/emu/run_emu_tests.sh) catches bugs.
# It copies the repository's sources into a scratch directory, and for each deliberate breakage in the
# list below (a removed barrier, a wrong mma fragment index, a wrong cuBLASLt epilogue, an off-by-one
# in a vocabulary slice, a missing stream wait, ...):
#   1. replaces one exact piece of source text (it must occur exactly once: a breakage that does not
#      apply proves nothing, and the script stops);
#   2. builds, in the copy, only the emulated binaries the breakage's test needs (make/emu.mk; a
#      breakage that does not compile also stops the script: it would prove nothing either);
#   3. runs that test as run_emu_tests.sh runs it (workbenches with LLMC_EMU_RACECHECK=1,
#      OMP_WAIT_POLICY=passive, the small trainer model) and requires it to FAIL;
#   4. puts the file back (the build directory is kept, so only what depends on it rebuilds).
# First, every test the selected breakages use is run once on the unbroken copy and must pass (else
# a "caught" would prove nothing); --no-baseline skips that (make test runs the unbroken suite).
# Prints "caught: NAME by TEST" with the failure's key line, or "NOT CAUGHT: NAME"; exits 1 if any
# breakage is not caught, 2 if the script cannot do its job (a breakage does not apply or build, or
# a test fails unbroken).
# Some breakages are known gaps: the suite does not catch them, or only in some runs, and the list
# says why (an emulator limit, a test's tolerance or random inputs, a redundant wait, timing). They
# run only with --gaps or by name, reported as "NOT CAUGHT (known gap)" (or caught, by chance), and
# do not change the exit status.
#   test/emu/check_breakages.sh [--no-baseline] [--gaps] [--keep] [--list] [NAME...]
#     (default: every breakage but the known gaps; --list shows them all; --keep keeps the copy)
# Cost on 2 cores with make -j1: about 10 minutes (5.5 without the baseline), most of it building
# test_tp_cuda, test_pp_cuda and train_gpt_emu again after each breakage of a header they include;
# the two FP8 weight-cast breakages add about 3 (test_cuda_model rebuilt twice, 2026-11-26), the five FP8
# gather ones about 5 (train_gpt_emu rebuilt twice);
# the four cp-mesh breakages add about 26 minutes (each rebuilds test_cp_cuda, 4-5 minutes on a
# machine shared with other builds, and runs it on 4 ranks, 0.5-1.5 minutes).
# MAKE_JOBS (default 1) is make's -j. Needs data/ (make default-data: the trainer tests read it); the
# copy links to the repository's.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)

baseline=1 keep=0 list=0 gaps=0
selected=()
for arg in "$@"; do
    case $arg in
        --no-baseline) baseline=0 ;;
        --keep) keep=1 ;;
        --list) list=1 ;;
        --gaps) gaps=1 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "check_breakages.sh: unknown option $arg" >&2; exit 2 ;;
        *) selected+=("$arg") ;;
    esac
done

# ---- the breakages ----
# breakage NAME FILE TEST WHAT OLD NEW [GAP]: in FILE, the text OLD (exactly once) becomes NEW, and
# TEST (see run_test) must fail. GAP, where given, says why the suite does NOT catch it (an emulator
# limit, a test's tolerance, a redundant wait): such a breakage runs only with --gaps or by name, and
# its result does not change the exit status; once it is caught, drop its GAP.
names=()
declare -A file_of old_of new_of test_of what_of gap_of
breakage() {
    names+=("$1")
    file_of[$1]=$2 test_of[$1]=$3 what_of[$1]=$4 old_of[$1]=$5 new_of[$1]=$6 gap_of[$1]=${7:-}
}

# 1. Removed barriers.
breakage layernorm-backward-barrier llmc/kernels/layernorm.cuh "bench layernorm" \
    "layernorm backward: the block sums its warps' shared-memory slices before every warp has written its own" \
    'layernorm_backward_write_partial(float* partials, const float* warp_slices, int C) {
    __syncthreads();' \
    'layernorm_backward_write_partial(float* partials, const float* warp_slices, int C) {'
breakage block-reduce-barrier llmc/kernels/cuda_common.cuh "bench classifier" \
    "block_reduce: the warps' results read from shared memory before every warp has written its own" \
    '    if (lane == 0) shared[warp] = x;
    __syncthreads();' \
    '    if (lane == 0) shared[warp] = x;'
breakage global-norm-tree-barrier llmc/kernels/global_norm.cuh "bench global_norm" \
    "global_norm_final_kernel: the halving tree's steps not separated by a barrier" \
    '        if ((int)threadIdx.x < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];
        __syncthreads();' \
    '        if ((int)threadIdx.x < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];'
breakage encoder-backward-barrier llmc/kernels/encoder.cuh "bench encoder_backward" \
    "encoder backward (wte): warp 0 sums the warps' partial sums before they are all written" \
    '    warp_sums[warp][lane][1] = sum_hi;
    __syncthreads();' \
    '    warp_sums[warp][lane][1] = sum_hi;'
breakage bias-backward-barrier llmc/kernels/matmul.cuh "bench matmul" \
    "bias_backward: a column's lane sums added before every row lane has stored its own" \
    '    mine[1] = make_float4(sum[4], sum[5], sum[6], sum[7]);
    __syncthreads();' \
    '    mine[1] = make_float4(sum[4], sum[5], sum[6], sum[7]);'
breakage attention-forward-barrier llmc/kernels/attention.cuh "bench attention_forward" \
    "attention forward: the K/V tile used after this thread's cp.async wait, not after every thread's" \
    '        cp_async_wait<1>();  // everything but the tile just requested has landed
        __syncthreads();' \
    '        cp_async_wait<1>();  // everything but the tile just requested has landed'
# shellcheck disable=SC2016  # the backquotes are the source's, literal
breakage attention-forward-refill-barrier llmc/kernels/attention.cuh "bench attention_forward" \
    "attention forward: no barrier before the next iteration refills the K/V buffer other warps still read" \
    '        __syncthreads();  // the next iteration refills buffer `buf` with tile + 2
    }' \
    '    }'
breakage attention-dkv-barrier llmc/kernels/attention.cuh "bench attention_backward" \
    "attention backward dK/dV: the Q/dout/lse tile used after this thread's cp.async wait, not every thread's" \
    '        cp_async_wait<1>();
        __syncthreads();
        if (step == 0) {
            load_a_rows<HS, STRIDE>(k_frag, k_s, 16 * warp, lane);' \
    '        cp_async_wait<1>();
        if (step == 0) {
            load_a_rows<HS, STRIDE>(k_frag, k_s, 16 * warp, lane);'

# 2. Wrong mma fragments, ldmatrix and cp.async.
breakage mma-b-operand-order llmc/kernels/attention_tiles.cuh "bench attention_forward" \
    "attention P V product (mma_a_b): the B operand's two k halves (b0, b1) swapped" \
    '                                           (lane / 16) * 8));
            mma_bf16_16816(acc[2 * nn], a[kk], b[0], b[1]);' \
    '                                           (lane / 16) * 8));
            mma_bf16_16816(acc[2 * nn], a[kk], b[1], b[0]);'
breakage mma-a-fragment-index llmc/kernels/attention_tiles.cuh "bench attention_backward" \
    "acc_to_a: an accumulator's rows g+8 packed into A register 2 (columns c+8) and vice versa" \
    '        a[kk][1] = pack_bf16x2(acc[2 * kk][2], acc[2 * kk][3]);
        a[kk][2] = pack_bf16x2(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);' \
    '        a[kk][2] = pack_bf16x2(acc[2 * kk][2], acc[2 * kk][3]);
        a[kk][1] = pack_bf16x2(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);'
breakage ldmatrix-missing-trans llmc/kernels/attention_tiles.cuh "bench attention_forward" \
    "mma_a_b: the [k][n] tile read with ldmatrix without .trans" \
    '            ldmatrix_x4_trans(b, smem_addr(tile + (kk * 16' \
    '            ldmatrix_x4(b, smem_addr(tile + (kk * 16'
breakage wgmma-swizzle-store llmc/kernels/attention_hopper.cuh "bench attention_forward" \
    "attention forward (wgmma): the tiles stored unswizzled while wgmma reads them with the 128-byte swizzle" \
    '    return (uint32_t)(row * HOPPER_ROW_BYTES + ((chunk ^ (row % 8)) * 16));' \
    '    return (uint32_t)(row * HOPPER_ROW_BYTES + chunk * 16);'
breakage wgmma-k-step llmc/kernels/attention_hopper.cuh "bench attention_forward" \
    "attention forward (wgmma): Q and K advanced 16 bytes (8 columns) a step of 16 columns" \
    '    return wgmma::descriptor(tile + 32 * k, 16, HOPPER_ATOM_BYTES, wgmma::Swizzle::Bytes128);' \
    '    return wgmma::descriptor(tile + 16 * k, 16, HOPPER_ATOM_BYTES, wgmma::Swizzle::Bytes128);'
breakage wgmma-v-not-transposed llmc/kernels/attention_hopper.cuh "bench attention_forward" \
    "wgmma_a_b (every wgmma kernel's P V, and the backward's): V read K-major instead of MN-major" \
    'wgmma::mma_rs<HOPPER_HS, true>(flat, a[k], mn_major_desc(b_tile, k), true);' \
    'wgmma::mma_rs<HOPPER_HS, false>(flat, a[k], mn_major_desc(b_tile, k), true);'
breakage wgmma-no-wait llmc/kernels/attention_hopper.cuh "bench attention_forward" \
    "wgmma_a_bt (every wgmma kernel's S, and the backward's): read before wgmma.wait_group retires it" \
    '    wgmma::commit_group();
    wgmma::wait_group<0>();
    wgmma::fence_operands(flat);
}
// acc (64 x 64) += A' \
    '    wgmma::commit_group();
    wgmma::fence_operands(flat);
}
// acc (64 x 64) += A'
breakage wgmma-refill-barrier llmc/kernels/attention_hopper.cuh "bench attention_forward" \
    "attention forward (wgmma): no barrier before the next tile is copied over the one just read" \
    '        __syncthreads();  // the next iteration refills buffer `buf` with tile + 2' \
    '        // (no barrier)'
breakage wgmma-dq-operand llmc/kernels/attention_hopper.cuh "bench attention_backward" \
    "attention backward (wgmma, and TMA: dq_tile): dQ += dS V instead of dS K" \
    '    wgmma_a_b<BN>(dq, ds_frag, k_tile);' \
    '    wgmma_a_b<BN>(dq, ds_frag, v_tile);'
breakage wgmma-dkv-float-buffer llmc/kernels/attention_hopper.cuh "bench attention_backward" \
    "attention backward (wgmma): the next step's Q, dout, lse and D copied over the ones in use" \
    '        if (step + 1 < num_steps) load_step(step + 1, buf ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        wgmma::fence_proxy_async();' \
    '        if (step + 1 < num_steps) load_step(step + 1, buf);
        cp_async_commit();
        cp_async_wait<1>();
        wgmma::fence_proxy_async();'
breakage tma-no-empty-wait llmc/kernels/attention_hopper_tma.cuh "bench attention_forward" \
    "attention forward (TMA): the producer refills a stage without waiting for its consumers to free it" \
    '            if (tile >= STAGES) tma::mbarrier_wait(&empty[s], (tile / STAGES - 1) & 1);' \
    '            // (no wait for the stage to be free)'
breakage tma-no-v-wait llmc/kernels/attention_hopper_tma.cuh "bench attention_forward" \
    "attention forward (TMA): P V read V's stage without waiting for its copy" \
    '        tma::mbarrier_wait(&v_full[s], parity);' \
    '        // (no wait for V)'
breakage tma-parity llmc/kernels/attention_hopper_tma.cuh "bench attention_forward" \
    "attention forward (TMA): the consumers wait on the tile's parity, not the stage's use (tile & 1)" \
    '        const uint32_t parity = (tile / STAGES) & 1;' \
    '        const uint32_t parity = tile & 1;'
breakage tma-expect-bytes llmc/kernels/attention_hopper_tma.cuh "bench attention_forward" \
    "attention forward (TMA): K's barrier armed with half the tile's bytes" \
    '            tma::mbarrier_arrive_expect_tx(&k_full[s], KV_BYTES);' \
    '            tma::mbarrier_arrive_expect_tx(&k_full[s], KV_BYTES / 2);'
breakage tma-dkv-floats-early llmc/kernels/attention_hopper_tma.cuh "bench attention_backward" \
    "attention backward (TMA): the producer stores a tile's lse and D before the stage is free" \
    '            if (step >= STAGES) tma::mbarrier_wait(&m.empty[s], (step / STAGES - 1) & 1);
            // lse and D of the tile' \
    '            // lse and D of the tile'
breakage tma-dkv-one-arrival llmc/kernels/attention_hopper_tma.cuh "bench attention_backward" \
    "attention backward (TMA): the dK/dV stages' full barriers expect one arrival, not the 32 storing threads'" \
    '    init_backward_barriers(m, 32);' \
    '    init_backward_barriers(m, 1);'
breakage tma-dq-no-full-wait llmc/kernels/attention_hopper_tma.cuh "bench attention_backward" \
    "attention backward (TMA): the dQ kernel's consumers read K and V without waiting for their copies" \
    '        tma::mbarrier_wait(&m.full[s], (tile / STAGES) & 1);
        if (group_active && (!CAUSAL || key0 <= group_first + 63))' \
    '        if (group_active && (!CAUSAL || key0 <= group_first + 63))'
breakage tma-backward-smem-size llmc/kernels/attention_hopper_tma.cuh "bench attention_backward" \
    "attention backward (TMA): the shared memory asked for leaves out the stages' pads to 1024 bytes" \
    '    static constexpr size_t SMEM_BYTES = HOPPER_ATOM_BYTES + OWN_BYTES + STAGES * STAGE_STRIDE + 8 * BARRIERS;' \
    '    static constexpr size_t SMEM_BYTES = HOPPER_ATOM_BYTES + OWN_BYTES + STAGES * STAGE_BYTES + 8 * BARRIERS;'
breakage tma-forward-base-pad llmc/kernels/attention_hopper_tma.cuh "bench attention_forward" \
    "attention forward (TMA): the shared memory asked for leaves out the base's pad to 1024 bytes" \
    '    static constexpr size_t SMEM_BYTES = HOPPER_ATOM_BYTES + HOPPER_Q_BYTES + 2 * STAGES * KV_BYTES + 8 * BARRIERS;' \
    '    static constexpr size_t SMEM_BYTES = HOPPER_Q_BYTES + 2 * STAGES * KV_BYTES + 8 * BARRIERS;'
breakage wgmma-dkv-diagonal llmc/kernels/attention_hopper.cuh "bench attention_backward" \
    "attention backward (wgmma, and TMA: backward_probabilities_t): each key's own query masked out of dK, dV" \
    '            pt[n][e] = needs_mask && ((CAUSAL && query < key) || query >= T) ? 0.0f : p;' \
    '            pt[n][e] = needs_mask && ((CAUSAL && query <= key) || query >= T) ? 0.0f : p;'
breakage cp-async-wait-count llmc/kernels/attention.cuh "bench attention_forward" \
    "attention forward: cp.async.wait_group 2 instead of 1 (the tile in use may still be in flight)" \
    '        cp_async_wait<1>();  // everything but the tile just requested has landed' \
    '        cp_async_wait<2>();  // everything but the tile just requested has landed'

# 3. Wrong epilogues and transposes.
breakage gelu-epilogue llmc/kernels/matmul.cuh "bench matmul" \
    "matmul_forward: the fc layer's GELU_AUX_BIAS epilogue replaced by BIAS (no GELU, pre_gelu unwritten)" \
    '(bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)' \
    '(bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)'
breakage dgelu-epilogue llmc/kernels/matmul.cuh "model" \
    "matmul_backward: the DGELU epilogue dropped (the fc layer's dinp not multiplied by GELU')" \
    '        g.epilogue = pre_gelu ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT;' \
    '        g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;'
breakage split-k-last-slice llmc/kernels/matmul.cuh "bench matmul" \
    "run_accumulating: the shorter last slice of a split weight gradient never computed" \
    '        if (full < split.slices) run_slices(full, 1, split.last_k(g.k), false);' \
    '        (void)full;'
breakage split-k-stride llmc/kernels/matmul.cuh "bench matmul" \
    "run_accumulating: the slices of an untransposed A advanced one row, not slice_k columns" \
    '        slice.stride_a = g.transpose_a ? split.slice_k : (int64_t)split.slice_k * slice.lda;' \
    '        slice.stride_a = split.slice_k;'
breakage split-k-sum llmc/kernels/matmul.cuh "bench matmul" \
    "split_k_sum_kernel: the partials summed from the second slice on (the first one lost)" \
    '    float4 sum = *reinterpret_cast<const float4*>(partials + i);
    for (int s = 1; s < slices; s++) {' \
    '    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 1; s < slices; s++) {'
breakage dweight-transpose llmc/kernels/matmul.cuh "model" \
    "matmul_backward: the weight gradient's dout operand not transposed" \
    '    g.transpose_b = true;
    g.b = dout;  // dout^T as a column-major (OC x BT); op_T makes it dout (BT x OC)' \
    '    g.transpose_b = false;
    g.b = dout;  // dout^T as a column-major (OC x BT); op_T makes it dout (BT x OC)'

# 4. Off-by-one in a vocabulary slice.
breakage vocab-slice-dlogits llmc/kernels/classifier.cuh "bench vocab_parallel" \
    "classifier_from_stats: the slice's first padding column (col == real) given a gradient" \
    '            if (col < real) {' \
    '            if (col <= real) {'
breakage vocab-slice-model-end llmc/models/cuda_model.cuh "tp" \
    "the model's embedding range ends one token early (vocab_begin + Vl - 1: the slice's last token gets 0)" \
    'param(P.wte), vocab_begin(), vocab_begin() + Vl, BT, C,' \
    'param(P.wte), vocab_begin(), vocab_begin() + Vl - 1, BT, C,'
breakage vocab-slice-embedding llmc/kernels/encoder.cuh "bench vocab_parallel" \
    "embedding_forward_range: token vocab_end (the next slice's first) also taken as this slice's" \
    '    if (token >= vocab_begin && token < vocab_end) {' \
    '    if (token >= vocab_begin && token <= vocab_end) {' \
    "caught by chance only: the workbench's tokens are random (seeded by the clock) and hold a \
slice's end token in about 1 run of 3 (--seed 4 does, 1, 2, 3, 5 and 6 do not); test_tp_cuda's \
batches hold token 128 (rank 0's vocab_end) 20 times, but the wrong row it gets (the one past rank \
0's slice) moves its losses by 6.6e-5 (2.6e-5 unbroken), under its 1e-2 tolerance"

# 5. Missing stream waits.
breakage staged-order-after llmc/dist/staged_comm.cuh "tp" \
    "StagedComm::order_after: the host no longer waits for the compute stream before staging a collective" \
    '        if (world_size() > 1) CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(cuda_event)));' \
    '        (void)cuda_event;'
breakage tp-after-compute llmc/models/cuda_model.cuh "tp" \
    "CUDAModel::after_compute: tensor-parallel collectives no longer ordered after the compute stream" \
    '    CommHandle after_compute(Issue issue) {
        before_messages(tp_comm_);' \
    '    CommHandle after_compute(Issue issue) {'
breakage pp-activation-send llmc/dist/pipeline_stage.h "pp" \
    "pipeline: a stage's output activations sent without ordering after the compute that writes them" \
    '                const PipelineLink& link = links.send_activations;
                stage.before_messages(*link.comm);
                slot_send[slot]' \
    '                const PipelineLink& link = links.send_activations;
                slot_send[slot]'
breakage snapshot-wait llmc/dist/device_memory.cuh "ckpt" \
    "checkpoint snapshot: the copy stream no longer waits for the compute stream before copying" \
    '        CUDA_CHECK(cudaStreamWaitEvent(copy_stream_.get(), snapshot_ready_.get(), 0));' \
    '' \
    "caught by timing only (in 7 runs of 16): the copies run when the background checkpoint writer \
waits for them, reading stale parameters (caught) if that is before the training thread's next loss \
read runs the step's update, the right ones if after; with --ckpt-sync 1 (written on the training \
thread) it is caught every time (6 of 6), but the suite resumes only asynchronously written checkpoints"
breakage nccl-wait-for llmc/dist/comm_nccl.cuh "tp-nccl" \
    "NcclComm::wait_for: the NCCL stream no longer waits for the compute stream's event" \
    '        CUDA_CHECK(cudaStreamWaitEvent(state_->stream, compute_done, 0));' \
    '        (void)compute_done;'
breakage nccl-wait-for-dp llmc/dist/comm_nccl.cuh "dp-nccl" \
    "the same missing wait, against the data-parallel suite's 2-rank NCCL run only" \
    '        CUDA_CHECK(cudaStreamWaitEvent(state_->stream, compute_done, 0));' \
    '        (void)compute_done;' \
    "caught by timing only (in 1 run of 3, when the stale reduce-scatters leave NaN in the parameters): \
otherwise they read stale gradients and the 2-rank run only learns slower (losses 0.0029 relative \
from 1 rank by step 20, 7e-6 unbroken), under run_gpu_dp_tests.sh's 2e-2 (the tp suite's NCCL run \
catches it every time: nccl-wait-for)"
breakage update-after-snapshot llmc/dist/device_memory.cuh "ckpt" \
    "DeviceMemory::before_update: the optimizer no longer waits on the device for the snapshot's copies" \
    '    void before_update() { CUDA_CHECK(cudaStreamWaitEvent(stream_, snapshot_copied_.get(), 0)); }' \
    '    void before_update() {}' \
    "redundant in the trainer: CheckpointWriter::before_update (train_loop.h) waits on the host \
(wait_snapshot) for the copies before every adamw_step"

# 6. A launch the card refuses, though its results would be right.
breakage gelu-launch-bounds llmc/kernels/gelu.cuh "bench gelu" \
    "gelu_forward: 512 threads per block for a kernel declared __launch_bounds__(256) (the grid still covers n)" \
    'LLMC_LAUNCH(gelu_forward_kernel, blocks, GELU_BLOCK_SIZE, 0, stream)' \
    'LLMC_LAUNCH(gelu_forward_kernel, blocks, 2 * GELU_BLOCK_SIZE, 0, stream)'

# 7. Context parallelism's ring pairs (the workbenches' ring checks).
breakage ring-merge-no-rescale llmc/kernels/attention.cuh "bench attention_forward" \
    "attention_merge: the running output and the pair's added with weight 1 (no exp(lse - lse_new) rescale)" \
    'acc[at + c + i] = (first ? 0.0f : acc[at + c + i] * w_old) + (float)o[i] * w_pair;' \
    'acc[at + c + i] = (first ? 0.0f : acc[at + c + i]) + (float)o[i];'
breakage ring-diagonal-unmasked llmc/kernels/attention.cuh "bench attention_forward" \
    "attention_forward_pair: the pair of a chunk with itself run without the causal mask" \
    '        if (causal) attention_forward_launch<H, true>(out, lse, q_qkv, kv_qkv, B, rows, heads, stream);' \
    '        if (causal) attention_forward_launch<H, false>(out, lse, q_qkv, kv_qkv, B, rows, heads, stream);'
breakage ring-earlier-chunk-masked llmc/kernels/attention.cuh "bench attention_forward" \
    "attention forward: a pair with an earlier key chunk masked causally (key > row) in its last key tile" \
    '                        if (key > (CAUSAL ? row : T - 1)) s[n][e] = -INFINITY;' \
    '                        if (key > row) s[n][e] = -INFINITY;'
breakage ring-backward-diagonal-unmasked llmc/kernels/attention.cuh "bench attention_backward" \
    "attention_backward_pair: the pair of a chunk with itself run without the causal mask" \
    '            attention_backward_launch<H, true>(dq_acc, dkv_acc, C, kv, dout, q_qkv, kv_qkv, lse, D, B, rows, heads, stream);' \
    '            attention_backward_launch<H, false>(dq_acc, dkv_acc, C, kv, dout, q_qkv, kv_qkv, lse, D, B, rows, heads, stream);'

# 8. Context parallelism with tensor and pipeline parallelism (the CUDA model's meshes).
breakage cp-tp-plain-attention-backward llmc/models/cuda_model.cuh "cp-mesh" \
    "layer_backward_tensor_parallel: attention's backward over the rank's own rows, not around the ring" \
    '                            a.atty.at(l), param(P.attproj_w, l), nullptr, BT, Cl, C, s);
        }
        attention_layer_backward(a, l, B, T, NH, HS);' \
    '                            a.atty.at(l), param(P.attproj_w, l), nullptr, BT, Cl, C, s);
        }
        attention_backward(a.d3C, a.scratch, a.dC, a.qkv.at(l), a.atty.at(l), a.lse.at(l), B, T, NH, HS, s);'
breakage cp-tp-embedding-positions llmc/models/cuda_model.cuh "cp-mesh" \
    "the vocabulary-parallel embedding adds the positions of rows 0..T-1, not the rank's global positions" \
    'add_positions(x, reduced(a.partial, x), param(P.wpe), row0, n, T, C, s, a.positions);' \
    'add_positions(x, reduced(a.partial, x), param(P.wpe), row0, n, T, C, s);'
breakage cp-pp-loss-not-summed llmc/models/cuda_model.cuh "cp-mesh" \
    "run_schedule: each micro-batch's loss the mean of the rank's rows, not summed over the context group" \
    'loss_sum += group_mean(pinned_losses_.get() + (size_t)mb * BT, BT);' \
    'loss_sum += mean_of(pinned_losses_.get() + (size_t)mb * BT, BT);'
breakage cp-pp-batch-not-cut llmc/models/cuda_model.cuh "cp-mesh" \
    "forward_backward_step: the pipeline's micro-batches not cut to the rank's positions" \
    'return run_schedule(local.inputs, local.targets, micro_batches, B, local.T, grad_scale);' \
    'return run_schedule(inputs, targets, micro_batches, B, local.T, grad_scale);'

# 9. FP8 (llmc/kernels/fp8.cuh, matmul.cuh's FP8 products, the weights' casts once a step).
breakage fp8-cast-transpose-barrier llmc/kernels/fp8.cuh "bench fp8" \
    "fp8_cast: the transpose read from the tile before every thread has written its codes" \
    '    if (a.qt) {
        __syncthreads();' \
    '    if (a.qt) {'
breakage fp8-cast-no-saturation llmc/kernels/fp8.cuh "bench fp8" \
    "fp8_cast: encoded without saturation (beyond the range becomes NaN, not the largest value)" \
    '__nv_cvt_float_to_fp8(scaled, __NV_SATFINITE, a.format)' '__nv_cvt_float_to_fp8(scaled, __NV_NOSAT, a.format)'
breakage fp8-product-wrong-scale llmc/kernels/matmul.cuh "bench fp8" \
    "FP8 products: B multiplied by A's inverse scale" \
    'g.b = b.data, g.b_type = b.type, g.b_scale = b.scale_inv;' 'g.b = b.data, g.b_type = b.type, g.b_scale = a.scale_inv;'
breakage split-k-transposed-stride llmc/kernels/matmul.cuh "bench fp8" \
    "run_accumulating: the slices of a transposed A (FP8's codes, stored along k) advanced whole columns" \
    '        slice.stride_a = g.transpose_a ? split.slice_k : (int64_t)split.slice_k * slice.lda;' \
    '        slice.stride_a = (int64_t)split.slice_k * slice.lda;'
breakage fp8-delayed-history-short llmc/kernels/fp8.cuh "bench fp8" \
    "fp8_delayed_update: the history's largest amax taken without its last slot" \
    'for (uint32_t h = 0; h < s.history_count; h++) m = fmaxf(m, ring[h]);' \
    'for (uint32_t h = 0; h + 1 < s.history_count; h++) m = fmaxf(m, ring[h]);'
breakage fp8-weights-stale-after-adamw llmc/dist/zero.h "model" \
    "ZeroEngine::adamw_step: the parameter version not advanced, so the FP8 weights cast before the update stay in use" \
    '        params_version_++, shared_params_version_++;
        invalidate_gathered();
    }

    // Drops every gathered' \
    '        shared_params_version_++;
        invalidate_gathered();
    }

    // Drops every gathered'
breakage fp8-weights-stale-after-set llmc/dist/zero.h "model" \
    "ZeroEngine::set_params: the parameter version not advanced, so new weights are multiplied as the old ones' FP8 copies" \
    '        params_version_++, shared_params_version_++;
        invalidate_gathered();
    }

    // Writes every master weight' \
    '        shared_params_version_++;
        invalidate_gathered();
    }

    // Writes every master weight'

breakage fp8-fused-amax-gelu-backward llmc/kernels/gelu.cuh "bench gelu" \
    "gelu_backward_inplace: the fc gradient's amax measured from the incoming gradient, not the result the cast reads" \
    '                m = fmaxf(m, fabsf(__bfloat162float(d[k])));
            }
            store128(d_in_out + i, d);' \
    '            }
            for (int k = 0; k < x128::size; k++) m = fmaxf(m, fabsf(__bfloat162float(load128(d_in_out + i)[k])));
            store128(d_in_out + i, d);'
breakage fp8-fused-amax-layernorm-missing llmc/kernels/layernorm.cuh "bench layernorm" \
    "layernorm_forward: the amax asked for never measured" \
    '    if (amax) block_amax_into(amax, largest, shared);' ''
breakage fp8-fused-amax-layernorm-backward-input llmc/kernels/layernorm.cuh "bench layernorm" \
    "layernorm_backward: the residual gradient's amax taken from the incoming gradient, not the sum it writes" \
    '        largest = fmaxf(largest, fabsf(__bfloat162float(dx_new[i])));' \
    '        largest = fmaxf(largest, fabsf(__bfloat162float(dx[i])));'
breakage fp8-gather-unpack-offset llmc/kernels/fp8.cuh "bench fp8" \
    "fp8_unpack: a weight piece's codes landed a byte past their place (but the first piece's)" \
    '    uint8_t* out = codes + p.dst;' '    uint8_t* out = codes + p.dst + (p.dst > 0);'
breakage fp8-gather-scale-stride llmc/kernels/fp8.cuh "bench fp8" \
    "fp8_pack: a weight's scale looked up without the scales' stride (another tensor's scale)" \
    'Fp8Scale* s = a.scales + (size_t)p.tensor * a.stride;' 'Fp8Scale* s = a.scales + (size_t)p.tensor;'
breakage fp8-gather-clips-one-rank llmc/kernels/fp8.cuh "bench fp8" \
    "fp8_clip_sum: rank 0's clipping counts taken for every rank's" \
    'const Fp8Clip& c = all[(size_t)r * tensors + i];' 'const Fp8Clip& c = all[i];'
breakage fp8-gather-packed-once llmc/models/cuda/fp8_linears.cuh "fp8-gather" \
    "Fp8LinearsCUDA::pack: the slices packed once, never again after the weights or their scales change" \
    'if (version != packed_version_ || scales_epoch_ != packed_scales_epoch_) pack_weights(shard, version);' \
    'if (packed_version_ == 0) pack_weights(shard, version);'
breakage fp8-gather-local-version llmc/dist/zero.h "fp8-gather-fault" \
    "ZeroEngine::prefetch_params: the packing decided on the rank's own parameter version (a flipped bit makes one rank pack, and exchange, alone)" \
    'codec_->pack(bucket, params_shard_, shared_params_version_)' 'codec_->pack(bucket, params_shard_, params_version_)'

# 10. Mixture of experts (kernels/moe.cuh; the workbench against cpu/moe.h, the model against CPUModel).
breakage moe-top-k-ties-high llmc/kernels/moe.cuh "bench moe" \
    "moe_route_kernel: ties in the top-K go to the higher expert index, not the lower" \
    'if (!taken && (best < 0 || p[e] > p[best])) best = e;' \
    'if (!taken && (best < 0 || p[e] >= p[best])) best = e;'
breakage moe-capacity-off-by-one llmc/kernels/moe.cuh "bench moe" \
    "moe_assign_kernel: each expert keeps one token more than its capacity" \
    '                if (taken[e] < capacity) {' \
    '                if (taken[e] <= capacity) {'
breakage moe-no-gate-gradient llmc/kernels/moe.cuh "bench moe" \
    "moe_combine_backward_kernel: the gates' gradient (dout . y) never reaches the router (only the auxiliary losses' does)" \
    '        if (lane == 0) dp[e] += dgate;' \
    '        (void)dgate;'
breakage moe-no-router-weight-gradient llmc/kernels/moe.cuh "bench moe" \
    "moe_router_weight_backward_kernel: the router's weight gradient is not added" \
    '    drouter[i] += sum;' \
    '    (void)sum;'
breakage moe-shared-expert-gradient-lost llmc/models/cuda_model.cuh "model" \
    "CUDAModel::mlp_backward: the experts' input gradient overwrites the shared expert's instead of adding to it" \
    'moe_backward(matmul_, a.dC, dense, g,' \
    'moe_backward(matmul_, a.dC, false, g,'

# 11. Llama's elementwise layers (kernels/rmsnorm.cuh, rope.cuh, swiglu.cuh; dev/cuda/llama_layers.cu
# against cpu/llama_ops.h).
breakage rmsnorm-no-eps llmc/kernels/rmsnorm.cuh "bench llama_layers" \
    "rmsnorm forward: rstd = 1 / sqrt(mean(x^2)), eps left out (rows of small scale are where it shows)" \
    'const float s = 1.0f / sqrtf(warp_reduce_sum(squares) / C + RMSNORM_EPS);' \
    'const float s = 1.0f / sqrtf(warp_reduce_sum(squares) / C);'
breakage rmsnorm-backward-no-mean-term llmc/kernels/rmsnorm.cuh "bench llama_layers" \
    "rmsnorm backward: dinp without the term through rstd's dependence on the whole row (norm * mean(dnorm * norm))" \
    '(dnorm - norm * dnorm_norm_mean) * s);' \
    'dnorm * s);'
breakage rmsnorm-backward-barrier llmc/kernels/rmsnorm.cuh "bench llama_layers" \
    "rmsnorm backward: the block sums its warps' shared-memory slices before every warp has written its own" \
    'rmsnorm_backward_write_partial(float* partials, const float* warp_slices, int C) {
    __syncthreads();' \
    'rmsnorm_backward_write_partial(float* partials, const float* warp_slices, int C) {'
breakage rope-adjacent-pairs llmc/kernels/rope.cuh "bench llama_layers" \
    "rope: channel i rotated with its neighbour (the adjacent pairs of Meta's layout) instead of channel i + HS/2" \
    'const float x0 = __bfloat162float(lo[k]), x1 = __bfloat162float(hi[k]);' \
    'const float x0 = __bfloat162float(lo[k]), x1 = __bfloat162float(lo[k ^ 1]);'
breakage rope-positions-ignored llmc/kernels/rope.cuh "bench llama_layers" \
    "rope_table: the given (context-parallel, global) positions ignored, every sequence at 0..T-1" \
    'const double pos = positions ? positions[t] : t;' \
    'const double pos = t;'
breakage swiglu-backward-no-sigmoid-derivative llmc/kernels/swiglu.cuh "bench llama_layers" \
    "swiglu backward: dgate = dout * up * sigmoid(gate), silu's derivative without its g s (1 - s) term" \
    'dk * __bfloat162float(u[k]) * s * (1.0f + gk * (1.0f - s))' \
    'dk * __bfloat162float(u[k]) * s'

# 12. A Llama on the CUDA model (test_cuda_model's Llama cases against the CPU model, FP8 products
# included; test_cp_cuda's Llama step on cp 2).
breakage attention-gqa-first-head-only llmc/kernels/attention.cuh "bench attention_backward" \
    "attention backward dK/dV (mma.sync): each kv head's dk, dv summed over the first query head of its group only" \
    '    const int num_steps = G * num_tiles;
    auto load_step' \
    '    const int num_steps = num_tiles;
    auto load_step'
breakage attention-gqa-kv-head llmc/kernels/attention_tiles.cuh "bench attention_forward" \
    "attention (every kernel): query head h reads kv head h % KVH (interleaved groups) instead of h / (NH / KVH)" \
    '__host__ __device__ int kv_of(int h) const { return h / (NH / KVH); }' \
    '__host__ __device__ int kv_of(int h) const { return h % KVH; }'
breakage wgmma-gqa-first-head-only llmc/kernels/attention_hopper.cuh "bench attention_backward" \
    "attention backward dK/dV (wgmma): each kv head's dk, dv summed over the first query head of its group only" \
    '    const int num_steps = G * num_tiles;
    auto load_step' \
    '    const int num_steps = num_tiles;
    auto load_step'
breakage tma-gqa-producer-head llmc/kernels/attention_hopper_tma.cuh "bench attention_backward" \
    "attention backward dK/dV (TMA): the producer streams the group's first query head's lse and D for every head" \
    'const float* lse_head = lse + ((size_t)b * NH + h) * rows.q_rows;' \
    'const float* lse_head = lse + ((size_t)b * NH + j * G) * rows.q_rows;'
breakage llama-cuda-no-rope-backward llmc/models/cuda_model.cuh "model" \
    "CUDAModel::attention_layer_backward: the qkv gradient is not rotated back (no table for the fused RoPE backward)" \
    'const float* rope = widths_.rotary ? a.rope : nullptr;' \
    'const float* rope = nullptr;'
breakage attention-rope-backward-direction llmc/kernels/attention_tiles.cuh "bench attention_backward" \
    "attention backward, RoPE's backward fused in write_rows: the first half of each pair rotated by +angle" \
    'v[n][k] = x0 * ck + x1 * sk;' \
    'v[n][k] = x0 * ck - x1 * sk;'
breakage llama-fp8-qkv-first-tensor-only llmc/models/cuda/fp8_gather.cuh "model" \
    "Fp8BlockWeights: the qkv product's FP8 copy sized by its query rows only (a Llama's wq without wkv)" \
    'size{w.qkv * C, C * C, w.up * C, C * w.hidden}' \
    'size{(size_t)w.heads * w.head_size * C, C * C, w.up * C, C * w.hidden}'
breakage llama-cp-no-rope-backward llmc/models/cuda_model.cuh "cp2" \
    "CUDAModel::attention_layer_backward: around the ring the qkv gradient is not rotated back" \
    '            if (rope) rope_backward(a.d3C, rope, B, T, NH, KVH, HS, stream_.get());' \
    ''
breakage llama-cp-local-positions llmc/models/cuda_model.cuh "cp2" \
    "CUDAModel::forward_chunk: RoPE at each rank's local positions 0..T/cp-1, not its rows' global ones" \
    'rope_table(a.rope, T, widths_.head_size, config_.rope_theta, a.positions, s);' \
    'rope_table(a.rope, T, widths_.head_size, config_.rope_theta, nullptr, s);'
breakage llama-cp-ring-row-width llmc/models/cuda/ring_attention.cuh "cp2" \
    "CudaRingAttention::forward: the second key chunk found 3 NH HS elements a row in (as if every head had its own k, v)" \
    'qkv + q * width, held + k * width, B,' \
    'qkv + q * width, held + k * 3 * C, B,'

if [ "$list" = 1 ]; then
    for n in "${names[@]}"; do
        printf '%-32s %-24s %s\n' "$n" "${test_of[$n]}" "${what_of[$n]}"
        [ -z "${gap_of[$n]}" ] || printf '%-32s %-24s %s\n' "" "" "(known gap: ${gap_of[$n]})"
    done
    exit 0
fi
if [ ${#selected[@]} -eq 0 ]; then
    for n in "${names[@]}"; do
        if [ -z "${gap_of[$n]}" ] || [ "$gaps" = 1 ]; then selected+=("$n"); fi
    done
fi
for n in "${selected[@]}"; do
    [ -n "${file_of[$n]:-}" ] || { echo "check_breakages.sh: no breakage named $n (--list)" >&2; exit 2; }
done

# ---- the tests: TEST -> the make targets it needs and how it runs (as run_emu_tests.sh runs it) ----
# The trainer runs' model and T: run_emu_tests.sh's (read from the copy, below).
export LLMC_EMULATED=1
export OMP_WAIT_POLICY=passive
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
emu=build/emu

targets_of() {
    case $1 in
        bench\ *) echo "$emu/cuda/${1#bench }" ;;
        model) echo "$emu/test_cuda_model" ;;
        tp) echo "$emu/test_tp_cuda" ;;
        pp) echo "$emu/test_pp_cuda" ;;
        cp-mesh | cp2) echo "$emu/test_cp_cuda" ;;
        dp-nccl | tp-nccl | ckpt | fp8-gather | fp8-gather-fault) echo "train_gpt_emu" ;;
        *) echo "check_breakages.sh: unknown test $1" >&2; exit 2 ;;
    esac
}
describe() {
    case $1 in
        bench\ *) echo "$emu/cuda/${1#bench } --check (LLMC_EMU_RACECHECK=1)" ;;
        model) echo "$emu/test_cuda_model" ;;
        tp) echo "mpirun -np 2 $emu/test_tp_cuda DIR 2 (test/gpu/run_gpu_tp_tests.sh)" ;;
        pp) echo "mpirun -np 2 $emu/test_pp_cuda DIR 2 1 1 (test/gpu/run_gpu_pp_tests.sh)" ;;
        cp-mesh) echo "mpirun -np 4 $emu/test_cp_cuda DIR cp2.tp2 cp2.tp2.sp0 pp2.cp2 (test/gpu/run_gpu_cp_tests.sh)" ;;
        cp2) echo "mpirun -np 2 $emu/test_cp_cuda DIR cp2 (test/gpu/run_gpu_cp_tests.sh)" ;;
        dp-nccl) echo "the 2-rank --gpu-comm nccl run against 1 rank (test/mpi/run_gpu_dp_tests.sh)" ;;
        tp-nccl) echo "the --tp 2 --gpu-comm nccl run against 1 rank (test/gpu/run_gpu_tp_tests.sh)" ;;
        ckpt) echo "a run resumed from its step-8 checkpoint against the uninterrupted run (test/gpu/run_gpu_ckpt_tests.sh)" ;;
        fp8-gather) echo "ZeRO-3 on 2 ranks, the weights gathered as FP8 codes against bf16 (test/gpu/run_gpu_fp8_tests.sh)" ;;
        fp8-gather-fault) echo "ZeRO-3 FP8 on 2 ranks, a bit flipped on rank 1 after a skipped step (test/gpu/run_gpu_fp8_tests.sh)" ;;
    esac
}
# run_test TEST: in the copy, output to stdout; the exit status is the test's. (Every step checks its
# own status: set -e does not act inside a function called as a condition.)
run_test() {
    local t=$1 d
    d=$(mktemp -d "$scratch/run.XXXXXX")
    case $t in
        bench\ *) LLMC_EMU_RACECHECK=1 timeout 600 "$emu/cuda/${t#bench }" --check ;;
        model) timeout 600 "$emu/test_cuda_model" ;;
        tp) timeout 600 mpirun --oversubscribe -np 2 "$emu/test_tp_cuda" "$d" 2 ;;
        pp) timeout 600 mpirun --oversubscribe -np 2 "$emu/test_pp_cuda" "$d" 2 1 1 ;;
        cp-mesh) timeout 600 mpirun --oversubscribe -np 4 "$emu/test_cp_cuda" "$d" cp2.tp2 cp2.tp2.sp0 pp2.cp2 ;;
        cp2) timeout 600 mpirun --oversubscribe -np 2 "$emu/test_cp_cuda" "$d" cp2 ;;
        dp-nccl)  # run_gpu_dp_tests.sh's 1-rank reference and its 2-rank NCCL run, compared by its lib.sh
            (
                # shellcheck source=/dev/null  # the copy's test/gpu/lib.sh
                source test/gpu/lib.sh
                dir=$d trainer=./timed_train_gpt_emu
                common=("${test_model[@]}" -t "$test_T" -d $((16 * test_T)) -x 20 -v 0 -s 0 -l 1e-3 --gpu-comm mpi)
                run one 1 16 -z 0 || { tail -n 20 "$dir/one.log"; exit 1; }
                echo "== nccl2: mpirun -np 2 --gpu-comm nccl, ZeRO-1"
                timeout 300 mpirun -np 2 "$trainer" "${common[@]/mpi/nccl}" -b 8 -z 1 -o "$dir/nccl2" > "$dir/nccl2.log" ||
                    { tail -n 20 "$dir/nccl2.log"; exit 1; }
                grep -q "collectives over NCCL" "$dir/nccl2.log" || { echo "FAIL the 2-rank NCCL run did not use NCCL"; exit 1; }
                compare one nccl2 2e-2
            ) ;;
        tp-nccl)  # run_gpu_tp_tests.sh's 1-rank reference and its --tp 2 NCCL run
            (
                # shellcheck source=/dev/null  # the copy's test/gpu/lib.sh
                source test/gpu/lib.sh
                dir=$d trainer=./timed_train_gpt_emu
                common=("${test_model[@]}" -t "$test_T" -d $((16 * test_T)) -x 20 -v 0 -s 0 -l 1e-3 --gpu-comm mpi)
                run one 1 16 || { tail -n 20 "$dir/one.log"; exit 1; }
                echo "== nccl: mpirun -np 2 --tp 2 --gpu-comm nccl"
                timeout 300 mpirun -np 2 "$trainer" "${common[@]/mpi/nccl}" -b 16 --tp 2 -o "$dir/nccl" > "$dir/nccl.log" ||
                    { tail -n 20 "$dir/nccl.log"; exit 1; }
                grep -q "collectives over NCCL" "$dir/nccl.log" || { echo "FAIL the NCCL run did not use NCCL"; exit 1; }
                compare one nccl 2e-2
            ) ;;
        ckpt)  # run_gpu_ckpt_tests.sh's first check: resumed from ckpt_00000008, bitwise the uninterrupted run
            (
                # shellcheck source=/dev/null  # the copy's test/gpu/lib.sh
                source test/gpu/lib.sh
                dir=$d trainer=./timed_train_gpt_emu
                common=("${test_model[@]}" -b 8 -t "$test_T" -x 16 -v 0 -s 0 -l 1e-3 -n 8 -nk 0)
                "$trainer" "${common[@]}" -o "$dir/ref" > "$dir/ref.log" || { tail -n 20 "$dir/ref.log"; exit 1; }
                mkdir -p "$dir/resumed"
                cp -r "$dir/ref/ckpt_00000008" "$dir/resumed/" || exit 1
                "$trainer" "${common[@]}" -o "$dir/resumed" -y 1 > "$dir/resumed.log" || { tail -n 20 "$dir/resumed.log"; exit 1; }
                grep -q "resumed from $dir/resumed/ckpt_00000008" "$dir/resumed.log" || { echo "FAIL no resume"; exit 1; }
                cmp "$dir/ref/model.bin" "$dir/resumed/model.bin" || { echo "FAIL model.bin differs after resume"; exit 1; }
                ck() { sed -nE 's/.*"step":([0-9]+),.*"train_loss":([-0-9.e+]+).*/\1 \2/p' "$1/metrics.jsonl" | tail -8; }
                diff <(ck "$dir/ref") <(ck "$dir/resumed") || { echo "FAIL losses differ after resume"; exit 1; }
                echo "ok resumed CUDA run is bitwise the uninterrupted one"
            ) ;;
        fp8-gather)  # run_gpu_fp8_tests.sh's 2b: the codes' gather gives the bf16 gather's run bit for bit
            (
                # shellcheck source=/dev/null  # the copy's test/gpu/lib.sh
                source test/gpu/lib.sh
                dir=$d trainer=./timed_train_gpt_emu
                common=("${test_model[@]}" -t "$test_T" -d $((16 * test_T)) -x 12 -v 0 -s 0 -l 1e-3 --gpu-comm mpi --fp8 1)
                run codes 2 4 --fp8-scaling delayed -z 3 || { tail -n 20 "$dir/codes.log"; exit 1; }
                run bf16 2 4 --fp8-scaling delayed -z 3 --fp8-gather 0 || { tail -n 20 "$dir/bf16.log"; exit 1; }
                cmp "$dir/codes/model.bin" "$dir/bf16/model.bin" || { echo "FAIL model.bin: the codes' gather differs from bf16's"; exit 1; }
                echo "ok the codes' gather gives the bf16 gather's run"
            ) ;;
        fp8-gather-fault)  # run_gpu_fp8_tests.sh's zero3_flip: the run must go on
            (
                # shellcheck source=/dev/null  # the copy's test/gpu/lib.sh
                source test/gpu/lib.sh
                dir=$d trainer=./timed_train_gpt_emu
                common=("${test_model[@]}" -t "$test_T" -d $((16 * test_T)) -x 12 -v 0 -s 0 -l 1e-3 --gpu-comm mpi --fp8 1)
                run flip 2 4 --fp8-scaling current -z 3 --faults nan_grad@3,flip_bit@3:1 --comm-timeout-s 30 ||
                    { tail -n 5 "$dir/flip.log"; echo "FAIL the run with a bit flipped on one rank stopped"; exit 1; }
                echo "ok the run goes on"
            ) ;;
    esac
}
# The failure's key line: a Catch2 failure's place and last message, else the first line that says
# what failed, else the last line.
key_line() {
    local catch2
    catch2=$(awk '/FAILED:$/ { where = $0; grab = 1; next } grab && /^$/ { print where " " last; exit } grab { last = $0 }' "$1")
    if [ -n "$catch2" ]; then echo "$catch2"; return; fi
    grep -m1 -E 'FAIL|^error|CUDA emulator|race:|fault|[Dd]eadlock' "$1" || grep -m1 -iE 'error|differ' "$1" | grep -v 'rel\. error' ||
        tail -n 1 "$1"
}

# ---- the scratch copy: tracked and untracked-but-not-ignored files, data/ linked ----
scratch=$(mktemp -d "${TMPDIR:-/tmp}/llmc_breakages.XXXXXX")
cleanup() { if [ "$keep" = 1 ]; then echo "kept $scratch"; else rm -rf "$scratch"; fi; }
trap cleanup EXIT
(
    cd "$root"
    git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
        tar --null -T - -cf -
) | tar -C "$scratch" -xf -
mkdir -p "$scratch/data"
for f in "$root"/data/*; do
    [ ! -e "$f" ] || [ -e "$scratch/data/$(basename "$f")" ] || ln -s "$f" "$scratch/data/"
done
cd "$scratch"
mkdir -p logs stash
eval "$(grep -E '^export LLMC_GPU_TEST_(MODEL|T)=' test/emu/run_emu_tests.sh)"
# The trainer under a time limit (lib.sh's run starts a 1-rank run without one).
printf '#!/bin/sh\nexec timeout 300 ./train_gpt_emu "$@"\n' > timed_train_gpt_emu
chmod +x timed_train_gpt_emu

start=$SECONDS
build() {  # build LOG TEST
    local t0=$SECONDS
    # shellcheck disable=SC2046
    if ! make -j"${MAKE_JOBS:-1}" SKIP_DEPS=1 $(targets_of "$2") > "$1" 2>&1; then
        return 1
    fi
    echo "   built $(targets_of "$2") ($((SECONDS - t0)) s)"
}

# ---- the baseline: every test the selected breakages use passes on the unbroken copy ----
if [ "$baseline" = 1 ]; then
    declare -A seen
    for n in "${selected[@]}"; do
        t=${test_of[$n]}
        [ -z "${seen[$t]:-}" ] || continue
        seen[$t]=1
        echo "== unbroken: $(describe "$t")"
        log="logs/baseline_${t// /_}"
        build "$log.build" "$t" || { tail -n 30 "$log.build"; echo "FAIL the unbroken copy does not build"; exit 2; }
        t0=$SECONDS
        if ! run_test "$t" > "$log" 2>&1; then
            tail -n 30 "$log"
            echo "FAIL the unbroken copy fails $(describe "$t"): a failure under a breakage would prove nothing"
            exit 2
        fi
        echo "   passes ($((SECONDS - t0)) s)"
    done
fi

# ---- the breakages ----
apply() {  # apply FILE OLD NEW: OLD must occur exactly once in FILE
    python3 - "$1" "$2" "$3" << 'EOF'
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
n = text.count(old)
if n != 1:
    sys.exit(f"{path}: the breakage's text occurs {n} times (expected exactly once):\n{old}")
open(path, "w").write(text.replace(old, new))
EOF
}

missed=() gaps_caught=()
for n in "${selected[@]}"; do
    f=${file_of[$n]} t=${test_of[$n]}
    echo "== breakage $n: ${what_of[$n]} ($f)"
    cp "$f" "stash/$n"
    if ! apply "$f" "${old_of[$n]}" "${new_of[$n]}"; then
        echo "FAIL breakage $n does not apply: it proves nothing; update its text to the source"
        exit 2
    fi
    if ! build "logs/$n.build" "$t"; then
        grep -m3 -E 'error' "logs/$n.build" || tail -n 20 "logs/$n.build"
        cp "stash/$n" "$f"
        echo "FAIL breakage $n does not build: it proves nothing"
        exit 2
    fi
    t0=$SECONDS
    if run_test "$t" > "logs/$n" 2>&1; then rc=0; else rc=$?; fi
    cp "stash/$n" "$f"  # a fresh time stamp: what was built from the broken file rebuilds
    if [ "$rc" != 0 ]; then
        how="exit $rc"
        if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then how="timed out"; fi
        echo "caught: $n by $(describe "$t") ($how, $((SECONDS - t0)) s)"
        echo "   $(key_line "logs/$n" | cut -c1-300)"
        if [ -n "${gap_of[$n]}" ]; then
            echo "   (a known gap, caught this time: if it is caught every time now, drop its GAP in check_breakages.sh)"
            gaps_caught+=("$n")
        fi
    elif [ -n "${gap_of[$n]}" ]; then
        echo "NOT CAUGHT (known gap): $n: $(describe "$t") passes with it ($((SECONDS - t0)) s)"
        echo "   why: ${gap_of[$n]}"
        grep -m1 '^seed ' "logs/$n" | sed 's/^/   workbench /' || true
    else
        echo "NOT CAUGHT: $n: $(describe "$t") passes with it ($((SECONDS - t0)) s)"
        grep -m1 '^seed ' "logs/$n" | sed 's/^/   workbench /' || true
        missed+=("$n")
    fi
done

echo "check_breakages.sh: ${#selected[@]} breakage(s) in $((SECONDS - start)) s: ${#missed[@]} not caught"
[ ${#gaps_caught[@]} -eq 0 ] || echo "known gaps now caught: ${gaps_caught[*]}"
if [ ${#missed[@]} -gt 0 ]; then
    echo "NOT CAUGHT: ${missed[*]}"
    exit 1
fi
