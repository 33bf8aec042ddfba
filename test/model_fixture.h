// test/model_fixture.h: a model fixture written by a float64 PyTorch oracle (dev/ref/make_fixture.py
// for GPT-2, dev/ref/make_llama_model_fixture.py for Llama: a model file and a state file), and the
// three checks every family's CPU model passes against one: the forward's logits and loss, every
// gradient tensor by tensor, and the losses of the fixture's AdamW steps with clipping.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "llmc/models/cpu_model.h"
#include "llmc/models/model_file.h"
#include "llmc/utils.h"
#include "test/file_order.h"
#include "test/rel_error.h"

namespace llmc::test {

constexpr int STATE_MAGIC = 20241121, STATE_VERSION = 1;

// Everything in a state file (make_fixture.py documents the layout) beside its model file.
struct Fixture {
    std::string model_path;
    ModelConfig config;
    int B = 0, T = 0, steps = 0;
    AdamWConfig opt;
    float grad_clip = 0.0f;
    MoeOptions moe;  // the auxiliary losses' weights (MoE fixture)
    std::vector<int> inputs, targets;
    std::vector<float> logits, grads, losses;
    float loss = 0.0f;

    Fixture(const char* model, const char* state) : model_path(model), config(read_model_header(model)) {
        File f(state, "rb");
        int32_t header[256];
        f.read(header, 256, "state header");
        if (header[0] != STATE_MAGIC || header[1] != STATE_VERSION)
            fail(strformat("'%s': bad magic/version %d/%d", state, header[0], header[1]));
        B = header[2];
        T = header[3];
        steps = header[4];
        float hyper[8];
        f.read(hyper, 8, "hyperparameters");
        opt.lr = hyper[0];
        opt.beta1 = hyper[1];
        opt.beta2 = hyper[2];
        opt.eps = hyper[3];
        opt.weight_decay = hyper[4];
        grad_clip = hyper[5];
        moe.balance_coef = hyper[6];
        moe.z_coef = hyper[7];
        const size_t BT = (size_t)B * T;
        inputs.resize(BT);
        targets.resize(BT);
        logits.resize(BT * config.vocab_size);
        grads.resize(num_params(config));
        losses.resize(steps);
        f.read(inputs.data(), BT, "inputs");
        f.read(targets.data(), BT, "targets");
        f.read(logits.data(), logits.size(), "logits");
        f.read(&loss, 1, "loss");
        f.read(grads.data(), grads.size(), "grads");
        f.read(losses.data(), losses.size(), "losses");
        if (f.tell() != f.size()) fail(strformat("'%s' has trailing bytes", state));
    }
};

// The fixture's model, loaded from its file, with its auxiliary losses' weights.
inline std::unique_ptr<CPUModel> load_model(const Fixture& fx) {
    auto model = std::make_unique<CPUModel>(fx.config, fx.B, fx.T);
    model->load(fx.model_path);
    model->set_moe_options(fx.moe);
    return model;
}

// Tensor t, all layers together, in a buffer in model file (llm.c) order: [begin, begin + size).
struct FileRange {
    size_t begin, size;
};
inline FileRange file_range(const ParamLayout& layout, int t) {
    return {layout.file_begin(t), layout.file_size(t)};
}

// A flat (bucket-major) buffer rearranged into model file order.
inline std::vector<float> in_file_order(const ParamLayout& layout, const float* flat) {
    std::vector<float> out(layout.num_params);
    to_file_order(layout, flat, out.data());
    return out;
}

inline void check_forward(const Fixture& fx) {
    const std::unique_ptr<CPUModel> loaded = load_model(fx);
    CPUModel& model = *loaded;
    const float loss = model.evaluate(fx.inputs.data(), fx.targets.data(), fx.B, fx.T);
    CHECK(rel_error(loss, fx.loss) <= 1e-5);

    // the model's logits rows are Vp wide; the fixture's hold the V real columns
    const int V = fx.config.vocab_size, Vp = fx.config.padded_vocab_size;
    std::vector<float> logits((size_t)fx.B * fx.T * V);
    for (int r = 0; r < fx.B * fx.T; r++)
        std::copy(model.logits() + (size_t)r * Vp, model.logits() + (size_t)r * Vp + V, logits.begin() + (size_t)r * V);
    CHECK(rel_error(logits.data(), fx.logits.data(), logits.size()) <= 1e-4);
}

inline void check_gradients(const Fixture& fx) {
    const std::unique_ptr<CPUModel> loaded = load_model(fx);
    CPUModel& model = *loaded;
    model.zero_grad();
    const float loss = model.forward_backward(fx.inputs.data(), fx.targets.data(), fx.B, fx.T, 1.0f, true);
    CHECK(rel_error(loss, fx.loss) <= 1e-5);
    // the fixture stores gradients in model file order
    const ParamLayout layout = model_layout(fx.config);
    const std::vector<float> grads = in_file_order(layout, model.grads());
    for (int t = 0; t < layout.num_tensors(); t++) {
        const std::string tensor = layout.name(t);
        CAPTURE(tensor);
        const FileRange r = file_range(layout, t);
        CHECK(rel_error(grads.data() + r.begin, fx.grads.data() + r.begin, r.size) <= 1e-4);
    }
}

inline void check_adamw_steps(const Fixture& fx) {
    const std::unique_ptr<CPUModel> loaded = load_model(fx);
    Model& m = *loaded;  // drive it only through the interface the train loop uses
    for (int step = 1; step <= fx.steps; step++) {
        CAPTURE(step);
        m.zero_grad();
        const float loss = m.forward_backward(fx.inputs.data(), fx.targets.data(), fx.B, fx.T, 1.0f, true);
        CHECK(rel_error(loss, fx.losses[step - 1]) <= 1e-5);
        // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1
        const double norm = std::sqrt(m.grad_norm_squared());
        const double coef = fx.grad_clip / (norm + 1e-6);
        m.adamw_step(fx.opt, step, coef < 1.0 ? (float)coef : 1.0f);
    }
}

}  // namespace llmc::test
