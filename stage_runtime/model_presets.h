// The published GPT-2 shapes (Radford et al. 2019; Hugging Face's gpt2, gpt2-medium, gpt2-large,
// gpt2-xl), one table, header-only and free of LibTorch so that the coordinator resolves
// `model.preset` in job specs and the benchmark takes `--preset` from the same rows.
#ifndef LONGHAUL_STAGE_RUNTIME_MODEL_PRESETS_H_
#define LONGHAUL_STAGE_RUNTIME_MODEL_PRESETS_H_

#include <string>
#include <string_view>

namespace longhaul::stage_runtime {

struct ModelPreset {
  std::string_view name;
  int layers, hidden, heads, context, vocab;
};

inline constexpr ModelPreset kModelPresets[] = {
    {"gpt2-small", 12, 768, 12, 1024, 50257},
    {"gpt2-medium", 24, 1024, 16, 1024, 50257},
    {"gpt2-large", 36, 1280, 20, 1024, 50257},
    {"gpt2-xl", 48, 1600, 25, 1024, 50257},
};

// nullptr when `name` is not a preset.
inline const ModelPreset* FindModelPreset(std::string_view name) {
  for (const ModelPreset& p : kModelPresets) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

// "gpt2-small | gpt2-medium | ..." for messages and help texts.
inline std::string ModelPresetNames() {
  std::string s;
  for (const ModelPreset& p : kModelPresets) {
    if (!s.empty()) s += " | ";
    s += p.name;
  }
  return s;
}

}  // namespace longhaul::stage_runtime

#endif  // LONGHAUL_STAGE_RUNTIME_MODEL_PRESETS_H_
