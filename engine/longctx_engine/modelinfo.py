"""vLLM's model-info cache, carried by the engine image.

Before vLLM loads a model it inspects the model's class in a fresh Python process, which
imports torch and vLLM once more (30-50 s on a busy 2-core node), unless its cache
(`$VLLM_CACHE_ROOT/modelinfos`, one JSON file per class, keyed by a hash of the class's
source) holds the answer. An engine pod's cache folder is an emptyDir, empty in every new
pod, so the image carries the answers for the architectures it serves, written when it is
built:

    python -m longctx_engine.modelinfo [ARCHITECTURE ...]

and the entrypoint copies them in before it starts vLLM (`seed`). A copy made for another
vLLM build does not match its hash, and vLLM inspects the class as before. Stdlib only
until `write` runs, which imports vLLM.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

# The image's copy: beside the Python environment the entrypoint runs in.
SEED_DIR = Path(sys.prefix) / "share" / "longctx" / "vllm-modelinfos"
# What longctx serves: the presets' and the test models' classes (vLLM's registry names).
ARCHITECTURES = ("GlmMoeDsaForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV2ForCausalLM",
                 "LlamaForCausalLM")


def cache_dir(env: Mapping[str, str]) -> Path:
    """Where vLLM looks (vllm/envs.py: VLLM_CACHE_ROOT, else $XDG_CACHE_HOME/vllm, else
    ~/.cache/vllm)."""
    root = env.get("VLLM_CACHE_ROOT") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or "~", ".cache"), "vllm")
    return Path(os.path.expanduser(root)) / "modelinfos"


def seed(env: Mapping[str, str], source: Path = SEED_DIR) -> list[str]:
    """Copies the image's answers into vLLM's cache, keeping any already there; the names
    copied. Nothing to copy (an image built without them) is not an error."""
    if not source.is_dir():
        return []
    target = cache_dir(env)
    copied = []
    for path in sorted(source.glob("*.json")):
        if not (target / path.name).exists():
            target.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target / path.name)
            copied.append(path.name)
    return copied


def write(architectures: Sequence[str], dest: Path = SEED_DIR) -> list[str]:
    """Inspects each architecture as vLLM does and keeps the answers in `dest` (at image
    build time; imports vLLM). An architecture this vLLM build lacks is skipped."""
    with tempfile.TemporaryDirectory() as root:
        os.environ["VLLM_CACHE_ROOT"] = root
        from vllm.model_executor.models.registry import ModelRegistry  # the build's vLLM
        known = [a for a in architectures if a in ModelRegistry.models]
        for arch in known:
            ModelRegistry.models[arch].inspect_model_cls()
        dest.mkdir(parents=True, exist_ok=True)
        written = []
        for path in sorted((Path(root) / "modelinfos").glob("*.json")):
            shutil.copyfile(path, dest / path.name)
            written.append(path.name)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("architectures", nargs="*", default=list(ARCHITECTURES))
    parser.add_argument("--dest", type=Path, default=SEED_DIR)
    args = parser.parse_args(argv)
    written = write(args.architectures, args.dest)
    print(f"{args.dest}: {', '.join(written) or 'nothing'}")
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
