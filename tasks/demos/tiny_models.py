"""Tiny random text models with in-memory character tokenizers, for tests and CPU demos (no
download), and the helpers the tiny multimodal ones (`tiny_multimodal.py`) and pipelines
(`tiny_pipelines.py`) build on.

A recipe names one as ``policy.model: tiny:NAME`` (`tasks.model_loading.TINY_MODELS`, filled
here); everything else loads with ``from_pretrained(name_or_local_path)``.
"""

from __future__ import annotations

import string

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

from ..dlm.policy import make_bidirectional
from ..model_loading import TINY_MODELS

CHAR_SPECIALS = ["<pad>", "<eos>", "<unk>"]
CHAR_ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n"


def char_tokenizer(vocab_size: int | None = None, **named: str) -> PreTrainedTokenizerFast:
    """One token per character of digits, letters, punctuation, space and newline; `named`
    special tokens (`image_token="<image>"`) are added and become attributes that processors read
    (`tokenizer.image_token`, `tokenizer.image_token_id`) and that `save_pretrained` keeps.
    `vocab_size`: filler tokens ``<x0>``, ``<x1>``, ... up to that many (a real model's output
    layer size, for benchmarks; text never encodes to them, a sampled one decodes as its name).

    It is a byte-level BPE without merges, as Qwen2's own tokenizer is one with merges: a checkpoint
    saved with it loads in `AutoTokenizer`, which rebuilds a Qwen2 checkpoint's tokenizer as
    `Qwen2Tokenizer` from the saved vocabulary, as the same tokenizer (space and newline are the
    byte-level symbols ``Ġ`` and ``Ċ``; a plain character table would lose them there)."""
    symbol = bytes_to_unicode()  # byte -> the byte-level alphabet's character
    tokens = CHAR_SPECIALS + ["".join(symbol[b] for b in c.encode()) for c in CHAR_ALPHABET]
    tokens += [f"<x{i}>" for i in range(max(0, (vocab_size or 0) - len(tokens)))]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>", padding_side="left", **named)


def seeded_model(model_class, config, tokenizer, seed: int):
    """`model_class(config)` initialised from `seed` (the global RNG is left as it was), with the
    tokenizer's pad / eos ids in its generation config."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.eos_token_id
    return model


def tiny_qwen2(tokenizer, hidden: int = 128, layers: int = 2, heads: int = 4, seed: int = 0,
               max_positions: int = 512, tied: bool = True) -> Qwen2ForCausalLM:
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 4,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=max(1, heads // 2), max_position_embeddings=max_positions,
                         tie_word_embeddings=tied, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)
    return seeded_model(Qwen2ForCausalLM, config, tokenizer, seed)


@TINY_MODELS.register("qwen2-char")
def qwen2_char(hidden: int = 128, layers: int = 2, heads: int = 4, seed: int = 0, max_positions: int = 512,
               vocab: int | None = None, tied: bool = True):
    """A Qwen2 decoder over the character tokenizer (the text demo's policy), with room for
    `max_positions` tokens of prompt and completion; `vocab`: an output layer of that many tokens
    (the tokenizer padded with fillers, `char_tokenizer`); `tied`: the output head is the input
    embedding (False: a head of its own)."""
    tokenizer = char_tokenizer(vocab)
    return tiny_qwen2(tokenizer, hidden, layers, heads, seed, max_positions, tied), tokenizer


# A short chat template that writes what Qwen2.5's writes for tools, in few characters: the tool
# names in a system line, an assistant's `tool_calls` as <tool_call>{"name", "arguments"}</tool_call>,
# each message as "<role initial>:content<eos>", the generation prompt "a:".
TOOL_CHAT_TEMPLATE = (
    "{% if tools %}s:tools {% for t in tools %}{{ t['function']['name'] }} {% endfor %}<eos>{% endif %}"
    "{% for m in messages %}{{ m['role'][0] }}:{% if m['content'] is string %}{{ m['content'] }}{% endif %}"
    "{% for c in m['tool_calls'] or [] %}<tool_call>{{ {'name': c['function']['name'], "
    "'arguments': c['function']['arguments']} | tojson }}</tool_call>{% endfor %}<eos>{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}")


@TINY_MODELS.register("qwen2-chat-char")
def qwen2_chat_char(hidden: int = 128, layers: int = 2, heads: int = 4, seed: int = 0, max_positions: int = 512):
    """`qwen2-char` with a chat template that takes tools (`TOOL_CHAT_TEMPLATE`), for episodes on
    conversational rows."""
    model, tokenizer = qwen2_char(hidden, layers, heads, seed, max_positions)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    return model, tokenizer


@TINY_MODELS.register("dlm-char")
def dlm_char(hidden: int = 64, layers: int = 2, heads: int = 4, seed: int = 0, max_positions: int = 512,
             vocab: int | None = None):
    """A bidirectional Qwen2 over the character tokenizer plus a `<mask>` token (the dlm demo's policy),
    with room for `max_positions` tokens; `vocab`: an output layer of that many tokens and the mask
    (the tokenizer padded with fillers, `char_tokenizer`)."""
    tokenizer = char_tokenizer(vocab)
    tokenizer.add_special_tokens({"mask_token": "<mask>"})
    return make_bidirectional(tiny_qwen2(tokenizer, hidden, layers, heads, seed, max_positions)), tokenizer


def chat_template(image: str = "", video: str = "", audio: str = "", turn: tuple[str, str] = ("<|im_start|>", "<|im_end|>"),
                  assistant: str = "assistant") -> str:
    """A chat template over {"type": "image" | "video" | "audio" | "text"} content items that writes
    each media item as the family's placeholder (`image` / `video` / `audio`) inside `turn` markers."""
    start, end = turn
    media = "".join(f"{{% elif c['type'] == '{kind}' %}}{text}" for kind, text in
                    (("image", image), ("video", video), ("audio", audio)) if text)
    return ("{% for m in messages %}" + start + "{{ m['role'] }}\n"
            "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
            "{% if c['type'] == 'text' %}{{ c['text'] }}" + media + "{% endif %}{% endfor %}{% endif %}"
            + end + "\n{% endfor %}{% if add_generation_prompt %}" + start + assistant + "\n{% endif %}")


def char_tokenizer_with(specials: list[str], template: str, **named: str) -> PreTrainedTokenizerFast:
    """The character tokenizer with the `named` special tokens, plus `specials`, and a chat template."""
    tokenizer = char_tokenizer(**named)
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    tokenizer.chat_template = template
    return tokenizer


def text_config(tokenizer, hidden: int, layers: int, heads: int, **extra) -> dict:
    """A small decoder's config fields over `tokenizer`'s vocabulary."""
    return dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=2048,
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                bos_token_id=tokenizer.eos_token_id, **extra)


def mrope_section(head_dim: int) -> list[int]:
    """Rotary frequencies per head split over (time, height, width), as Qwen's multimodal rope."""
    half = head_dim // 2
    return [half // 4, (half - half // 4) // 2, half - half // 4 - (half - half // 4) // 2]
