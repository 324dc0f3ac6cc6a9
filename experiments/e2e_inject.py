"""End-to-end check: run tiny-mla (or any MLA model the hooks support) on held-out text with each
quantizer injected into its latent cache, and measure what reaches the logits.

    .venv/bin/python experiments/e2e_inject.py --results results/default.h5

For every quantizer of the study in RESULTS.h5 (the `quantizer` column of /latent_error, in order),
c_kv is replaced at the output of `kv_a_layernorm` and k_pe after RoPE (data/latent_hooks.py) by
its quantize-dequantize through the C++ quantizers (the `latentq` Python module, the very code of
the CLI), on the MLA layers the study ran (the root attribute `layers` of RESULTS.h5, else the
`layer` column of /latent_error; recorded in the /e2e attribute `layers`), for the targets the study
ran that quantizer on (c_kv+k_pe for a --quantizers spec the study did not run, with a warning).
A transformed quantizer ('had,int4-asym-token', 'rot,mxfp4') quantizes the rotated rows and injects
them un-rotated (latentq/transform.h); 'klt,...' quantizers are not injected (a note says so).
Like the study, each window's whole prefill is quantized at once (per-channel groups and per-tensor
scales see later tokens of the window). Per quantizer:

  kl_mean     mean over tokens of KL(p_ref ‖ p_q), p = softmax(logits) over the 256 bytes, nats
  top1_agree  fraction of tokens whose argmax logit is unchanged
  ppl_ref     perplexity of the reference model on the next byte, exp(mean NLL), per byte
  ppl_quant   the same with the quantized latents

The rows are written as group /e2e (one 1-D dataset per column) into RESULTS.h5; the other groups
of the file are kept. The file is updated through a temporary copy and a rename, so an interrupted
run leaves the previous file intact.

Text: by default the held-out split of the KJV text (data/kjv_text.py), `--num-seqs` windows of
`--seq-len` bytes starting after the first `--offset-bytes` bytes (the shipped dump reads the first
4 × 512 bytes, so the default 2048 keeps the two apart).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import h5py
import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "data"))


def import_latentq():
    """Import the compiled `latentq` module from LATENTQ_PYMODULE_DIR or <repo>/build/python."""
    d = os.environ.get("LATENTQ_PYMODULE_DIR", os.path.join(ROOT, "build", "python"))
    if d not in sys.path:
        sys.path.insert(0, d)
    try:
        import latentq  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"e2e_inject: cannot import the latentq Python module from {d} ({e}); "
                         "build it first (scripts/setup.sh test, or cmake --build build --target latentq_py)")
    return latentq


def open_results(results_path: str) -> h5py.File:
    """Open a results file read-only. Raises ValueError naming the path when it is missing or not a
    readable HDF5 file (instead of h5py's errno text)."""
    if not os.path.isfile(results_path):
        raise ValueError(f"{results_path}: results file not found")
    try:
        return h5py.File(results_path, "r")
    except OSError:
        raise ValueError(f"{results_path}: cannot read the results file (unreadable or not HDF5)") from None


def study_layers(results_path: str) -> list[int] | None:
    """Layers the study ran: the root attribute `layers` ("0,1,2"), else the distinct values of the
    /latent_error `layer` column (ascending); None when neither is present. Raises ValueError on a
    malformed attribute."""
    with open_results(results_path) as f:
        if "layers" in f.attrs:
            v = f.attrs["layers"]
            v = v.decode() if isinstance(v, bytes) else str(v)
            try:
                return [int(x) for x in v.split(",") if x.strip()]
            except ValueError:
                raise ValueError(f"{results_path}: root attribute layers = '{v}', expected comma-separated "
                                 "layer indices") from None
        if "latent_error" in f and "layer" in f["latent_error"]:
            return sorted({int(x) for x in f["latent_error/layer"][:]})
    return None


def study_quantizers(results_path: str) -> list[tuple[str, tuple[str, ...]]]:
    """(quantizer, targets) pairs of /latent_error in first-seen order. Raises ValueError on a file
    that is missing, unreadable, not latentq-results/1 or has no /latent_error."""
    with open_results(results_path) as f:
        schema = f.attrs.get("schema", b"")
        schema = schema.decode() if isinstance(schema, bytes) else str(schema)
        if schema != "latentq-results/1":
            raise ValueError(f"{results_path}: schema '{schema}', expected 'latentq-results/1'")
        if "latent_error" not in f:
            raise ValueError(f"{results_path}: no /latent_error group (run `latentq run` first)")
        g = f["latent_error"]
        qs = [q.decode() if isinstance(q, bytes) else str(q) for q in g["quantizer"][:]]
        ts = [t.decode() if isinstance(t, bytes) else str(t) for t in g["target"][:]]
    order: dict[str, list[str]] = {}
    for q, t in zip(qs, ts):
        lst = order.setdefault(q, [])
        if t not in lst:
            lst.append(t)
    return [(q, tuple(t)) for q, t in order.items()]


def mixed_specs(results_path: str, quantizer: str) -> dict[tuple[int, str], str]:
    """{(layer, target): stored spec} of the /latent_error rows of `quantizer`: what a mixed
    assignment ([[mixed]] in the study config, a name that is no spec) stores on each layer."""
    with open_results(results_path) as f:
        g = f["latent_error"]
        dec = lambda v: v.decode() if isinstance(v, bytes) else str(v)
        return {(int(l), dec(t)): dec(s) for l, t, q, s in
                zip(g["layer"][:], g["target"][:], g["quantizer"][:], g["stored"][:]) if dec(q) == quantizer}


def make_inject(latentq, spec, targets: tuple[str, ...], layers=None):
    """Injection callback: quantize-dequantize c_kv / k_pe [B, T, D] per layer, one sequence per batch
    row; only the layers in `layers` (None: every layer). `spec` is a spec string, or a dict
    {(layer, target): spec} for a mixed assignment (mixed_specs()): a layer it lacks is left exact."""
    def fn(layer: int, name: str, x: torch.Tensor) -> torch.Tensor:
        if name not in targets or (layers is not None and layer not in layers):
            return x
        s = spec if isinstance(spec, str) else spec.get((layer, name))
        if s is None:
            return x
        B, T, D = x.shape
        flat = x.detach().to(torch.float32).reshape(B * T, D).contiguous().numpy()
        offs = [b * T for b in range(B + 1)]
        y = latentq.quantize_dequantize(flat, s, name, offs)
        return torch.from_numpy(y).reshape(B, T, D)
    return fn


def require_finite_logits(x: torch.Tensor, what: str) -> None:
    """Raise ValueError naming `what` and the count when the logits x (any shape) hold NaN/Inf: no
    metric is computed from them (a NaN reference would give NaN or, for top-1, arbitrary numbers)."""
    bad = int((~torch.isfinite(x)).sum())
    if bad:
        raise ValueError(f"{what}: {bad} of {x.numel()} logits are NaN/Inf; no metric is computed from "
                         "non-finite logits")


def logit_metrics(ref: torch.Tensor, q: torch.Tensor, ids: torch.Tensor, what: str = "the quantized run") -> dict:
    """ref, q: [B, T, V] float32 logits; ids [B, T] int64. KL and top-1 over all B·T positions;
    NLL on next-token targets (positions 0..T-2). Raises ValueError when ref or q has NaN/Inf
    (require_finite_logits; `what` names the run of q)."""
    require_finite_logits(ref, "the reference run (exact latents)")
    require_finite_logits(q, what)
    lp_ref = F.log_softmax(ref.double(), -1)
    lp_q = F.log_softmax(q.double(), -1)
    kl = (lp_ref.exp() * (lp_ref - lp_q)).sum(-1)
    top1 = (ref.argmax(-1) == q.argmax(-1)).double()
    tgt = ids[:, 1:]
    nll_ref = -lp_ref[:, :-1].gather(-1, tgt[..., None]).mean()
    nll_q = -lp_q[:, :-1].gather(-1, tgt[..., None]).mean()
    return {"kl_mean": float(kl.mean()), "top1_agree": float(top1.mean()),
            "nll_ref": float(nll_ref), "nll_quant": float(nll_q),
            "ppl_ref": float(torch.exp(nll_ref)), "ppl_quant": float(torch.exp(nll_q))}


def write_group(results_path: str, name: str, columns: dict[str, np.ndarray], attrs: dict) -> None:
    """Replace group `name` in results_path, keeping every other group: copy → edit → rename."""
    d = os.path.dirname(os.path.abspath(results_path))
    fd, tmp = tempfile.mkstemp(prefix=".e2e-", suffix=".h5.tmp", dir=d)
    os.close(fd)
    try:
        shutil.copyfile(results_path, tmp)
        with h5py.File(tmp, "r+") as f:
            if name in f:
                del f[name]
            g = f.create_group(name)
            for k, v in columns.items():
                if v.dtype.kind in "US":
                    g.create_dataset(k, data=v.astype(object), dtype=h5py.string_dtype("utf-8"))
                else:
                    g.create_dataset(k, data=v)
            for k, v in attrs.items():
                g.attrs[k] = v
        os.replace(tmp, results_path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", required=True, help="latentq-results/1 file of `latentq run` (updated in place)")
    ap.add_argument("--model", default=os.path.join(ROOT, "data", "tiny-mla"), help="tiny-mla directory")
    ap.add_argument("--text", help="text file (bytes are the tokens); default: the KJV held-out split")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--num-seqs", type=int, default=4)
    ap.add_argument("--offset-bytes", type=int, default=2048)
    ap.add_argument("--quantizers", nargs="*", help="spec strings (default: every quantizer of the study)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    for flag, v, lo in (("--seq-len", a.seq_len, 1), ("--num-seqs", a.num_seqs, 1), ("--offset-bytes", a.offset_bytes, 0),
                        ("--threads", a.threads, 1)):
        if v < lo:
            print(f"e2e_inject: error: {flag} {v}: must be >= {lo}", file=sys.stderr)
            return 2

    latentq = import_latentq()
    from latent_hooks import LatentInjector
    from tiny_mla import TinyMLAForCausalLM

    torch.set_num_threads(a.threads)
    try:
        pairs = study_quantizers(a.results)
        layers = study_layers(a.results)
        if a.quantizers:
            known = dict(pairs)
            pairs = []
            for q in a.quantizers:
                c = latentq.canonical_spec(q)
                if c not in known:
                    print(f"e2e_inject: warning: quantizer {c} is not in the study of {a.results}; "
                          "its targets default to c_kv+k_pe", file=sys.stderr)
                pairs.append((c, known.get(c, ("c_kv", "k_pe"))))
        if a.text:
            try:
                with open(a.text, "rb") as f:
                    text = f.read()
            except OSError as e:
                raise ValueError(f"--text {a.text}: cannot read ({e.strerror or type(e).__name__})") from None
        else:
            from kjv_text import load_kjv, split_kjv
            text = split_kjv(load_kjv())[1]
        need = a.offset_bytes + a.seq_len * a.num_seqs
        if len(text) < need:
            raise ValueError(f"text has {len(text)} bytes; {need} needed for --offset-bytes {a.offset_bytes} + "
                             f"{a.num_seqs} x {a.seq_len}")
        model = TinyMLAForCausalLM.from_pretrained(a.model)
        max_pos = model.config.max_position_embeddings
        if a.seq_len > max_pos:
            raise ValueError(f"--seq-len {a.seq_len} exceeds max_position_embeddings {max_pos} of the model {a.model}")
        num_layers = model.config.num_hidden_layers
        if layers is None:
            layers = list(range(num_layers))
        bad = [l for l in layers if not 0 <= l < num_layers]
        if bad:
            raise ValueError(f"{a.results}: study layer(s) {bad} not in the model {a.model} "
                             f"({num_layers} layers)")
    except (ValueError, OSError, RuntimeError) as e:
        print(f"e2e_inject: error: {e}", file=sys.stderr)
        return 2
    if len(layers) < num_layers:
        print(f"e2e_inject: note: the study ran layers {','.join(map(str, layers))} only; the other "
              f"{num_layers - len(layers)} of {num_layers} layers stay unquantized", file=sys.stderr)
    layer_set = frozenset(layers)
    # KLT rotations are fitted on the dump's fit split by the C++ study (probes::fit_rotation); the
    # injection sees only its own windows, so it does not refit one: those quantizers are left out.
    klt = [q for q, _ in pairs if q.startswith("klt,")]
    if klt:
        print(f"e2e_inject: note: {len(klt)} klt quantizer(s) not injected (the KLT basis is fitted on the "
              f"dump's fit split, not available here): {', '.join(klt)}", file=sys.stderr)
        pairs = [p for p in pairs if not p[0].startswith("klt,")]

    buf = np.frombuffer(text[a.offset_bytes:need], dtype=np.uint8).astype(np.int64)
    ids = torch.from_numpy(buf.reshape(a.num_seqs, a.seq_len))
    t0 = time.time()
    try:
        with torch.no_grad():
            ref = model(ids)
            require_finite_logits(ref, f"the reference run (exact latents) of {a.model}")
            rows = []
            for spec, targets in pairs:
                try:
                    latentq.canonical_spec(spec)
                    how = spec
                except ValueError:  # a mixed assignment: its spec per (layer, target) from /latent_error
                    how = mixed_specs(a.results, spec)
                with LatentInjector(model, make_inject(latentq, how, targets, layer_set)):
                    q = model(ids)
                m = logit_metrics(ref, q, ids, f"the run with {spec} latents ({'+'.join(targets)})")
                rows.append({"quantizer": spec, "targets": "+".join(targets), **m})
                print(f"  {spec:28s} KL {m['kl_mean']:.3e}  top1 {m['top1_agree']:.4f}  "
                      f"ppl {m['ppl_ref']:.4f} -> {m['ppl_quant']:.4f}", flush=True)
    except ValueError as e:  # non-finite logits: nothing is written
        print(f"e2e_inject: error: {e}; {a.results} is left unchanged", file=sys.stderr)
        return 2
    cols = {k: np.array([r[k] for r in rows]) for k in rows[0]}
    cols["num_tokens"] = np.full(len(rows), a.num_seqs * a.seq_len, dtype=np.int64)
    write_group(a.results, "e2e", cols, {
        "model": os.path.abspath(a.model), "text_offset_bytes": a.offset_bytes,
        "seq_len": a.seq_len, "num_seqs": a.num_seqs, "layers": ",".join(map(str, layers)),
        "definition": "KL(p_ref||p_q) mean over tokens (nats); top1 = argmax agreement; ppl = exp(mean next-byte NLL)"})
    print(f"e2e: {len(rows)} quantizers, {a.num_seqs}x{a.seq_len} tokens, {time.time() - t0:.1f}s -> {a.results}:/e2e")
    return 0


if __name__ == "__main__":
    sys.exit(main())
