"""The decision log's roles: which versions are stable and canary (and at what share) after its records."""

from __future__ import annotations

from hugerec.continuous.decision_log import LiveRoles, Record, live_roles


def test_live_roles_follow_publish_promote_rollback_and_ignore_restore_and_unload() -> None:
    def publish(v: str, stable: str | None, **extra: object) -> Record:
        return Record(0, "publish", "", None, v, {"stable": stable, **extra})

    assert live_roles([], 0.1) == LiveRoles(None, None, None)
    log = [publish("w0", "w0"), publish("w1", "w0", share=0.25)]
    assert live_roles(log, 0.1) == LiveRoles("w0", "w1", 0.25)
    assert live_roles([publish("w0", "w0"), publish("w1", "w0")], 0.1) == LiveRoles("w0", "w1", 0.1)  # older logs
    log += [Record(1, "promote", "", None, "w1"), publish("w2", "w1", share=0.3)]
    assert live_roles(log, 0.1) == LiveRoles("w1", "w2", 0.3)
    log += [Record(2, "rollback", "", None, "w2"), Record(2, "unload", "", None, "w0")]
    log += [Record(2, "restore", "", None, "w1", {"role": "stable"})]
    assert live_roles(log, 0.1) == LiveRoles("w1", None, None)
    assert live_roles([Record(0, "publish", "offline", None, "w0")], 0.1) == LiveRoles("w0", None, None)
