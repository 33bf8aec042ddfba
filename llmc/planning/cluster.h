// cluster.h: what --plan predicts a step on: the model's shape and the cluster's GPUs and links.
//
// A ModelShape describes any decoder-only model by the numbers that set its FLOPs and bytes (GPT-2
// presets, or --model-shape FILE.json for models llmc does not build, such as published runs). A
// Topology describes one GPU's peak and memory bandwidth, its links (NVLink inside a node, the
// network between nodes, each with a latency and a per-direction bandwidth per GPU) and the
// efficiency each kind of kernel reaches; --topology h100|a100|FILE.json picks it. The defaults
// are written down below with their sources; the efficiencies are assumptions, to be replaced by
// what dev/bench measures.
#pragma once

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "llmc/models/family.h"
#include "llmc/utils.h"

namespace llmc {

struct ModelShape {
    int layers = 0, hidden = 0, heads = 0, kv_heads = 0, ffn_hidden = 0;
    bool swiglu = false;  // false: GELU MLP (two matrices); true: SwiGLU (three)
    int vocab = 0;
    bool tied = true;        // the head reuses the token embedding
    bool is_built = false;   // a model llmc builds: its FLOPs are family.h's count, exactly as the MFU line's
    // Mixture of experts (GPT-2's --experts; 0: dense): every moe_every-th layer has `experts` MLPs,
    // each token visiting top_k of them (and the shared one, with moe_shared), chosen by a router.
    int experts = 0, top_k = 0, moe_every = 1;
    bool moe_shared = false;

    // Weights that multiply activations: qkv (K and V narrower with fewer KV heads) and the
    // attention projection; one MLP (or one expert's); a dense layer's together.
    double attention_params() const {
        const double kv = (double)hidden * kv_heads / heads;
        return (double)hidden * (hidden + 2 * kv) + (double)hidden * hidden;
    }
    double mlp_params() const { return (swiglu ? 3.0 : 2.0) * hidden * ffn_hidden; }
    double layer_matmul_params() const { return attention_params() + mlp_params(); }
    bool is_moe_layer(int layer) const { return experts > 0 && layer % moe_every == moe_every - 1; }
    double params() const {
        const double norms_and_biases = 13.0 * hidden;  // 2 LayerNorms and the biases, per layer (GPT-2)
        return layers * (layer_matmul_params() + norms_and_biases) + (tied ? 1.0 : 2.0) * vocab * hidden;
    }
};

// A model as llmc builds it: GPT-2 (a GELU MLP of 4C, a tied embedding) or Llama (its kv heads, a
// SwiGLU MLP of ffn_hidden, an untied head), with the padded vocabulary.
inline ModelShape shape_of(const ModelConfig& m) {
    ModelShape s;
    s.layers = m.num_layers, s.hidden = m.channels, s.heads = m.num_heads, s.kv_heads = m.kv_head_count();
    s.ffn_hidden = m.mlp_hidden(), s.vocab = m.padded_vocab_size, s.is_built = true;
    s.swiglu = m.arch == ModelArch::Llama, s.tied = m.arch != ModelArch::Llama;
    if (m.num_experts > 0)
        s.experts = m.num_experts, s.top_k = m.moe_top_k, s.moe_every = m.moe_every, s.moe_shared = m.moe_shared;
    return s;
}

// Model FLOPs per trained token, counted as mfu.h counts them: 6 per multiplying weight (forward
// 2, backward 4) plus causal attention's 6 L C T. For a model llmc builds it is family.h's own function.
inline double shape_flops_per_token(const ModelShape& s, const ModelConfig& m, int T) {
    if (s.is_built) return model_flops_per_token(m, T);
    return 6.0 * (s.layers * s.layer_matmul_params() + (double)s.vocab * s.hidden) + 6.0 * s.layers * (double)s.hidden * T;
}

namespace detail {

inline nlohmann::json read_json_file(const std::string& path, const char* flag) {
    std::ifstream in(path);
    if (!in) fail(strformat("%s '%s' cannot be opened", flag, path.c_str()));
    try {
        return nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
        fail(strformat("%s '%s' is not valid JSON: %s", flag, path.c_str(), e.what()));
    }
    return {};
}

// j[key], which must be a number > 0 (an integer where `integer`).
inline double positive(const nlohmann::json& j, const char* key, bool integer, const std::string& where) {
    if (!j.contains(key)) fail(strformat("%s has no \"%s\"", where.c_str(), key));
    const nlohmann::json& v = j[key];
    if (!v.is_number() || (integer && !v.is_number_integer()) || v.get<double>() <= 0)
        fail(strformat("%s: \"%s\" must be a positive %s, got %s", where.c_str(), key, integer ? "integer" : "number",
                       v.dump().c_str()));
    return v.get<double>();
}

inline void refuse_unknown_keys(const nlohmann::json& j, std::initializer_list<const char*> known, const std::string& where) {
    for (auto it = j.begin(); it != j.end(); ++it) {
        bool ok = false;
        for (const char* k : known) ok = ok || it.key() == k;
        if (!ok) fail(strformat("%s: unknown key \"%s\"", where.c_str(), it.key().c_str()));
    }
}

}  // namespace detail

// --model-shape FILE.json: {"layers", "hidden", "heads", "kv_heads", "ffn_hidden", "ffn": "gelu" |
// "swiglu", "vocab", "tied": true | false}, every key required.
inline ModelShape read_model_shape(const std::string& path) {
    const nlohmann::json j = detail::read_json_file(path, "--model-shape");
    const std::string where = strformat("--model-shape '%s'", path.c_str());
    if (!j.is_object()) fail(where + " must hold a JSON object");
    detail::refuse_unknown_keys(j, {"layers", "hidden", "heads", "kv_heads", "ffn_hidden", "ffn", "vocab", "tied"}, where);
    ModelShape s;
    s.layers = (int)detail::positive(j, "layers", true, where);
    s.hidden = (int)detail::positive(j, "hidden", true, where);
    s.heads = (int)detail::positive(j, "heads", true, where);
    s.kv_heads = (int)detail::positive(j, "kv_heads", true, where);
    s.ffn_hidden = (int)detail::positive(j, "ffn_hidden", true, where);
    s.vocab = (int)detail::positive(j, "vocab", true, where);
    if (!j.contains("ffn") || !j["ffn"].is_string() || (j["ffn"] != "gelu" && j["ffn"] != "swiglu"))
        fail(where + ": \"ffn\" must be \"gelu\" or \"swiglu\"");
    if (!j.contains("tied") || !j["tied"].is_boolean()) fail(where + ": \"tied\" must be true or false");
    s.swiglu = j["ffn"] == "swiglu";
    s.tied = j["tied"].get<bool>();
    if (s.hidden % s.heads) fail(strformat("%s: hidden %d is not a multiple of heads %d", where.c_str(), s.hidden, s.heads));
    if (s.heads % s.kv_heads)
        fail(strformat("%s: heads %d is not a multiple of kv_heads %d", where.c_str(), s.heads, s.kv_heads));
    return s;
}

struct Topology {
    std::string name;
    int gpus_per_node = 8;
    double peak_tflops = 0;         // dense bf16 tensor-core peak of one GPU
    double fp8_peak_tflops = 0;     // dense FP8 peak (0: no FP8 tensor cores)
    double hbm_gbps = 0;            // memory bandwidth, GB/s
    double memory_gib = 0;          // memory per GPU
    double nvlink_gbps = 0;         // per GPU per direction, inside a node
    double network_gbps = 0;        // per GPU per direction, between nodes (the node's NICs / its GPUs)
    double host_gbps = 0;           // per GPU per direction, to host memory (PCIe): checkpoint snapshots
    double nvlink_latency_s = 0, network_latency_s = 0;
    // Share of the peak a kernel kind reaches (assumptions, see the presets).
    double matmul_efficiency = 0;     // large bf16 GEMMs (cuBLASLt)
    double attention_efficiency = 0;  // fused causal attention, of the tensor-core peak
    double memory_efficiency = 0;     // elementwise kernels, LayerNorm, AdamW: of hbm_gbps
};

// DGX H100 (NVIDIA DGX H100 datasheet; H100 SXM5 datasheet): 8 GPUs, 989 TFLOP/s dense bf16 (1979 FP8), HBM3
// 3.35 TB/s, 80 GB; NVLink 4 900 GB/s per GPU = 450 GB/s per direction; 8 ConnectX-7 of 400 Gb/s
// per node = 50 GB/s per GPU; PCIe Gen5 x16, 64 GB/s per direction. DGX A100 (DGX A100 datasheet;
// A100 SXM4 80GB datasheet): 312 TFLOP/s, HBM2e 2.0 TB/s, 80 GB; NVLink 3 600 GB/s = 300 per
// direction; 8 x 200 Gb/s HDR = 25 GB/s per GPU; PCIe Gen4 x16, 32 GB/s per direction. Latencies
// (assumed): 3 us per collective step over NVLink, 8 us over InfiniBand, the order of NCCL's
// small-message times. Efficiencies (assumed): cuBLASLt reaches about 70% of the H100's dense peak
// and 80% of the A100's on transformer-sized GEMMs; fused attention about half; elementwise kernels
// about 80% of the memory bandwidth.
inline Topology topology_preset(const std::string& name) {
    Topology t;
    t.name = name;
    if (name == "h100") {
        t.peak_tflops = 989, t.fp8_peak_tflops = 1979, t.hbm_gbps = 3350, t.memory_gib = 80, t.nvlink_gbps = 450, t.network_gbps = 50, t.host_gbps = 64;
        t.matmul_efficiency = 0.70;
    } else if (name == "a100") {
        t.peak_tflops = 312, t.hbm_gbps = 2039, t.memory_gib = 80, t.nvlink_gbps = 300, t.network_gbps = 25, t.host_gbps = 32;
        t.matmul_efficiency = 0.80;
    } else {
        fail(strformat("--topology must be h100, a100 or a JSON file, got '%s'", name.c_str()));
    }
    t.nvlink_latency_s = 3e-6, t.network_latency_s = 8e-6;
    t.attention_efficiency = 0.5, t.memory_efficiency = 0.8;
    return t;
}

// --topology: a preset's name, or a JSON file of every Topology field by its name (a "base"
// preset's values fill the keys it leaves out). Measured rates may stand for the efficiencies:
// "matmul_tflops" and "attention_tflops" (achieved, dense bf16) and "memory_gbps" (achieved by the
// elementwise kernels), as dev/bench/measured_topology.sh writes them from a GPU session's timings.
inline Topology read_topology(const std::string& spec) {
    if (spec == "h100" || spec == "a100") return topology_preset(spec);
    if (spec.size() < 5 || spec.substr(spec.size() - 5) != ".json")
        fail(strformat("--topology must be h100, a100 or a .json file, got '%s'", spec.c_str()));
    const nlohmann::json j = detail::read_json_file(spec, "--topology");
    const std::string where = strformat("--topology '%s'", spec.c_str());
    if (!j.is_object()) fail(where + " must hold a JSON object");
    detail::refuse_unknown_keys(j, {"base", "gpus_per_node", "peak_tflops", "fp8_peak_tflops", "hbm_gbps", "memory_gib", "nvlink_gbps",
                                    "network_gbps", "host_gbps", "nvlink_latency_s", "network_latency_s", "matmul_efficiency",
                                    "attention_efficiency", "memory_efficiency", "matmul_tflops", "attention_tflops",
                                    "memory_gbps"}, where);
    if (!j.contains("base") || !j["base"].is_string() || (j["base"] != "h100" && j["base"] != "a100"))
        fail(where + ": \"base\" must be \"h100\" or \"a100\" (the preset whose values fill the keys not given)");
    Topology t = topology_preset(j["base"].get<std::string>());
    t.name = spec;
    auto set = [&](const char* key, double* field, bool integer = false) {
        if (j.contains(key)) *field = detail::positive(j, key, integer, where);
    };
    double gpus = t.gpus_per_node;
    set("gpus_per_node", &gpus, true);
    t.gpus_per_node = (int)gpus;
    set("peak_tflops", &t.peak_tflops), set("fp8_peak_tflops", &t.fp8_peak_tflops), set("hbm_gbps", &t.hbm_gbps), set("memory_gib", &t.memory_gib);
    set("nvlink_gbps", &t.nvlink_gbps), set("network_gbps", &t.network_gbps), set("host_gbps", &t.host_gbps);
    set("nvlink_latency_s", &t.nvlink_latency_s), set("network_latency_s", &t.network_latency_s);
    set("matmul_efficiency", &t.matmul_efficiency), set("attention_efficiency", &t.attention_efficiency);
    set("memory_efficiency", &t.memory_efficiency);
    auto measured = [&](const char* rate_key, const char* efficiency_key, double peak, double* efficiency) {
        if (!j.contains(rate_key)) return;
        if (j.contains(efficiency_key))
            fail(strformat("%s: give \"%s\" or the measured \"%s\", not both", where.c_str(), efficiency_key, rate_key));
        *efficiency = detail::positive(j, rate_key, false, where) / peak;
    };
    measured("matmul_tflops", "matmul_efficiency", t.peak_tflops, &t.matmul_efficiency);
    measured("attention_tflops", "attention_efficiency", t.peak_tflops, &t.attention_efficiency);
    measured("memory_gbps", "memory_efficiency", t.hbm_gbps, &t.memory_efficiency);
    for (double e : {t.matmul_efficiency, t.attention_efficiency, t.memory_efficiency})
        if (e > 1) fail(where + ": an efficiency is a share of the peak, at most 1 (a measured rate at most the peak)");
    return t;
}

}  // namespace llmc
