"""The King James Bible as training text, from Debian's ``bible-kjv`` package.

``bible "Gen1:1-Rev22:21"`` prints the whole text (4,298,239 bytes with bible-kjv 4.x). The last
``HELDOUT_FRACTION`` of it (cut at a line boundary, within the Revelation/Jude region) is the
held-out split: training never sees it; the shipped dump and the end-to-end checks read it.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess

HELDOUT_FRACTION = 0.05


def load_kjv() -> bytes:
    """Return the full text as bytes. Raises RuntimeError if the ``bible`` program is missing."""
    exe = shutil.which("bible")
    if exe is None:
        raise RuntimeError(
            "the 'bible' program was not found: install Debian's bible-kjv package "
            "(apt-get install bible-kjv bible-kjv-text)"
        )
    out = subprocess.run([exe, "Gen1:1-Rev22:21"], check=True, capture_output=True).stdout
    if len(out) < 1_000_000:
        raise RuntimeError(f"'bible Gen1:1-Rev22:21' printed only {len(out)} bytes; expected ~4.3 MB")
    return out


def split_kjv(text: bytes) -> tuple[bytes, bytes]:
    """Split into (train, heldout) at the first newline after (1 - HELDOUT_FRACTION) of the bytes."""
    cut = text.index(b"\n", int(len(text) * (1.0 - HELDOUT_FRACTION))) + 1
    return text[:cut], text[cut:]


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Write the held-out (or training) split of the KJV text to a file.")
    ap.add_argument("--split", choices=["train", "heldout"], default="heldout")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    tr, ho = split_kjv(load_kjv())
    with open(a.out, "wb") as f:
        f.write(ho if a.split == "heldout" else tr)
