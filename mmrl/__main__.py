from mmrl.cli.main import run

# guarded: a vLLM rollout engine (policy.rollout_engine: vllm) may spawn processes that import this module
if __name__ == "__main__":
    run()
