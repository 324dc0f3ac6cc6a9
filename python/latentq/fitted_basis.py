"""The KLT bases a study quantized behind, for the e2e step: a 'klt,<quantizer>' cell rotates each layer's
c_kv (or k_pe) by the eigenbasis of the dump's fit split (latentq/analysis/svd_probe.h fit_rotation), which
the e2e step's own windows cannot give. ``StudyBases`` refits that basis from the study's dump, with the
very C++ function the study ran (``latentq.fit_rotation``), so the e2e injects the study's rotation:
x -> Rᵀ·dequantize(quantize(R·x)), which equals folding R into W_UK / W_UV (c_kv) or q_pe (k_pe) up to
float32 rounding (latentq/transform.h).

The dump is the results file's root attribute ``input_path``; its sha256 must equal ``input_sha256``
(the file the study read), checked once, before the first basis is fitted.
"""

from __future__ import annotations

import hashlib
import os

import h5py
import numpy as np

KLT_PREFIX = "klt,"


def needs_basis(spec: str | None) -> bool:
    """True for a spec behind the fitted KLT ('klt,tc3'), whose quantize needs the study's basis."""
    return spec is not None and spec.startswith(KLT_PREFIX)


def _attr(f: h5py.File, name: str) -> str | None:
    v = f.attrs.get(name)
    if v is None:
        return None
    return v.decode() if isinstance(v, bytes) else str(v)


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class StudyBases:
    """``bases(layer, target)`` -> R float32 [D, D] (x' = R @ x; D = kv_lora_rank for "c_kv",
    qk_rope_head_dim for "k_pe"): the KLT basis the study fitted for that layer and target, refitted from
    the study's dump (/layers/NNN/<target> float32 [T, D] and /seq_offsets [S+1]) by latentq.fit_rotation
    and kept for the step (D·D·4 bytes per layer and target).

    ``available`` is False, with ``why`` saying so, when the results file records no dump or the dump is
    not at its path; then the caller leaves the klt quantizers out. Calling it raises ValueError naming the
    file when the dump's sha256 is not the study's input_sha256 (another file at that path), or the layer or
    target is not in the dump."""

    def __init__(self, latentq, results_path: str):
        self.latentq, self.results = latentq, results_path
        with h5py.File(results_path, "r") as f:
            self.path, self.sha256 = _attr(f, "input_path"), _attr(f, "input_sha256")
        self.why = ""
        if not self.path:
            self.why = f"{results_path} records no input_path (the dump the study read)"
        elif not os.path.isfile(self.path):
            self.why = f"the study's dump {self.path} is not there"
        self.available = not self.why
        self._checked = False
        self._bases: dict[tuple[int, str], np.ndarray] = {}

    def __call__(self, layer: int, target: str) -> np.ndarray:
        key = (layer, target)
        if key in self._bases:
            return self._bases[key]
        if not self.available:
            raise ValueError(f"klt basis of layer {layer} {target}: {self.why}")
        if not self._checked:
            sha = _file_sha256(self.path)
            if self.sha256 and sha != self.sha256:
                raise ValueError(
                    f"{self.path}: sha256 {sha[:12]}…, but {self.results} was made from input sha256 "
                    f"{self.sha256[:12]}…: the klt bases would not be the study's"
                )
            self._checked = True
        with h5py.File(self.path, "r") as f:
            name = f"layers/{layer:03d}/{target}"
            if name not in f:
                raise ValueError(f"{self.path}: no /{name}, needed for the klt basis of layer {layer} {target}")
            x = np.ascontiguousarray(f[name][:], dtype=np.float32)
            offsets = [int(v) for v in f["seq_offsets"][:]]
        self._bases[key] = self.latentq.fit_rotation(x, "klt", offsets)
        return self._bases[key]
