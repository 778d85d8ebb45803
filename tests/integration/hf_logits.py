"""Loads a `longhaulctl export --format=hf` directory with Hugging Face transformers and compares
its logits with longhaul's own on the same tokens (tests/integration/hf_export_test.cc).

usage: hf_logits.py MODEL_DIR OURS.safetensors
OURS holds "tokens" [B, T] (float32 holding integer ids) and "logits" [B, T, V] that longhaul's
model computed from the same stage checkpoints. Prints one JSON line:
  {"rel_diff": max|hf - ours| / max|ours|, "max_abs_diff": ..., "missing_keys": [...], ...}
Exit status 0 when it ran (the caller judges the numbers), 1 on any error.
"""
import json
import sys

import torch
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel


def main() -> int:
    model_dir, ours_path = sys.argv[1], sys.argv[2]
    ours = load_file(ours_path)
    tokens = ours["tokens"].to(torch.long)
    want = ours["logits"].to(torch.float64)
    # Eager attention: the reference implementation, independent of our fused or explicit forms.
    model, info = GPT2LMHeadModel.from_pretrained(model_dir, output_loading_info=True, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        got = model(tokens).logits.to(torch.float64)
    out = {
        "shape": list(got.shape),
        "want_shape": list(want.shape),
        "missing_keys": sorted(info["missing_keys"]),
        "unexpected_keys": sorted(info["unexpected_keys"]),
        "mismatched_keys": [str(k) for k in info["mismatched_keys"]],
        # Untied embeddings: lm_head must be its own tensor, not wte.
        "tied": model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(),
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
    }
    if got.shape == want.shape:
        diff = (got - want).abs().max().item()
        out["max_abs_diff"] = diff
        out["rel_diff"] = diff / want.abs().max().item()
        out["max_abs_logit"] = want.abs().max().item()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
