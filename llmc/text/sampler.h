// sampler.h: text generation from a Model: softmax with temperature, then one multinomial draw.
//
// Sampling uses its own Rng (seeded from the run's seed), so printing samples never changes the
// training trajectory, and the same step prints the same text in every run with the same seed.
#pragma once

#include <cmath>
#include <functional>
#include <vector>

#include "llmc/model.h"
#include "llmc/numerics/rng.h"

namespace llmc {

// The sampling Rng's seed for a run seed: its own stream, apart from the training RNG's.
inline uint64_t sampling_seed(uint64_t run_seed) { return run_seed ^ 0x5A4D504C45ull; }

// Draws a token id in [0, vocab_size) from softmax(logits / temperature); padded ids never come out.
inline int sample_token(const float* logits, int vocab_size, float temperature, Rng& rng) {
    float max_logit = logits[0];
    for (int i = 1; i < vocab_size; i++) max_logit = std::max(max_logit, logits[i]);
    double total = 0.0;
    for (int i = 0; i < vocab_size; i++) total += std::exp((double)(logits[i] - max_logit) / temperature);
    double target = rng.uniform() * total, cumulative = 0.0;
    for (int i = 0; i < vocab_size; i++) {
        cumulative += std::exp((double)(logits[i] - max_logit) / temperature);
        if (cumulative > target) return i;
    }
    return vocab_size - 1;  // only reachable through rounding in the last bucket
}

// Extends `tokens` by num_new tokens, handing each to `on_token` as soon as it is drawn (so a caller
// can print them as they come). The model sees at most its max_seq_len latest tokens.
inline void generate(Model& model, std::vector<int>& tokens, int num_new, float temperature, Rng& rng,
                     const std::function<void(int)>& on_token = nullptr) {
    const ModelConfig& c = model.config();
    std::vector<float> logits(c.padded_vocab_size);
    for (int i = 0; i < num_new; i++) {
        int context = std::min((int)tokens.size(), model.max_seq_len());
        model.next_token_logits(tokens.data() + tokens.size() - context, context, logits.data());
        tokens.push_back(sample_token(logits.data(), c.vocab_size, temperature, rng));
        if (on_token) on_token(tokens.back());
    }
}

}  // namespace llmc
