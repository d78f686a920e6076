"""Tiny random-weight models that vLLM can serve without a hub (nothing is downloaded).

write_models(root) writes two models with save_pretrained, deterministically (fixed seed):
- "dense": a 2-layer Llama, hidden 128;
- "mla": a 2-layer DeepSeek-V2 with MLA (kv_lora_rank 512 + qk_rope_head_dim 64 = 576, a
  head size vLLM's CPU MLA backend accepts; 96 is refused) and MoE (4 routed experts + 1
  shared, top-2; layer 0 dense, layer 1 MoE).
Each gets a word-level tokenizer built with `tokenizers`, saved as a PreTrainedTokenizerFast
with a chat template, so /v1/chat/completions works. Needs torch and transformers (the engine
venv of tools/engine-env.sh): `python -m tests.cluster.tiny_models DIR`.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

MARKER = ".longctx-tiny-model"
# Words w0..wN plus the special and role tokens; a prompt of "w1 w2 ..." is one token per word.
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
VOCAB_SIZE = 1024
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SEED = 0

COMMON = dict(vocab_size=VOCAB_SIZE, num_hidden_layers=2, max_position_embeddings=4096,
              bos_token_id=1, eos_token_id=2, pad_token_id=3, tie_word_embeddings=False)
SPECS: dict[str, dict] = {
    "dense": dict(COMMON, model_type="llama", hidden_size=128, intermediate_size=256,
                  num_attention_heads=4, num_key_value_heads=2),
    "mla": dict(COMMON, model_type="deepseek_v2", hidden_size=128, intermediate_size=256,
                moe_intermediate_size=64, num_attention_heads=4, num_key_value_heads=4,
                kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=32,
                v_head_dim=32, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                first_k_dense_replace=1, moe_layer_freq=1, topk_method="greedy", n_group=1,
                topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.0),
}


def write_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = SPECIALS + [f"w{i}" for i in range(VOCAB_SIZE - len(SPECIALS))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # Role markers as special tokens: they split out even when glued to text.
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>",
                                   chat_template=CHAT_TEMPLATE)
    fast.save_pretrained(path)


def write_model(name: str, path: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(SPECS[name])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(path)
    write_tokenizer(path)


def write_models(root: Path) -> dict[str, Path]:
    """Writes the models under root (skipping those already complete); returns their dirs."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, spec in SPECS.items():
        path = root / name
        # The marker holds the spec, so a changed spec rewrites the model.
        stamp = json.dumps(spec, sort_keys=True)
        marker = path / MARKER
        if not (marker.is_file() and marker.read_text() == stamp):
            tmp = root / f".{name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            write_model(name, tmp)
            (tmp / MARKER).write_text(stamp)
            shutil.rmtree(path, ignore_errors=True)
            tmp.rename(path)  # a reader never sees a half-written model
        paths[name] = path
    return paths


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.cluster.tiny_models DIR")
    for name, path in write_models(Path(sys.argv[1])).items():
        print(f"{name}\t{path}")
