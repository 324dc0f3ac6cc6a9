"""The latentq-dump/1 file conventions every dump writer shares (python -m latentq.dump for MLA and sparse MLA,
latentq.dump_v4 for DeepSeek-V4): the schema string, the query-row rule, the HDF5 chunking rule, the error type of a
bad request and the relative error of the self-checks. data/README.md documents the file."""

from __future__ import annotations

import datetime
import json
import os
import tempfile

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


def compression_kw(compression: str | None) -> dict:
    """The h5py create_dataset arguments of ``--compression``: "gzip" (level 4, byte shuffle) or None (none)."""
    return {"compression": "gzip", "compression_opts": 4, "shuffle": True} if compression == "gzip" else {}


def put_index(parent, name: str, data: np.ndarray, kw: dict) -> None:
    """A 1-D dataset written whole at creation, chunked by INDEX_CHUNK elements (tokens, positions, seq_offsets,
    q_rows, ...); kw: compression_kw's arguments."""
    parent.create_dataset(name, data=data, chunks=(min(len(data), INDEX_CHUNK),), **kw)


def put_token_arrays(f, tokens: np.ndarray, positions: np.ndarray, offsets: np.ndarray, kw: dict) -> None:
    """The root datasets every dump has: /tokens int32 [T], /positions int32 [T], /seq_offsets int64 [S+1]."""
    put_index(f, "tokens", np.asarray(tokens).astype(np.int32), kw)
    put_index(f, "positions", np.asarray(positions).astype(np.int32), kw)
    put_index(f, "seq_offsets", np.asarray(offsets).astype(np.int64), kw)


def temp_output(out_path: str) -> str:
    """A new empty file beside ``out_path`` (its folder created), ".tmp-<name>.<random>": the writer fills it, then
    latentq.files.publish renames it over out_path (or the caller removes it on failure)."""
    out_dir = os.path.dirname(os.path.abspath(out_path))
    os.makedirs(out_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-" + os.path.basename(out_path) + ".", dir=out_dir)
    os.close(fd)
    return tmp


def common_root_attrs(
    meta: dict, config_dict: dict, *, num_layers: int, num_heads: int, softmax_scale: float, seq_lens: list[int]
) -> dict:
    """The root attributes of every dump whatever its cache family (data/README.md): schema, model, revision,
    source, created (UTC), config_json, num_layers, num_heads, softmax_scale, original_dtype, compute_dtype,
    num_seqs, seq_len (-1 when the sequences differ in length), text_sha256, q_rows_rule, torch_version,
    transformers_version. meta: model, revision, source, original_dtype, compute_dtype, text_sha256."""
    import transformers

    return {
        "schema": SCHEMA,
        "model": meta["model"],
        "revision": meta["revision"],
        "source": meta["source"],
        "created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "config_json": json.dumps(config_dict, sort_keys=True, default=str),
        "num_layers": np.int64(num_layers),
        "num_heads": np.int64(num_heads),
        "softmax_scale": np.float64(softmax_scale),
        "original_dtype": meta["original_dtype"],
        "compute_dtype": meta["compute_dtype"],
        "num_seqs": np.int64(len(seq_lens)),
        "seq_len": np.int64(seq_lens[0] if len(set(seq_lens)) == 1 else -1),
        "text_sha256": meta["text_sha256"],
        "q_rows_rule": Q_ROWS_RULE,
        "torch_version": str(torch.__version__),
        "transformers_version": transformers.__version__,
    }


def write_root_attrs(f, attrs: dict, extra_attrs: dict | None) -> None:
    """attrs, then extra_attrs over them, as the file's root attributes (str() of a str subclass: TorchVersion)."""
    for k, v in {**attrs, **(extra_attrs or {})}.items():
        f.attrs[k] = str(v) if isinstance(v, str) else v
