"""The module a composite policy trains: its parts under their names, called through one forward.

`CompositeModel.parts` holds each part's module (`thinker`, `generator`), or, where the parts share
one module (`policy.shared_weights`), that module once under `thinker` with `shared` naming the part
that uses it; `forward(part, ...)` runs the named part's module, so that a wrapper the strategy puts around the whole module (one that reduces the
gradients in its own call) sees every part's forward. A part's adapter is handed a `PartCall`: it
calls like the part's module (through the whole module's forward) and reads the part's attributes
(its config, its output head) from the part itself.
"""

from __future__ import annotations

from typing import Any

from torch import nn


class CompositeModel(nn.Module):
    """The parts' modules by name; `shared` maps a part that holds no module of its own to the part
    whose module it runs; `forward(part, *args, **kwargs)` is `part(part)(*args, **kwargs)`."""

    def __init__(self, parts: dict[str, nn.Module], shared: dict[str, str] | None = None):
        super().__init__()
        self.parts = nn.ModuleDict(parts)
        self.shared = dict(shared or {})

    def part(self, name: str) -> nn.Module:
        """The module part `name` runs (its own, or the one it shares)."""
        return self.parts[self.shared.get(name, name)]

    def forward(self, part: str, *args: Any, **kwargs: Any) -> Any:
        return self.part(part)(*args, **kwargs)


def composite_of(model: nn.Module) -> CompositeModel:
    """The `CompositeModel` inside `model` (itself, or under a strategy's wrapper's `module`)."""
    while not isinstance(model, CompositeModel):
        inner = getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            raise TypeError(f"{type(model).__name__} holds no composite model")
        model = inner
    return model


class PartCall:
    """One part of a composite model as its adapter uses a model: calling it runs `whole(name, ...)`
    (the whole, possibly wrapped, module's forward); any attribute is the part module's own."""

    def __init__(self, whole: nn.Module, name: str):
        self.whole, self.name = whole, name
        self.part = composite_of(whole).part(name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.whole(self.name, *args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.part, attr)
