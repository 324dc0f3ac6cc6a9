"""The host side of layer streaming (latentq.stream): the hidden states of every input between two decoder layers
(``HostStates``: in memory or in an anonymous temporary file) and handing a freed layer's heap back to the OS
(``_trim_host_heap``)."""

from __future__ import annotations

import math
import os
import tempfile

import numpy as np
import torch


class HostStates:
    """The hidden states of the inputs between layers, on the host: item n is a [B_n, L_n, hidden]
    tensor of ``dtype``. In memory, or (``in_memory=False``) in an anonymous temporary file in
    ``directory`` (removed on close), read and written with pread / pwrite, so that the file's pages
    are not part of the process's memory. ``get(n)`` returns a new CPU tensor; ``put(n, x)`` stores
    a copy (x of the item's shape, any device)."""

    def __init__(self, shapes: list[tuple[int, ...]], dtype: torch.dtype, in_memory: bool, directory: str | None):
        self.shapes, self.dtype, self.in_memory = [tuple(s) for s in shapes], dtype, in_memory
        elem = torch.empty((), dtype=dtype).element_size()
        sizes = [math.prod(s) * elem for s in self.shapes]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.nbytes = int(self.offsets[-1])
        self._mem: list[torch.Tensor | None] = [None] * len(shapes)
        self._file = None if in_memory else tempfile.TemporaryFile(prefix="latentq-states-", dir=directory)

    def put(self, n: int, x: torch.Tensor) -> None:
        if tuple(x.shape) != self.shapes[n] or x.dtype != self.dtype:
            raise RuntimeError(
                f"hidden states {n}: got {tuple(x.shape)} {x.dtype}, expected {self.shapes[n]} {self.dtype}"
            )
        x = x.detach().to("cpu")
        if self.in_memory:
            self._mem[n] = x  # layers return new tensors and do not write into their input
            return
        buf = memoryview(x.contiguous().reshape(-1).view(torch.uint8).numpy())
        off, done = int(self.offsets[n]), 0
        while done < len(buf):
            done += os.pwrite(self._file.fileno(), buf[done:], off + done)

    def get(self, n: int) -> torch.Tensor:
        if self.in_memory:
            if self._mem[n] is None:
                raise RuntimeError(f"hidden states {n} were never stored")
            return self._mem[n]
        x = torch.empty(self.shapes[n], dtype=self.dtype)
        buf = memoryview(x.reshape(-1).view(torch.uint8).numpy())
        off, done = int(self.offsets[n]), 0
        while done < len(buf):
            got = os.preadv(self._file.fileno(), [buf[done:]], off + done)
            if got <= 0:
                raise RuntimeError(f"hidden states {n}: short read from the temporary file")
            done += got
        return x

    def close(self) -> None:
        self._mem = [None] * len(self.shapes)
        if self._file is not None:
            self._file.close()
            self._file = None


def _trim_host_heap() -> None:
    """Give freed heap memory back to the OS (glibc's ``malloc_trim(0)``; nothing elsewhere). A layer's
    tensors of a few MB each come from malloc's heap, not from their own mmap (glibc raises its mmap
    threshold to the size of the largest block freed, up to 32 MiB), and what a freed layer leaves
    there would otherwise stay resident and fragment: the streamed dump's peak RSS grew ≈ 5 MB per
    layer without this, at 122 MB per layer (bench/dump_stream_rss.py)."""
    global _LIBC
    if _LIBC is None:
        import ctypes
        import ctypes.util

        try:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


_LIBC = None
