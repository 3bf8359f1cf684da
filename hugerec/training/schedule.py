"""Learning-rate schedule: linear warmup, constant, then polynomial decay (the MLPerf DLRM policy).

The schedule is a pure function of the step, so a checkpoint only has to store the step to resume
it exactly (no scheduler object with hidden state). The trainer multiplies the dense optimizer's lr
by the factor, and with `sparse=True` the embedding tables' sparse optimizers' lr too (the factor
reaches the fused update as a per-step multiplier on each table's lr):

    factor
      1 |      ______________
        |     /              \\
        |    /                 \\__           polynomial decay ((remaining / decay_steps) ** power)
        |   /                      ‾‾‾‾‾‾‾‾  end_factor
      0 +--+---------------+---------+-----> step
           warmup_steps    decay_start  decay_start + decay_steps
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Schedule:
    """Multiplier on the base learning rate as a function of the 0-based step.

    warmup_steps  steps of linear warmup from base_lr / warmup_steps to base_lr (0: none)
    decay_start   first step of the decay (must be >= warmup_steps)
    decay_steps   length of the polynomial decay (0: no decay, constant after warmup)
    power         exponent of the decay (2.0 in MLPerf DLRM, 1.0 = linear)
    end_factor    floor of the multiplier once decayed
    decay_epochs  the decay's length in epochs instead of steps (0: off; needs decay_steps = 0): `fit`
                  turns it into decay_steps with the training data's length (`in_steps`)
    sparse        also scale the sparse optimizers' lr (every embedding table's rows) by the factor, not
                  only the dense optimizer's. False: the tables keep their own constant lr. The MLPerf
                  DLRM reference decays both (`mlperf_dlrm`); a sequential model's item table is most of
                  its parameters, so a decay for it needs True

    TrainConfig's default is Schedule(decay_epochs=1.0, power=1.0): the dense lr falls linearly to 0 over
    the first epoch. Measured on the real Criteo sample (benchmarks/quality.py, `real criteo auc`): the
    deep models peaked in their first epoch and fell after it at a constant lr; decayed over that epoch
    they end it at a better AUC, and later epochs (early stopping picks the best) only move the
    embedding rows, whose sparse optimizer keeps its own lr. On large data trained for one epoch it is
    the usual linear decay to 0 (+0.3-0.4 AUC points on the synthetic set, see benchmarks/quality.py).
    """

    warmup_steps: int = 0
    decay_start: int = 0
    decay_steps: int = 0
    power: float = 2.0
    end_factor: float = 0.0
    decay_epochs: float = 0.0
    sparse: bool = False

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
        if isinstance(self.decay_epochs, bool) or not isinstance(self.decay_epochs, int | float):
            raise ValueError(f"Schedule: decay_epochs must be a number >= 0, got {self.decay_epochs!r}")
        if not self.decay_epochs >= 0:
            raise ValueError(f"Schedule: decay_epochs must be >= 0, got {self.decay_epochs}")
        if not isinstance(self.sparse, bool):
            raise ValueError(f"Schedule: sparse must be true or false, got {self.sparse!r}")
        if self.decay_epochs and self.decay_steps:
            raise ValueError(
                f"Schedule: give decay_steps ({self.decay_steps}) or decay_epochs ({self.decay_epochs}), not both"
            )

    def in_steps(self, steps_per_epoch: int | None) -> Schedule:
        """This schedule with decay_epochs turned into decay_steps (itself when decay_epochs is 0)."""
        if not self.decay_epochs:
            return self
        if steps_per_epoch is None:
            raise ValueError(
                f"Schedule: decay_epochs={self.decay_epochs} needs training data with a length (len(train_data)); "
                "give decay_steps instead, or schedule=Schedule() for a constant lr"
            )
        steps = max(1, round(self.decay_epochs * steps_per_epoch))
        return replace(self, decay_steps=steps, decay_epochs=0.0)

    @staticmethod
    def mlperf_dlrm(warmup_steps: int = 2750, decay_start: int = 49315, decay_steps: int = 27772) -> Schedule:
        """The MLPerf DLRM (Criteo Terabyte) reference policy: linear warmup, then quadratic decay to 0, of
        every lr (the reference's one optimizer updates the embeddings and the MLPs alike)."""
        return Schedule(warmup_steps, decay_start, decay_steps, power=2.0, end_factor=0.0, sparse=True)

    def factor(self, step: int) -> float:
        """Multiplier for the update taken at 0-based `step`."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.decay_steps == 0 or step < self.decay_start:
            return 1.0
        remaining = max(self.decay_start + self.decay_steps - step, 0) / self.decay_steps
        return max(remaining**self.power, self.end_factor)
