"""The `latentq` package without its compiled part: `import latentq` and the model-side modules work,
and a C++ name (any public name the package does not define in Python: the C++ names are written in
python/src/core.cpp only) raises an ImportError that says how to build latentq._core."""

import os
import subprocess
import sys

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "python")

CHECK = """
import latentq, latentq.capture
assert latentq._core is None
try:
    latentq.quantize
except ImportError as e:
    assert "latentq._core" in str(e) and "cmake --build build --target latentq_py" in str(e), e
else:
    raise AssertionError("latentq.quantize without latentq._core")
for name in ("no_such_name", "decode_order"):  # no list of C++ names to miss one: every public name
    try:
        getattr(latentq, name)
    except ImportError as e:
        assert "latentq._core" in str(e) and "cmake --build build --target latentq_py" in str(e), e
    else:
        raise AssertionError(f"latentq.{name} without latentq._core")
for name in ("_no_such_name", "__wrapped__"):  # private names and dunders stay AttributeErrors (hasattr works)
    assert not hasattr(latentq, name), name
from latentq import tiny_mla  # a submodule imports through `from latentq import`
assert tiny_mla.__name__ == "latentq.tiny_mla"
print("ok")
"""


def test_import_without_the_compiled_module():
    # the package's source directory alone on the path (no build directory): PYTHONPATH, and no .pth
    # files of the venv's site-packages (-S); torch comes from the venv's site-packages, added by hand
    import torch

    site = os.path.dirname(os.path.dirname(torch.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, site]))
    r = subprocess.run([sys.executable, "-S", "-c", CHECK], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
