import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if a model or data set is loaded (validation must come first)."""
    import mmrl.trainer as trainer_module

    def refuse(*args, **kwargs):
        raise AssertionError("a model or data set was loaded")
    monkeypatch.setattr(trainer_module, "build_policy", refuse)
    monkeypatch.setattr(trainer_module, "load_data", refuse)
