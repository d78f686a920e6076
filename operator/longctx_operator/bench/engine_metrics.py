"""The engines' Prometheus counters a benchmark reads before and after each concurrency.

A URL names one engine (`http://10.0.0.5:8000`) or a headless Service
(`http://tiny-decode.ns.svc:8000`): every address the name resolves to is scraped and the
counters are summed, so one URL covers every pod of a role.
"""

from __future__ import annotations

import socket
import urllib.parse
import urllib.request

# Our name -> (vLLM metric, label filter): exposition names of vLLM 0.32-0.33.
COUNTERS = {
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", ""),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", ""),
    "nixl_bytes": ("vllm:nixl_bytes_transferred_sum", ""),
    "nixl_transfers": ("vllm:nixl_bytes_transferred_count", ""),
    "external_kv_tokens": ("vllm:prompt_tokens_by_source_total",
                           'source="external_kv_transfer"'),
    "requests_done": ("vllm:request_success_total", ""),
    "prompt_tokens": ("vllm:prompt_tokens_total", ""),
    "generation_tokens": ("vllm:generation_tokens_total", ""),
}


def parse(text: str) -> dict[str, float]:
    """Sums of our counters in one Prometheus text page."""
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        name, _, labels = key.partition("{")
        for ours, (metric, label) in COUNTERS.items():
            if name == metric and label in labels:
                try:
                    out[ours] += float(value)
                except ValueError:
                    pass
    return out


def addresses(url: str) -> list[str]:
    """`url` once per address its host resolves to (a headless Service: each pod)."""
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port or 80
    try:
        found = sorted({info[4][0] for info in socket.getaddrinfo(host, port,
                                                                  proto=socket.IPPROTO_TCP)})
    except socket.gaierror as exc:
        raise ValueError(f"engine metrics URL {url}: {host} does not resolve ({exc})") from exc
    return [f"{parts.scheme}://{a if ':' not in a else f'[{a}]'}:{port}" for a in found]


def scrape(urls: list[str], timeout: float = 30) -> dict[str, float]:
    """The summed counters of every engine behind `urls` (each scraped at /metrics)."""
    total = dict.fromkeys(COUNTERS, 0.0)
    for url in urls:
        for address in addresses(url):
            with urllib.request.urlopen(f"{address}/metrics", timeout=timeout) as resp:
                for key, value in parse(resp.read().decode()).items():
                    total[key] += value
    return total


def by_role(engines: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    return {role: scrape(urls) for role, urls in engines.items()}
