"""Files of the Python steps: outputs written to a temporary name in the target directory, then renamed;
the rule that no output lands on an input; the sha256 of files (the dump's inputs, the study's dump).

``tempfile.mkstemp`` creates its file with mode 0600; ``publish`` gives it the mode a file opened
normally would get (0666 less the process umask) before the rename, so every output of the dump,
the e2e step and the report respects the umask as the C++ tools' outputs do.
"""

from __future__ import annotations

import hashlib
import os


def publish(tmp: str, path: str) -> None:
    """Rename ``tmp`` over ``path`` with mode 0666 & ~umask. Raises OSError as os.chmod / os.replace."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)


def file_sha256(paths: list[str]) -> str:
    """sha256 over the bytes of the given files, concatenated in the given order (hex string)."""
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _inside(child: str, parent: str) -> bool:
    rel = os.path.relpath(child, parent)
    return rel != "." and not rel.startswith("..")


def refuse_output_over_input(inputs: list[tuple[str, str]], outputs: list[tuple[str, str]]) -> None:
    """Raise ValueError, naming both roles and paths, when an output path is one of the inputs: the same
    path once resolved (symlinks, ".."), the same file through another name (a hard link: same device and
    inode), or a path inside an input directory (a checkpoint directory). ``inputs`` and ``outputs`` are
    (role, path) pairs; empty paths are ignored. The C++ tools apply the same rule
    (latentq/provenance.h ``refuse_output_over_input``)."""
    for orole, opath in outputs:
        if not opath:
            continue
        ro = os.path.realpath(opath)
        for irole, ipath in inputs:
            if not ipath:
                continue
            ri = os.path.realpath(ipath)
            same = ro == ri
            if not same and os.path.exists(opath) and os.path.exists(ipath):
                same = os.path.samefile(opath, ipath)
            within = not same and os.path.isdir(ri) and _inside(ro, ri)
            if same or within:
                raise ValueError(
                    f"{orole} {opath} {'is' if same else 'lies inside'} {irole} {ipath}: a command never writes "
                    "over what it reads; choose another output"
                )
