"""``forge run``'s options, parsed once: the command line fills ``RunOptions``; ``run.cli.main_run`` (and
``build_plan``, which lays them over the run config into the orchestrator's ``RunPlan``) read it."""

from __future__ import annotations

from dataclasses import dataclass

from forgelib.errors import UsageError
from forgelib.stacks import STACK_MODES

MAX_RETRIES = 100  # as the run config schema's bound
MIN_MEMORY_BUDGET_MB = 64


@dataclass(frozen=True)
class RunOptions:
    """What the command line says about a run; None (or False): the run config decides."""

    config: str = ""  # the run config file
    repeats: int | None = None
    workers: int | None = None
    output: str | None = None
    resume: str | None = None  # a run id: run only the trials that did not finish
    as_json: bool = False
    junit: str | None = None
    report: bool = False
    retries: int | None = None
    snapshots: bool = False
    no_snapshots: bool = False
    stacks: str | None = None  # one of STACK_MODES
    cluster: str | None = None  # a Ray cluster address
    memory_budget_mb: int | None = None
    agent: str | None = None  # `oracle` or an agent file

    def check(self) -> None:
        """The usage errors, before anything is loaded (``UsageError``: exit 2, with the fix)."""
        if self.snapshots and self.no_snapshots:
            raise UsageError("--snapshots and --no-snapshots contradict each other; give one")
        if not self.config:
            raise UsageError("--config is required: a run config, e.g. PACK/run_configs/dev.yaml")
        if self.repeats is not None and self.repeats < 1:
            raise UsageError("--repeats must be at least 1")
        if self.workers is not None and self.workers < 1:
            raise UsageError("--workers must be at least 1")
        if self.retries is not None and not 0 <= self.retries <= MAX_RETRIES:
            raise UsageError(f"--retries must be between 0 and {MAX_RETRIES}")
        if self.stacks is not None and self.stacks not in STACK_MODES:
            raise UsageError(f"--stacks must be one of {', '.join(STACK_MODES)}, not {self.stacks!r}")
        if self.memory_budget_mb is not None and self.memory_budget_mb < MIN_MEMORY_BUDGET_MB:
            raise UsageError(f"--memory-budget-mb must be at least {MIN_MEMORY_BUDGET_MB} (MiB)")
        if self.resume and self.repeats is not None:
            raise UsageError("--repeats cannot change a resumed run's plan; drop it or start a new run")

    def use_snapshots(self, configured: bool) -> bool:
        """Whether fresh stacks start from goldens: the run config's ``snapshots``, as the flags override."""
        return (configured or self.snapshots) and not self.no_snapshots


__all__ = ["MAX_RETRIES", "RunOptions"]
