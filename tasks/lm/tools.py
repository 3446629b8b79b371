"""Tools an episode may call (docs/episodes.md, 'The tool contract').

A tool is a plain typed Python function with a docstring (Google style, an `Args:` entry per
parameter), as TRL's `tools=`: its JSON schema (transformers' `get_json_schema`) goes to the
chat template's `tools=`, and the model calls it with Qwen's syntax,
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. A parameter named `episode` is not
shown to the model: it receives the calling episode's `EpisodeView` (its images, video frames
and data row). A tool returns a string, a PIL image, or a list of strings and images; an
exception, an unknown tool, bad arguments or an unreadable call become a tool error that the
model reads in the tool turn (counted, never a crash).
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from mmrl.registry import TOOLS, import_user_module

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
INJECTED = "episode"  # the parameter that receives the calling episode, hidden from the model


def register_tool(name: str) -> Callable:
    """Register a tool function under `name` (a recipe's `policy.episode.tools` names it)."""
    return TOOLS.register(name)


@dataclass
class EpisodeView:
    """What a tool sees of its episode: `images` (PIL, the prompt's then those tools returned, in
    order), `input_sizes` (each image's [width, height] as the processor resized it, None where
    unknown), `videos` (each an array of frames) with their `video_metadata` (fps, frame
    indices), `row` (the data row, e.g. verl's `tools_kwargs`), `box_frame` (the frame boxes are
    given in, `policy.episode.box_frame`)."""

    images: list[Any] = field(default_factory=list)
    input_sizes: list[Any] = field(default_factory=list)
    videos: list[Any] = field(default_factory=list)
    video_metadata: list[Any] = field(default_factory=list)
    row: dict[str, Any] = field(default_factory=dict)
    box_frame: str = "image"


@dataclass
class ToolCall:
    """One call as the model wrote it and what it gave back: `result` (text the model reads),
    `images` (images returned), `error` (None: it ran)."""

    name: str
    arguments: dict[str, Any]
    result: str = ""
    images: list[Any] = field(default_factory=list)
    error: str | None = None

    def record(self, turn: int) -> dict[str, Any]:
        """The call as a reward reads it (column `tool_calls`)."""
        return {"turn": turn, "name": self.name, "arguments": self.arguments, "result": self.result,
                "images": len(self.images), "error": self.error}


def resolve_tools(names: Sequence[str], modules: Sequence[str]) -> dict[str, Callable]:
    """{name: function} for the recipe's `tools` after importing its `tool_modules`: a registered
    name, or ``FILE.py:FUNCTION`` / ``module:FUNCTION``. Each is checked to have a schema."""
    for module in modules:
        import_user_module(module, "policy.episode.tool_modules")
    tools = {}
    for name in names:
        if ":" in name:
            spec, attr = name.rsplit(":", 1)
            fn = getattr(import_user_module(spec, "policy.episode.tools"), attr, None)
            if not callable(fn):
                raise ValueError(f"policy.episode.tools: {spec!r} has no function {attr!r}")
            key = attr
        else:
            fn, key = TOOLS.get(name), name
        tool_schema(fn, key)  # fails now, naming the tool, rather than at the first call
        tools[key] = fn
    return tools


def tool_schema(fn: Callable, name: str) -> dict[str, Any]:
    """The JSON schema of a tool (transformers' `get_json_schema`), its `episode` parameter left out."""
    from transformers.utils import get_json_schema
    sig = inspect.signature(fn)

    def shown(**kwargs):  # the signature the model sees
        return fn(**kwargs)

    shown.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if p.name != INJECTED])
    shown.__annotations__ = {k: v for k, v in getattr(fn, "__annotations__", {}).items() if k != INJECTED}
    shown.__doc__, shown.__name__ = fn.__doc__, name
    try:
        return get_json_schema(shown)
    except Exception as e:  # transformers' schema errors say which argument lacks a type or description
        raise ValueError(f"policy.episode.tools: tool {name!r} needs type hints and a docstring with an Args: "
                         f"entry per parameter: {e}") from None


def parse_tool_calls(text: str) -> list[ToolCall]:
    """The calls in a model turn's text; an unreadable one is a call with an error."""
    calls = []
    for body in TOOL_CALL.findall(text):
        try:
            data = json.loads(body)
        except json.JSONDecodeError as e:
            calls.append(ToolCall("", {}, error=f"the tool call is not JSON: {e}"))
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            calls.append(ToolCall("", {}, error='a tool call must be {"name": ..., "arguments": {...}}'))
            continue
        args = data.get("arguments", {})
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        if not isinstance(args, dict):
            calls.append(ToolCall(data["name"], {}, error="the tool call's arguments must be an object"))
            continue
        calls.append(ToolCall(data["name"], args))
    return calls


def run_tool(call: ToolCall, tools: dict[str, Callable], episode: EpisodeView) -> ToolCall:
    """Run one call in place: its result text and images, or its error."""
    if call.error is not None:
        return call
    fn = tools.get(call.name)
    if fn is None:
        call.error = f"unknown tool {call.name!r}; tools: {', '.join(sorted(tools))}"
        return call
    params = inspect.signature(fn).parameters
    kwargs = dict(call.arguments)
    if INJECTED in params:
        kwargs[INJECTED] = episode
    try:
        inspect.signature(fn).bind(**kwargs)
        out = fn(**kwargs)
    except Exception as e:
        call.error = f"{type(e).__name__}: {e}"
        return call
    for part in out if isinstance(out, (list, tuple)) else [out]:
        if isinstance(part, str):
            call.result += part
        elif hasattr(part, "convert") and hasattr(part, "size"):  # a PIL image
            call.images.append(part.convert("RGB"))
        else:
            call.result += json.dumps(part) if isinstance(part, (int, float, dict, list, bool)) else str(part)
    return call
