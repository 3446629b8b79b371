"""Diffusion and flow-matching text-to-image policies (SD3, FLUX.1, SD 1.5, Qwen-Image, Z-Image, FLUX.2 [klein]),
instruction-based image editing (Qwen-Image-Edit / Edit-Plus, FLUX.1 Kontext: `editing.py`) and video policies
(Wan 2.1 / 2.2 text- and image-to-video, Wan 2.2 A14B's two experts, HunyuanVideo, HunyuanVideo 1.5), video with its sound
(LTX-2, from text or an image: `ltx2.py`) and sound (Stable Audio 3:
`stable_audio3.py`; AudioLDM 2: `audioldm2.py`): the `diffusion` adapter (`policy.py`) and
the parts it is built of. What differs between pipelines is a `Family` (`family.py`); the
families are `families.py` (images) and `video_families.py` (videos), and a new family is one
more class there or a module of its own imported below. (The tiny pipelines, the t2i demo's
pixel-space flow pipelines and its synthetic coloured shapes are the demos': `tasks.demos`.)"""

from . import (audioldm2, families, flux2_klein, flux_kontext, hunyuan_video15, ltx2, policy, prompt_enhancer, qwen_image,  # noqa: F401  (registration)
               qwen_image_edit, stable_audio3, video_families, z_image)
