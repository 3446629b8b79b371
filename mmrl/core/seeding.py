"""Seeds derived from integers (run seed, step, attempt, group index, salts): the same on every
process and every run, so rollouts do not depend on the number of processes.
"""

from __future__ import annotations

import hashlib


def derive_seed(*values: int) -> int:
    """A stable 63-bit seed mixed from integers with blake2b (same on every process and run)."""
    text = ",".join(str(int(v)) for v in values).encode()
    digest = hashlib.blake2b(text, digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)
