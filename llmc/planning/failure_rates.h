// planning/failure_rates.h: how often GPUs of a large run fail, from published statistics: the
// default of --failure-rate (config/run_config.h) and of goodput.h's failure model.
#pragma once

namespace llmc {

// Llama 3 ("The Llama 3 Herd of Models", Meta 2024, section 3.3.4) had 419 unexpected interruptions
// in a 54-day snapshot of pre-training on 16,384 H100s: 419 / (54 x 24 x 16,384) = 1.97e-5 per
// GPU-hour, one every 3.1 hours for the job.
constexpr double kLlama3FailuresPerGpuHour = 419.0 / (54.0 * 24 * 16384);

}  // namespace llmc
