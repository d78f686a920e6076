"""One loopback Prometheus per session, loaded with the simulated series."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.observability import series
from tests.observability.prom import Prometheus


@pytest.fixture(scope="session")
def prometheus() -> Iterator[Prometheus]:
    with Prometheus(series.openmetrics()) as prom:
        yield prom
