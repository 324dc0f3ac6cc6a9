"""The fitted bases a study quantized behind, for the e2e step: a '<transform>,<quantizer>' cell whose transform is
fitted on the dump (latentq.transform_rows(): 'klt', the eigenbasis of the fit split; 'sklt', the score-metric KLT of
the fit split and its query rows) transforms each layer's c_kv (or k_pe) by a basis the e2e step's own windows cannot
give. ``StudyBases`` refits that basis from the study's dump with the very C++ function the study ran
(``latentq.fit_layer_rotation``, latentq/fit_layer.h: it reads what the transform's fit needs), so the e2e injects the
study's transform: x -> A⁻¹·dequantize(quantize(A·x)) (A = R orthogonal for klt, A⁻¹ = Rᵀ), which equals folding A
into W_UK / W_UV (c_kv) or q_pe (k_pe) up to float32 rounding (latentq/transform.h).

The dump is the results file's root attribute ``input_path``; its sha256 must equal ``input_sha256``
(the file the study read), checked once, before the first basis is fitted.
"""

from __future__ import annotations

import functools
import os

import h5py
import numpy as np


@functools.cache
def fitted_transforms() -> tuple[str, ...]:
    """The names of the transforms fitted on the dump, in table order (latentq/transform.h kTransforms, through
    latentq.transform_rows(): ('klt', 'sklt')). A fitted transform takes no block and no seed, so its name is its
    whole transform part. Raises ImportError when latentq._core is not built."""
    from latentq import _core

    return tuple(r["name"] for r in _core.transform_rows() if r["fitted"])


def needs_basis(spec: str | None) -> bool:
    """True for a spec behind a fitted transform ('klt,tc3', 'sklt,tc3'), whose quantize needs the study's basis."""
    return spec is not None and "," in spec and transform_of(spec) in fitted_transforms()


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
    transform, as latentq.fit_layer_rotation returns it (a rotation, klt: R float32 [D, D], x' = R @ x; else, sklt:
    (A, A⁻¹) float32 [2, D, D]; D = kv_lora_rank for "c_kv", qk_rope_head_dim for "k_pe"), refitted from the
    study's dump and kept for the step (D·D·4 bytes, twice for sklt, per layer and target).

    ``available`` is False, with ``why`` saying so, when the results file records no dump or the dump is
    not at its path; then the caller leaves the fitted quantizers out. Calling it raises ValueError naming the
    file when the dump's sha256 is not the study's input_sha256 (another file at that path), or the layer is not in
    the dump (or lacks what the fit reads), RuntimeError when the dump cannot be read."""

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
        the dump), else why not: the dump is not there, or the dump lacks what the fit reads on some layer
        (latentq.fit_layer_missing: for sklt, a layer without query rows, as in a latent-only dump)."""
        if not self.available:
            return self.why
        if transform not in self._why_not:
            missing = self.latentq.fit_layer_missing(
                self.path, transform, None if layers is None else [int(n) for n in layers]
            )
            self._why_not[transform] = f"the study's dump {missing}" if missing else ""
        return self._why_not[transform]

    def check_dump(self) -> None:
        """Once: raises ValueError naming both files when the dump's sha256 is not the study's input_sha256 (another
        file at the recorded path). The e2e step calls it before its first forward when a run needs a basis."""
        if self._checked:
            return
        from latentq.files import file_sha256  # the hash of the dump's inputs

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
        self._bases[key] = self.latentq.fit_layer_rotation(self.path, layer, target, transform)
        return self._bases[key]
