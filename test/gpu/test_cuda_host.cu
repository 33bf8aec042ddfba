// Host-side tests of the CUDA model: the parts that run on the CPU (memory planning, activation
// layout, scratch sizing, config validation) and the FP8 encoding against CUDA's. Compiled by nvcc, needs no GPU, so CI runs it as part
// of `make test` wherever nvcc exists.
#include <catch2/catch.hpp>
#include <cuda_fp8.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llmc/numerics/fp8.h"
#include "llmc/models/cuda_backend.cuh"
#include "llmc/models/cuda_model.cuh"
#include "llmc/planning/step_plan.h"
#include "test/gpu/shape_only_comm.h"

using namespace llmc;

namespace {

CUDAModelOptions with(Recompute r) {
    CUDAModelOptions o;
    o.recompute = r;
    return o;
}

bool aligned_256(const void* p) { return reinterpret_cast<uintptr_t>(p) % 256 == 0; }

}  // namespace

TEST_CASE("each recomputation setting keeps less activation memory than the one before") {
    for (const char* preset : {"d12", "d48"}) {
        const ModelConfig c = model_preset(preset);
        size_t previous = SIZE_MAX;
        for (int r = 0; r <= 3; r++) {
            const size_t bytes = CudaActivationLayout::bytes_for(c, 8, 1024, with((Recompute)r));
            INFO(preset << " -r " << r << ": " << bytes << " bytes");
            CHECK(bytes < previous);
            previous = bytes;
        }
    }
}

TEST_CASE("every smaller call's activations fit in the allocation made for max_B x max_T") {
    const ModelConfig c = model_preset("d12");
    for (int r = 0; r <= 3; r++) {
        const CUDAModelOptions o = with((Recompute)r);
        const size_t allocated = CudaActivationLayout::bytes_for(c, 16, 1024, o);
        for (int B : {1, 3, 8, 15, 16})
            for (int T : {1, 7, 64, 1000, 1024}) {
                INFO("-r " << r << " B " << B << " T " << T);
                CHECK(CudaActivationLayout::bytes_for(c, B, T, o) <= allocated);
            }
    }
}

TEST_CASE("every activation slice, per layer too, starts on a 256-byte boundary") {
    const ModelConfig c = model_preset("d12");
    char* const base = reinterpret_cast<char*>(uintptr_t(1) << 32);  // never dereferenced
    for (int r = 0; r <= 3; r++)
        for (auto [B, T] : {std::pair{3, 37}, std::pair{8, 1024}}) {
            const CudaActivationLayout a(c, B, T, with((Recompute)r), base);
            for (int l = 0; l < c.num_layers; l++) {
                INFO("-r " << r << " B " << B << " T " << T << " layer " << l);
                for (const void* p : {(const void*)a.residual2.at(l), (const void*)a.residual3.at(l),
                                      (const void*)a.ln1.at(l), (const void*)a.qkv.at(l), (const void*)a.atty.at(l),
                                      (const void*)a.ln2.at(l), (const void*)a.fch.at(l),
                                      (const void*)a.fch_gelu.at(l), (const void*)a.ln1_mean.at(l),
                                      (const void*)a.lse.at(l)})
                    CHECK(aligned_256(p));
            }
            for (const void* p : {(const void*)a.encoded, (const void*)a.lnf, (const void*)a.logits,
                                  (const void*)a.scratch, (const void*)a.dresidual, (const void*)a.row_loss})
                CHECK(aligned_256(p));
        }
}

TEST_CASE("recomputed tensors share one slice; kept ones have one per layer") {
    const ModelConfig c = model_preset("d4");
    char* const base = reinterpret_cast<char*>(uintptr_t(1) << 32);
    const CudaActivationLayout none(c, 2, 64, with(Recompute::None), base);
    CHECK(none.fch_gelu.layer_stride > 0);
    CHECK(none.ln1.layer_stride > 0);
    const CudaActivationLayout gelu(c, 2, 64, with(Recompute::Gelu), base);
    CHECK(gelu.fch_gelu.layer_stride == 0);
    CHECK(gelu.ln1.layer_stride > 0);
    const CudaActivationLayout ln(c, 2, 64, with(Recompute::GeluLayerNorm), base);
    CHECK(ln.ln1.layer_stride == 0);
    CHECK(ln.ln2.layer_stride == 0);
    CHECK(ln.fch.layer_stride > 0);
    const CudaActivationLayout block(c, 2, 64, with(Recompute::Block), base);
    CHECK(block.residual3.layer_stride > 0);  // each layer's input is what a block recomputes from
    for (auto s : {block.residual2.layer_stride, block.qkv.layer_stride, block.atty.layer_stride,
                   block.fch.layer_stride, block.ln1.layer_stride})
        CHECK(s == 0);
    CHECK(block.lse.layer_stride == 0);
}

TEST_CASE("kernel scratch sizes never shrink as the row count grows") {
    for (int C : {64, 768, 1600}) {
        size_t ln_prev = 0, mm_prev = 0;
        for (int N = 1; N <= 70000; N += N < 600 ? 1 : 97) {
            const size_t ln = layernorm_backward_scratch_floats(N, C), mm = matmul_backward_scratch_floats(N, 4 * C);
            INFO("N " << N << " C " << C);
            CHECK(ln >= ln_prev);
            CHECK(mm >= mm_prev);
            ln_prev = ln;
            mm_prev = mm;
        }
    }
}

TEST_CASE("the memory plan lists the parameters at 18 bytes each and the activation layout's bytes") {
    const ModelConfig c = model_preset("d12");
    const CUDAModelOptions o = with(Recompute::Gelu);
    size_t per_kind[(int)MemoryKind::Count] = {};
    for (const BufferSpec& s : CUDAModel::memory_specs(c, 16, 1024, o, CUDAModel::zero_plan(c, 0, 0, 1)))
        per_kind[(int)s.kind] += s.bytes();
    const size_t n = num_params(c);
    CHECK(per_kind[(int)MemoryKind::Parameters] == 2 * n);
    CHECK(per_kind[(int)MemoryKind::MasterWeights] == 4 * n);
    CHECK(per_kind[(int)MemoryKind::Gradients] == 4 * n);
    CHECK(per_kind[(int)MemoryKind::OptimizerState] == 8 * n);
    CHECK(per_kind[(int)MemoryKind::Activations] >= CudaActivationLayout::bytes_for(c, 16, 1024, o));
    CHECK(per_kind[(int)MemoryKind::CommBuffers] == 0);
}

TEST_CASE("the CUDA model refuses shapes its kernels cannot run, before touching the GPU") {
    ModelConfig c = model_preset("d4");
    c.channels = 100;  // 4 heads of 25: not a multiple of 8
    CHECK_THROWS_WITH(CUDAModel(c, 1, 16), Catch::Contains("channels (100) must be a multiple of 8"));
    c = model_preset("d4");
    c.padded_vocab_size = c.vocab_size;  // 50257
    CHECK_THROWS_WITH(CUDAModel(c, 1, 16), Catch::Contains("padded_vocab_size (50257) must be a multiple of 8"));
}

TEST_CASE("ZeRO plans for the CUDA model keep every bucket and slice 16-byte aligned in bf16") {
    for (const char* preset : {"d4", "d12", "d48"}) {
        const ModelConfig c = model_preset(preset);
        for (int world : {1, 2, 3, 5, 8, 64})
            for (int rank : {0, world - 1}) {
                const ZeroPlan plan = CUDAModel::zero_plan(c, 3, rank, world);
                for (const ZeroPlan::Bucket& k : plan.buckets) {
                    INFO(preset << " world " << world << " rank " << rank << " bucket at " << k.begin);
                    CHECK(k.padded_begin % 8 == 0);
                    CHECK(k.shard_size % 8 == 0);
                    CHECK(k.shard_offset % 8 == 0);
                    CHECK(k.padded_extent >= k.size);
                }
            }
    }
}

TEST_CASE("the CUDA memory plan shards master weights and moments from ZeRO-1, gradients from 2, parameters at 3") {
    const ModelConfig c = model_preset("d12");
    const int world = 8;
    size_t bytes[4][(int)MemoryKind::Count] = {};
    for (int stage = 0; stage <= 3; stage++)
        for (const BufferSpec& s : CUDAModel::memory_specs(c, 4, 1024, {}, CUDAModel::zero_plan(c, stage, 0, world)))
            bytes[stage][(int)s.kind] += s.bytes();
    using K = MemoryKind;
    const size_t n = num_params(c);
    CHECK(bytes[0][(int)K::MasterWeights] >= 4 * n);
    CHECK(bytes[1][(int)K::MasterWeights] * world < 4 * n + 4 * 8 * world * 14);  // a shard, plus padding
    CHECK(bytes[1][(int)K::OptimizerState] < bytes[0][(int)K::OptimizerState] / 4);
    CHECK(bytes[2][(int)K::Gradients] < bytes[1][(int)K::Gradients] / 2);
    // ZeRO-3 keeps a shard plus the gathered embeddings (a third of d12) and two layers
    CHECK(bytes[3][(int)K::Parameters] < bytes[2][(int)K::Parameters] * 2 / 3);
    CHECK(bytes[0][(int)K::Parameters] >= 2 * n);  // bf16
    CHECK(bytes[0][(int)K::Parameters] < 4 * n);
}

TEST_CASE("under tensor parallelism each rank's activations, layers and vocabulary slice fit its piece") {
    const ModelConfig c = model_preset("d12");
    const int B = 4, T = 1024, BT = B * T, C = c.channels;
    for (int tp : {2, 4})
        for (bool sp : {true, false}) {
            INFO("tp " << tp << (sp ? ", sequence parallel" : ""));
            const TpShape shape{tp, tp - 1, sp};
            const CUDAModelOptions o = with(Recompute::None);
            std::vector<char> buffer(CudaActivationLayout::bytes_for(c, B, T, o, shape) + 256);
            char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(buffer.data()) + 255) / 256 * 256);
            const CudaActivationLayout a(c, B, T, o, base, shape);
            const size_t n = sp ? BT / tp : BT;
            // The residual stream and the LayerNorms hold n rows of C; qkv 3C/tp columns of all rows.
            CHECK((size_t)((char*)a.residual3.at(1) - (char*)a.residual3.at(0)) == n * C * sizeof(floatX));
            CHECK((size_t)((char*)a.qkv.at(1) - (char*)a.qkv.at(0)) == (size_t)BT * 3 * C / tp * sizeof(floatX));
            CHECK((size_t)((char*)a.fch.at(1) - (char*)a.fch.at(0)) == (size_t)BT * 4 * C / tp * sizeof(floatX));
            for (const void* p : {(const void*)a.full, (const void*)a.partial, (const void*)a.dfull,
                                  (const void*)a.dln, (const void*)a.ce_stats, (const void*)a.dln_weights})
                CHECK(aligned_256(p));
            // Less than the whole model's activations, more than a 1/tp share of them (the gathered
            // LayerNorm outputs and the partial sums are whole).
            const size_t whole = CudaActivationLayout::bytes_for(c, B, T, o);
            CHECK(CudaActivationLayout::bytes_for(c, B, T, o, shape) < whole);
            // Each rank's ZeRO plan covers exactly its piece of the parameters.
            const ZeroPlan plan = CUDAModel::zero_plan(c, 0, 0, 1, shape);
            size_t planned = 0;
            for (const ZeroPlan::Bucket& k : plan.buckets) planned += k.size;
            CHECK(planned == GPT2Params::layout(c, {tp - 1, tp}).num_params);
            CHECK(planned < num_params(c));
        }
}

TEST_CASE("the CUDA model's --plan accepts --tp (every rank's piece) and --pp (every stage)") {
    RunConfig cfg;
    cfg.model = "d12";
    cfg.batch_size = 4;
    cfg.seq_len = 1024;
    cfg.total_batch_tokens = 4 * 1024 * 2;
    cfg.tp = 2;
    resolve_run_config(cfg, 4, nullptr);
    const std::string plan = CudaBackend::plan_report(cfg);
    CHECK_THAT(plan, Catch::Contains("tp 2"));
    RunConfig whole = cfg;
    whole.tp = 1;
    resolve_run_config(whole, 2, nullptr);
    CHECK(CudaActivationLayout::bytes_for(cfg.model_config, 4, 1024, {}, CudaBackend::tp_shape(cfg, 0)) <
          CudaActivationLayout::bytes_for(whole.model_config, 4, 1024, {}));
    RunConfig pipelined = cfg;
    pipelined.tp = 1;
    pipelined.pp = 2;
    pipelined.total_batch_tokens = 4 * 1024 * 8;  // 4 micro-batches per step on 2 data-parallel ranks
    resolve_run_config(pipelined, 4, nullptr);
    const std::string pp_plan = CudaBackend::plan_report(pipelined);
    CHECK_THAT(pp_plan, Catch::Contains("pipeline: 2 stage(s), 1f1b schedule, 4 micro-batch(es) per step"));
    CHECK_THAT(pp_plan, Catch::Contains("0-5+emb"));
    CHECK_THAT(pp_plan, Catch::Contains("6-11+head"));
    // 1F1B: stage 0 holds 2 micro-batches' activations, stage 1 one; each stage half the layers
    const MemoryPlan first = CudaBackend::memory_plan(pipelined, 0, 0, 0), last = CudaBackend::memory_plan(pipelined, 0, 0, 1);
    const MemoryPlan one = CudaBackend::memory_plan(whole, 0, 0, 0);
    const size_t params = (size_t)MemoryKind::Parameters;
    CHECK(first.bytes[params] < one.bytes[params]);
    CHECK(last.bytes[params] < one.bytes[params]);
}

TEST_CASE("pipeline activation slots: kept tensors per slot, scratch and recomputed tensors shared") {
    const ModelConfig c = model_preset("d12");
    const int B = 2, T = 64;
    char* base = reinterpret_cast<char*>(uintptr_t(1) << 32);  // addresses only, never dereferenced
    for (int r : {0, 1, 2, 3}) {
        CUDAModelOptions o;
        o.recompute = (Recompute)r;
        StageShape stage;
        stage.layers = 6;
        stage.chunks = 2;
        stage.embedding = true;
        stage.head = false;
        stage.pipelined = true;
        stage.slots = 3;
        const CudaActivationLayout a0(c, B, T, o, base, {}, stage, 0), a2(c, B, T, o, base, {}, stage, 2);
        CHECK(a0.total_bytes == 3 * a0.slot_bytes + a0.scratch_bytes);
        CHECK(a0.total_bytes == CudaActivationLayout::bytes_for(c, B, T, o, {}, stage));
        // per slot: the chunks' inputs and the kept layers, one slot_bytes apart
        CHECK((char*)a2.encoded - (char*)a0.encoded == (ptrdiff_t)(2 * a0.slot_bytes));
        CHECK((char*)a2.residual3.base - (char*)a0.residual3.base == (ptrdiff_t)(2 * a0.slot_bytes));
        CHECK(a0.residual3.layer_stride > 0);
        // scratch: the same for every slot, past the last slot
        CHECK(a2.dresidual == a0.dresidual);
        CHECK(a2.recv == a0.recv);
        CHECK((char*)a0.dresidual >= base + 3 * a0.slot_bytes);
        CHECK((char*)a0.recv + 2 * 768 * B * T <= base + a0.total_bytes);  // n x C bf16
        // no head on this stage: no logits, final norm or losses
        CHECK(a0.logits == nullptr);
        CHECK(a0.lnf == nullptr);
        // what backward recomputes is scratch too (one slice, shared)
        CHECK((a0.fch_gelu.layer_stride == 0) == (r >= 1));
        CHECK((a0.ln1.layer_stride == 0) == (r >= 2));
        CHECK((a0.qkv.layer_stride == 0) == (r >= 3));
        if (r >= 1) CHECK(a0.fch_gelu.base == a2.fch_gelu.base);
        if (r >= 3) CHECK(a0.qkv.base == a2.qkv.base);
        // half the layers hold less than the whole model's one slot
        const CudaActivationLayout whole(c, B, T, o, nullptr);
        CHECK(a0.slot_bytes < whole.slot_bytes);
    }
}


TEST_CASE("FP8 at ZeRO-3: the memory plan lists the codes' gather, and the plan's bytes sent fall by the codes' "
          "saving") {
    ModelConfig c = model_preset("d4");  // 4 layers of C 256
    c.vocab_size = 512, c.padded_vocab_size = 512;
    for (bool gather : {true, false}) {
        INFO("--fp8-gather " << gather);
        CUDAModelOptions o;
        o.fp8 = {true, Fp8Scaling::Current, 4, gather};
        const ZeroPlan plan = CUDAModel::zero_plan(c, 3, 0, 3);
        bool gather_line = false;
        for (const BufferSpec& s : CUDAModel::memory_specs(c, 2, 64, o, plan)) {
            gather_line = gather_line || s.name.find("FP8 gather") != std::string::npos;
        }
        CHECK(gather_line == gather);  // test_cuda_model checks the plan against a model's allocation
        const double saved = CUDAModel::fp8_gather_bytes_saved(c, plan, o.fp8);
        const auto [packed, bf16] = CUDAModel::fp8_gather_chunk_bytes(c, plan, o.fp8);
        if (!gather) {
            CHECK(saved == 0);
            CHECK(packed == 0);
            continue;
        }
        // a byte a weight element instead of two, over 2 of 3 ranks' chunks, 4 layers
        const double weights = 4.0 * 12 * 256 * 256;
        CHECK(saved > 2.0 / 3 * weights * 0.98);
        CHECK(saved < 2.0 / 3 * weights);
        CHECK((double)packed / (double)bf16 < 0.51);  // a layer's chunk: about half
        CHECK(saved == Approx(2.0 * 4 * ((double)bf16 - (double)packed)));
        RunConfig cfg;
        cfg.grad_accum_steps = 2;
        const MemoryPlan with = plan_memory(cfg, plan, {}, DeviceMemory::precision, 0, saved);
        const MemoryPlan without = plan_memory(cfg, plan, {}, DeviceMemory::precision, 0, 0);
        CHECK(without.comm_bytes_per_rank - with.comm_bytes_per_rank == Approx(2 * 2 * saved));  // 2 gathers a micro-batch
    }
}

TEST_CASE("the CUDA model refuses a --tp its heads or its vocabulary slices cannot take, before touching the GPU") {
    ModelConfig c = model_preset("d4");  // 4 heads of 64
    ShapeOnlyComm three(3), two(2);
    TensorParallelGroup tp;
    tp.comm = &three;
    CHECK_THROWS_WITH(CUDAModel(c, 1, 16, {}, {}, tp), Catch::Contains("--tp 3 must be a positive divisor of num_heads (4)"));
    c.vocab_size = 500;
    c.padded_vocab_size = 520;  // a multiple of 8, but 260 per rank is not
    tp.comm = &two;
    CHECK_THROWS_WITH(CUDAModel(c, 1, 16, {}, {}, tp),
                      Catch::Contains("padded_vocab_size (520) must be a multiple of 8 x --tp 2"));
}

TEST_CASE("the CUDA model refuses a pipeline split that does not fit its group or its layers, before touching the GPU") {
    ShapeOnlyComm two(2);
    PipelineGroup pp;
    pp.comm = &two;
    pp.host = &two;
    pp.pipe.split = make_pipeline_split(4, 4, 1);  // 4 stages for a group of 2
    CHECK_THROWS_WITH(CUDAModel(model_preset("d4"), 1, 16, {}, {}, {}, pp),
                      Catch::Contains("does not fit a pipeline group of 2 rank(s) and a model of 4 layers"));
    pp.pipe.split = make_pipeline_split(6, 2, 1);  // a 6-layer split for a 4-layer model
    CHECK_THROWS_WITH(CUDAModel(model_preset("d4"), 1, 16, {}, {}, {}, pp),
                      Catch::Contains("does not fit a pipeline group of 2 rank(s) and a model of 4 layers"));
    pp.pipe.split = make_pipeline_split(4, 2, 1);
    pp.pipe.micro_batches = 0;
    CHECK_THROWS_WITH(CUDAModel(model_preset("d4"), 1, 16, {}, {}, {}, pp), Catch::Contains("at least 1 micro-batch"));
}

// llmc/numerics/fp8.h's encoder (which the CPU model's FP8 simulation uses) against CUDA's own conversion,
// which the FP8 kernels use: every float whose low 16 bits are one of the patterns around a
// rounding boundary, so every midpoint between fp8 values, both sides of it, subnormals,
// saturation, infinities and NaNs.
TEST_CASE("llmc/numerics/fp8.h encodes as CUDA's __nv_cvt_float_to_fp8 with saturation does") {
    const uint32_t low_bits[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff, 0x3fff, 0x4000, 0xc000};
    long mismatches = 0;
    for (uint32_t high = 0; high < 0x10000; high++)
        for (uint32_t low : low_bits) {
            const float x = std::bit_cast<float>(high << 16 | low);
            const uint8_t e4m3 = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
            const uint8_t e5m2 = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
            mismatches += fp8::encode(x, fp8::Format::E4M3) != e4m3;
            mismatches += fp8::encode(x, fp8::Format::E5M2) != e5m2;
        }
    CHECK(mismatches == 0);
    for (int code = 0; code < 256; code++)
        for (auto [format, cuda] : {std::pair{fp8::Format::E4M3, __NV_E4M3}, std::pair{fp8::Format::E5M2, __NV_E5M2}}) {
            const float ours = fp8::decode((uint8_t)code, format);
            const float theirs = __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)code, cuda)));
            CAPTURE(code);
            CHECK(((std::isnan(ours) && std::isnan(theirs)) || ours == theirs));
        }
}

// Needs the CUDA model's memory plan (flash attention: no T x T matrix), hence here and not in
// test_step_model.cpp. With 80 GiB the sequence fits a data-parallel rank without context
// parallelism or recomputation only at ZeRO-3, by 1.4 GiB (tp cannot cut 25 heads over 64 GPUs);
// with 70 GiB no layout of cp 1 and -r 0 fits, and the best is a context-parallel one, faster than
// any that recomputes instead.
TEST_CASE("--plan-search for GPT-2 1.5B at T = 32k on 64 H100s: where no cp 1 -r 0 layout fits, a cp layout wins", "[plan]") {
    RunConfig base;
    base.model = "d48", base.seq_len = 32768, base.max_seq_len = 32768, base.total_batch_tokens = 64 * 32768;
    const StagePlan plan = [](const RunConfig& c, int stage) { return CudaBackend::memory_plan(c, 0, 0, stage); };
    const Resolve resolve = [](RunConfig& c, int gpus) { resolve_run_config(c, gpus, nullptr); };
    Topology t = topology_preset("h100");
    for (double gib : {80.0, 70.0}) {
        t.memory_gib = gib;
        const std::vector<Layout> layouts = search_layouts(base, 64, t, resolve, plan);
        REQUIRE(!layouts.empty());
        const Layout& best = layouts.front();
        INFO(gib << " GiB: the best is " << layout_name(best.cfg) << ", " << best.memory_bytes / 1073741824.0 << " GiB");
        REQUIRE(best.fits);
        bool plain_fits = false, context_tried = false;
        const Layout* best_recomputing = nullptr;  // the fastest that fits with -r > 0 and no cp
        for (const Layout& l : layouts) {
            const bool plain = l.cfg.dims.cp == 1 && l.cfg.recompute == 0;
            plain_fits |= plain && l.fits;
            if (plain && l.cfg.dims.pp == 1 && l.cfg.zero_stage < 3) {
                INFO(layout_name(l.cfg) << ": " << l.memory_bytes / 1073741824.0 << " GiB");
                CHECK_FALSE(l.fits);  // 86 GiB and more
            }
            context_tried |= l.cfg.dims.cp > 1;
            if (!best_recomputing && l.fits && l.cfg.dims.cp == 1 && l.cfg.recompute > 0) best_recomputing = &l;
        }
        CHECK(context_tried);
        REQUIRE(best_recomputing != nullptr);
        CHECK(plain_fits == (gib == 80.0));
        if (plain_fits) continue;
        CHECK(best.cfg.dims.cp > 1);
        CHECK(best.cfg.recompute == 0);
        CHECK(best.step.step_s < best_recomputing->step.step_s);
    }
}
