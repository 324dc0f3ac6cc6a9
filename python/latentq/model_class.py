"""Which transformers class loads an HF checkpoint: its own (AutoConfig / AutoModelForCausalLM, remote code with
--trust-remote-code), or, for a config that names remote code in its ``auto_map`` but whose ``architectures[0]`` is
a class transformers ships (Kimi K2), that shipped class. latentq.model (in memory) and latentq.stream (layer by
layer) load through hf_config_and_class; latentq.dump records native_class_note."""

from __future__ import annotations

import json
import os


def _read_config(path: str) -> dict | None:
    """config.json of a local checkpoint directory, or None (no directory, no file, not JSON)."""
    try:
        with open(os.path.join(path, "config.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def native_class_note(path: str) -> str | None:
    """Why a remote-code checkpoint loads as a class transformers ships, or None.

    A config.json with an ``auto_map`` (the checkpoint's own modeling code) whose ``architectures[0]`` is a
    class transformers ships (Kimi K2: model_type ``kimi_k2``, architectures ``DeepseekV3ForCausalLM``) loads
    that class with its own config class: the same weights and module names, the checkpoint's code never run,
    with or without --trust-remote-code. The note is one line for the terminal and the dump's attribute
    ``model_class_note``."""
    cfg = _read_config(path)
    if not cfg or not isinstance(cfg.get("auto_map"), dict):
        return None
    arch = (cfg.get("architectures") or [None])[0]
    import transformers

    if not isinstance(arch, str) or not isinstance(getattr(transformers, arch, None), type):
        return None
    return (
        f"the config names the checkpoint's own code (auto_map, model_type {cfg.get('model_type')!r}) and "
        f"architectures[0] {arch}, a class transformers {transformers.__version__} ships: loading that class "
        "(the checkpoint's model code is not run)"
    )


def hf_config_and_class(path: str, trust_remote_code: bool):
    """(config, model class or None, note or None) of an HF checkpoint: the class transformers ships and its
    config class when native_class_note says so (note: that line), else AutoConfig (class None: the caller
    uses AutoModelForCausalLM). Raises what transformers raises for a config it cannot read (e.g. remote code
    without --trust-remote-code)."""
    from transformers import AutoConfig

    note = native_class_note(path)
    if note is None:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code), None, None
    import transformers
    from transformers.utils import logging as hf_logging

    cfg = _read_config(path)
    cls = getattr(transformers, cfg["architectures"][0])
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "model of type kimi_k2 to instantiate a model of type deepseek_v3": the note
    try:
        config = cls.config_class.from_pretrained(path)
    finally:
        hf_logging.set_verbosity(verbosity)
    return config, cls, note
