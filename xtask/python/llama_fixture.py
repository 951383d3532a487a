"""Writes the fixture weft's CI checks its Llama family against (no Python there): for a tiny
random `LlamaForCausalLM` (grouped-query attention, Llama 3's rope scaling, tied head) and a
tiny random `Phi3ForCausalLM` (fused projections, untied head), `save_pretrained`'s folder
(config.json, model.safetensors) and `expected.safetensors` holding the input ids and the f32
logits `transformers` computes for them. Usage: llama_fixture.py OUT_DIR."""
import json
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file

SHAPE = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=32,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    pad_token_id=None,
    bos_token_id=None,
    eos_token_id=None,
)


def main() -> None:
    out = Path(sys.argv[1])
    torch.manual_seed(0)
    ids = torch.randint(0, SHAPE["vocab_size"], (2, 12))
    llama = transformers.LlamaConfig(
        **SHAPE,
        tie_word_embeddings=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    )
    phi3 = transformers.Phi3Config(**SHAPE, tie_word_embeddings=False)
    for name, config, cls in [
        ("llama", llama, transformers.LlamaForCausalLM),
        ("phi3", phi3, transformers.Phi3ForCausalLM),
    ]:
        torch.manual_seed(1)
        model = cls(config).float().eval()
        # Norm weights away from one, so that a norm applied without its weight shows.
        with torch.no_grad():
            for key, value in model.named_parameters():
                if key.endswith("norm.weight"):
                    value.uniform_(0.5, 1.5)
            logits = model(ids).logits
        folder = out / name
        model.save_pretrained(folder, safe_serialization=True)
        save_file(
            {"input_ids": ids.to(torch.int64), "logits": logits.contiguous()},
            str(folder / "expected.safetensors"),
        )
        written = json.loads((folder / "config.json").read_text())
        print(name, "transformers", transformers.__version__, "keys", sorted(written)[:6], "...")


if __name__ == "__main__":
    main()
