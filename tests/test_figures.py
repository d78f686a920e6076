"""tests/figures.py: figures recorded to JSON, and the document tables generated from them."""

from __future__ import annotations

import json

import pytest

from tests import figure_tables, figures


@pytest.fixture
def docs(tmp_path, monkeypatch):
    """A docs/ of its own: every table's document with its markers, no figures yet, and a
    folder of runs of its own."""
    monkeypatch.setattr(figures, "DOCS", tmp_path)
    monkeypatch.setattr(figures, "FIGURES_DIR", tmp_path / "figures")
    monkeypatch.setattr(figures, "RUNS", tmp_path / "runs")
    monkeypatch.delenv(figures.RUN_ENV, raising=False)
    for doc in {t.doc for t in figure_tables.TABLES.values()}:
        names = [n for n, t in figure_tables.TABLES.items() if t.doc == doc]
        (tmp_path / doc).write_text("# Prose\n\n" + "".join(
            f"<!-- figures:{n} -->\n<!-- /figures:{n} -->\n\nmore prose\n" for n in names))
    figures.write_tables()
    return tmp_path


def make_figures(monkeypatch, run=None) -> None:
    """`make figures` (RUN=run): this run's figures into docs/figures, then the tables."""
    monkeypatch.delenv(figures.RUN_ENV, raising=False)
    assert figures.main(["--write", *([str(run)] if run else [])]) == 0


CHANGE = {"sent": 41, "failed": 0, "cut_off": 0, "longest_wait_s": 1.37, "seconds": 95,
          "events": ["RolloutStarted: Surge from a to b", "Removed: StatefulSet/x",
                     "RolloutDrained: held no request", "Removed: ConfigMap/y"],
          "conditions": ["Ready=True Serving: both | roles"]}


def test_a_table_without_figures_says_which_command_fills_it(docs):
    text = (docs / "data-path.md").read_text()
    assert f"No run recorded yet: {figure_tables.DAY_TWO} records " \
           "`docs/figures/traffic-rollouts.json`" in text
    assert not figures.stale()


def test_a_record_goes_beside_the_tree_and_make_figures_puts_it_into_the_docs(docs,
                                                                               monkeypatch):
    before = (docs / "data-path.md").read_text()
    recorder = figures.Figures("traffic-rollouts", "traffic")
    recorder.record("Surge rollout", CHANGE)
    recorder.record("Surge rollout", {"by_revision": {"a": 1}})   # the same run adds
    run = figures.this_run()
    assert run.parent == docs / "runs" and figures.source()["commit"][:10] in run.name
    assert not (docs / "figures").exists() and (docs / "data-path.md").read_text() == before
    cases = json.loads((run / "traffic-rollouts.json").read_text())
    assert cases["Surge rollout"]["sent"] == 41 and cases["Surge rollout"]["by_revision"]
    assert len(cases["Surge rollout"]["measured"]) == len("2026-12-04")
    assert cases["Surge rollout"]["commit"] == figures.source()["commit"]
    assert len(cases["Surge rollout"]["commit"]) == 40
    assert isinstance(cases["Surge rollout"]["dirty"], bool)

    make_figures(monkeypatch)   # the latest run
    text = (docs / "data-path.md").read_text()
    assert "| Surge rollout | 41 | 0 | 0 | 1.4 s | 95.0 s | `RolloutStarted`: Surge from a " \
           "to b<br>`Removed` x2: StatefulSet/x<br>`RolloutDrained`: held no request<br>" \
           "Ready=True Serving: both \\| roles |" in text
    assert f"at commit {figures.source()['commit'][:10]}" in text
    assert not figures.stale()


def test_a_later_runs_figures_replace_the_earlier_runs_whole(docs, monkeypatch):
    figures.Figures("traffic-rollouts", "traffic").record("node drain (loop-1)", {"sent": 10})
    figures.Figures("traffic-rollouts", "traffic").record("Surge rollout", CHANGE)
    first = figures.this_run()
    make_figures(monkeypatch, first)
    later = figures.Figures("traffic-rollouts", "traffic")
    later.record("Surge rollout", {"sent": 12, "failed": 1, "events": []})
    later.record("node drain (loop-0)", {"sent": 11})
    second = figures.this_run()
    assert second != first
    make_figures(monkeypatch, second)
    cases = json.loads((docs / "figures" / "traffic-rollouts.json").read_text())
    assert list(cases) == ["Surge rollout", "node drain (loop-0)"], cases
    assert cases["Surge rollout"]["sent"] == 12 and "cut_off" not in cases["Surge rollout"]
    text = (docs / "data-path.md").read_text()
    assert "| Surge rollout | 12 | 1 | - | - | - | nothing |" in text and "loop-1" not in text
    # Figures of other names, recorded by other runs, stay as they were.
    figures.Figures("real-engines", "real-engines").record("CR applied to Ready", {"seconds": 9})
    make_figures(monkeypatch, figures.this_run())
    assert json.loads((docs / "figures" / "traffic-rollouts.json").read_text()) == cases


def test_make_figures_without_a_run_regenerates_the_tables_from_the_committed_json(
        docs, monkeypatch, capsys):
    (docs / "figures").mkdir()
    (docs / "figures" / "real-engines.json").write_text(json.dumps(
        {"CR applied to Ready": {"measured": "2026-12-01", "seconds": 74}}))
    make_figures(monkeypatch)
    assert "no run recorded" in capsys.readouterr().out
    assert "| CR applied to Ready | 74.0 s | - |" in (docs / "data-path.md").read_text()
    with pytest.raises(SystemExit, match="no such run folder"):
        figures.main(["--write", str(docs / "runs" / "none")])


def test_a_table_edited_by_hand_is_named_and_make_figures_restores_it(docs, capsys,
                                                                        monkeypatch):
    figures.Figures("traffic-rollouts", "traffic").record("Surge rollout", CHANGE)
    make_figures(monkeypatch, figures.this_run())
    path = docs / "data-path.md"
    generated = path.read_text()
    path.write_text(generated.replace("| Surge rollout | 41 | 0 |", "| Surge rollout | 41 | 3 |"))
    assert figures.stale() == ["docs/data-path.md: figures:changes-and-faults"]
    assert figures.main([]) == 1
    assert "figures:changes-and-faults differs from its JSON: run `make figures`" in \
        capsys.readouterr().out
    make_figures(monkeypatch)
    assert path.read_text() == generated


def test_missing_or_unknown_markers_are_refused_naming_them(docs):
    text = (docs / "bench.md").read_text()
    with pytest.raises(AssertionError, match=r"docs/bench.md has no <!-- figures:bench -->"):
        figures.render("bench.md", text.replace("<!-- /figures:bench -->", ""))
    with pytest.raises(AssertionError, match=r"no table is generated for \['old-table'\]"):
        figures.render("bench.md", text + "<!-- figures:old-table -->\n")


def test_the_fault_and_bench_tables_read_what_their_modules_record(docs, monkeypatch):
    faults = figures.Figures("data-path-faults", "faults")
    faults.record("decode lost mid-answer", {"error": "", "tokens": 60,
                                             "client_s_after_kill": 0.4, "back_s": 44})
    faults.record("side channel", {"error": "stream error: {'code': 500}", "tokens": 0,
                                   "client_s_after_stop": 5.0, "nixl_failed": 1.0,
                                   "served_again_s": 0.7, "failed_after_resume": 0})
    faults.record("two decodes", {"tokens": 768, "equal_to_no_fault": 2, "continued": 2.0,
                                  "pause_s": 0.8, "other_decode_nixl_tokens": 300.0,
                                  "other_decode_computed_tokens": 0.0,
                                  "closest_greedy_choice": 0.0312,
                                  "differed": [{"token": 40, "margin": 0.0156}]})
    make_figures(monkeypatch, figures.this_run())
    text = (docs / "data-path.md").read_text()
    assert "| decode lost mid-answer | 60 tokens, no error | 0.4 s | - | 44.0 s | - |" in text
    assert ("| two decodes | 768 tokens, no error | - | - | - | 2 equal to their no-fault "
            "answer, 2 continued, pausing 0.8 s on average, finished by the other decode, "
            "which read 300 prompt tokens over NIXL and computed 0, recomputing the prefix "
            "flipped token 40 (logit margin 0.016) |") in text
    assert ("| side channel | stream error: {'code': 500} | 5.0 s | 1 | - | served again after "
            "0.7 s, 0 failed first |") in text
    point = {"concurrency": 4, "requests": 8, "failures": 0, "throughput_tok_s_per_gpu": 115.3,
             "interactivity_p90_tok_s_per_user": 0.19, "ttft_p50_s": 6.358,
             "ttft_p90_s": 11.009, "prefix_cache_hit_rate": 0.422, "nixl_bytes": 1.6e6,
             "predicted": None}
    figures.Figures("bench", "bench").record("sweep", {"points": [point]})
    make_figures(monkeypatch, figures.this_run())
    assert "| 4 | 8 | 0 | 115.3 | 0.19 | 6.358 | 11.009 | 0.422 | 1.6 | - | - |" in \
        (docs / "bench.md").read_text()


def test_the_real_engine_and_control_plane_tables_label_each_figure(docs, monkeypatch):
    figures.Figures("real-engines", "real-engines").record("a streamed request, by leg", {
        "ttft_s": 0.52, "total_s": 1.9, "kv_pull_s": 0.012, "kv_tokens": 602.0,
        "nixl_bytes": 1400832.0})
    run = figures.this_run()
    make_figures(monkeypatch, run)
    assert ("| a streamed request, by leg | 1.9 s | TTFT 0.52 s; KV pull 0.012 s; prompt tokens "
            "over NIXL 602; NIXL bytes 1,400,832 |") in (docs / "data-path.md").read_text()
    figures.Figures("control-plane-faults", "control-plane").record(
        "admission denial", {"retry_delays_s": [2, 4], "converged_s": 1.8})
    assert figures.this_run() != run
    make_figures(monkeypatch, figures.this_run())
    assert "| admission denial | retry delays (s) 2, 4; converged after 1.8 s |" in \
        (docs / "reliability.md").read_text()


def test_every_generated_table_is_what_its_recorded_figures_give():
    """The tables between `<!-- figures:NAME -->` markers are what docs/figures/*.json
    generate (tests/figures.py): a table edited by hand, or figures recorded without their
    tables, fail here."""
    stale = figures.stale()
    assert not stale, f"generated tables that differ from their JSON: {stale}; run `make figures`"
