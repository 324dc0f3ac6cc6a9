"""Progress of a long step (the dump, the e2e runs): counts, elapsed time and an ETA; and the one form of
a step's errors, warnings and notes (``say``).

On a terminal it is a tqdm bar; otherwise (CI, Slurm, the pipe through which ``latentq run`` relays its
Python steps) one line about every ``interval`` seconds and one at the end (none for a step shorter than
``interval``), so a log shows the step is alive without a line per item. The environment chooses too:
  LATENTQ_PROGRESS           ``bar``, ``lines`` or ``off`` (default: ``bar`` when the stream is a terminal,
                             else ``lines``); ``latentq`` sets ``bar`` for its child when it runs on a terminal
  LATENTQ_PROGRESS_INTERVAL  seconds between lines (default 10; 0: a line per item)
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def message(step: str, kind: str, text: str) -> str:
    """``latentq <step>: <kind>: <text>``: how every Python step (dump, e2e, report, findings, thresholds,
    stream, model) words an error, a warning or a note (kind: "error", "warning" or "note"), as the C++
    CLI words its own ("latentq: error: ...")."""
    assert kind in ("error", "warning", "note"), kind
    return f"latentq {step}: {kind}: {text}"


def say(step: str, kind: str, text: str) -> None:
    """``message(step, kind, text)`` as one line on stderr, flushed (a parent relaying the step's stderr
    shows it at once)."""
    print(message(step, kind, text), file=sys.stderr, flush=True)


class StepParser(argparse.ArgumentParser):
    """The command line of a step: a usage error reads ``latentq <step>: error: ...`` (exit 2), as the step's
    own errors do. The description is printed as written (RawDescriptionHelpFormatter)."""

    def __init__(self, step: str, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(**kwargs)
        self.step = step

    def error(self, msg: str):
        self.print_usage(sys.stderr)
        self.exit(2, message(self.step, "error", msg) + "\n")


class Progress:
    """``Progress(total, desc, unit)``; ``update(n)`` after each item, ``write(line)`` for a line of the
    step's own output (printed above a bar), ``close()`` at the end (also as a context manager, which
    prints no last line when the block raises).
    total: the item count (>= 0); desc: the step's name, the start of every line ("e2e"); unit: the items'
    name ("runs"). Lines read ``e2e: 12/71 runs, 35 s, ETA 170 s`` (the ETA: elapsed / done x left)."""

    def __init__(self, total: int, desc: str, unit: str, stream=None, mode: str | None = None, interval=None):
        self.total, self.desc, self.unit = int(total), desc, unit
        self.stream = stream if stream is not None else sys.stderr
        mode = mode or os.environ.get("LATENTQ_PROGRESS") or ("bar" if _isatty(self.stream) else "lines")
        if mode not in ("bar", "lines", "off"):
            raise ValueError(f"LATENTQ_PROGRESS={mode!r}: expected bar, lines or off")
        self.mode = mode
        if interval is None:
            interval = float(os.environ.get("LATENTQ_PROGRESS_INTERVAL", "10"))
        self.interval = float(interval)
        self.done = 0
        self.t0 = self.last = time.monotonic()
        self.bar = None
        if mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, desc=desc, unit=f" {unit}", file=self.stream, dynamic_ncols=True)

    def line(self) -> str:
        """The current progress line (what the lines mode prints)."""
        el = time.monotonic() - self.t0
        left = self.total - self.done
        eta = f", ETA {el / self.done * left:.0f} s" if self.done and left > 0 else ""
        return f"{self.desc}: {self.done}/{self.total} {self.unit}, {el:.0f} s{eta}"

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.mode == "lines":
            now = time.monotonic()
            if now - self.last >= self.interval and self.done < self.total:
                self.last = now
                print(self.line(), file=self.stream, flush=True)

    def write(self, text: str) -> None:
        """A line of the step's own output, on stdout (above the bar on a terminal)."""
        if self.bar is not None:
            self.bar.write(text, file=sys.stdout)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.mode == "lines" and time.monotonic() - self.t0 >= self.interval:  # a short step stays quiet
            print(self.line() + " (done)" if self.done >= self.total else self.line(), file=self.stream, flush=True)
        self.mode = "off"

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is not None and self.bar is None:
            self.mode = "off"  # a failing step: its error line is the last word, not a progress line
        self.close()


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# Loggers of libraries imported on the way (transformers' FP8 integration imports torchao) that print at
# import time: torchao warns once per prebuilt extension it cannot load ("Failed to load ..._C_*.so": CUDA
# builds, unused on this path), torch's pytree warns once per Enum class torchao registers. Neither is about
# the step's own work; errors still show.
IMPORT_NOISE_LOGGERS = ("torchao", "torch.utils._pytree")


def quiet_import_noise() -> None:
    """Raise the loggers of IMPORT_NOISE_LOGGERS to ERROR (the command-line steps call it first)."""
    import logging

    for name in IMPORT_NOISE_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
