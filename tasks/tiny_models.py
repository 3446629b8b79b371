"""Tiny random models with in-memory tokenizers, for tests and CPU demos (no download).

A recipe names one as ``policy.model: tiny:NAME``; everything else loads with
``from_pretrained(name_or_local_path)``.
"""

from __future__ import annotations

import string
from typing import Callable

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from mmrl.registry import Registry

TINY_MODELS: Registry[Callable[..., tuple]] = Registry("tiny model")

CHAR_SPECIALS = ["<pad>", "<eos>", "<unk>"]
CHAR_ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n"


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of digits, letters, punctuation, space and newline."""
    vocab = {tok: i for i, tok in enumerate(CHAR_SPECIALS + list(CHAR_ALPHABET))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>", padding_side="left")


def tiny_qwen2(tokenizer, hidden: int = 128, layers: int = 2, heads: int = 4, seed: int = 0,
               max_positions: int = 512) -> Qwen2ForCausalLM:
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 4,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=max(1, heads // 2), max_position_embeddings=max_positions,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


@TINY_MODELS.register("qwen2-char")
def qwen2_char(hidden: int = 128, layers: int = 2, heads: int = 4, seed: int = 0):
    """A Qwen2 decoder over the character tokenizer (the text demo's policy)."""
    tokenizer = char_tokenizer()
    return tiny_qwen2(tokenizer, hidden, layers, heads, seed), tokenizer
