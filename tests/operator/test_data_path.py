"""Data-path faults from what the operator reads: engine restarts in pod status, NIXL fault
counters that grew; the condition and the Events they make."""

from __future__ import annotations

import datetime

from longctx_operator.controller import data_path

NOW = datetime.datetime(2026, 12, 4, 12, 0, 0, tzinfo=datetime.timezone.utc)


def pod(role: str, restarts: int, finished: str | None, uid: str = "u1") -> dict:
    status = {"name": "engine", "restartCount": restarts}
    if finished:
        status["lastState"] = {"terminated": {"reason": "Error", "exitCode": 137,
                                              "finishedAt": finished}}
    return {"metadata": {"name": f"d-{role}-0", "uid": uid,
                         "labels": {"app.kubernetes.io/component": role}},
            "status": {"containerStatuses": [status]}}


def test_a_restarted_decode_engine_says_what_clients_saw():
    (fault,) = data_path.restarted([pod("decode", 1, "2026-12-04T11:59:30Z")], NOW, "fail")
    assert fault.reason == "EngineRestarted" and fault.pod == "d-decode-0"
    assert "exit code 137" in fault.message and "without an error event" in fault.message


def test_a_restart_long_ago_or_none_is_no_fault():
    assert data_path.restarted([pod("decode", 1, "2026-12-04T11:00:00Z"),
                                pod("prefill", 0, None)], NOW, "fail") == []


def test_a_prefill_restart_under_recompute_says_decode_recomputes():
    (fault,) = data_path.restarted([pod("prefill", 2, "2026-12-04T11:59:59Z")], NOW,
                                   "recompute")
    assert "recomputed on decode" in fault.message


def test_counter_growth_names_the_metric_and_the_pod():
    growth = data_path.Growth("d-decode-0", "decode", "vllm:nixl_num_failed_transfers_total",
                              1.0, NOW)
    fault = growth.fault("fail")
    assert fault.reason == "KVTransferFailed"
    assert "vllm:nixl_num_failed_transfers_total +1" in fault.message
    assert "error event" in fault.message


def test_the_condition_holds_then_clears():
    growth = data_path.Growth("p", "decode", "vllm:nixl_num_kv_expired_reqs_total", 2, NOW)
    cond, clears_in = data_path.condition([growth.fault("fail")], NOW)
    assert cond["status"] == "False" and cond["reason"] == "KVLeaseExpired"
    assert clears_in == data_path.FAULT_HOLD_SECONDS + 1
    cond, clears_in = data_path.condition([], NOW)
    assert cond["status"] == "True" and clears_in is None


def test_each_fault_is_reported_once_and_old_growth_forgotten():
    recorded = data_path.Recorded()
    key = ("ns", "cr")
    growth = data_path.Growth("p", "decode", "vllm:nixl_num_failed_transfers_total", 1, NOW)
    recorded.add(key, growth)
    faults = [g.fault("fail") for g in recorded.recent(key, NOW)]
    assert len(recorded.unreported(key, faults)) == 1
    assert recorded.unreported(key, faults) == []
    later = NOW + datetime.timedelta(seconds=data_path.FAULT_HOLD_SECONDS + 1)
    assert recorded.recent(key, later) == []


def test_an_engine_that_just_died_is_reported_once_across_its_restart():
    dead = pod("decode", 0, None)
    dead["status"]["containerStatuses"][0]["state"] = {"terminated": {
        "reason": "Error", "exitCode": 137, "finishedAt": "2026-12-04T11:59:50Z"}}
    back = pod("decode", 1, "2026-12-04T11:59:50Z")
    (first,) = data_path.restarted([dead], NOW, "fail")
    (second,) = data_path.restarted([back], NOW, "fail")
    assert first.key == second.key


def test_a_pod_being_deleted_is_no_fault():
    leaving = pod("decode", 1, "2026-12-04T11:59:50Z")
    leaving["metadata"]["deletionTimestamp"] = "2026-12-04T11:59:49Z"
    assert data_path.restarted([leaving], NOW, "fail") == []


def test_each_counter_fault_says_what_its_counter_counts():
    """As the chart's alerts say: an expired lease is KV no decode read (no wrong token);
    a read after expiry is the one that may build an answer on freed KV."""
    expired = data_path.Growth("p-0", "prefill", "vllm:nixl_num_kv_expired_reqs_total", 1,
                               NOW).fault("fail")
    assert "not read by any decode engine within the KV lease" in expired.message
    assert "may be wrong" not in expired.message and "another request" not in expired.message
    late = data_path.Growth("p-0", "prefill", "vllm:nixl_num_notifications_after_expiry_total",
                            1, NOW).fault("fail")
    assert late.reason == "KVReadAfterExpiry" and "another request's KV" in late.message


def test_a_failed_notification_counted_in_both_counters_is_one_fault():
    before = dict.fromkeys(data_path.FAILURE_COUNTERS, 0.0)
    after = {**before, "vllm:nixl_num_failed_transfers_total": 3.0,
             "vllm:nixl_num_failed_notifications_total": 1.0}
    grew = {g.metric: g.grew_by for g in data_path.growths("d-0", "decode", before, after, NOW)}
    assert grew == {"vllm:nixl_num_failed_transfers_total": 2.0,
                    "vllm:nixl_num_failed_notifications_total": 1.0}


def test_a_standing_fault_holds_the_condition_with_no_timer():
    missing = data_path.MissingSeries("d-0", "u", 8000, "vllm:num_requests_running", NOW)
    passing = data_path.Growth("d-0", "decode", "vllm:nixl_num_failed_transfers_total", 1,
                               NOW).fault("fail")
    cond, clears_in = data_path.condition([missing.fault()], NOW)
    assert cond["reason"] == "MissingSeries" and clears_in is None
    assert "the requests it holds" in cond["message"]
    _, clears_in = data_path.condition([missing.fault(), passing], NOW)
    assert clears_in == data_path.FAULT_HOLD_SECONDS + 1
