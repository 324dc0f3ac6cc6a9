"""Model loading for the Python steps (latentq.dump, latentq.e2e): a tiny-mla directory or an HF MLA
checkpoint (directory or hub id), its tokenizer, its identity (revision, original dtype) and whether it
runs in memory or layer by layer (``--stream auto|on|off``, ``--memory-budget``).

    load_model(path, dtype, ...)  -> (model, config dict, source, revision, original_dtype, tokenizer or None)
    stream_plan(mode, budget, path, dtype) -> (stream?, why, budget bytes): the rule both steps share
    device_error(device)          -> why a --device cannot run here, or None
    run_model(model, ids)         -> logits [B, T, V] of one forward pass (tiny-mla or HF)

Models larger than memory: latentq.stream.LayerStreamer (the model on the meta device, each decoder
layer read from the shards right before it runs). Quantized checkpoints (DeepSeek FP8, DeepSeek-V4's
FP8 with e8m0 block scales and MXFP4 routed experts, compressed-tensors pack- / float-quantized,
ModelOpt NVFP4 / FP8: latentq.weight_formats) are decoded on load to the compute dtype by latentq.stream in
either mode.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys

import torch

from latentq.files import file_sha256
from latentq.model_class import hf_config_and_class
from latentq.progress import say

# The compute dtypes of --dtype.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelError(ValueError):
    """A model request a step refuses (tiny-mla under --stream on, a --memory-budget that does not parse)."""


def _is_hf(model) -> bool:
    """Whether model is an HF PreTrainedModel. Does not import transformers (seconds) when it is not
    imported yet: then no HF model exists."""
    tf = sys.modules.get("transformers")
    return tf is not None and isinstance(model, tf.PreTrainedModel)


def run_model(model, ids: torch.Tensor) -> torch.Tensor:
    """One forward pass, input_ids [B, T] int64 -> logits [B, T, V] (HF: use_cache=False)."""
    if _is_hf(model):
        return model(input_ids=ids, use_cache=False).logits
    return model(ids)


def state_dict_sha256(model) -> str:
    """sha256 over the state dict (names, dtypes, shapes, bytes), sorted by name."""
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        t = v.detach().cpu().contiguous()
        h.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


WEIGHT_FILE_SUFFIXES = (".safetensors", ".bin")  # what from_pretrained reads for a torch model


def weight_files(path: str) -> list[str]:
    """The weight files directly in the checkpoint directory ``path`` (WEIGHT_FILE_SUFFIXES), sorted by name;
    [] when there is none or ``path`` is not a directory."""
    if not os.path.isdir(path):
        return []
    return sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(WEIGHT_FILE_SUFFIXES))


def weights_revision(path: str) -> str | None:
    """``sha256:<hex>`` over the bytes of a local directory's weight files (weight_files: every
    ``*.safetensors`` and ``*.bin``, sorted by name, concatenated), or None when there is none or path is
    not a directory."""
    w = weight_files(path)
    return "sha256:" + file_sha256(w) if w else None


def checkpoint_dtype(cfg_file: dict | None, path: str | None = None) -> str:
    """The ``original_dtype`` attribute of a checkpoint from its config.json (and, given the directory
    ``path``, its ``hf_quant_config.json``): for quantized weights the quantization's
    (latentq.weight_formats: ``float8_e4m3fn`` for DeepSeek FP8 / FP8 formats, ``float8_e4m3fn+mxfp4`` for
    DeepSeek-V4 with MXFP4 experts, ``int4`` / ``int8`` for compressed-tensors pack-quantized, ``nvfp4``; its
    torch_dtype names the unquantized tensors), else torch_dtype / dtype, else "unknown". A quantization that
    latentq.weight_formats does not take gives torch_dtype (the loader then refuses the checkpoint, naming it)."""
    cfg_file = cfg_file or {}
    q = _quantization(cfg_file, path)
    if q is not None:
        return q.original_dtype
    return str(cfg_file.get("torch_dtype") or cfg_file.get("dtype") or "unknown")


def _is_quantized(cfg_file: dict, path: str) -> bool:
    """Whether a local checkpoint says its weights are quantized (``quantization_config``, or ModelOpt's
    ``hf_quant_config.json``), whether or not latentq.weight_formats takes the format."""
    return bool(cfg_file.get("quantization_config")) or os.path.isfile(os.path.join(path, "hf_quant_config.json"))


def _quantization(cfg_file: dict, path: str | None):
    """latentq.weight_formats.detect for a local checkpoint (None: unquantized, or not one it takes)."""
    from latentq.weight_formats import detect

    try:
        return detect(path or "", cfg_file)
    except ValueError:
        return None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")
TOKENIZER_MODES = ("auto", "bytes")


def has_tokenizer_files(path: str) -> bool:
    """Whether the checkpoint directory ``path`` holds a tokenizer (one of TOKENIZER_FILES, or a
    ``*.tiktoken`` file)."""
    if not os.path.isdir(path):
        return False
    names = os.listdir(path)
    return any(n in TOKENIZER_FILES or n.endswith(".tiktoken") for n in names)


def _tokenizer_class(path: str) -> str:
    """The tokenizer class the checkpoint names (tokenizer_config.json's tokenizer_class, or its auto_map
    entry), or "AutoTokenizer" when it names none."""
    try:
        with open(os.path.join(path, "tokenizer_config.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return "AutoTokenizer"
    auto = cfg.get("auto_map", {}).get("AutoTokenizer") if isinstance(cfg.get("auto_map"), dict) else None
    if isinstance(auto, list):
        auto = next((x for x in auto if x), None)
    return str(cfg.get("tokenizer_class") or auto or "AutoTokenizer")


def load_tokenizer(path: str, trust_remote_code: bool = False, mode: str = "auto"):
    """The checkpoint's tokenizer (transformers' AutoTokenizer), or None for byte tokens.

    mode ``bytes``: None (the text's bytes are the tokens; the dump records "bytes"). mode ``auto``: None,
    with a warning, only when the checkpoint has no tokenizer at all (has_tokenizer_files; a hub id is
    always tried); a tokenizer that is there but fails to load raises ModelError naming the class and the
    flag that would help (--trust-remote-code when it is the checkpoint's own code, else --tokenizer bytes),
    never bytes in silence. Raises ValueError for another mode."""
    if mode not in TOKENIZER_MODES:
        raise ValueError(f"--tokenizer {mode}: expected one of {', '.join(TOKENIZER_MODES)}")
    if mode == "bytes":
        return None
    if os.path.isdir(path) and not has_tokenizer_files(path):
        say("model", "warning", f"no tokenizer in {path}; using byte tokens")
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as e:  # a tokenizer that is there and does not load is the user's to decide
        cls = _tokenizer_class(path) if os.path.isdir(path) else "AutoTokenizer"
        remote = os.path.isdir(path) and any(n.endswith(".py") for n in os.listdir(path))
        hint = (
            "it is the checkpoint's own code: pass --trust-remote-code if you trust it"
            if remote and not trust_remote_code
            else "pass --tokenizer bytes to tokenize the text as bytes instead"
        )
        raise ModelError(
            f"--model {path}: its tokenizer {cls} does not load ({type(e).__name__}: {str(e)[:300]}); {hint}"
        ) from None


def _read_config(path: str) -> dict | None:
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        return None
    with open(cfg_path) as f:
        return json.load(f)


def is_tiny_mla(path: str) -> bool:
    """Whether path is a tiny-mla directory (config.json architectures == ["TinyMLAForCausalLM"])."""
    cfg = _read_config(path)
    return cfg is not None and cfg.get("architectures") == ["TinyMLAForCausalLM"]


def load_model(
    path: str,
    dtype: torch.dtype,
    trust_remote_code: bool = False,
    *,
    stream: bool = False,
    device: str = "cpu",
    memory_budget: int | None = None,
    spill_dir: str | None = None,
    tokenizer: str = "auto",
):
    """Load tiny-mla (config.json architectures == ["TinyMLAForCausalLM"]) or an HF model.
    Returns (model, config_dict, source, revision, original_dtype, tokenizer_or_None).

    HF checkpoints load with AutoModelForCausalLM.from_pretrained (eager attention), except quantized
    ones (a ``quantization_config`` or ``hf_quant_config.json``: DeepSeek FP8, compressed-tensors,
    ModelOpt ...), which latentq.stream loads with the decoders of latentq.weight_formats
    (LayerStreamer.materialize: the whole model in memory, every weight decoded to ``dtype``; the
    same weights as the streamed path; a format it does not take raises CheckpointError).
    stream=True: ``model`` is a latentq.stream.LayerStreamer (nothing loaded yet; device, memory_budget
    and spill_dir are its own) for a local safetensors checkpoint directory; else the model is moved to
    ``device``. Raises
    latentq.stream.CheckpointError for a checkpoint that cannot be streamed."""
    cfg_file = _read_config(path) if os.path.isdir(path) else None
    if cfg_file is not None and cfg_file.get("architectures") == ["TinyMLAForCausalLM"]:
        from latentq.tiny_mla import TinyMLAForCausalLM

        if stream:
            raise ModelError(f"--model {path}: tiny-mla is not streamed (it fits in memory); use --stream off or auto")
        model = TinyMLAForCausalLM.from_pretrained(path).to(dtype).to(device).eval()
        rev = "sha256:" + file_sha256([os.path.join(path, "model.safetensors")])
        return model, cfg_file, "tiny-mla", rev, str(cfg_file.get("torch_dtype", "float32")), None
    orig = checkpoint_dtype(cfg_file, path)
    quantized = cfg_file is not None and _is_quantized(cfg_file, path)
    if stream or quantized:
        from latentq.stream import LayerStreamer

        sm = LayerStreamer(
            path,
            dtype,
            device=device,
            memory_budget=memory_budget,
            spill_dir=spill_dir,
            trust_remote_code=trust_remote_code,
        )
        model = sm if stream else sm.materialize().to(device)
        config = sm.config
    else:
        from transformers import AutoModelForCausalLM

        config, cls, note = hf_config_and_class(path, trust_remote_code)
        if cls is None:
            cls = AutoModelForCausalLM
            kw = {"trust_remote_code": trust_remote_code}
        else:
            say("model", "note", note)
            kw = {}
        model = cls.from_pretrained(path, config=config, dtype=dtype, attn_implementation="eager", **kw)
        model = model.to(device).eval()
        config = model.config
    rev = getattr(config, "_commit_hash", None) or weights_revision(path)
    return model, config.to_dict(), "hf-hooks", rev, orig, load_tokenizer(path, trust_remote_code, tokenizer)


def stream_decision(mode: str, path: str, dtype: torch.dtype, budget: int) -> tuple[bool, str]:
    """(stream?, why) for --stream MODE on --model path. ``on``: stream (the checkpoint must be a local
    safetensors directory); ``off``: never; ``auto``: by size, whatever the weight format: stream a local
    safetensors HF checkpoint whose weights in ``dtype`` (from the shards' headers, quantized weights at their
    decoded size; layers past num_hidden_layers left out) exceed ``budget`` bytes, load it in memory
    otherwise (a quantized one through latentq.stream too, so both ways decode the same weights); tiny-mla
    and hub ids load in memory. Raises ModelError, before anything is loaded, for a local checkpoint that
    cannot stream (e.g. .bin weights) whose weight files alone exceed the budget: its size, the budget and
    why it cannot stream."""
    if mode == "off":
        return False, "--stream off"
    if mode == "on":
        return True, "--stream on"
    from latentq.stream import Checkpoint, CheckpointError

    if not os.path.isdir(path) or is_tiny_mla(path):
        return False, "not a local HF checkpoint directory" if not os.path.isdir(path) else "tiny-mla"

    def size(n: int) -> str:
        return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.2f} MiB"

    try:
        ck = Checkpoint(path)
    except CheckpointError as e:
        on_disk = weight_files_bytes(path)
        if on_disk > budget:
            raise ModelError(
                f"--model {path}: its weight files are {size(on_disk)}, over the memory budget {size(budget)}, "
                f"and it cannot stream layer by layer: {e}. Raise --memory-budget if the machine has the memory, "
                "or convert the checkpoint to safetensors"
            ) from None
        return False, f"not streamable ({e}); its weight files ({size(on_disk)}) fit the budget {size(budget)}"
    n = int(ck.config.get("num_hidden_layers") or 1 << 30)

    def mtp(name: str) -> bool:  # DeepSeek-V3's layer 61, DeepSeek-V4's mtp.K. blocks
        m = re.match(r"^.+\.layers\.(\d+)\.", name)
        return (m is not None and int(m.group(1)) >= n) or name.startswith("mtp.")

    need = ck.header_bytes(dtype, skip=mtp)
    if need > budget:
        return True, f"weights {size(need)} in {str(dtype).replace('torch.', '')} > budget {size(budget)}"
    return False, f"weights {size(need)} fit the budget {size(budget)}"


def weight_files_bytes(path: str) -> int:
    """Bytes of the checkpoint directory's weight files (weight_files): a lower bound of what loading it in
    memory takes (more when the compute dtype is wider than the stored one)."""
    return sum(os.path.getsize(f) for f in weight_files(path))


def device_error(device: str) -> str | None:
    """Why ``device`` (a --device value) cannot run the model here, or None: not a torch device string,
    a device type other than cpu / cuda, or cuda without CUDA available to torch."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        return f"--device {device}: not a torch device (expected cpu, cuda or cuda:N)"
    if dev.type not in ("cpu", "cuda"):
        return f"--device {device}: expected cpu, cuda or cuda:N"
    if dev.type == "cuda" and not torch.cuda.is_available():
        return f"--device {device}: CUDA is not available to torch here"
    return None


def stream_plan(mode: str, memory_budget: str | None, path: str, dtype: torch.dtype) -> tuple[bool, str, int]:
    """(stream?, why, budget in bytes) for --stream MODE and --memory-budget TEXT (None: the default,
    half the physical memory) on --model path: stream_decision, and the refusals both CLI steps share.
    Raises ModelError (a ValueError) for a budget parse_size refuses, or tiny-mla under --stream on."""
    from latentq.stream import default_memory_budget, parse_size

    try:
        budget = default_memory_budget() if memory_budget is None else parse_size(memory_budget)
    except ValueError as e:
        raise ModelError(f"--memory-budget: {e}") from None
    stream, why = stream_decision(mode, path, dtype, budget)
    if stream and is_tiny_mla(path):
        raise ModelError(f"--model {path}: tiny-mla is not streamed (it fits in memory); use --stream off or auto")
    return stream, why, budget
