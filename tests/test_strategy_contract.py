"""Every built-in distribution strategy keeps the shared contract (tests/strategy_contract.py)."""

from strategy_contract import StrategyContract

from mmrl.distributed import STRATEGIES, zero3


class TestDataParallel(StrategyContract):
    strategy = "ddp"


class TestFullySharded(StrategyContract):
    strategy = "fsdp"


class TestZeroThree(StrategyContract):
    strategy = "zero3"

    def available(self) -> bool:
        return zero3.available()


def test_every_registered_strategy_is_under_contract():
    covered = {cls.strategy for cls in StrategyContract.__subclasses__()}
    assert set(STRATEGIES.names()) <= covered
