"""What a trial can see of a data-directory service's container from inside it, as the server's OS user (a
superuser trial reaches that user through ``COPY … TO PROGRAM``): PID 1's command line, the names of
PID 1's children (each name once: a server that is PID 1 has a changing number of backends as children,
with their clients' addresses in their command lines), ``ls -la /`` without its dates (and without
``/proc``, whose link count is the number of processes), and the stat of forge's ``/forge``. A restored
stack must show exactly what a fresh one does.
"""

from __future__ import annotations

from forgelib.stacks.stack import Stack

# One shell script, so that it runs the same way through ``docker exec`` and through COPY … FROM PROGRAM.
VIEW = (
    "printf 'pid1: %s\\n' \"$(tr '\\0' ' ' < /proc/1/cmdline)\"; "
    "for p in /proc/[0-9]*; do [ \"$(cut -d' ' -f4 $p/stat 2>/dev/null)\" = 1 ] && cat $p/comm; done "
    "| sort -u | sed 's/^/child: /'; "
    'ls -la / | awk \'$NF != "proc" {print "root:", $1, $2, $3, $4, $5, $NF}\'; '
    "echo forge: $(stat -c '%a %U:%G %h %s %F' /forge 2>&1 | sed 's/^stat: //')"
)


def seen(stack: Stack, service: str, user: str) -> list[str]:
    """``VIEW`` in ``service``'s container as ``user``, line by line."""
    argv = ["docker", "exec", "--user", user, stack.compose.container(service), "sh", "-c", VIEW]
    return str(stack.compose.runner.run(argv, timeout=60).stdout).splitlines()
