"""A tiny random transformers checkpoint with a tokenizer, made offline: the input of ``mgx-graph export`` in
tests/cli/test_cli_export.py and the model of bench/clean_install_gpu.sh (exported by bench/download_gpu_wheels.sh).

    python bench/tiny_checkpoint.py OUT [--arch ARCH] [--seed N]      (ARCH: a key of ARCHS, default llama)

Hidden size 64, 2 layers, 4 attention heads over 2 KV heads (phi and nemotron: hidden size 128 and 4 KV heads,
so that their partial rotary half of a head is a multiple of 8, as onnxruntime-genai's attention requires;
gemma2 and gpt_oss: a sliding window of 4 tokens on their local layers, so a short generation already leaves
it; gpt_oss: 4 experts, 2 per token; lfm2: a short-convolution layer, then an attention layer), a word-level vocabulary of about 100 common English
words (the tokenizer is built with ``tokenizers``, nothing is downloaded) with a plain chat template. The
end-of-sequence row of the output projection is zero, so greedy decoding runs its full length: that logit is 0
while the largest of the others is positive (all but surely). Needs torch, transformers and tokenizers.
"""
from __future__ import annotations

import argparse
from pathlib import Path

WORDS = ("the a of to and in is it that was for on are as with his they at be this from have or by one had not but "
         "what all were when we there can an your which their said if do will each about how up out them then she "
         "many some so these would other into has more her two like him see time could no make than first been its "
         "who now people my made over did down only way find use may water long little very after words called").split()
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
#: --arch -> the transformers config class, and what that architecture sets beyond the common shape
ARCHS = {"llama": ("LlamaConfig", {}), "mistral": ("MistralConfig", {}), "qwen2": ("Qwen2Config", {}),
         "qwen3": ("Qwen3Config", {}), "phi": ("PhiConfig", {"hidden_size": 128, "num_key_value_heads": 4}),
         "phi3": ("Phi3Config", {"original_max_position_embeddings": 256}), "gemma": ("GemmaConfig", {"head_dim": 16}),
         "gemma2": ("Gemma2Config", {"head_dim": 16, "sliding_window": 4}),
         "lfm2": ("Lfm2Config", {"layer_types": ["conv", "full_attention"]}),
         "gpt_oss": ("GptOssConfig", {"head_dim": 16, "sliding_window": 4, "num_local_experts": 4,
                                      "num_experts_per_tok": 2}),
         "granite": ("GraniteConfig", {}), "olmo": ("OlmoConfig", {}), "smollm3": ("SmolLM3Config", {}),
         "ernie": ("Ernie4_5Config", {}), "hunyuan": ("HunYuanDenseV1Config", {"head_dim": 16}),
         "nemotron": ("NemotronConfig", {"hidden_size": 128, "num_key_value_heads": 4})}


def save_tokenizer(folder: Path) -> int:
    """A word-level tokenizer (``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, then :data:`WORDS`) with a plain chat template,
    saved in ``folder``; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.decoder = decoders.WordPiece(prefix="##")
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                  pad_token="</s>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(folder))
    return len(vocab)


def save_checkpoint(folder, arch: str = "llama", seed: int = 0) -> Path:
    """A random checkpoint of ``arch`` and its tokenizer in ``folder`` (made if needed); returns the folder."""
    import torch
    import transformers as tf

    if arch not in ARCHS:
        raise ValueError(f"arch: expected one of {', '.join(ARCHS)}, got {arch!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = save_tokenizer(folder)
    name, extra = ARCHS[arch]
    shape = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=2,
                 tie_word_embeddings=False)
    config = getattr(tf, name)(**{**shape, **extra})
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        model.lm_head.weight[config.eos_token_id] = 0.0
    model.save_pretrained(str(folder))
    return folder


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the checkpoint folder to write")
    ap.add_argument("--arch", default="llama", choices=sorted(ARCHS))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(save_checkpoint(args.out, args.arch, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
