"""A few training steps of a recipe's GPU overrides on a randomly initialised model of a released
model's size: time per step and peak GPU memory, before anyone downloads the weights.

`--random wan2.1-t2v-1.3b` saves a WanPipeline whose transformer and VAE have Wan2.1-T2V-1.3B's
configuration (30 blocks of width 1536, 12 heads, FFN 8960, 16 latent channels; the Wan 2.1 VAE)
with random weights. Its text encoder has UMT5-XXL's width (4096, 64 heads, FFN 10240) but
`--text-layers` layers (default 2, against 24) and the in-memory character vocabulary: it is frozen
and runs once per prompt, so the step's cost and memory are the transformer's and the VAE's. The
pipeline directory then loads through the same `from_pretrained` path as the real checkpoint.

    python scripts/gpu_dry_run.py tasks/recipes/t2v_wan.yaml --random wan2.1-t2v-1.3b --steps 3 \\
        policy.dtype=bfloat16 policy.height=240 policy.width=416 policy.num_frames=33 ...

prints and writes (`--json`) {"steps_s": [...], "peak_allocated_gib": ..., "parameters": ..., ...}.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from bench_report import emit

from mmrl.config.parse import load_recipe
from mmrl.train.loop.trainer import Trainer


def save_random_wan_t2v_1_3b(out: Path, text_layers: int) -> int:
    """A WanPipeline at Wan2.1-T2V-1.3B's size with random weights, saved to `out`; its
    transformer's parameter count."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from mmrl.tasks.demos.tiny_pipelines import pipeline_tokenizer
    torch.manual_seed(0)
    tok = pipeline_tokenizer()
    text = UMT5EncoderModel(UMT5Config(vocab_size=len(tok), d_model=4096, d_kv=64, d_ff=10240, num_layers=text_layers,
                                       num_heads=64, feed_forward_proj="gated-gelu", pad_token_id=tok.pad_token_id,
                                       eos_token_id=tok.eos_token_id, decoder_start_token_id=0))
    transformer = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128,
                                        in_channels=16, out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960,
                                        num_layers=30, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                                        eps=1e-6, rope_max_seq_len=1024)
    pipe = WanPipeline(tokenizer=tok, text_encoder=text, vae=AutoencoderKLWan(), transformer=transformer,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))
    pipe.save_pretrained(out)
    return sum(p.numel() for p in transformer.parameters())


RANDOM_MODELS = {"wan2.1-t2v-1.3b": save_random_wan_t2v_1_3b}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recipe", help="the recipe file")
    p.add_argument("overrides", nargs="*", help="key=value overrides, as `mmrl train` takes them")
    p.add_argument("--random", required=True, choices=sorted(RANDOM_MODELS), help="the released model's size to build")
    p.add_argument("--text-layers", type=int, default=2, help="layers of the random text encoder")
    p.add_argument("--steps", type=int, default=3, help="training steps (the first one is reported apart: warm-up)")
    p.add_argument("--json", help="write the report here")
    args = p.parse_intermixed_args()
    if not torch.cuda.is_available():
        p.error("a GPU dry run needs CUDA")
    work = Path(tempfile.mkdtemp(prefix="mmrl-gpu-dry-run-"))
    start = time.perf_counter()
    parameters = RANDOM_MODELS[args.random](work / "model", args.text_layers)
    build_s = time.perf_counter() - start
    cfg = load_recipe(args.recipe, [*args.overrides, f"policy.model={work / 'model'}", f"output_dir={work / 'run'}",
                                    f"max_steps={args.steps}"])
    trainer = Trainer(cfg)
    steps = []
    for _ in range(args.steps):
        torch.cuda.synchronize()
        begin = time.perf_counter()
        trainer.train_step()
        torch.cuda.synchronize()
        steps.append(round(time.perf_counter() - begin, 2))
    emit({"recipe": args.recipe, "random_model": args.random, "transformer_parameters": parameters,
          "text_encoder_layers": args.text_layers, "build_and_save_s": round(build_s, 1), "steps_s": steps,
          "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
          "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2),
          "device": torch.cuda.get_device_name(), "overrides": args.overrides, "date": time.strftime("%Y-%m-%d")},
         args.json)


if __name__ == "__main__":
    main()
