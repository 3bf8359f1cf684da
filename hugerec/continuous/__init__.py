"""Continuous training in production: the loop over time windows (loop.py), its validation gate (gate.py),
decision log (decision_log.py), publisher (publish.py), monitor (monitor.py, observer.py) and decisions
(decisions.py). Import names from the module that defines them."""

from hugerec.continuous.decision_log import Record, read_log
from hugerec.continuous.decisions import DecisionConfig
from hugerec.continuous.gate import GateConfig
from hugerec.continuous.loop import Loop, LoopConfig, ModelSpec, Recovery
from hugerec.continuous.monitor import MonitorConfig
from hugerec.continuous.observer import ServerObserver
from hugerec.continuous.publish import Publisher, ServerTarget
from hugerec.continuous.traffic import Replay, replay, sent_schema
from hugerec.continuous.window_schema import window_schemas

__all__ = [
    "DecisionConfig",
    "GateConfig",
    "Loop",
    "LoopConfig",
    "ModelSpec",
    "MonitorConfig",
    "Publisher",
    "Record",
    "Recovery",
    "Replay",
    "ServerObserver",
    "ServerTarget",
    "read_log",
    "replay",
    "sent_schema",
    "window_schemas",
]
