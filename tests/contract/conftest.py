"""The real vLLM 0.33.0 (CPU build of the wheel, no GPU), imported once per session."""

from __future__ import annotations

import os
import types

import pytest

VLLM_VERSION = "0.33.0"
INSTALL_HINT = (
    "the contract tests need the real vLLM {v} in this Python environment. Create it with "
    "`tools/python-env.sh` (prints the venv path; run pytest with that venv's python), or "
    "`pip install vllm=={v}` (CPU is enough; VLLM_TARGET_DEVICE=cpu is set by the tests)."
)


@pytest.fixture(scope="session")
def vllm():
    """vLLM's parser, validators and config classes. Fails (never skips) without vLLM."""
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"   # before the first vllm import
    try:
        import vllm as _vllm
        from vllm.config import (AttentionConfig, KVTransferConfig, ParallelConfig,
                                 SpeculativeConfig)
        from vllm.config.kv_transfer import hisparse_host_pool_gib
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
        from vllm.entrypoints.launchers import dp_supervisor
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError as e:  # pragma: no cover - depends on the environment
        pytest.fail(f"cannot import vllm ({e}): " + INSTALL_HINT.format(v=VLLM_VERSION),
                    pytrace=False)
    if _vllm.__version__.split("+")[0] != VLLM_VERSION:
        pytest.fail(f"vllm {_vllm.__version__} is installed, the contract is {VLLM_VERSION}: "
                    + INSTALL_HINT.format(v=VLLM_VERSION), pytrace=False)
    parser = make_arg_parser(FlexibleArgumentParser())
    return types.SimpleNamespace(
        version=_vllm.__version__, parser=parser, make_parser=lambda: make_arg_parser(
            FlexibleArgumentParser()),
        validate_parsed_serve_args=validate_parsed_serve_args, AsyncEngineArgs=AsyncEngineArgs,
        ParallelConfig=ParallelConfig, KVTransferConfig=KVTransferConfig,
        AttentionConfig=AttentionConfig, SpeculativeConfig=SpeculativeConfig,
        hisparse_host_pool_gib=hisparse_host_pool_gib, KVConnectorFactory=KVConnectorFactory,
        dp_supervisor=dp_supervisor)
