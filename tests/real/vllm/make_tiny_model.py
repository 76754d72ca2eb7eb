"""Make a tiny random Llama model plus tokenizer that vLLM can serve on CPU.

Run with the vLLM venv's python (it needs torch, transformers, tokenizers):

    python make_tiny_model.py OUTDIR

Nothing can be downloaded from a model hub here, so the model is built on the
spot: random weights (fixed seed) and a byte-level BPE tokenizer trained on a
generated corpus. The output is the same on every run, and a complete OUTDIR
(marked by a sentinel file written last) is left alone.
"""

from __future__ import annotations

import random
import shutil
import sys
from pathlib import Path

SEED = 1234
VOCAB_SIZE = 384  # a few hundred tokens: 256 byte symbols + merges + specials
MAX_LEN = 512
SENTINEL = ".oomguard-complete"
SPECIALS = ["<unk>", "<s>", "</s>"]
# Minimal template so /v1/chat/completions works too; vLLM refuses chat
# requests for a tokenizer without one.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{{ m['role'] }}: {{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)
# Words of the training corpus; repeated, so BPE learns whole-word merges.
WORDS = (
    "memory", "cache", "block", "page", "token", "queue", "request", "batch", "kernel",
    "tensor", "model", "server", "prompt", "output", "device", "thread", "worker", "engine",
    "metric", "gauge", "counter", "the", "a", "of", "to", "and", "in", "is", "for", "on",
    "with", "as", "at", "by", "from",
)  # fmt: skip


def corpus(rng: random.Random, lines: int = 2000) -> list[str]:
    """Pseudo-sentences: enough repetition for BPE to learn a few merges."""
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 16))) for _ in range(lines)]


def build(out: Path) -> None:
    # Heavy imports (seconds) only when a model is really built, so the
    # "already complete" path stays instant.
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    rng = random.Random(SEED)
    torch.manual_seed(SEED)

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(rng), trainer=trainer)

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        model_max_length=MAX_LEN,
    )
    fast.chat_template = CHAT_TEMPLATE

    # head_dim must be 64 (128 / 2 heads): the CPU attention kernel rejects
    # head_dim 16 at the first request.
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=MAX_LEN,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=None,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).eval()

    model.save_pretrained(out, safe_serialization=True)
    fast.save_pretrained(out)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} OUTDIR", file=sys.stderr)
        return 2
    out = Path(argv[1]).resolve()
    if (out / SENTINEL).exists():
        print(f"tiny model already in {out}")
        return 0
    # Build next to OUTDIR and rename, so an interrupted run never leaves a
    # half-written model that looks complete.
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    build(tmp)
    (tmp / SENTINEL).write_text("ok\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"tiny model written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
