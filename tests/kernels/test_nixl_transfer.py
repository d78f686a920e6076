"""A real NIXL transfer (two agents, UCX, host memory) in the normal suite."""

from longctx_kernels.nixl_check import INSTALL_HINT, nixl_two_agent_transfer


def test_nixl_is_importable():
    try:
        import nixl._api  # noqa: F401
    except ImportError as exc:  # no skip: a missing NIXL must turn the suite red
        raise AssertionError(f"nixl is not importable ({exc}); {INSTALL_HINT}") from exc


def test_host_memory_read_between_two_agents_is_bit_exact():
    result = nixl_two_agent_transfer(num_bytes=64 << 20, device="cpu", repeats=2)
    assert result.memory == "DRAM"
    assert result.bit_exact
    assert result.gbytes_per_s > 0
