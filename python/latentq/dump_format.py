"""The latentq-dump/1 file conventions every dump writer shares (python -m latentq.dump for MLA and sparse MLA,
latentq.dump_v4 for DeepSeek-V4): the schema string, the query-row rule, the HDF5 chunking rule, the error type of a
bad request and the relative error of the self-checks. data/README.md documents the file."""

from __future__ import annotations

import numpy as np
import torch

SCHEMA = "latentq-dump/1"
Q_ROWS_RULE = "per sequence k rows at positions floor((j+1)*L/k)-1, j=0..k-1; k=q_rows//S (+1 for the first q_rows%S)"


class DumpError(ValueError):
    """Bad dump request (text too short, output exists, bad q_rows ...)."""


def select_q_rows(seq_lens: list[int], q_rows: int) -> list[np.ndarray]:
    """Local query positions per sequence (Q_ROWS_RULE; latentq.dump's docstring). Returns one int64 array per
    sequence, sorted. Raises DumpError if q_rows < 1 or a sequence would need more rows than it has."""
    S = len(seq_lens)
    if q_rows < 1:
        raise DumpError(f"q_rows must be >= 1 (got {q_rows})")
    out = []
    for s, L in enumerate(seq_lens):
        k = q_rows // S + (1 if s < q_rows % S else 0)
        if k > L:
            raise DumpError(f"q_rows={q_rows} needs {k} rows from sequence {s} of length {L}")
        out.append(np.array([(j + 1) * L // k - 1 for j in range(k)], dtype=np.int64))
    return out


def rel_err(a, b) -> float:
    """max |a - b| / max |b| (float64)."""
    a = torch.as_tensor(np.asarray(a) if not isinstance(a, torch.Tensor) else a).double()
    b = torch.as_tensor(np.asarray(b) if not isinstance(b, torch.Tensor) else b).double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


CHUNK_BYTES = 1 << 20  # target bytes per HDF5 chunk of a per-token / per-query dataset
INDEX_CHUNK = 1 << 16  # elements per chunk of tokens, positions, seq_offsets, q_rows


def chunk_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """HDF5 chunk shape of a float32 dataset of ``shape`` written row by row: whole rows, about 1 MiB
    per chunk, rows = max(1, 2**20 // (4 * elements per row)), capped at shape[0] (the rule of the C++
    synthetic dumper, study/io/synth.cpp rows_per_mib). Example: c_kv [32768, 512] -> (512, 512)."""
    row = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    return (max(1, min(int(shape[0]), CHUNK_BYTES // (4 * row))),) + tuple(int(d) for d in shape[1:])
