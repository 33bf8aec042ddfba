// Tensor parallelism without MPI: how a layout cuts each tensor over a tensor-parallel group, the
// checkpoint pieces of such a cut, and the vocabulary-parallel cross-entropy against the whole one.
// (The model itself runs under mpirun: test/mpi/test_tp.cpp.)
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "llmc/ckpt/manifest.h"
#include "llmc/cpu/ops.h"
#include "llmc/models/gpt2/params.h"
#include "llmc/numerics/rng.h"

using namespace llmc;
using Catch::Matchers::Contains;

namespace {

ModelConfig tp_model() {
    ModelConfig c;
    c.max_seq_len = 8;
    c.vocab_size = 250;
    c.padded_vocab_size = 256;
    c.num_layers = 2;
    c.num_heads = 4;
    c.channels = 8;
    return c;
}

}  // namespace

TEST_CASE("tensor-parallel pieces tile every tensor exactly once and round-trip", "[tensor_parallel]") {
    const ModelConfig c = tp_model();
    const ParamLayout whole = GPT2Params::layout(c);
    std::vector<float> values(whole.num_params);
    for (size_t i = 0; i < values.size(); i++) values[i] = (float)i;  // each element names its own index
    for (int tp : {2, 4}) {
        std::vector<int> seen(whole.num_params, 0);
        std::vector<float> rebuilt(whole.num_params, -1.0f);
        size_t total = 0;
        for (int r = 0; r < tp; r++) {
            const ParamLayout piece = GPT2Params::layout(c, {r, tp});
            total += piece.num_params;
            std::vector<float> mine(piece.num_params);
            copy_between_layouts(whole, values.data(), piece, mine.data(), true);
            for (float v : mine) seen[(size_t)v]++;
            copy_between_layouts(whole, rebuilt.data(), piece, mine.data(), false);
            // qkv is cut by heads in each of q, k, v: rank r's first local row is global row r * C/tp of q.
            const size_t C = c.channels;
            CHECK(mine[piece.offset(GPT2Params::QKVW, 1)] == values[whole.offset(GPT2Params::QKVW, 1) + r * C / tp * C]);
            CHECK(mine[piece.offset(GPT2Params::QKVW, 1) + C / tp * C] ==
                  values[whole.offset(GPT2Params::QKVW, 1) + (C + r * C / tp) * C]);
            // the attention projection by input columns: local (row 1, col 0) is global (1, r * C/tp)
            CHECK(mine[piece.offset(GPT2Params::ATTPROJW, 0) + C / tp] ==
                  values[whole.offset(GPT2Params::ATTPROJW, 0) + C + r * C / tp]);
            // wte by vocabulary rows, wpe whole
            CHECK(piece.tensor_size(GPT2Params::WTE) == 256 / tp * C);
            CHECK(piece.tensor_size(GPT2Params::WPE) == whole.tensor_size(GPT2Params::WPE));
        }
        CHECK(rebuilt == values);
        for (int t = 0; t < whole.num_tensors(); t++) {
            const bool split = GPT2Params::layout(c, {0, tp}).is_split(t);
            for (int l = 0; l < (whole.is_per_layer(t) ? c.num_layers : 1); l++)
                for (size_t i = 0; i < whole.tensor_size(t); i++)
                    REQUIRE(seen[whole.offset(t, l) + i] == (split ? 1 : tp));  // cut once, or a replica on every rank
        }
        CHECK(total > whole.num_params);  // the replicas
    }
}

TEST_CASE("tensor x expert parallelism: each rank's piece of its experts tiles the experts once", "[tensor_parallel]") {
    ModelConfig c = tp_model();
    c.num_experts = 4, c.moe_top_k = 2, c.moe_every = 2;  // experts in layer 1
    using P = GPT2Params;
    const ParamLayout whole = P::layout(c);
    std::vector<float> values(whole.num_params);
    for (size_t i = 0; i < values.size(); i++) values[i] = (float)i;
    const int tp = 2, ep = 2;
    const size_t C = c.channels, F = 4 * C;
    std::vector<int> seen(whole.num_params, 0);
    std::vector<float> rebuilt(whole.num_params, -1.0f);
    for (int t = 0; t < tp; t++)
        for (int e = 0; e < ep; e++) {
            const ParamLayout piece = P::layout(c, {t, tp}, {}, {e, ep});
            std::vector<float> mine(piece.num_params);
            copy_between_layouts(whole, values.data(), piece, mine.data(), true);
            for (float v : mine) seen[(size_t)v]++;
            copy_between_layouts(whole, rebuilt.data(), piece, mine.data(), false);
            // ep rank e holds experts 2e and 2e + 1; of each, tensor rank t holds the fc rows
            // [t F/2, (t + 1) F/2) and the fc projection's columns [t F/2, (t + 1) F/2)
            const size_t efcw = whole.offset(P::EFCW, 1), efcprojw = whole.offset(P::EFCPROJW, 1);
            CHECK(piece.tensor_size(P::EFCW) == 2 * F / 2 * C);
            CHECK(mine[piece.offset(P::EFCW, 1)] == values[efcw + 2 * e * F * C + t * F / 2 * C]);
            CHECK(mine[piece.offset(P::EFCW, 1) + F / 2 * C] == values[efcw + (2 * e + 1) * F * C + t * F / 2 * C]);
            CHECK(mine[piece.offset(P::EFCPROJW, 1) + F / 2] == values[efcprojw + 2 * e * C * F + F + t * F / 2]);
            CHECK(mine[piece.offset(P::EFCPROJW, 1) + C * F / 2] == values[efcprojw + (2 * e + 1) * C * F + t * F / 2]);
            CHECK(piece.tensor_size(P::EFCPROJB) == 2 * C);  // a replica over the tensor group
            CHECK(piece.tensor_size(P::ROUTERW) == whole.tensor_size(P::ROUTERW));
        }
    CHECK(rebuilt == values);
    // cut tensors once per tensor group, replicas on every tensor rank; experts once per expert group
    const ParamLayout cut = P::layout(c, {0, tp}, {}, {0, ep});
    for (const ParamLayout::Segment& s : whole.segments())
        for (size_t i = s.begin; i < s.end; i++)
            REQUIRE(seen[i] == (cut.is_split(s.tensor) ? 1 : tp) * (cut.is_per_expert(s.tensor) ? 1 : ep));
}

TEST_CASE("a tensor-parallel piece's checkpoint slices map to the whole tensor", "[tensor_parallel][checkpoint]") {
    const ModelConfig c = tp_model();
    const ParamLayout whole = GPT2Params::layout(c);
    const ParamLayout piece = GPT2Params::layout(c, {1, 2});
    // Elements 3.. of layer 0's attention projection (8 x 4 local: global columns 4-7) up to the
    // middle of row 5: a partial first row, whole rows (one strided piece), a partial last row.
    const size_t at = piece.offset(GPT2Params::ATTPROJW, 0);
    const std::vector<TensorPiece> p = tensor_pieces(piece, {at + 3, at + 5 * 4 + 2});
    REQUIRE(p.size() == 3);
    CHECK((p[0].begin == 7 && p[0].end == 8 && p[0].run == 0));
    CHECK((p[1].begin == 8 + 4 && p[1].run == 4 && p[1].stride == 8 && p[1].runs() == 4 && p[1].end == 5 * 8));
    CHECK((p[2].begin == 5 * 8 + 4 && p[2].end == 5 * 8 + 6 && p[2].flat_begin == at + 5 * 4));
    size_t total = 0;
    for (const TensorPiece& q : p) total += q.size();
    CHECK(total == 5 * 4 + 2 - 3);
    // Layer 1's qkv piece: three blocks (q, k, v), each contiguous.
    const size_t qkv = piece.offset(GPT2Params::QKVW, 1), n = piece.tensor_size(GPT2Params::QKVW);
    const std::vector<TensorPiece> b = tensor_pieces(piece, {qkv, qkv + n});
    REQUIRE(b.size() == 3);
    const size_t layer = whole.tensor_size(GPT2Params::QKVW);
    for (int k = 0; k < 3; k++) CHECK((b[k].begin == layer + k * 64 + 32 && b[k].end == b[k].begin + 32));
}

TEST_CASE("strided manifest slices are checked when parsed", "[tensor_parallel][checkpoint]") {
    const ModelConfig c = tp_model();
    const ParamLayout piece = GPT2Params::layout(c, {1, 2});
    Manifest m;
    m.model = c;
    m.tp = 2;
    m.world_size = 2;
    m.run_config = nlohmann::json::object();
    m.tensors = manifest_tensors(piece);
    ManifestFile f = describe_rank_file(piece, {{STATE_PARAMS, StateDtype::F32}}, {{0, piece.num_params}}, 1, "r.bin");
    bool strided = false;
    for (const ManifestSlice& s : f.buffers[0].slices) strided |= s.strided();
    CHECK(strided);
    m.files = {f};
    const Manifest back = parse_manifest(manifest_text(manifest_json(m)), "m");
    REQUIRE(back.tp == 2);
    REQUIRE(back.files[0].buffers[0].slices.size() == f.buffers[0].slices.size());
    for (size_t i = 0; i < f.buffers[0].slices.size(); i++) {
        const ManifestSlice &x = back.files[0].buffers[0].slices[i], &y = f.buffers[0].slices[i];
        CHECK((x.begin == y.begin && x.end == y.end && x.run == y.run && x.stride == y.stride &&
               x.byte_offset == y.byte_offset));
    }
    // a stride that does not end at end
    nlohmann::json j = manifest_json(m);
    for (auto& s : j["files"][0]["buffers"][0]["slices"])
        if (s.size() == 6) {
            s[2] = s[2].get<uint64_t>() + 1;
            break;
        }
    REQUIRE_THROWS_WITH(parse_manifest(j.dump(), "m"), Contains("must end exactly at end"));
}

TEST_CASE("vocabulary-parallel cross-entropy equals the whole one", "[tensor_parallel]") {
    const int rows = 5, V = 250, Vp = 256;
    std::vector<float> logits((size_t)rows * Vp);
    Rng rng(3);
    for (float& x : logits) x = (float)(4 * rng.normal());
    std::vector<int> targets = {0, 63, 64, 249, 128};
    std::vector<float> whole = logits, whole_loss(rows);
    cpu::crossentropy(whole_loss.data(), whole.data(), targets.data(), true, 0.5f, rows, V, Vp);
    for (int n : {2, 4}) {
        const int cols = Vp / n;
        std::vector<float> stats((size_t)3 * rows * n), loss(rows);
        std::vector<std::vector<float>> parts(n);
        for (int r = 0; r < n; r++) {
            parts[r].resize((size_t)rows * cols);
            for (int i = 0; i < rows; i++)
                std::copy(&logits[(size_t)i * Vp + r * cols], &logits[(size_t)i * Vp + (r + 1) * cols], &parts[r][(size_t)i * cols]);
            const int real = std::clamp(V - r * cols, 0, cols);
            cpu::crossentropy_local_stats(&stats[(size_t)3 * rows * r], parts[r].data(), targets.data(), rows, r * cols,
                                          real, cols);
        }
        for (int r = 0; r < n; r++) {
            const int real = std::clamp(V - r * cols, 0, cols);
            cpu::crossentropy_from_stats(loss.data(), parts[r].data(), targets.data(), stats.data(), n, true, 0.5f, rows,
                                         r * cols, real, cols);
            for (int i = 0; i < rows; i++) {
                REQUIRE(std::fabs(loss[i] - whole_loss[i]) <= 1e-5f * std::fabs(whole_loss[i]));
                for (int v = 0; v < cols; v++)
                    REQUIRE(std::fabs(parts[r][(size_t)i * cols + v] - whole[(size_t)i * Vp + r * cols + v]) <= 1e-6f);
            }
        }
    }
}
