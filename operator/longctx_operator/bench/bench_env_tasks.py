"""What runs inside the benchmark environment (tools/bench-env.sh), never in `longctx`'s own
process: the PNG (matplotlib) and the validation of each llm-d report (llmd-benchmark-report).

    python -m longctx_operator.bench.bench_env_tasks plot REPORT.json OUT.png [REPORT_B.json]
    python -m longctx_operator.bench.bench_env_tasks validate REPORT.json
"""

from __future__ import annotations

import json
import sys
from typing import Any


def validate(report: dict[str, Any]) -> list[str]:
    """Each concurrency's llm-d document against BenchmarkReportV02; the problems found."""
    from llmd_benchmark_report import BenchmarkReportV02
    from pydantic import ValidationError

    problems = []
    for point in report["points"]:
        doc = point.get("llmd_benchmark_report")
        if doc is None:
            problems.append(f"concurrency {point['concurrency']}: no llm-d report "
                            "(the tool recorded no request)")
            continue
        try:
            BenchmarkReportV02.model_validate(doc)
        except ValidationError as exc:
            problems.append(f"concurrency {point['concurrency']}: {exc}")
    return problems


def plot(reports: list[dict[str, Any]], path: str) -> None:
    """The seed's Figure 5: throughput per GPU (logical, cached input counted) against P90
    interactivity, one point per concurrency, a line through them; `longctx plan`'s
    prediction for the same workload as hollow markers, joined to its measured point."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=100)
    for i, report in enumerate(reports):
        color = f"C{i}"
        label = report["target"]["label"]
        points = [p for p in report["points"] if "throughput_tok_s_per_gpu" in p]
        xs = [p["interactivity_p90_tok_s_per_user"] for p in points]
        ys = [p["throughput_tok_s_per_gpu"] for p in points]
        ax.plot(xs, ys, "o-", color=color, label=f"{label} (measured)")
        for p, x, y in zip(points, xs, ys):
            ax.annotate(f"c={p['concurrency']}", (x, y), textcoords="offset points",
                        xytext=(4, 4), fontsize=8)
            pred = p.get("predicted") or {}
            if "throughput_tok_s_per_gpu" in pred:
                px, py = pred["interactivity_tok_s_per_user"], pred["throughput_tok_s_per_gpu"]
                ax.plot([px], [py], "o", mfc="none", color=color)
                ax.plot([x, px], [y, py], ":", color=color, linewidth=0.8)
        if any((p.get("predicted") or {}).get("throughput_tok_s_per_gpu") for p in points):
            ax.plot([], [], "o", mfc="none", color=color, label=f"{label} (longctx plan)")
    unit = "GPU"
    ax.set_xlabel("P90 interactivity (output tok/s/user, E2E-normalized)")
    ax.set_ylabel(f"throughput (tok/s/{unit}, input incl. cached + output)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "plot":
        reports = [json.loads(open(p).read()) for p in [argv[1]] + argv[3:]]
        plot(reports, argv[2])
        return 0
    if len(argv) == 2 and argv[0] == "validate":
        problems = validate(json.loads(open(argv[1]).read()))
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
