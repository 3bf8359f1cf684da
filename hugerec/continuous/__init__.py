"""Continuous training in production: the loop over time windows (loop.py), its validation gate (gate.py),
decision log (decision_log.py), publisher (publish.py), monitor (monitor.py, observer.py) and decisions
(decisions.py). Import names from the module that defines them."""
