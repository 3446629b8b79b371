"""Prompts as the model reads them: chat templates, the system prompt, and batches of prompt
texts tokenized with left padding (shared by the token adapters)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from torch import Tensor

from mmrl.errors import UserError


def with_system_prompt(messages: list[dict], system_prompt: str | None) -> list[dict]:
    """`messages` with a system message `system_prompt` put first, unless it is empty or the
    messages already start with a system message."""
    if system_prompt and messages[0].get("role") != "system":
        return [{"role": "system", "content": system_prompt}] + messages
    return messages


def prompt_text(tokenizer: Any, prompt: Any, chat_template: bool | None, system_prompt: str | None,
                tools: list[dict] | None = None) -> str:
    """A string prompt as is; a list of chat messages (or, with `chat_template` true, a string as
    the user's message) through the tokenizer's chat template, `system_prompt` first if given,
    the `tools`' JSON schemas given to the template (an episode's)."""
    use_template = chat_template
    if use_template is None:
        use_template = not isinstance(prompt, str)
    if not use_template:
        if not isinstance(prompt, str):
            raise TypeError(f"prompt {prompt!r} is not a string and policy.chat_template is false")
        return prompt
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    messages = with_system_prompt(messages, system_prompt)
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)


def cut_prompts_left(ids: Tensor, mask: Tensor, max_tokens: int) -> tuple[Tensor, Tensor]:
    """Left-padded prompt ids and mask [P, L] with each prompt's first tokens dropped so that it
    keeps at most `max_tokens` (its last ones, as TRL's max_prompt_length keeps them)."""
    return ids[:, -max_tokens:], mask[:, -max_tokens:]


def check_prompt_lengths(mask: Tensor, prompts: Sequence[Any], limits: Sequence[tuple[int | None, str]],
                         shown: Callable[[Any], Any]) -> None:
    """UserError naming the first prompt whose token count (mask [P, L]) exceeds a limit of
    `limits` ((limit or None, why)); only that prompt is rendered, by `shown`."""
    lengths = mask.sum(1).tolist()
    for limit, why in limits:
        if limit is None:
            continue
        for prompt, length in zip(prompts, lengths):
            if length > limit:
                raise UserError(f"a prompt has {int(length)} tokens, more than the {limit} {why}: "
                                f"{str(shown(prompt))[:80]!r}; shorten or drop such rows, or set "
                                "policy.max_prompt_length to cut prompts from the left (text prompts)")


def tokenize_prompts(tokenizer: Any, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
    """(ids, attention mask) [P, L] of prompt texts, padded on the tokenizer's side (left, see
    `model_loading.pad_on_the_left`), without special tokens (the chat template has them)."""
    enc = tokenizer(list(texts), padding=True, return_tensors="pt", add_special_tokens=False)
    return enc["input_ids"], enc["attention_mask"]


def chat_template_check(cfg: Any) -> Callable[[Any], str | None]:
    """The data check of a prompt under an adapter config with `chat_template` (see `prompt_text`):
    a message list needs `chat_template` not false, and a prompt that goes through the template
    needs a tokenizer that has one. The tokenizer is read once, only when a prompt needs it, and
    without the model's weights (`model_loading.load_tokenizer_only`)."""
    from ..model_loading import load_tokenizer_only
    has_template: list[bool] = []

    def check(prompt: Any) -> str | None:
        if isinstance(prompt, str) and not cfg.chat_template:
            return None
        if cfg.chat_template is False:
            return "a message list, but policy.chat_template is false (text prompts only)"
        if not has_template:
            has_template.append(getattr(load_tokenizer_only(cfg), "chat_template", None) is not None)
        if has_template[0]:
            return None
        return (f"goes through the chat template, and the tokenizer of {cfg.tokenizer or cfg.model!r} has none; "
                f"give text prompts (and policy.chat_template=false), or policy.tokenizer with a chat template")
    return check
