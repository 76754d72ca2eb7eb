"""Write a small llama-architecture GGUF model that llama-server loads: random weights, a tiny SPM vocabulary.

Four layers of width 1024 (8 heads of 128), a 4096-wide feed-forward, 8192 tokens of trained context,
f32 weights: 64 M parameters, 270 MB. Smaller would do to load and answer; this size is what makes the
server's life observable on 2 cores: it loads for about a second (with `--load-mode dio` and an f32 KV
cache, harness.py) and generates some 30 tokens a second on one thread, so a scrape sees the load
and the queue. The vocabulary is SentencePiece-style (`tokenizer.ggml.model = "llama"`):
`<unk>`, `<s>`, `</s>`, the 256 byte tokens `<0x00>`..`<0xFF>` (llama.cpp falls back to them for any
character not in the vocabulary, and fails without them), then "▁" and the lower-case letters alone and
after "▁". Its output is noise; the tests send token ids and `ignore_eos`, so lengths are exact.
"""

from __future__ import annotations

import string
from pathlib import Path

import gguf
import numpy as np

N_EMBD = 1024
N_HEAD = 8
N_FF = 4096
N_LAYER = 4
N_CTX_TRAIN = 8192

# token types of llama.cpp's vocabulary (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"]
    types = [UNKNOWN, CONTROL, CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    words = ["\u2581", *string.ascii_lowercase, *("\u2581" + c for c in string.ascii_lowercase)]
    tokens += words
    types += [NORMAL] * len(words)
    # SPM merges by score: longer pieces score higher, so "▁a" wins over "▁" then "a".
    scores = [0.0 if t != NORMAL else -10.0 + len(tok) for tok, t in zip(tokens, types, strict=True)]
    return tokens, scores, types


def write_tiny_llama(path: Path, seed: int = 0) -> Path:
    """Write the model to `path` (a .gguf file) and return it."""
    path = Path(path)
    tokens, scores, types = vocabulary()
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:  # numpy shape is ggml's dims reversed
        w = rng.standard_normal(shape, dtype=np.float32)
        w *= 0.02
        return w

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("oomguard-tiny-llama")
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    writer.add_tensor("token_embd.weight", weight(n_vocab, N_EMBD))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("output.weight", weight(n_vocab, N_EMBD))
    for i in range(N_LAYER):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(N_EMBD, N_FF))

    tmp = path.with_suffix(".partial")
    writer.path = tmp  # written under another name, renamed when whole
    writer.write_header_to_file(tmp)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.rename(path)
    return path


if __name__ == "__main__":
    import sys

    print(write_tiny_llama(Path(sys.argv[1])))
