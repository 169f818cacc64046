"""Small transformers tokenizers trained in the test process (nothing downloaded) whose pieces split UTF-8
characters, and a long text that makes them do so, for the incremental detokenization tests.

* :func:`byte_level_bpe`: GPT-2's scheme (byte-level pre-tokenizer and decoder) trained on an ASCII corpus,
  so every other character is two to four byte tokens; optionally with transformers'
  ``clean_up_tokenization_spaces`` (" ," -> ",", a token's text depends on the next one).
* :func:`llama_bpe`: Llama-2's scheme: pieces with a "▁" word start (SentencePiece's Metaspace), byte
  fallback (``<0xE6>`` ...) for characters outside the vocabulary, and the decoder that drops the leading
  space of the first piece it decodes (Replace, ByteFallback, Fuse, Strip).

Both have one special token, ``<|end|>`` (id 0), left out by ``skip_special_tokens``.
"""
from __future__ import annotations

CORPUS = ("hello world, the quick brown fox jumps over the lazy dog. it is fine! ok? "
          "streaming text one token at a time is what a server does. ") * 8
TEXT = ("Grüße aus Köln — 東京 🎉🎉 done. naïve café , ok ? 😀 ünïcödé\n\nend of the first part. "
        "Здравствуй, мир! Ελληνικά και 한국어 텍스트, then plain words again: the quick brown fox , "
        "jumps over the lazy dog . 🇫🇷🏳️‍🌈 e\u0301 ß ẞ ﬁ — “quoted” ‘text’ … and a tail   with spaces.")
END = "<|end|>"


def _fast(tok, clean_up: bool = False):
    from transformers import PreTrainedTokenizerFast

    force = {"clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output": True} if clean_up else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=END, clean_up_tokenization_spaces=clean_up,
                                   **force)  # transformers 5 applies the clean-up to a BPE only when forced


def byte_level_bpe(clean_up: bool = False):
    """A GPT-2-style byte-level BPE (vocabulary 320) as a transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([CORPUS], trainers.BpeTrainer(
        vocab_size=320, show_progress=False, special_tokens=[END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return _fast(tok, clean_up)


def llama_bpe():
    """A Llama-2-style BPE (Metaspace pieces, byte fallback) as a transformers tokenizer."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    meta = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = meta
    trained.train_from_iterator([CORPUS], trainers.BpeTrainer(vocab_size=200, show_progress=False,
                                                               special_tokens=[END]))
    model = json.loads(trained.to_str())["model"]
    vocab = dict(model["vocab"])
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, byte_fallback=True))
    tok.add_special_tokens([END])
    tok.pre_tokenizer = meta
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return _fast(tok)
