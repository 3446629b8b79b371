"""Tools for the episode tests (tests/test_episodes.py), named as `FILE.py:FUNCTION`."""

from PIL import Image


def add(a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return str(a + b)


def show(colour: str, episode) -> list:
    """An image of one colour, and the number of images the episode has seen before it.

    Args:
        colour: red or blue
    """
    return [Image.new("RGB", (64, 48), colour), f"seen {len(episode.images)}"]
