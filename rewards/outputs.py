"""The kinds of completion the built-in rewards declare they score (``register_reward(...,
outputs=...)``), matched before anything loads against what the recipe's adapter draws
(`Policy.output_kind`): a reward of text on a text-to-image policy is refused naming both."""

TEXT = ("text", "episode")  # a language model's text; an episode's last turn (its turns are columns)
IMAGE = ("image", "video", "audio_video")  # an image, or a video's frames scored as images (`video_frames.per_frame`)
VIDEO = ("video", "audio_video")           # a video's frames, with its `fps` column
AUDIO = ("audio", "audio_video")           # a waveform (of a video with its sound: its sound track)
AUDIO_VIDEO = ("audio_video",)             # a video with its sound, both scored together (`av_sync`)
