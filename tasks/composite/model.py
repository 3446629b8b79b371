"""The module a composite policy trains: its parts under their names, called through one forward.

`CompositeModel.parts` holds each part's module (`thinker`, `generator`); `forward(part, ...)` runs
the named part, so that a wrapper the strategy puts around the whole module (one that reduces the
gradients in its own call) sees every part's forward. A part's adapter is handed a `PartCall`: it
calls like the part's module (through the whole module's forward) and reads the part's attributes
(its config, its output head) from the part itself.
"""

from __future__ import annotations

from typing import Any

from torch import nn


class CompositeModel(nn.Module):
    """The parts' modules by name; `forward(part, *args, **kwargs)` is `parts[part](*args, **kwargs)`."""

    def __init__(self, parts: dict[str, nn.Module]):
        super().__init__()
        self.parts = nn.ModuleDict(parts)

    def forward(self, part: str, *args: Any, **kwargs: Any) -> Any:
        return self.parts[part](*args, **kwargs)


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
        self.part = composite_of(whole).parts[name]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.whole(self.name, *args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.part, attr)
