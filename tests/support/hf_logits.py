"""transformers' logits for token sequences, the reference the bundled model is compared
with (tests/vllm/test_transformers_logits.py). Runs with the vLLM virtualenv's Python,
which has transformers (the project's environment has not):

    VENV/bin/python tests/support/hf_logits.py MODEL_DIR OUT.safetensors < sequences.json

``sequences.json`` is a JSON list of token-id lists; ``OUT`` gets ``seq<i>``: float32
logits ``[len, vocab]`` of every position of sequence i, computed one sequence at a time
(no padding) by ``LlamaForCausalLM.from_pretrained`` in float32 with eager attention.
"""

from __future__ import annotations

import json
import sys

import torch
from safetensors.torch import save_file
from transformers import LlamaForCausalLM


def main(model_dir: str, out: str) -> None:
    sequences = json.load(sys.stdin)
    model = LlamaForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    logits = {}
    with torch.no_grad():
        for i, ids in enumerate(sequences):
            output = model(torch.tensor([ids]), use_cache=False)
            logits[f"seq{i}"] = output.logits[0].float().contiguous()
    save_file(logits, out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: hf_logits.py MODEL_DIR OUT.safetensors < sequences.json")
    main(sys.argv[1], sys.argv[2])
