"""One run of an `mmrl sweep`, in a process of its own: ``python -m mmrl.cli.sweep_worker --run ...``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mmrl.experiments.sweep import run_one


def _worker(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m mmrl.cli.sweep_worker", description="one run of an `mmrl sweep`")
    p.add_argument("--run", required=True, metavar="RECIPE_OR_DEMO")
    p.add_argument("--warm-cache", required=True)
    p.add_argument("--warm-start-ignores", action="append", default=[])
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    run_one(args.run, args.overrides, Path(args.warm_cache), args.warm_start_ignores)
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))
