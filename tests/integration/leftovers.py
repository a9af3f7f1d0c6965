"""What an agent leaves running, for the tests that a phase's processes end with it.

Each loop records its pid and uid, then appends a byte to its counter file every 50 ms;
each way of starting one escapes the exec's process group, and most its session too:
detached, double-forked, a job-control group, renamed (argv and comm).
"""

from __future__ import annotations

from collections.abc import Mapping

_LOOP = 'echo "$$ $(id -u)" > "$0.pid"; while :; do echo x >> "$0"; sleep 0.05; done'
_RENAME = (
    "import ctypes, subprocess, sys; "
    "ctypes.CDLL(None).prctl(15, b'kworker/0:1', 0, 0, 0); "  # PR_SET_NAME
    "subprocess.run(['sh', '-c', sys.argv[1], sys.argv[2]])"
)
LAUNCH = {
    "setsid": 'setsid nohup sh -c "$L" {c} &',
    "double-fork": '( setsid sh -c "$L" {c} & )',
    "job": 'bash -c \'set -m; sh -c "$1" "$2" &\' _ "$L" {c}',
    "exec-a": 'setsid bash -c \'exec -a innocent sh -c "$1" "$2"\' _ "$L" {c} &',
    "prctl": f'( setsid python3 -c "{_RENAME}" "$L" {{c}} & )',
}


def start_loops(launch: Mapping[str, str], directory: str, prefix: str = "") -> str:
    """A script starting one loop per entry, counting into `directory/<prefix><name>`; it
    returns once every loop has counted (so each has left the exec's process group), or
    fails after 10 s."""
    counters = [f"{directory}/{prefix}{name}" for name in launch]
    ticking = " && ".join(f"[ -s {counter} ]" for counter in counters)
    # Nothing left behind holds the exec's output open, or the exec would not return.
    lines = ["set -e", "exec </dev/null >/dev/null 2>&1", f"L='{_LOOP}'"]
    lines += [line.format(c=c) for line, c in zip(launch.values(), counters, strict=True)]
    lines += [f"for _ in $(seq 100); do {ticking} && exit 0; sleep 0.1; done; exit 1"]
    return "\n".join(lines)
