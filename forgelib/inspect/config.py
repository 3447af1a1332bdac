"""The ``forge`` sandbox's config: ``sandbox=("forge", "path/to/project.yaml")`` or a ``ForgeConfig``.

A pydantic model, as inspect expects of a provider's config class (it serializes the config into the eval
log and back through ``ForgeSandboxEnvironment.config_deserialize``). Relative project paths resolve
against the directory inspect runs ``task_init`` in (the task file's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from forgelib.inspect.stacks import SandboxConfigError, Settings
from forgelib.spec.models import Timeouts


class ForgeConfig(BaseModel):
    """Which forge project (and task) a sample's stack comes from, and how."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    project: str = Field(description="a forge project directory or its project.yaml")
    task: str | None = Field(
        default=None,
        description="a forge task of the project: its environment manifest applies and forge_scorer() "
        "runs its grading.yaml; a sample's metadata `forge_task` overrides it",
    )
    stacks: Literal["fresh", "warm"] = Field(
        default="fresh",
        description="fresh: a new stack per sample; warm: stacks reused across samples, reset in place "
        "and fingerprint-verified before each",
    )
    goldens: bool = Field(
        default=False,
        description="fresh stacks start reset services from golden snapshots (captured in task_init); "
        "with stacks=warm, each warm stack's first provisioning starts from them (the first one captures)",
    )
    default: str | None = Field(
        default=None,
        description="the compose service that is inspect's default sandbox (else the one marked "
        "x-default: true, or named default)",
    )


def parse(config: object) -> ForgeConfig:
    """``config`` as inspect hands it over: a path string, a ``ForgeConfig``, a dict (from a log)."""
    if isinstance(config, ForgeConfig):
        return config
    if isinstance(config, str) and config:
        return ForgeConfig(project=config)
    if isinstance(config, dict):
        try:
            return ForgeConfig(**config)
        except ValidationError as e:
            raise SandboxConfigError(f"sandbox ('forge', {config!r}): {_first(e)}") from None
    if config is None or config == "":
        raise SandboxConfigError(
            "sandbox 'forge' needs a project: sandbox=('forge', 'path/to/project.yaml') or "
            "SandboxEnvironmentSpec('forge', ForgeConfig(project=...))"
        )
    raise SandboxConfigError(
        f"sandbox 'forge': config of type {type(config).__name__} is not a project path or a ForgeConfig"
    )


def _first(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "config"
    return f"{where}: {err['msg']}"


def key(config: object) -> str:
    """The same config's one key (a string config and its ForgeConfig differ: each is its own config)."""
    if isinstance(config, BaseModel):
        return json.dumps(config.model_dump(), sort_keys=True)
    return json.dumps(config, sort_keys=True, default=str)


def settings(cfg: ForgeConfig, base: Path | None = None) -> Settings:
    """The config with its project path made absolute (against ``base``, default the working directory)."""
    path = Path(cfg.project).expanduser()
    if not path.is_absolute():
        path = (base or Path.cwd()) / path
    return Settings(
        project=path,
        task=cfg.task,
        stacks=cfg.stacks,
        goldens=cfg.goldens,
        default=cfg.default,
        timeouts=Timeouts(),
    )


def deserialize(data: dict[str, Any]) -> ForgeConfig:
    return parse(data)
