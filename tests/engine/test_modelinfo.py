"""longctx_engine/modelinfo.py: the image's copy of vLLM's model-info cache goes where vLLM looks,
without touching what a pod's cache already holds."""

from __future__ import annotations

from longctx_engine import modelinfo


def test_the_cache_is_where_vllm_looks():
    assert modelinfo.cache_dir({"VLLM_CACHE_ROOT": "/c/v", "HOME": "/h"}) == \
        modelinfo.Path("/c/v/modelinfos")
    assert modelinfo.cache_dir({"XDG_CACHE_HOME": "/x", "HOME": "/h"}) == \
        modelinfo.Path("/x/vllm/modelinfos")
    assert modelinfo.cache_dir({"HOME": "/home/longctx"}) == \
        modelinfo.Path("/home/longctx/.cache/vllm/modelinfos")


def test_seed_copies_what_is_missing_and_keeps_the_rest(tmp_path):
    source = tmp_path / "image"
    source.mkdir()
    (source / "a.json").write_text('{"from": "image"}')
    (source / "b.json").write_text('{"from": "image"}')
    env = {"HOME": str(tmp_path / "home")}
    target = modelinfo.cache_dir(env)
    target.mkdir(parents=True)
    (target / "b.json").write_text('{"from": "pod"}')
    assert modelinfo.seed(env, source) == ["a.json"]
    assert (target / "a.json").read_text() == '{"from": "image"}'
    assert (target / "b.json").read_text() == '{"from": "pod"}'
    assert modelinfo.seed(env, source) == []
    assert modelinfo.seed(env, tmp_path / "none") == []
