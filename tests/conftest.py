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


@pytest.fixture
def no_weights(monkeypatch):
    """Fail the test if the policy is built: the data is read (its rows are checked before any model
    loads), the model is not. A test that gets past every check ends in AssertionError('the policy
    was built')."""
    import mmrl.train.loop.parts as parts

    def refuse(*args, **kwargs):
        raise AssertionError("the policy was built")
    monkeypatch.setattr(parts, "build_policy", refuse)


@pytest.fixture
def one_torch_thread():
    """The test on one torch thread, its count restored after: bit-for-bit comparisons with a
    one-thread worker's forwards, and tiny models on a shared machine (two threads of a tiny UNet's
    forward wait on each other: 0.17 s on one thread, 0.75-6.3 s on two, measured under a load of 7
    on 2 cores)."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
