"""GenEval's object detector and colour classifier, behind one interface so that the official setup
and others are interchangeable: ``detect(image) -> {class name: [(box [5], mask or None), ...]}``
(every detection, any score; tasks/bench/geneval_rules.py keeps and judges them).

Detectors (``detector`` option):
  mask2former   the official one: mmdet's Mask2Former (Swin-S, COCO; GenEval's
                ``mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco``), boxes and masks, from
                `detector_config` (an mmdet config file) and `detector_path` (its checkpoint);
                needs mmdet / mmcv installed (not a dependency of mmrl)
  transformers  any transformers object detector (``AutoModelForObjectDetection``: DETR,
                Deformable DETR, RT-DETR, ... trained on COCO) from `detector_path` (a hub id or
                a folder), boxes only;
                its COCO label names are GenEval's class names (``mouse``: ``computer mouse``, ...)
  recorded      detections recorded beforehand: `detector_path` a JSON file {prompt id: {class:
                [[x1, y1, x2, y2, score], ...]}}, the same for every sample of the prompt (tests,
                or detections made elsewhere)

The colour classifier is GenEval's: an open_clip CLIP (officially ViT-L-14, ``openai``) as a
zero-shot classifier over the ten colours, each colour's text embedding the normalised mean of
the normalised embeddings of "a photo of a {c} {class}", "a photo of a {c}-colored {class}",
"a photo of a {c} object"; it sees the object's box cropped from the image, where a mask exists
the pixels outside it replaced by grey ``#999`` first.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from mmrl.rewards.clip import _device, load_clip

from .geneval_rules import COLORS, Detection
from .scorer_models import scorer_model

OBJECT_NAMES = Path(__file__).parent / "prompts" / "geneval" / "object_names.txt"
COCO_RENAMES = {"mouse": "computer mouse", "remote": "tv remote", "keyboard": "computer keyboard", "tvmonitor": "tv",
                "motorbike": "motorcycle", "aeroplane": "airplane", "sofa": "couch", "diningtable": "dining table",
                "pottedplant": "potted plant", "hair dryer": "hair drier"}
COLOUR_TEMPLATES = ("a photo of a {c} {name}", "a photo of a {c}-colored {name}", "a photo of a {c} object")
DETECTORS = ("mask2former", "transformers", "recorded")
Detector = Callable[[Any, str], dict[str, list[Detection]]]  # (PIL image, prompt id) -> raw detections


def class_names() -> list[str]:
    """GenEval's 80 class names (COCO's, in its order, three renamed)."""
    return OBJECT_NAMES.read_text().split("\n")[:80]


@functools.lru_cache(maxsize=2)
def _transformers_detector(path: str, device: str):
    from transformers import AutoImageProcessor, AutoModelForObjectDetection
    model = scorer_model(AutoModelForObjectDetection, path, "geneval: detector_path", device)
    return model, AutoImageProcessor.from_pretrained(path)


def transformers_detections(path: str, device: str, image: Any) -> dict[str, list[Detection]]:
    """Every box a transformers detector scores for the image, by GenEval class name."""
    model, processor = _transformers_detector(path, device)
    with torch.no_grad():
        outputs = model(**processor(images=image, return_tensors="pt").to(device))
    found = processor.post_process_object_detection(outputs, threshold=0.0, target_sizes=[image.size[::-1]])[0]
    out: dict[str, list[Detection]] = {}
    for score, label, box in zip(found["scores"].tolist(), found["labels"].tolist(), found["boxes"].tolist()):
        name = model.config.id2label[label]
        out.setdefault(COCO_RENAMES.get(name, name), []).append((np.array([*box, score]), None))
    return out


@functools.lru_cache(maxsize=1)
def _mmdet_detector(config: str, checkpoint: str, device: str):
    try:
        from mmdet.apis import init_detector
    except ImportError:
        raise ImportError("geneval: detector=mask2former needs mmdet and mmcv (GenEval's environment: mmdet 2.x, "
                          "mmcv-full 1.x); install them, or use detector=transformers") from None
    for name, path in (("detector_config", config), ("detector_path", checkpoint)):
        if not path or not Path(path).is_file():
            raise FileNotFoundError(f"geneval: {name} {path!r} does not exist (mmdet Mask2Former)")
    return init_detector(config, checkpoint, device=device)


def mask2former_detections(config: str, checkpoint: str, device: str, image: Any) -> dict[str, list[Detection]]:
    """mmdet's per-class arrays [n, 5] (and masks), by GenEval class name, as GenEval reads them."""
    from mmdet.apis import inference_detector
    result = inference_detector(_mmdet_detector(config, checkpoint, device), np.asarray(image)[:, :, ::-1])
    boxes = result[0] if isinstance(result, tuple) else result
    masks = result[1] if isinstance(result, tuple) and len(result) > 1 else None
    return {name: [(boxes[i][j], None if masks is None else masks[i][j]) for j in range(len(boxes[i]))]
            for i, name in enumerate(class_names())}


@functools.lru_cache(maxsize=4)
def _recorded(path: str) -> dict:
    if not Path(path).is_file():
        raise FileNotFoundError(f"geneval: detector_path {path!r} does not exist (recorded detections, JSON)")
    return json.loads(Path(path).read_text())


def recorded_detections(path: str, prompt_id: str) -> dict[str, list[Detection]]:
    table = _recorded(path)
    if prompt_id not in table:
        raise KeyError(f"geneval: recorded detections {path!r} have none for prompt id {prompt_id!r}")
    return {name: [(np.asarray(box, dtype=np.float64), None) for box in boxes] for name, boxes in table[prompt_id].items()}


def detector(name: str, path: str | None, config: str | None, device: str | None) -> Detector:
    """The detector `name` (module docstring) as a function of (image, prompt id)."""
    if name not in DETECTORS:
        raise ValueError(f"geneval: detector={name!r} is not one of {', '.join(DETECTORS)}")
    if not path:
        raise ValueError(f"geneval: detector={name} needs the option detector_path")
    dev = _device(device)
    if name == "recorded":
        return lambda image, prompt_id: recorded_detections(path, prompt_id)
    if name == "transformers":
        return lambda image, prompt_id: transformers_detections(path, dev, image)
    return lambda image, prompt_id: mask2former_detections(config, path, dev, image)


def object_crop(image: Any, detection: Detection):
    """The object's box cropped from the RGB image, outside its mask (when it has one) grey #999."""
    from PIL import Image
    box, mask = detection
    image = image.convert("RGB")
    if mask is not None:
        image = Image.composite(image, Image.new("RGB", image.size, "#999"), Image.fromarray(np.asarray(mask, dtype=bool)))
    return image.crop(tuple(float(v) for v in box[:4]))


class ColourClassifier:
    """GenEval's zero-shot colour classifier (module docstring) on an open_clip model."""

    def __init__(self, model: str, pretrained: str | None, model_config: str | None, device: str | None):
        self.device = _device(device)
        self.net, self.preprocess, self.tokenizer = load_clip(model, pretrained, model_config, self.device)
        self.weights: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def _classifier(self, name: str) -> torch.Tensor:
        """[D, 10] each colour's text embedding for objects of class `name`."""
        if name not in self.weights:
            columns = []
            for c in COLORS:
                texts = self.tokenizer([t.format(c=c, name=name) for t in COLOUR_TEMPLATES]).to(self.device)
                emb = torch.nn.functional.normalize(self.net.encode_text(texts).float(), dim=-1).mean(0)
                columns.append(emb / emb.norm())
            self.weights[name] = torch.stack(columns, dim=1)
        return self.weights[name]

    @torch.no_grad()
    def __call__(self, image: Any, objects: list[Detection], name: str) -> list[str]:
        pixels = torch.stack([self.preprocess(object_crop(image, d)) for d in objects]).to(self.device)
        features = torch.nn.functional.normalize(self.net.encode_image(pixels).float(), dim=-1)
        return [COLORS[i] for i in (features @ self._classifier(name)).argmax(1).tolist()]
