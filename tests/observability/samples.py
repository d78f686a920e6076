"""Metrics pages recorded from real engines, and promtool input series made from them.

`record(name, url)` saves an engine's /metrics page as `samples/<name>.prom`; the fault tests
and `python -m tests.observability.record_samples` call it before and after each fault.
`load(name)` parses a page back into its series, and `input_series` turns a before page and
an after page into promtool `input_series` (the before values, the scrapes that failed while
the engine was down, then the after values), labelled as the PodMonitor labels the target.
"""

from __future__ import annotations

import ipaddress
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

SAMPLES = Path(__file__).with_name("samples")
NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
# The pod network of the loopback nodes (tests/cluster/pod_network.py) and loopback itself:
# nothing else is ever scraped.
ALLOWED_NETWORKS = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("198.18.0.0/15"))


def path_of(name: str) -> Path:
    if not NAME.fullmatch(name):
        raise ValueError(f"sample name {name!r}: use lowercase letters, digits and '-' "
                         "(it becomes the file name samples/<name>.prom)")
    return SAMPLES / f"{name}.prom"


def record(name: str, url: str, timeout: float = 30) -> Path:
    """Saves the Prometheus text page at `url` (an engine's /metrics) as samples/<name>.prom.
    A read that fails raises, naming the URL: a missing page is never an empty sample."""
    path = path_of(name)
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        local = any(ipaddress.ip_address(host) in net for net in ALLOWED_NETWORKS)
    except ValueError:
        local = False
    if not local:
        raise ValueError(f"{url}: only loopback and the harness's pod network "
                         f"({', '.join(map(str, ALLOWED_NETWORKS))}) are scraped")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text = resp.read().decode()
    except (OSError, urllib.error.URLError) as exc:
        raise AssertionError(f"recording {name}: reading {url} failed: {exc}") from exc
    if not load_text(text):
        raise AssertionError(f"recording {name}: {url} returned no samples:\n{text[:500]}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def load_text(text: str) -> dict[str, float]:
    """A Prometheus text page as {'name{label="v",...}': value}, labels sorted by name."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[series_key(sample.name, sample.labels)] = sample.value
    return out


def load(name: str) -> dict[str, float]:
    path = path_of(name)
    if not path.is_file():
        raise AssertionError(f"{path} is missing: record it with "
                             "`python -m tests.observability.record_samples`")
    return load_text(path.read_text())


def series_key(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{escape(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metric_names(series: dict[str, float]) -> set[str]:
    return {key.partition("{")[0] for key in series}


def with_labels(key: str, extra: dict[str, str]) -> str:
    """A series key with the target labels a PodMonitor adds (they win over the page's)."""
    name, _, rest = key.partition("{")
    pairs = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', rest))
    pairs.update({k: escape(v) for k, v in extra.items()})
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(pairs.items())) + "}"


def number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return repr(float(value)) if value != int(value) else str(int(value))


def input_series(before: dict[str, float], after: dict[str, float], labels: dict[str, str],
                 before_minutes: int, down_minutes: int, after_minutes: int) -> list[dict]:
    """promtool input series at a 1-minute interval: `before_minutes` scrapes of the before
    page, `down_minutes` failed scrapes (the engine restarting), then `after_minutes` scrapes
    of the after page. A series absent from a scrape is missing there ('_'), and marked
    stale first if the previous scrape had it, as Prometheus does: a metric that does not
    exist is absent, never zero."""
    out = []
    for key in sorted(set(before) | set(after)):
        parts, present = [], False
        for page, minutes in ((before, before_minutes), ({}, down_minutes),
                              (after, after_minutes)):
            if not minutes:
                continue
            value = page.get(key)
            # promtool's notation: `vxN` is N+1 samples of v, `_xN` N missing samples.
            if value is not None:
                parts.append(f"{number(value)}x{minutes - 1}")
            elif present:
                parts.append("stale" + (f" _x{minutes - 1}" if minutes > 1 else ""))
            else:
                parts.append(f"_x{minutes}")
            present = value is not None
        out.append({"series": with_labels(key, labels), "values": " ".join(parts)})
    return out
