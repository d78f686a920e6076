"""tests/figures.py: figures recorded to JSON, and the document tables generated from them."""

from __future__ import annotations

import json

import pytest

from tests import figure_tables, figures


@pytest.fixture
def docs(tmp_path, monkeypatch):
    """A docs/ of its own: every table's document with its markers, no figures yet."""
    monkeypatch.setattr(figures, "DOCS", tmp_path)
    monkeypatch.setattr(figures, "FIGURES_DIR", tmp_path / "figures")
    for doc in {t.doc for t in figure_tables.TABLES.values()}:
        names = [n for n, t in figure_tables.TABLES.items() if t.doc == doc]
        (tmp_path / doc).write_text("# Prose\n\n" + "".join(
            f"<!-- figures:{n} -->\n<!-- /figures:{n} -->\n\nmore prose\n" for n in names))
    figures.write_tables()
    return tmp_path


CHANGE = {"sent": 41, "failed": 0, "cut_off": 0, "longest_wait_s": 1.37, "seconds": 95,
          "events": ["RolloutStarted: Surge from a to b", "Removed: StatefulSet/x",
                     "RolloutDrained: held no request", "Removed: ConfigMap/y"],
          "conditions": ["Ready=True Serving: both | roles"]}


def test_a_table_without_figures_says_which_command_fills_it(docs):
    text = (docs / "data-path.md").read_text()
    assert f"No run recorded yet: {figure_tables.DAY_TWO} records " \
           "`docs/figures/traffic-rollouts.json`" in text
    assert not figures.stale()


def test_a_record_writes_the_json_and_regenerates_its_tables_at_once(docs):
    recorder = figures.Figures("traffic-rollouts", "traffic")
    recorder.record("Surge rollout", CHANGE)
    recorder.record("Surge rollout", {"by_revision": {"a": 1}})   # the same run adds
    cases = json.loads((docs / "figures" / "traffic-rollouts.json").read_text())
    assert cases["Surge rollout"]["sent"] == 41 and cases["Surge rollout"]["by_revision"]
    assert len(cases["Surge rollout"]["measured"]) == len("2026-12-04")
    text = (docs / "data-path.md").read_text()
    assert "| Surge rollout | 41 | 0 | 0 | 1.4 s | 95.0 s | `RolloutStarted`: Surge from a " \
           "to b<br>`Removed` x2: StatefulSet/x<br>`RolloutDrained`: held no request<br>" \
           "Ready=True Serving: both \\| roles |" in text
    assert not figures.stale()
    # A later run replaces the case's figures; the cases it did not reach keep theirs.
    figures.Figures("traffic-rollouts", "traffic").record("scale-down", {"sent": 10})
    later = figures.Figures("traffic-rollouts", "traffic")
    later.record("Surge rollout", {"sent": 12, "failed": 1, "events": []})
    cases = json.loads((docs / "figures" / "traffic-rollouts.json").read_text())
    assert cases["Surge rollout"]["sent"] == 12 and "by_revision" not in cases["Surge rollout"]
    assert cases["scale-down"] == {"measured": cases["scale-down"]["measured"], "sent": 10}
    assert "| Surge rollout | 12 | 1 | - | - | - | nothing |" in \
        (docs / "data-path.md").read_text()


def test_a_table_edited_by_hand_is_named_and_make_figures_restores_it(docs, capsys,
                                                                        monkeypatch):
    figures.Figures("traffic-rollouts", "traffic").record("Surge rollout", CHANGE)
    path = docs / "data-path.md"
    generated = path.read_text()
    path.write_text(generated.replace("| Surge rollout | 41 | 0 |", "| Surge rollout | 41 | 3 |"))
    assert figures.stale() == ["docs/data-path.md: figures:changes-and-faults"]
    monkeypatch.setattr("sys.argv", ["figures"])
    assert figures.main() == 1
    assert "figures:changes-and-faults differs from its JSON: run `make figures`" in \
        capsys.readouterr().out
    monkeypatch.setattr("sys.argv", ["figures", "--write"])
    assert figures.main() == 0 and path.read_text() == generated


def test_missing_or_unknown_markers_are_refused_naming_them(docs):
    text = (docs / "bench.md").read_text()
    with pytest.raises(AssertionError, match=r"docs/bench.md has no <!-- figures:bench -->"):
        figures.render("bench.md", text.replace("<!-- /figures:bench -->", ""))
    with pytest.raises(AssertionError, match=r"no table is generated for \['old-table'\]"):
        figures.render("bench.md", text + "<!-- figures:old-table -->\n")


def test_the_fault_and_bench_tables_read_what_their_modules_record(docs):
    faults = figures.Figures("data-path-faults", "faults")
    faults.record("decode lost mid-answer", {"error": "", "tokens": 60,
                                             "client_s_after_kill": 0.4, "back_s": 44})
    faults.record("side channel", {"error": "stream error: {'code': 500}", "tokens": 0,
                                   "client_s_after_stop": 5.0, "nixl_failed": 1.0,
                                   "served_again_s": 0.7, "failed_after_resume": 0})
    text = (docs / "data-path.md").read_text()
    assert "| decode lost mid-answer | 60 tokens, no error | 0.4 s | - | 44.0 s | - |" in text
    assert ("| side channel | stream error: {'code': 500} | 5.0 s | 1 | - | served again after "
            "0.7 s, 0 failed first |") in text
    point = {"concurrency": 4, "requests": 8, "failures": 0, "throughput_tok_s_per_gpu": 115.3,
             "interactivity_p90_tok_s_per_user": 0.19, "ttft_p50_s": 6.358,
             "ttft_p90_s": 11.009, "prefix_cache_hit_rate": 0.422, "nixl_bytes": 1.6e6,
             "predicted": None}
    figures.Figures("bench", "bench").record("sweep", {"points": [point]})
    assert "| 4 | 8 | 0 | 115.3 | 0.19 | 6.358 | 11.009 | 0.422 | 1.6 | - | - |" in \
        (docs / "bench.md").read_text()


def test_the_real_engine_and_control_plane_tables_label_each_figure(docs):
    figures.Figures("real-engines", "real-engines").record("a streamed request, by leg", {
        "ttft_s": 0.52, "total_s": 1.9, "kv_pull_s": 0.012, "kv_tokens": 602.0,
        "nixl_bytes": 1400832.0})
    assert ("| a streamed request, by leg | 1.9 s | TTFT 0.52 s; KV pull 0.012 s; prompt tokens "
            "over NIXL 602; NIXL bytes 1,400,832 |") in (docs / "data-path.md").read_text()
    figures.Figures("control-plane-faults", "control-plane").record(
        "admission denial", {"retry_delays_s": [2, 4], "converged_s": 1.8})
    assert "| admission denial | retry delays (s) 2, 4; converged after 1.8 s |" in \
        (docs / "reliability.md").read_text()


def test_every_generated_table_is_what_its_recorded_figures_give():
    """The tables between `<!-- figures:NAME -->` markers are what docs/figures/*.json
    generate (tests/figures.py): a table edited by hand, or figures recorded without their
    tables, fail here."""
    stale = figures.stale()
    assert not stale, f"generated tables that differ from their JSON: {stale}; run `make figures`"
