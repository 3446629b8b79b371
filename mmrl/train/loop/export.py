"""``mmrl export CHECKPOINT --merge OUT``: a LoRA checkpoint merged into its base model, written
as a plain ``from_pretrained`` directory (with the processor or tokenizer, or the whole pipeline
for a diffusion model).

The checkpoint's ``model/`` holds the PEFT adapter; the run's ``config.json`` (in the output
directory that holds ``checkpoints/``) says which adapter and base model it belongs to. The
adapter builds the base policy as training did, PEFT loads and merges the adapter, and the
adapter's own `save_pretrained` writes the merged model in its family's format.
"""

from __future__ import annotations

import json
from pathlib import Path

from mmrl.config.parse import parse_config
from mmrl.errors import MissingFileError, UserError
from mmrl.registry import load_plugins
from mmrl.train.loop.parts import build_policy

ADAPTER_CONFIG = "adapter_config.json"


def run_config_of(checkpoint: Path) -> Path:
    """The run's config.json for ``OUTPUT_DIR/checkpoints/step-N``."""
    path = checkpoint.resolve().parent.parent / "config.json"
    if not path.is_file():
        raise MissingFileError(f"{path}: no run config beside checkpoint {checkpoint} (expected "
                                "OUTPUT_DIR/config.json for OUTPUT_DIR/checkpoints/step-N)")
    return path


def merge_lora(checkpoint: str | Path, out: str | Path) -> Path:
    """Merge the LoRA adapter of `checkpoint` into its base model and save it to `out`."""
    checkpoint, out = Path(checkpoint), Path(out)
    adapter = checkpoint / "model"
    if not (adapter / ADAPTER_CONFIG).is_file():
        if adapter.is_dir():
            raise UserError(f"{adapter} holds full weights, not a LoRA adapter: it loads with "
                             "from_pretrained as it is, there is nothing to merge")
        raise MissingFileError(f"{adapter}: not found (is {checkpoint} a checkpoint directory?)")
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--merge {out}: the directory exists and is not empty")
    from peft import PeftModel

    load_plugins()
    cfg = parse_config(json.loads(run_config_of(checkpoint).read_text()))
    policy = build_policy(cfg)
    merged = PeftModel.from_pretrained(policy.model, adapter).merge_and_unload()
    policy.model = merged
    policy.save_pretrained(merged, out)
    return out
