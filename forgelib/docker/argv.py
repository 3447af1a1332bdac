"""docker CLI argv builders: the one place a ``docker …`` argv is spelled (test_docker_argv.py).

Pure functions, one per verb of the CLI, as compose.py's builders are: options as keywords in the order
the CLI is given them, ``None``/``False`` skipped, so unit tests assert exact argv without an engine.
Nothing here runs anything: every argv goes through ``runner.py``. ``compose(...)`` starts every
``docker compose`` argv (compose.py's ``base_argv`` and the engine probe).

Options (``flags``): ``no_trunc=True`` -> ``--no-trunc``; ``tail=5`` -> ``--tail 5``; a list repeats the
flag (``label=["a=1", "b=2"]``); ``filters`` is spliced as given (``labels.filters``' ``--filter`` pairs).
Always the long spelling (``--all``, never ``-a``): one way to read every logged command.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Opt = str | int | float | bool | None | Sequence[str]


def _flags(options: dict[str, Opt]) -> list[str]:
    argv: list[str] = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        if key == "filters":
            argv += [str(v) for v in value]  # type: ignore[union-attr]
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif isinstance(value, str | int | float):
            argv += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        else:
            for v in value:
                argv += [flag, str(v)]
    return argv


def flags(**options: Opt) -> list[str]:
    """``foo_bar=True`` -> ``--foo-bar``; ``tail=5`` -> ``--tail 5``; ``None`` and ``False`` are skipped;
    a list repeats the flag once per item; ``filters``: ready ``--filter`` pairs, spliced."""
    return _flags(options)


def _docker(*args: str) -> list[str]:
    return ["docker", *args]


# ---------------------------------------------------------------------------------------------- engine


def compose(*args: str) -> list[str]:
    """``docker compose ARGS``: the start of every compose argv (compose.base_argv)."""
    return _docker("compose", *args)


def info(**options: Opt) -> list[str]:
    return _docker("info", *flags(**options))


# ------------------------------------------------------------------------------------------ containers


def ps(**options: Opt) -> list[str]:
    """``docker ps``: e.g. ``ps(all=True, quiet=True, no_trunc=True, filters=lab.filters(...))``."""
    return _docker("ps", *_flags(options))


def inspect(refs: Sequence[str], *, kind: str | None = None, **options: Opt) -> list[str]:
    """``docker inspect REFS``, or ``docker KIND inspect`` (KIND: image, network, volume, container)."""
    return _docker(*([kind] if kind else []), "inspect", *flags(**options), *refs)


def create(image: str, args: Sequence[str] = (), **options: Opt) -> list[str]:
    return _docker("create", *flags(**options), image, *args)


def run(image: str, args: Sequence[str] = (), **options: Opt) -> list[str]:
    return _docker("run", *flags(**options), image, *args)


def start(refs: Sequence[str], **options: Opt) -> list[str]:
    return _docker("start", *flags(**options), *refs)


def stop(refs: Sequence[str], **options: Opt) -> list[str]:
    return _docker("stop", *flags(**options), *refs)


def pause(refs: Sequence[str]) -> list[str]:
    return _docker("pause", *refs)


def unpause(refs: Sequence[str]) -> list[str]:
    return _docker("unpause", *refs)


def rm(refs: Sequence[str], *, kind: str | None = None, **options: Opt) -> list[str]:
    """``docker rm REFS``, or ``docker KIND rm`` (``image``, ``network``, ``volume``)."""
    return _docker(*([kind] if kind else []), "rm", *_flags(options), *refs)


def exec(
    container: str,
    argv: Sequence[str],
    *,
    interactive: bool = False,
    tty: bool = False,
    env: Mapping[str, str] | None = None,
    workdir: str | None = None,
    user: str | None = None,
) -> list[str]:
    """``docker exec`` of ``argv`` in ``container`` (``-i``/``-it``, then ``--env K=V``, workdir, user)."""
    mode = "-it" if interactive and tty else "-i" if interactive else "-t" if tty else None
    opts = [mode] if mode else []
    opts += flags(env=[f"{k}={v}" for k, v in (env or {}).items()], workdir=workdir, user=user)
    return _docker("exec", *opts, container, *argv)


def cp(src: str, dst: str, **options: Opt) -> list[str]:
    """``docker cp SRC DST``: one side is ``CONTAINER:PATH``."""
    return _docker("cp", *flags(**options), src, dst)


def port(container: str, mapping: str) -> list[str]:
    """``docker port CONTAINER 5432/tcp``."""
    return _docker("port", container, mapping)


def logs(container: str, **options: Opt) -> list[str]:
    return _docker("logs", *flags(**options), container)


def stats(refs: Sequence[str], **options: Opt) -> list[str]:
    return _docker("stats", *flags(**options), *refs)


# ------------------------------------------------------------------------- images, networks, volumes


def ls(kind: str, **options: Opt) -> list[str]:
    """``docker KIND ls`` (``image``, ``network``, ``volume``)."""
    return _docker(kind, "ls", *_flags(options))


def pull(ref: str, **options: Opt) -> list[str]:
    return _docker("pull", *_flags(options), ref)


def build(context: str, **options: Opt) -> list[str]:
    return _docker("build", *flags(**options), context)


def tag(source: str, target: str) -> list[str]:
    return _docker("tag", source, target)


def load(**options: Opt) -> list[str]:
    return _docker("load", *flags(**options))


def save(refs: Sequence[str], **options: Opt) -> list[str]:
    return _docker("save", *flags(**options), *refs)


def network_disconnect(network: str, container: str, **options: Opt) -> list[str]:
    return _docker("network", "disconnect", *flags(**options), network, container)
