"""The tiny random-weight Llama checkpoints the vLLM tests serve and compare, built here.

Run with the vLLM virtualenv's Python (it imports transformers, which the project's own
environment does not have): ``VENV/bin/python tests/support/vllm_checkpoint.py ROOT``.
It writes ``ROOT/<key>/`` and prints that path; ``<key>`` is a hash of this file and of
transformers' and tokenizers' versions, so an edit here or an upgrade builds afresh and an
unchanged one is reused (``ROOT/<key>/.complete`` marks a finished build). Nothing is
downloaded: the weights are random (seeded), the tokenizer is built here.

``<key>/`` holds one checkpoint per variant, each a directory both engines load:

- ``served``: grouped-query attention (4 query heads, 2 KV heads), head_dim 32 (vLLM's CPU
  attention supports head sizes 32, 64, 80, ...), plain RoPE. The one vLLM serves.
- ``rope-llama3``, ``rope-linear``: the same shapes with RoPE scaling, for the logits
  comparison with transformers only (tests/vllm/test_transformers_logits.py).

The tokenizer is word-level (one token per word or punctuation mark, whitespace split), so
that decoding is injective: a completion's text split on whitespace gives back its token
ids on any server, which is how the greedy comparison reads schedscope's completions (it
has no logprobs). The loader's text-prompt words (harness/loadgen/prompts.py) are each one
token; the chat template's words are in the vocabulary too, and a few rare words close it
(the last ids). Ids 0-2 are ``<unk>``,
``<s>``, ``</s>`` (end of sequence, as schedscope's default).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

#: The loader's text-prompt words (harness/loadgen/prompts.py WORDS, copied: this script
#: runs outside the project's environment; tests/vllm/test_checkpoint.py checks the copy).
PROMPT_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there had one all we can their has been if "
    "more when will would who so no out up into do any time about other than then them"
).split()
SPECIAL = ["<unk>", "<s>", "</s>"]
#: Rare words, last (a vocabulary built by frequency puts them there): the load
#: generator's vocabulary probe (harness/loadgen/prompt_choice.py) meets them, so its
#: /tokenize bound is the vocabulary's size and `--prompt-mode auto` picks token ids.
RARE_WORDS = (
    "zephyr quixotic xylophone juxtapose kaleidoscope onomatopoeia serendipity mnemonic "
    "rhythm sphinx fjord czar pneumatic bureaucracy idiosyncrasy"
).split()
TEMPLATE_WORDS = ["system", "user", "assistant", ":", ".", ",", "?", "!"]
#: Filler words up to a vocabulary of 1,280 (a multiple of 128, as real vocabularies are).
VOCAB_SIZE = 1280
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }} : {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant :{% endif %}"
)
SHAPES = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
    tie_word_embeddings=False,
    # Wider than transformers' 0.02: sharper logits, fewer near-ties between the
    # engines' float32 arithmetic in the greedy comparison.
    initializer_range=0.1,
)
VARIANTS = {
    "served": None,
    "rope-llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "rope-linear": {"rope_type": "linear", "factor": 4.0},
}
SEED = 1234


def vocabulary() -> list[str]:
    words = SPECIAL + PROMPT_WORDS + [w for w in TEMPLATE_WORDS if w not in PROMPT_WORDS]
    fillers = (f"w{i:04d}" for i in range(VOCAB_SIZE))
    while len(words) < VOCAB_SIZE - len(RARE_WORDS):
        words.append(next(fillers))
    return words + RARE_WORDS


def content_key() -> str:
    import tokenizers
    import transformers

    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(f"{transformers.__version__} {tokenizers.__version__}".encode())
    return digest.hexdigest()[:16]


def save_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate(vocabulary())}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))


def save_model(out: Path, rope_scaling: dict | None) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(**SHAPES, rope_scaling=rope_scaling, torch_dtype="float32")
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(str(out), safe_serialization=True)


def build(root: Path) -> Path:
    out = root / content_key()
    if (out / ".complete").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    for name, rope_scaling in VARIANTS.items():
        save_model(out / name, rope_scaling)
        save_tokenizer(out / name)
    (out / "vocabulary.json").write_text(json.dumps(vocabulary()))
    (out / ".complete").write_text("")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: vllm_checkpoint.py ROOT")
    print(build(Path(sys.argv[1])))
