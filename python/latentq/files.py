"""Output files of the Python steps: written to a temporary name in the target directory, then renamed.

``tempfile.mkstemp`` creates its file with mode 0600; ``publish`` gives it the mode a file opened
normally would get (0666 less the process umask) before the rename, so every output of the dump,
the e2e step and the report respects the umask as the C++ tools' outputs do.
"""

from __future__ import annotations

import os


def publish(tmp: str, path: str) -> None:
    """Rename ``tmp`` over ``path`` with mode 0666 & ~umask. Raises OSError as os.chmod / os.replace."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)
