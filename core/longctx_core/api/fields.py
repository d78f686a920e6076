"""Field rules several sections of the LongContextDeployment API share: image references,
argv words, powers of two."""

from __future__ import annotations

from longctx_core.api.schema import Rule

# A container image reference (registry/repository[:tag][@digest], the grammar of
# distribution/reference), written without backslashes so that CEL (RE2) and the offline
# check read the same pattern; the kubelet reports anything else as InvalidImageName only
# after the old pod is gone.
_HOST_PART = "[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_PATH_PART = "[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
IMAGE_PATTERN = (f"^(?:{_HOST_PART}(?:[.]{_HOST_PART})*(?::[0-9]+)?/)?{_PATH_PART}"
                 f"(?:/{_PATH_PART})*(?::[a-zA-Z0-9_][a-zA-Z0-9_.-]{{0,127}})?"
                 "(?:@[a-zA-Z][a-zA-Z0-9]*(?:[-_+.][a-zA-Z][a-zA-Z0-9]*)*:[a-fA-F0-9]{32,})?$")
MAX_IMAGE_LENGTH = 512


def image_rule(field: str, example: str) -> Rule:
    return Rule(f"self.matches('{IMAGE_PATTERN}')",
                f"{field} is not an image reference "
                "(registry/repository[:tag][@sha256:digest], lowercase repository, no spaces); "
                f"write it like {example}")


# A --model or --served-model-name value: one argv word that vLLM cannot read as a flag
# (no leading '-', no spaces or control characters).
ARGV_NAME_PATTERN = "^[A-Za-z0-9_./~][-A-Za-z0-9_./:@+~=]*$"


def argv_name_rule(field: str, flag: str) -> Rule:
    return Rule(f"self.matches('{ARGV_NAME_PATTERN}')",
                f"{field} is not one {flag} word: write a Hugging Face repo id "
                "(org/name) or a path, without spaces, control characters or a leading '-' "
                "(vLLM would read it as a flag)")


def power_of_two(field: str) -> Rule:
    """The integer field is 1, 2, 4, ... 512 (GPU counts of one node group)."""
    return Rule(f"self.{field} in [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]",
                f"{field} is {{self.{field}}}; it must be a power of two (1, 2, 4, ... 512)")
