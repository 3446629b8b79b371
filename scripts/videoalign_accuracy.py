"""VideoAlign's pairwise accuracy of a video reward on VideoGen-RewardBench (or any CSV of the same
form): each video of the pairs scored once by a registered reward, the margins score(A) - score(B)
compared with the human labels per dimension, accuracy with and without ties as VideoAlign's
``calc_accuracy.py`` (tasks/bench/pairwise_accuracy.py).

    python scripts/videoalign_accuracy.py PAIRS.csv [--root DIR] [--reward videoalign]
        [--args '{"path": "KlingTeam/VideoReward"}'] [--head-arg head] [--json PATH]

PAIRS.csv: ``path_A``, ``path_B`` (relative to --root), ``prompt``, ``fps_A``, ``fps_B`` and the
label columns among VQ, MQ, TA, Overall (``A``, ``B`` or ``same``). With --head-arg the reward is
called once per dimension with that argument set to the dimension (``Overall``: ``overall``), as
the videoalign reward's heads; otherwise one score serves every dimension. Prints JSON: per
dimension, the pairs and both accuracies (a fraction).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

DIMENSIONS = ("VQ", "MQ", "TA", "Overall")


def pair_accuracies(pairs: list[dict], scores: dict[str, dict[str, float]]) -> dict[str, dict]:
    """dimension -> {pairs, with_ties, without_ties} from video path -> dimension -> score."""
    from mmrl.tasks.bench.pairwise_accuracy import LABELS, accuracy_with_ties, accuracy_without_ties
    out = {}
    for dim in (d for d in DIMENSIONS if d in pairs[0]):
        labelled = [p for p in pairs if p[dim] in LABELS]
        h = [LABELS[p[dim]] for p in labelled]
        m = [scores[p["path_A"]][dim] - scores[p["path_B"]][dim] for p in labelled]
        out[dim] = {"pairs": len(h), "with_ties": accuracy_with_ties(h, m), "without_ties": accuracy_without_ties(h, m)}
    return out


def score_videos(pairs: list[dict], root: Path, reward: str, args: dict, head_arg: str | None) -> dict[str, dict[str, float]]:
    """Each distinct video (path -> its prompt and fps) scored once per dimension."""
    import mmrl.rewards  # noqa: F401  (registration)
    import mmrl.tasks  # noqa: F401  (registration)
    from mmrl.core.scoring import get_reward
    from mmrl.tasks.lm.video_clips import load_video
    videos = {}
    for p in pairs:
        for side in ("A", "B"):
            videos.setdefault(p[f"path_{side}"], (p["prompt"], float(p.get(f"fps_{side}") or 8)))
    paths = sorted(videos)
    clips = [load_video(str(root / path)).frames for path in paths]
    prompts, fps = [videos[p][0] for p in paths], [videos[p][1] for p in paths]
    fn, scores = get_reward(reward), {p: {} for p in paths}
    dims = [d for d in DIMENSIONS if d in pairs[0]]
    shared = None if head_arg else fn(prompts, clips, fps=fps, **args)
    for dim in dims:
        values = shared if shared is not None else fn(prompts, clips, fps=fps, **{**args, head_arg: "overall" if dim == "Overall" else dim})
        for path, value in zip(paths, values):
            scores[path][dim] = float(value)
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pairs")
    parser.add_argument("--root", default=None, help="the folder the paths are relative to (default: the CSV's)")
    parser.add_argument("--reward", default="videoalign")
    parser.add_argument("--args", default="{}", help="the reward's arguments, JSON")
    parser.add_argument("--head-arg", default=None, help="the reward argument naming the dimension (videoalign: head)")
    parser.add_argument("--json", default=None)
    opts = parser.parse_args()
    with open(opts.pairs, newline="") as f:
        pairs = list(csv.DictReader(f))
    if not pairs:
        raise SystemExit(f"{opts.pairs}: no pairs")
    root = Path(opts.root) if opts.root else Path(opts.pairs).parent
    scores = score_videos(pairs, root, opts.reward, json.loads(opts.args), opts.head_arg)
    result = {"pairs_file": opts.pairs, "reward": opts.reward, "args": json.loads(opts.args),
              "accuracy": pair_accuracies(pairs, scores)}
    print(json.dumps(result, indent=1))
    if opts.json:
        Path(opts.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
