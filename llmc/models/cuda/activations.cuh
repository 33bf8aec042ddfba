// models/cuda/activations.cuh: CUDAModel's options and where its activations live: every tensor of
// a step cut out of one allocation, per layer or shared, sized by recomputation, tensor and pipeline
// parallelism and the mixture of experts (the memory plan, --plan, lists the same allocation).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "llmc/dist/pipeline_stage.h"
#include "llmc/kernels/attention.cuh"
#include "llmc/kernels/cuda_common.cuh"
#include "llmc/kernels/layernorm.cuh"
#include "llmc/kernels/rmsnorm.cuh"
#include "llmc/model.h"
#include "llmc/models/gpt2/config.h"
#include "llmc/models/family.h"
#include "llmc/models/cuda/fp8_linears.cuh"
#include "llmc/models/parallel_groups.h"
#include "llmc/numerics/fp8.h"

namespace llmc {

enum class Recompute { None = 0, Gelu = 1, GeluLayerNorm = 2, Block = 3 };

struct CUDAModelOptions {
    Recompute recompute = Recompute::None;
    int classifier_chunk_rows = 8192;  // logits rows computed at once (8192 x 50304 bf16 = 786 MiB)
    Fp8Options fp8;                    // the blocks' products in FP8 (fp8_linears.cuh)
    MoeOptions moe;                    // a mixture-of-experts model's capacity and auxiliary losses
    int split_k = 0;                   // 0: each weight gradient's own split of k (split_k.h); N: N slices (tests)
};

// A per-layer activation: L slices back to back, or, when backward recomputes it, one slice that
// every layer reuses (layer_stride 0).
template <typename T>
struct LayerTensor {
    T* base = nullptr;
    size_t layer_stride = 0;
    T* at(int layer) const { return base + (size_t)layer * layer_stride; }
};

// Where each activation lives in the activation allocation for a call with B x T tokens. Sizes
// grow with B and T, so any B <= max_B, T <= max_T fits in the allocation made for max_B x max_T.
// Under tensor parallelism (tp) the attention and MLP activations hold this rank's heads and hidden
// units, the logits its vocabulary columns, and under sequence parallelism the residual stream and
// the LayerNorms its n rows; below, C_l = C/tp and n = BT/tp with sequence parallelism, else BT.
// Under pipeline parallelism (StageShape, pipeline_stage.h) the per-layer tensors hold the rank's
// layers only, and the allocation holds `slots` micro-batches' activations (one slot each; `slot`
// picks the one this layout points into) beside one set of scratch that every slot shares: what
// backward recomputes, the gradients, the logits and the messages' buffers.
struct CudaActivationLayout {
    // per slot: each chunk's input (the embedding's output, or what the previous stage sent), the
    // layers' activations backward reads (those it recomputes are scratch), the final norm's
    floatX* encoded;                                     // (chunks, n, C)
    LayerTensor<floatX> residual2, residual3;            // (n, C) after attention, after the MLP
    LayerTensor<floatX> ln1, qkv, atty, ln2, fch, fch_gelu;
    LayerTensor<float> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd, lse;
    floatX* lnf;
    float *lnf_mean, *lnf_rstd;
    // scratch
    floatX* logits;                                      // (chunk rows, Vp/tp); dlogits in place
    float* row_loss;                                     // (BT)
    int *inputs, *targets;                               // (BT) token ids on the device
    floatX *dresidual, *dC, *d3C, *d4C;                  // backward: residual-stream and layer gradients
    // A Llama only (family.h; no bytes for GPT-2): the gradient of SwiGLU's output (dhidden) and
    // RoPE's cos/sin table for the T positions of the pass (kernels/rope.cuh). Grouped kv heads need
    // nothing: the attention kernels read them where they are.
    floatX* dhidden;
    float* rope;
    float* scratch;                                      // kernel scratch (bias/LN partials, attention D)
    // Tensor parallelism only (no bytes otherwise): a LayerNorm output gathered to all BT rows (full),
    // a row-parallel product's partial sum (partial), the gathered residual gradient (dfull), a
    // reduced LayerNorm-output gradient (dln, sequence parallel), every rank's classifier statistics
    // of one chunk (ce_stats), and one layer's LayerNorm weight gradients before they are summed
    // over the group (dln_weights, sequence parallel).
    floatX *full, *partial, *dfull, *dln;
    float *ce_stats, *dln_weights;
    // Pipeline parallelism only: where a message from a neighbouring stage lands, and the two
    // buffers input gradients leave from (n rows of C each).
    floatX *recv, *send_grad;
    // Context parallelism only (ring attention, T the rank's rows of a sequence): the global position
    // of each row (T), the key/value blocks arriving around the ring (whole qkv rows, one buffer at cp
    // 2, two beyond), a ring pair's out and lse, the fp32 running out (forward) or dq sum (backward),
    // and the two fp32 dk, dv accumulators that travel back with the blocks.
    int* positions;
    floatX *ring_kv, *pair_out;
    float *pair_lse, *ring_acc, *ring_dkv;
    // FP8 products only (--fp8): the FP8 copies of the product at hand (fp8_linears.cuh).
    Fp8Scratch fp8;

    size_t slot_bytes = 0, scratch_bytes = 0;
    size_t total_bytes = 0;  // every slot and the scratch

    // T: the rows of each sequence this rank holds (T / cp of a sequence under context parallelism
    // over cp ranks, whose ring buffers it adds).
    static size_t bytes_for(const ModelConfig& c, int B, int T, const CUDAModelOptions& o, const TpShape& tp = {},
                            const StageShape& stage = {}, int cp = 1) {
        return CudaActivationLayout(c, B, T, o, nullptr, tp, stage, 0, cp).total_bytes;
    }

    // Assigns 256-byte aligned slices of `base`; with nullptr only the sizes are set.
    CudaActivationLayout(const ModelConfig& c, int B, int T, const CUDAModelOptions& o, char* base,
                         const TpShape& tp = {}, const StageShape& stage = {}, int slot = 0, int cp = 1) {
        const size_t BT = (size_t)B * T, C = c.channels, Cl = C / tp.size;
        const size_t L = stage.layers < 0 ? c.num_layers : stage.layers;
        const size_t NH = c.num_heads / tp.size;
        // a block's widths on this rank: a qkv row, the MLP's input product and its activation's
        // output (GPT-2: 3 C_l, 4 C_l, 4 C_l; Llama: its kv heads' and SwiGLU's, family.h)
        const BlockWidths w(c, tp.size);
        const size_t Vp = c.padded_vocab_size / tp.size, n = tp.rows((int)BT);
        const bool split = tp.size > 1, sp = tp.sequence_parallel, head = stage.head, pipe = stage.pipelined;
        const size_t chunk_rows = std::min(BT, (size_t)o.classifier_chunk_rows);
        const int r = (int)o.recompute;
        struct Take {
            std::function<void(char*)> set;
            size_t offset;
            bool per_slot;
        };
        std::vector<Take> takes;
        auto take = [&](auto*& p, size_t count, bool per_slot) {
            using T_ = std::remove_reference_t<decltype(*p)>;
            size_t& at = per_slot ? slot_bytes : scratch_bytes;
            p = nullptr;  // and stays so for a tensor of no elements
            if (count > 0) takes.push_back({[&p](char* q) { p = reinterpret_cast<T_*>(q); }, at, per_slot});
            at += (count * sizeof(T_) + 255) / 256 * 256;
        };
        // kept: L slices per slot; recomputed in backward: one slice of scratch. Every slice starts on
        // a 256-byte boundary, so a layer's tensors are aligned alike whatever the setting (cuBLASLt
        // picks its algorithm by alignment, and recomputation must not change which one runs).
        auto layered = [&](auto& t, size_t per_layer, bool kept) {
            constexpr size_t per_256_bytes = 256 / sizeof(*t.base);
            const size_t stride = (per_layer + per_256_bytes - 1) / per_256_bytes * per_256_bytes;
            take(t.base, kept ? L * stride : stride, kept);
            t.layer_stride = kept ? stride : 0;
        };
        take(encoded, stage.chunks * n * C, true);
        layered(residual3, n * C, true);
        layered(residual2, n * C, r < 3);
        layered(ln1, n * C, r < 2);
        layered(ln1_mean, n, r < 3);
        layered(ln1_rstd, n, r < 3);
        layered(qkv, BT * w.qkv, r < 3);
        layered(atty, BT * Cl, r < 3);
        layered(lse, NH * BT, r < 3);
        layered(ln2, n * C, r < 2);
        layered(ln2_mean, n, r < 3);
        layered(ln2_rstd, n, r < 3);
        layered(fch, BT * w.up, r < 3);
        layered(fch_gelu, BT * w.hidden, r < 1);
        take(lnf, head ? n * C : 0, true);
        take(lnf_mean, head ? n : 0, true);
        take(lnf_rstd, head ? n : 0, true);
        take(logits, head ? chunk_rows * Vp : 0, false);
        take(row_loss, head ? BT : 0, false);
        take(inputs, BT, false);
        take(targets, BT, false);
        take(dresidual, n * C, false);
        take(dC, BT * C, false);
        take(d3C, BT * w.qkv, false);
        take(d4C, BT * w.up, false);
        take(dhidden, w.swiglu ? BT * w.hidden : 0, false);
        take(rope, w.rotary ? (size_t)T * w.head_size : 0, false);
        size_t scratch_floats = std::max({matmul_backward_scratch_floats((int)BT, (int)w.up),
                                          matmul_backward_scratch_floats((int)BT, (int)w.hidden),
                                          matmul_backward_scratch_floats((int)BT, (int)w.qkv),
                                          matmul_backward_scratch_floats((int)BT, (int)C),
                                          w.layernorm ? layernorm_backward_scratch_floats((int)BT, (int)C)
                                                      : rmsnorm_backward_scratch_floats((int)BT, (int)C),
                                          attention_backward_scratch_floats(B, T, (int)NH)});
        take(scratch, scratch_floats, false);
        take(full, sp ? BT * C : 0, false);
        take(partial, split ? BT * C : 0, false);
        take(dfull, sp ? BT * C : 0, false);
        take(dln, sp ? n * C : 0, false);
        take(ce_stats, split && head ? chunk_rows * 3 * tp.size : 0, false);
        take(dln_weights, sp ? 4 * C : 0, false);
        take(recv, pipe ? n * C : 0, false);
        take(send_grad, pipe ? 2 * n * C : 0, false);
        const bool ring = cp > 1;
        take(positions, ring ? T : 0, false);
        take(ring_kv, ring ? std::min(cp - 1, 2) * BT * w.qkv : 0, false);
        take(pair_out, ring ? BT * Cl : 0, false);
        take(pair_lse, ring ? NH * BT : 0, false);
        take(ring_acc, ring ? BT * Cl : 0, false);
        take(ring_dkv, ring ? 2 * BT * (w.qkv - Cl) : 0, false);
        const bool quantized = o.fp8.enabled;
        const size_t widest = std::max({(size_t)Cl, w.qkv, w.up, w.hidden});  // a product's input or output row
        take(fp8.input, quantized ? BT * widest : 0, false);
        take(fp8.input_t, quantized ? BT * widest : 0, false);
        take(fp8.grad, quantized ? BT * widest : 0, false);
        take(fp8.grad_t, quantized ? BT * widest : 0, false);
        total_bytes = stage.slots * slot_bytes + scratch_bytes;
        for (const Take& t : takes)
            t.set(base ? base + (t.per_slot ? slot * slot_bytes : stage.slots * slot_bytes) + t.offset : nullptr);
    }
};

}  // namespace llmc
