"""Starts the processes of a multi-process GPU run (tests/gpu/mp_script.py) and reads their reports.

    run = start(4, ["kernels", "collectives"], shared=True, log_dir=tmp)   # 4 ranks sharing GPU 0
    result = run.wait()
    result.check("collectives")      # AssertionError naming each failing rank, with its log

Shared mode puts every process on GPU 0 (`local_device_ids=[0]`): iris's heaps map into each
other through CUDA IPC, which works between processes of one device, and the processes'
kernels time-slice on it. Each process gets a small heap and a small share of the GPU's memory
(no preallocation), so that runs of 2, 4 and 8 ranks fit at once. Otherwise process i runs on
GPU i. Runs are bounded: each process dumps its stacks and exits before `limit_s`
(faulthandler), and wait() kills whatever is left at the limit.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from iris_core.heap.cuda import gpu_count  # noqa: F401 - the GPU suite counts GPUs through it
from iris_core.sim.launcher import free_port

SCRIPT = Path(__file__).with_name("mp_script.py")
ROOT = SCRIPT.parent.parent.parent
REPORT = re.compile(r"^process (\d+): scenario (\S+) (OK|FAIL)\b(.*)$")
SUMMARY: list[Result] = []  # every run of this pytest session (tests/gpu/conftest.py prints their timings)


@dataclass
class Result:
    """What the processes of one run reported."""

    world_size: int
    shared: bool
    seconds: float
    returncodes: list[int | None]
    logs: list[str]
    timed_out: bool
    reports: dict[str, dict[int, tuple[str, str]]] = field(default_factory=dict)  # scenario -> process -> status

    def __post_init__(self):
        for process, log in enumerate(self.logs):
            for line in log.splitlines():
                m = REPORT.match(line)
                if m and int(m.group(1)) == process:
                    self.reports.setdefault(m.group(2), {})[process] = (m.group(3), m.group(4).strip())

    @property
    def label(self) -> str:
        return f"{self.world_size} ranks {'sharing GPU 0' if self.shared else 'on their own GPUs'}"

    def seconds_of(self, scenario: str) -> float:
        """The slowest process's time for `scenario` (as reported), or nan."""
        times = [float(m.group(1)) for status, detail in self.reports.get(scenario, {}).values()
                 for m in [re.match(r"([\d.]+) s", detail)] if m]
        return max(times) if times else float("nan")

    def check(self, scenario: str) -> None:
        """Raises AssertionError unless every process reported `scenario` OK."""
        reports = self.reports.get(scenario, {})
        bad = [p for p in range(self.world_size) if reports.get(p, ("missing",))[0] != "OK"]
        if not bad:
            return
        why = "timed out" if self.timed_out else "ran"
        text = [f"{scenario}: {self.label} ({why} {self.seconds:.0f} s): not OK on process(es) {bad}"]
        for p in bad[:3]:
            text.append(f"--- process {p} (exit {self.returncodes[p]}): "
                        f"{reports.get(p, ('no report', ''))[0]}\n{_excerpt(self.logs[p], p, scenario)}")
        raise AssertionError("\n".join(text))

    def summary(self) -> str:
        """One line: the run, its time, and each scenario's status and slowest time."""
        parts = []
        for scenario, reports in self.reports.items():
            ok = sum(status == "OK" for status, _ in reports.values())
            parts.append(f"{scenario} {ok}/{self.world_size} OK {self.seconds_of(scenario):.0f} s")
        return f"{self.label}: {self.seconds:.0f} s{' (timed out)' if self.timed_out else ''}; " + ", ".join(parts)

    def check_exit(self) -> None:
        """Raises AssertionError unless every process ended with `process P: OK` and exit code 0."""
        bad = [p for p, (rc, log) in enumerate(zip(self.returncodes, self.logs, strict=True))
               if rc != 0 or f"process {p}: OK" not in log]
        if bad:
            raise AssertionError(f"{self.label}: process(es) {bad} did not end cleanly (exit codes "
                                 f"{[self.returncodes[p] for p in bad]}):\n" +
                                 "\n".join(f"--- process {p}:\n{self.logs[p][-4000:]}" for p in bad[:3]))


def _excerpt(log: str, process: int, scenario: str, limit: int = 6000) -> str:
    """The log from `scenario`'s start line on (or its tail when it never started)."""
    start = log.find(f"process {process}: scenario {scenario} start")
    return (log[start:start + limit] if start >= 0 else log[-limit:]) or "(empty log)"


class Run:
    """Processes of one run, started; wait() collects them."""

    def __init__(self, world_size: int, scenarios: list[str], *, shared: bool, log_dir: Path, limit_s: float,
                 heap_mib: int = 768, env: dict[str, str] | None = None):
        self.world_size, self.shared, self.limit_s = world_size, shared, limit_s
        log_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        base = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        base.pop("JAX_PLATFORMS", None)
        if shared:
            # every process's XLA client on one GPU: allocate on demand, at most ~7 GiB each
            base.update(XLA_PYTHON_CLIENT_PREALLOCATE="false", XLA_PYTHON_CLIENT_MEM_FRACTION="0.05",
                        IRIS_FUSED_WORKSPACE_BYTES=str(4 << 20))
        else:
            base.update(XLA_PYTHON_CLIENT_MEM_FRACTION="0.4")
        base.update(env or {})
        self.paths = [log_dir / f"{'shared' if shared else 'own'}_w{world_size}_p{p}.log" for p in range(world_size)]
        self.procs = []
        self.started = time.monotonic()
        for p, path in enumerate(self.paths):
            with open(path, "w") as log:  # the child keeps its own descriptor
                self.procs.append(subprocess.Popen(
                    [sys.executable, str(SCRIPT), str(p), str(world_size), str(port), "--scenarios",
                     ",".join(scenarios), "--out", str(log_dir), "--heap-mib", str(heap_mib),
                     "--limit", str(max(limit_s - 20, 10))] + (["--shared"] if shared else []),
                    cwd=ROOT, env=base, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def wait(self, grace_s: float = 90) -> Result:
        """Waits for every process, at most until the limit, or `grace_s` after one failed (its
        peers may wait for it until their own timeouts)."""
        deadline = self.started + self.limit_s
        look_at = self.started + max(self.limit_s - 30, 5)  # before mp_script's own exit at limit - 20
        while any(p.poll() is None for p in self.procs) and time.monotonic() < deadline:
            if look_at and time.monotonic() > look_at:
                look_at = None
                for proc, path in zip(self.procs, self.paths):
                    if proc.poll() is None:
                        _native_state(proc.pid, path.with_suffix(".native"))
            if any(p.poll() not in (None, 0) for p in self.procs):
                deadline = min(deadline, time.monotonic() + grace_s)
                grace_s = float("inf")  # counted from the first failure only
            time.sleep(0.5)
        timed_out = any(p.poll() is None for p in self.procs)
        for proc in self.procs:  # what is left at the limit (or after a peer's failure) is ended
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        return Result(self.world_size, self.shared, time.monotonic() - self.started,
                      [p.returncode for p in self.procs], [path.read_text(errors="replace") for path in self.paths],
                      timed_out)


def _native_state(pid: int, path: Path) -> None:
    """Where a process that is still running near its limit waits, below Python: each thread's
    kernel wait channel and, where gdb is installed, its native stack (a hang inside CUDA or XLA)."""
    lines = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task")):
        def read(name):
            try:
                return Path(f"/proc/{pid}/task/{tid}/{name}").read_text().strip()
            except OSError as e:
                return f"({e.strerror})"
        lines.append(f"thread {tid} {read('comm')}: wchan {read('wchan')}, state {read('stat').split(' ')[2:3]}")
    if shutil.which("gdb"):
        try:
            lines.append(subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 25"],
                                        capture_output=True, text=True, timeout=60).stdout)
        except subprocess.TimeoutExpired:
            lines.append("(gdb timed out)")
    else:
        lines.append("(no gdb here)")
    path.write_text("\n".join(lines) + "\n")


def start(world_size: int, scenarios: list[str], **kwargs) -> Run:
    """Starts `world_size` processes running `scenarios` (see Run)."""
    return Run(world_size, scenarios, **kwargs)
