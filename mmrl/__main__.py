import sys

from .cli import main

# guarded: a vLLM rollout engine (policy.rollout_engine: vllm) may spawn processes that import this module
if __name__ == "__main__":
    sys.exit(main())
