"""Continuous training in production: the loop over time windows (loop.py), its validation gate (gate.py),
decision log (decision_log.py), publisher (publish.py), monitor (monitor.py, observer.py) and decisions
(decisions.py). Import names from the module that defines them."""

from hugerec.continuous.decisions import DecisionConfig
from hugerec.continuous.gate import GateConfig
from hugerec.continuous.loop import Loop, LoopConfig, ModelSpec
from hugerec.continuous.monitor import MonitorConfig

__all__ = [
    "DecisionConfig",
    "GateConfig",
    "Loop",
    "LoopConfig",
    "ModelSpec",
    "MonitorConfig",
]
