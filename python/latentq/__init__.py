"""latentq: quantizers of the latent KV cache of MLA models, and the Python side of the study.

The package lives in two directories: the pure-Python modules here (``<repo>/python/latentq/``) and
the compiled ``latentq._core`` (pybind11, python/src/core.cpp) in ``<build>/python/latentq/``.
``pkgutil.extend_path`` joins them when ``<repo>/python`` and ``<build>/python`` are both on
sys.path: scripts/setup.sh writes the two into the venv's ``latentq.pth``; the ctest tests and the
``latentq`` CLI set PYTHONPATH.

Modules:
  _core       the C++ quantizers on numpy arrays; every public name is re-exported here
              (``latentq.quantize``, ``latentq.quantize_dequantize``, ``latentq.decode_order_mask``, ...)
  capture     forward hooks that capture c_kv, k_pe, q, the attention output and the softmax scale
  inject      quantized latents into the model (LatentInjector) and the decode order (DecodeOrderAttention)
  format_table ``latentq.formats()``: the format table (every example spec and engine preset) as a DataFrame
  dump        ``python -m latentq.dump``: latentq-dump/1 HDF5 files (data/README.md)
  e2e         ``python -m latentq.e2e``: the model with quantized latents (/e2e, /e2e_position)
  report      ``python -m latentq.report``: figures and report.md of a results file
  thresholds  ``python -m latentq.thresholds``: results/thresholds.toml from a run of the default study
  tiny_mla    the tiny-mla model; kjv_text: the KJV text and its train / held-out split

``import latentq`` works without the compiled part (the model-side modules do not need it); a name that
is not a Python one (a C++ name) is then an ImportError that says how to build it.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

__path__ = pkgutil.extend_path(__path__, __name__)

BUILD_HINT = (
    "build it with `cmake --build build --target latentq_py` (or scripts/setup.sh run), and put "
    "<repo>/python and <build>/python on sys.path (scripts/setup.sh writes both into the venv's latentq.pth)"
)

try:
    _core = importlib.import_module("latentq._core")
except ImportError as e:
    _core = None
    _core_error = f"{type(e).__name__}: {e}"
else:
    _core_error = ""
    globals().update({k: getattr(_core, k) for k in dir(_core) if not k.startswith("_")})


def formats():
    """The format table as a pandas DataFrame (latentq.format_table.formats: name, family, engine,
    record_bytes, ...)."""
    from latentq.format_table import formats as table

    return table()


def __getattr__(name: str):
    """A name the package does not define in Python. With latentq._core: AttributeError (every C++ name is
    already here). Without it: ImportError saying how to build it, for any public name, which may be the
    compiled module's (the names python/src/core.cpp defines are written there only, not copied here);
    AttributeError for a name with a leading underscore (the compiled module exports none) and for a submodule
    of the package (``from latentq import dump`` then imports it)."""
    if _core is None and not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is None:
        raise ImportError(
            f"latentq.{name} needs the compiled module latentq._core (it is not a Python name of the package), "
            f"which did not import ({_core_error}); {BUILD_HINT}"
        )
    raise AttributeError(f"module 'latentq' has no attribute {name!r}")
