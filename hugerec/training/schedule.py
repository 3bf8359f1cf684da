"""Learning-rate schedule: linear warmup, constant, then polynomial decay (the MLPerf DLRM policy).

The schedule is a pure function of the step, so a checkpoint only has to store the step to resume
it exactly (no scheduler object with hidden state):

    factor
      1 |      ______________
        |     /              \\
        |    /                 \\__           polynomial decay ((remaining / decay_steps) ** power)
        |   /                      ‾‾‾‾‾‾‾‾  end_factor
      0 +--+---------------+---------+-----> step
           warmup_steps    decay_start  decay_start + decay_steps
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    """Multiplier on the base learning rate as a function of the 0-based step.

    warmup_steps  steps of linear warmup from base_lr / warmup_steps to base_lr (0: none)
    decay_start   first step of the decay (must be >= warmup_steps)
    decay_steps   length of the polynomial decay (0: no decay, constant after warmup)
    power         exponent of the decay (2.0 in MLPerf DLRM, 1.0 = linear)
    end_factor    floor of the multiplier once decayed
    """

    warmup_steps: int = 0
    decay_start: int = 0
    decay_steps: int = 0
    power: float = 2.0
    end_factor: float = 0.0

    def __post_init__(self) -> None:
        for name in ("warmup_steps", "decay_start", "decay_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"Schedule: {name} must be an int >= 0, got {value!r}")
        if self.decay_steps and self.decay_start < self.warmup_steps:
            raise ValueError(
                f"Schedule: decay_start ({self.decay_start}) must be >= warmup_steps ({self.warmup_steps})"
            )
        if not self.power > 0:
            raise ValueError(f"Schedule: power must be > 0, got {self.power}")
        if not 0.0 <= self.end_factor <= 1.0:
            raise ValueError(f"Schedule: end_factor must be in [0, 1], got {self.end_factor}")

    @staticmethod
    def mlperf_dlrm(warmup_steps: int = 2750, decay_start: int = 49315, decay_steps: int = 27772) -> Schedule:
        """The MLPerf DLRM (Criteo Terabyte) reference policy: linear warmup, then quadratic decay to 0."""
        return Schedule(warmup_steps, decay_start, decay_steps, power=2.0, end_factor=0.0)

    def factor(self, step: int) -> float:
        """Multiplier for the update taken at 0-based `step`."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.decay_steps == 0 or step < self.decay_start:
            return 1.0
        remaining = max(self.decay_start + self.decay_steps - step, 0) / self.decay_steps
        return max(remaining**self.power, self.end_factor)
