"""The fitted bases a study quantized behind, for the e2e step: a 'klt,<quantizer>' cell rotates each layer's
c_kv (or k_pe) by the eigenbasis of the dump's fit split, an 'sklt,<quantizer>' cell transforms it by the
score-metric KLT of the fit split and its query rows (latentq/analysis/svd_probe.h fit_rotation,
score_basis.h), which the e2e step's own windows cannot give. ``StudyBases`` refits that basis from the
study's dump, with the very C++ function the study ran (``latentq.fit_rotation``), so the e2e injects the
study's transform: x -> A⁻¹·dequantize(quantize(A·x)) (A = R orthogonal for klt, A⁻¹ = Rᵀ), which equals
folding A into W_UK / W_UV (c_kv) or q_pe (k_pe) up to float32 rounding (latentq/transform.h).

The dump is the results file's root attribute ``input_path``; its sha256 must equal ``input_sha256``
(the file the study read), checked once, before the first basis is fitted.
"""

from __future__ import annotations

import os

import h5py
import numpy as np

FITTED = ("klt", "sklt")  # the transforms fitted on the dump (latentq/transform.h fitted_transform)


def needs_basis(spec: str | None) -> bool:
    """True for a spec behind a fitted transform ('klt,tc3', 'sklt,tc3'), whose quantize needs the study's basis."""
    return spec is not None and "," in spec and spec.split(",", 1)[0] in FITTED


def transform_of(spec: str) -> str:
    """The transform part of a '<transform>,<quantizer>' spec ('klt' of 'klt,tc3')."""
    return spec.split(",", 1)[0]


def _attr(f: h5py.File, name: str) -> str | None:
    v = f.attrs.get(name)
    if v is None:
        return None
    return v.decode() if isinstance(v, bytes) else str(v)


class StudyBases:
    """``bases(layer, target, transform="klt")`` -> the basis the study fitted for that layer, target and fitted
    transform, as latentq.fit_rotation returns it (klt: R float32 [D, D], x' = R @ x; sklt: (A, A⁻¹) float32
    [2, D, D]; D = kv_lora_rank for "c_kv", qk_rope_head_dim for "k_pe"), refitted from the study's dump
    (/layers/NNN/<target> float32 [T, D], /seq_offsets [S+1]; for sklt also /layers/NNN/q_rows, and q_nope with
    w_uk for c_kv, q_pe for k_pe) and kept for the step (D·D·4 bytes, twice for sklt, per layer and target).

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
        self._bases: dict[tuple[int, str, str], np.ndarray] = {}  # (layer, target, transform) -> basis
        self._why_not: dict[str, str] = {}

    def why_not(self, transform: str, layers) -> str:
        """ "" when the dump can give `transform`'s basis on every layer of `layers` (ints; None: every layer of
        the dump), else why not: the dump is not there, or (sklt) a layer has no query rows (/layers/NNN/q_rows:
        a latent-only dump)."""
        if not self.available or transform != "sklt":
            return self.why
        if transform not in self._why_not:
            with h5py.File(self.path, "r") as f:
                names = [f"layers/{int(l):03d}" for l in layers] if layers is not None else list(f["layers"])
                names = [n if n.startswith("layers/") else f"layers/{n}" for n in names]
                bare = [n for n in names if f"{n}/q_rows" not in f]
            self._why_not[transform] = (
                f"the study's dump {self.path} has no query rows in /{bare[0]}, which sklt fits on" if bare else ""
            )
        return self._why_not[transform]

    def check_dump(self) -> None:
        """Once: raises ValueError naming both files when the dump's sha256 is not the study's input_sha256 (another
        file at the recorded path). The e2e step calls it before its first forward when a run needs a basis."""
        if self._checked:
            return
        from latentq.dump import file_sha256  # the dumper's own file hash (torch-heavy module: imported when used)

        sha = file_sha256([self.path])
        if self.sha256 and sha != self.sha256:
            raise ValueError(
                f"{self.path}: sha256 {sha[:12]}…, but {self.results} was made from input sha256 "
                f"{self.sha256[:12]}…: the fitted bases would not be the study's"
            )
        self._checked = True

    def __call__(self, layer: int, target: str, transform: str = "klt") -> np.ndarray:
        key = (layer, target, transform)
        if key in self._bases:
            return self._bases[key]
        if not self.available:
            raise ValueError(f"{transform} basis of layer {layer} {target}: {self.why}")
        self.check_dump()
        g = f"layers/{layer:03d}"
        need = [target] + (
            [] if transform != "sklt" else ["q_rows"] + (["q_nope", "w_uk"] if target == "c_kv" else ["q_pe"])
        )
        with h5py.File(self.path, "r") as f:
            missing = [n for n in need if f"{g}/{n}" not in f]
            if missing:
                raise ValueError(
                    f"{self.path}: no /{g}/{missing[0]}, needed for the {transform} basis of layer {layer} {target}"
                )
            d = {n: np.ascontiguousarray(f[f"{g}/{n}"][:]) for n in need}
            offsets = [int(v) for v in f["seq_offsets"][:]]
        x = d[target].astype(np.float32)
        if transform == "sklt":
            q = d["q_nope" if target == "c_kv" else "q_pe"].astype(np.float32)
            w = d["w_uk"].astype(np.float32) if target == "c_kv" else None
            self._bases[key] = self.latentq.fit_rotation(
                x, "sklt", offsets, q, w, d["q_rows"].astype(np.int32).tolist()
            )
        else:
            self._bases[key] = self.latentq.fit_rotation(x, transform, offsets)
        return self._bases[key]
