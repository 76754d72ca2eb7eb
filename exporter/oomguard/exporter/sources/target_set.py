"""The one set of targets: who is scraped. Discovery changes it, the others read it.

The configured targets are in it from the start. Local discovery (sources/local/) and pod discovery
(sources/kubernetes/) add, remove and retarget theirs through it, and tell it what they learn of a target (a
new container, its pod's UID); the event poller gives it the engines' starts read in their logs. The collection
scrapes its scrapers; the trend sampler reads its views (`model.TargetView`); the kernel log's attribution
reads whose processes and pods each target has. Everything here runs on the event loop: a change is whole
between two awaits, so a collection or a tick sees the set before a change or after it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from oomguard.exporter.config import TargetConfig
from oomguard.exporter.join import reservation
from oomguard.exporter.model import PodRef, ProcessTree, TargetReading, TargetView
from oomguard.exporter.sources.targets import TargetScraper


class TargetSet:
    def __init__(
        self,
        make_scraper: Callable[[TargetConfig], TargetScraper],
        configs: Iterable[TargetConfig] = (),
        *,
        on_change: Callable[..., None] | None = None,
    ):
        """`make_scraper`: a target's scraper from its configuration (the runtime's: timeouts, limits, finder).
        `on_change(gone=...)`: told of each target added, removed (`gone`) or retargeted (`gone`: its old address's
        state is let go): the runtime's garbage collector freezer (runtime.py, TargetFreezer)."""
        self._make = make_scraper
        self._on_change = on_change
        self.version = 0  # changed by every change of the targets or their pods: whose processes and pods are whose
        self._by_name: dict[str, TargetScraper] = {}  # in the order added: the exposition's order
        # A discovered pod, by target name: its UID (whose kernel OOM kills are its own) and its reference (its node
        # and its name, which tell its GPUs).
        self._pods: dict[str, tuple[str, PodRef]] = {}
        self._member_uids: dict[str, tuple[str, ...]] = {}  # the workers' pods of an engine spanning pods
        self._reservations: dict[str, float | None] = {}  # each target's reservation as its last scrape said
        for config in configs:
            self.add(config)

    def names(self) -> list[str]:
        return list(self._by_name)

    def scrapers(self) -> tuple[TargetScraper, ...]:
        """The scrapers as they stand: a collection scrapes these, whatever discovery changes meanwhile."""
        return tuple(self._by_name.values())

    # -- discovery's changes ---------------------------------------------------------------------------
    def add(self, config: TargetConfig) -> None:
        name = config.label
        if name in self._by_name:
            raise ValueError(f"target {name!r} is already watched")
        self._by_name[name] = self._make(config)
        self._changed(gone=False)

    def remove(self, name: str) -> None:
        """Gone, with its counts (a target that comes back starts from zero, as a new series would)."""
        gone = self._by_name.pop(name, None)
        self._pods.pop(name, None)
        self._member_uids.pop(name, None)
        self._reservations.pop(name, None)
        if gone is not None:
            self._changed(gone=True)

    def retarget(self, name: str, config: TargetConfig) -> None:
        """The target at a new address (a pod replaced under its name): its counts go on, the new process is
        loading until it first answers."""
        self._by_name[name].retarget(config)
        self._changed(gone=True)

    def _changed(self, *, gone: bool) -> None:
        self.version += 1
        if self._on_change is not None:
            self._on_change(gone=gone)

    def new_life(self, name: str) -> None:
        """A new process at the same address (a container restarted in its pod): loading until it answers, not
        down."""
        self._by_name[name].status.new_life()

    def set_pod(self, name: str, uid: str, pod: PodRef, member_uids: tuple[str, ...] = ()) -> None:
        """The pod a discovered target is (and, for an engine spanning pods, its workers'): a kernel OOM kill in their
        cgroups is its own (`owners`); their nodes and names tell its GPUs (`views`)."""
        self._pods[name] = (uid, pod)
        self._member_uids[name] = member_uids
        self.version += 1

    def log_start(self, name: str, at: float, pid: int | None) -> None:
        """An engine's start read in its log (a life that never serves is seen nowhere else); a target gone since
        is ignored."""
        if (scraper := self._by_name.get(name)) is not None:
            scraper.restarts.log_start(at, pid)

    # -- what the others read --------------------------------------------------------------------------
    def url(self, name: str) -> str:
        return self._by_name[name].config.url

    def has_served(self, name: str) -> bool:
        """Whether the target has answered healthy since it was added (or last retargeted)."""
        return self._by_name[name].status.ever_up

    def local_ports(self) -> list[int]:
        """The ports of the targets on this host, whose processes the process lookup finds."""
        return [s.port for s in self._by_name.values() if s.finder is not None]

    def views(self) -> tuple[TargetView, ...]:
        return tuple(
            TargetView(
                name=name,
                gpus=s.config.gpus,
                port=s.port if s.finder is not None else None,
                state=s.status.state,
                asleep=s.asleep,
                pod=self._pods[name][1] if name in self._pods else None,
                reservation=self._reservations.get(name),
            )
            for name, s in self._by_name.items()
        )

    def note_reservations(self, readings: Iterable[TargetReading]) -> None:
        """Each scraped target's reservation (its engine's, else its command line's): the trend sampler judges its
        GPUs' use beyond it between scrapes."""
        for t in readings:
            if t.name in self._by_name:
                self._reservations[t.name] = reservation(t)

    def owners(self, found: Mapping[int, ProcessTree | None]) -> Iterator[tuple[str, frozenset[int], str | None]]:
        """Each target's processes on this host (from the process lookup's `found`, by port) and its pod's UID:
        whose a kernel OOM kill may be (events/kill_owners.py)."""
        for name, s in self._by_name.items():
            tree = found.get(s.port) if s.finder is not None else None
            yield (
                name,
                tree.pids if tree is not None else frozenset(),
                self._pods[name][0] if name in self._pods else None,
            )
            for uid in self._member_uids.get(name, ()):
                yield name, frozenset(), uid
