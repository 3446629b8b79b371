import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if a model or data set is loaded (validation must come first)."""
    import mmrl.train.loop.parts as parts

    def refuse(*args, **kwargs):
        raise AssertionError("a model or data set was loaded")
    monkeypatch.setattr(parts, "build_policy", refuse)
    monkeypatch.setattr(parts, "load_data", refuse)
