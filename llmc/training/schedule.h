// schedule.h: learning-rate schedules.
//
// Every schedule is a pure function of the 0-based step: linear warmup from lr/warmup to lr over
// the first warmup_steps, then one of
//   cosine    half a cosine from lr down to final_lr_frac * lr at the last step
//   linear    a straight line from lr down to final_lr_frac * lr
//   constant  lr until the end
//   wsd       warmup-stable-decay: lr until the last decay_frac of the run, then a 1 - sqrt cooldown
//             to final_lr_frac * lr (the cooldown shape that trains best in the WSD literature)
// Being stateless, a resumed run gets exactly the rates of an uninterrupted one.
#pragma once

#include <cmath>
#include <string>

#include "llmc/utils.h"

namespace llmc {

enum class LrScheduleKind { Cosine, Linear, Constant, Wsd };

inline LrScheduleKind parse_lr_schedule(const std::string& name) {
    if (name == "cosine") return LrScheduleKind::Cosine;
    if (name == "linear") return LrScheduleKind::Linear;
    if (name == "constant") return LrScheduleKind::Constant;
    if (name == "wsd") return LrScheduleKind::Wsd;
    fail(strformat("unknown learning-rate schedule '%s': expected cosine, linear, constant or wsd", name.c_str()));
}

struct LrSchedule {
    LrScheduleKind kind = LrScheduleKind::Cosine;
    float max_lr = 3e-4f;
    int warmup_steps = 0;
    int total_steps = 1;
    float final_lr_frac = 0.0f;  // the last step's lr as a fraction of max_lr
    float wsd_decay_frac = 0.2f; // wsd only: the fraction of all steps spent cooling down

    float lr_at(int step) const {
        if (step < warmup_steps) return max_lr * (float)(step + 1) / (float)warmup_steps;
        float min_lr = final_lr_frac * max_lr;
        // progress through the post-warmup part of the run: 0 at its first step, 1 at the last step
        int decay_steps = total_steps - 1 - warmup_steps;
        double progress = decay_steps > 0 ? (double)(step - warmup_steps) / decay_steps : 1.0;
        if (progress > 1.0) progress = 1.0;
        switch (kind) {
        case LrScheduleKind::Cosine:
            return (float)(min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (max_lr - min_lr));
        case LrScheduleKind::Linear:
            return (float)(max_lr - progress * (max_lr - min_lr));
        case LrScheduleKind::Constant:
            return max_lr;
        case LrScheduleKind::Wsd: {
            int cooldown_steps = (int)std::lround(wsd_decay_frac * total_steps);
            int cooldown_begin = total_steps - cooldown_steps;
            if (step < cooldown_begin || cooldown_steps <= 0) return max_lr;
            double p = cooldown_steps > 1 ? (double)(step - cooldown_begin) / (cooldown_steps - 1) : 1.0;
            if (p > 1.0) p = 1.0;
            return (float)(min_lr + (1.0 - std::sqrt(p)) * (max_lr - min_lr));
        }
        }
        return max_lr;
    }
};

}  // namespace llmc
