"""The kernel's OOM-kill records, and which of them are one kill.

For one kill the kernel writes several records, which vary with its version:

- `oom-kill:constraint=...,task_memcg=/...,task=NAME,pid=N,uid=U`: the summary (4.19 on; its
  `dump_header` is rate limited, so it may be missing in a storm of kills);
- `Out of memory: Killed process N (NAME) ...` or `Memory cgroup out of memory: Killed process N
  (NAME) ...` (5.x and 6.x), `Killed process N (NAME) total-vm:...` (4.x, after a `Kill process N
  (NAME) score S or sacrifice child` line that chose the victim and is not the kill);
- `oom_reaper: reaped process N (NAME), now anon-rss:...`: the reaper freed the victim's memory.

One kill is one event, whichever of its records were read, in any order, split across reads
and across an exporter restart: records naming the same pid within `SAME_KILL_USEC` of each
other (the kernel log's own clock, microseconds since boot) are one kill. On 4.x kernels that
sacrificed a child, the summary names the parent and the next `Killed process` record the child:
a `Killed process` record that directly follows a summary (no kill record between them, within
`SACRIFICED_CHILD_USEC`) is that summary's kill.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SAME_KILL_USEC = 60_000_000  # the reaper may come a while after the kill; a pid is not reused that soon
SACRIFICED_CHILD_USEC = 1_000_000  # the summary and the child's kill are written in one pass of the OOM killer
RECENT_KILLS_KEPT = 256  # kills remembered for the dedupe (the state file keeps them too)

SUMMARY = "summary"
KILLED = "killed"
REAPED = "reaped"

_SUMMARY = re.compile(r"\boom-kill:.*?\btask=(?P<task>.*?),pid=(?P<pid>\d+)")
_MEMCG = re.compile(r"\btask_memcg=(?P<memcg>[^,]*)")
_KILLED = re.compile(r"\bKilled process (?P<pid>\d+) \((?P<task>[^)]*)\)")
_REAPED = re.compile(r"\boom_reaper: reaped process (?P<pid>\d+) \((?P<task>[^)]*)\)")
_FORMS = ((SUMMARY, _SUMMARY), (KILLED, _KILLED), (REAPED, _REAPED))


@dataclass(frozen=True, slots=True)
class KillRecord:
    form: str  # SUMMARY, KILLED or REAPED
    pid: int
    task: str  # the process's name as the kernel wrote it
    usec: int  # the record's time on the kernel log's clock
    memcg: str | None = None  # the victim's memory cgroup (the summary only), as the kernel wrote it


def parse(message: str, usec: int) -> KillRecord | None:
    """The kill record in a kernel log message, or None for any other message."""
    if "process" not in message and "oom-kill:" not in message:
        return None  # the common case, cheaply
    for form, pattern in _FORMS:
        if (m := pattern.search(message)) is not None:
            memcg = None
            if form == SUMMARY and (cg := _MEMCG.search(message, 0, m.start("task"))) is not None:
                memcg = cg.group("memcg") or None
            return KillRecord(form, int(m.group("pid")), m.group("task"), usec, memcg)
    return None


@dataclass(slots=True)
class Kill:
    """One kill as its records so far tell it."""

    victim: int  # the pid its first record named
    pids: set[int]  # every pid its records named (4.x: the parent summarised and the child sacrificed)
    usec: int  # its first record's time
    memcg: str | None
    forms: set[str]


class KillDedupe:
    """Folds kill records into kills: `feed` returns the kill a record starts, or None when it belongs to
    one already seen. Its state (the recent kills) is saved, so a restart between two records of one kill
    does not count it twice."""

    def __init__(self, state: list | None = None) -> None:
        self.recent: list[Kill] = []
        self._last_form: str | None = None  # the form of the last record fed, for a sacrificed child
        for entry in state or ():
            try:
                pids, usec, memcg = entry
                victim, all_pids = int(pids[0]), {int(p) for p in pids}
                kill = Kill(victim, all_pids, int(usec), memcg if isinstance(memcg, str) else None, set())
            except (TypeError, ValueError, IndexError, OverflowError):
                continue  # a malformed entry: forgotten (at worst one kill of the last minute counted twice)
            self.recent.append(kill)

    def feed(self, record: KillRecord) -> Kill | None:
        kill = self._same_kill(record)
        self._last_form = record.form
        if kill is not None:
            kill.pids.add(record.pid)
            kill.forms.add(record.form)
            kill.memcg = kill.memcg or record.memcg
            return None
        kill = Kill(record.pid, {record.pid}, record.usec, record.memcg, {record.form})
        self.recent.append(kill)
        self._forget(record.usec)
        return kill

    def _same_kill(self, record: KillRecord) -> Kill | None:
        for kill in reversed(self.recent):
            if record.pid in kill.pids and abs(record.usec - kill.usec) <= SAME_KILL_USEC:
                return kill
        if record.form == KILLED and self._last_form == SUMMARY and self.recent:
            last = self.recent[-1]
            if KILLED not in last.forms and 0 <= record.usec - last.usec <= SACRIFICED_CHILD_USEC:
                return last  # 4.x: the parent summarised, its child sacrificed
        return None

    def _forget(self, now_usec: int) -> None:
        self.recent = [k for k in self.recent if now_usec - k.usec <= SAME_KILL_USEC][-RECENT_KILLS_KEPT:]

    def state(self) -> list[list]:
        return [[[k.victim, *sorted(k.pids - {k.victim})], k.usec, k.memcg] for k in self.recent]
