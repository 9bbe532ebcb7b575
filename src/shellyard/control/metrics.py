"""Prometheus metrics of one replica (docs/operations.md).

Latencies are histograms observed as they happen; everything else is read when scraped
(``refresh``), from the database (every replica's executions and deliveries) and from this
replica's objects (its leases, its runners' health, the wakes it emitted), so no count can
drift from the records."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shellyard.store.leases import KINDS as LEASE_KINDS

#: Seconds: a start is a few ms on a warm local runner, a remote one adds a round trip.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class Readings:
    """What ``refresh`` read, handed to the collector."""

    executions: Mapping[str, int] = field(default_factory=dict)
    deliveries: Mapping[str, int] = field(default_factory=dict)
    leases: Mapping[str, int] = field(default_factory=dict)
    runners: Mapping[str, bool] = field(default_factory=dict)
    takeovers: int = 0
    wakes_emitted: int = 0
    fanout_published: int = 0
    fanout_received: int = 0
    #: The event loop serving this replica: "uvloop" or "asyncio" (shellyard/loops.py).
    event_loop: str = ""


class Metrics:
    def __init__(self) -> None:
        # A registry per control plane: several planes in one process (tests) never clash.
        self.registry = CollectorRegistry(auto_describe=True)
        self.spawn = Histogram(
            "shellyard_spawn_seconds",
            "Time the runner took to start an execution's process (its start call).",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.commit = Histogram(
            "shellyard_commit_seconds",
            "From an execution's process exit to its final record: the sandbox's end, the "
            "snapshot commit and the record's transaction.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.readings = Readings()
        self.registry.register(_ReadingsCollector(self))

    def observe(self, what: str, seconds: float) -> None:
        (self.spawn if what == "spawn" else self.commit).observe(seconds)

    def render(self, readings: Readings) -> bytes:
        self.readings = readings
        return generate_latest(self.registry)


class _ReadingsCollector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        r = self.metrics.readings
        states = GaugeMetricFamily(
            "shellyard_executions", "Executions by state (all replicas).", labels=["state"]
        )
        for state in ("queued", "running", "completed", "cancelled", "failed", "unknown"):
            states.add_metric([state], r.executions.get(state, 0))
        yield states
        yield GaugeMetricFamily(
            "shellyard_queue_depth",
            "Executions accepted and waiting to start (all replicas).",
            value=r.executions.get("queued", 0),
        )
        leases = GaugeMetricFamily(
            "shellyard_leases_held", "Leases of ongoing work this replica holds.", labels=["kind"]
        )
        for kind in sorted({*LEASE_KINDS, *r.leases}):  # every kind, 0 when none is held
            leases.add_metric([kind], r.leases.get(kind, 0))
        yield leases
        yield CounterMetricFamily(
            "shellyard_lease_takeovers",
            "Leases this replica took over from a replica that stopped renewing them.",
            value=r.takeovers,
        )
        up = GaugeMetricFamily(
            "shellyard_runner_up",
            "1 when the runner answered its last heartbeat.",
            labels=["runner"],
        )
        for runner_id, ok in sorted(r.runners.items()):
            up.add_metric([runner_id], 1 if ok else 0)
        yield up
        yield CounterMetricFamily(
            "shellyard_wakes_emitted", "Wakes this replica emitted.", value=r.wakes_emitted
        )
        deliveries = GaugeMetricFamily(
            "shellyard_wake_deliveries",
            "Webhook deliveries of wakes by state (all replicas): delivered, failed, pending.",
            labels=["state"],
        )
        for state in ("pending", "delivered", "failed"):
            deliveries.add_metric([state], r.deliveries.get(state, 0))
        yield deliveries
        fanout = CounterMetricFamily(
            "shellyard_fanout_messages",
            "Cross-replica messages (LISTEN/NOTIFY) this replica sent and acted on.",
            labels=["direction"],
        )
        fanout.add_metric(["sent"], r.fanout_published)
        fanout.add_metric(["received"], r.fanout_received)
        yield fanout
        if r.event_loop:
            loop = GaugeMetricFamily(
                "shellyard_event_loop_info",
                "1, labelled with the event loop this replica runs on (SHELLYARD_LOOP).",
                labels=["loop"],
            )
            loop.add_metric([r.event_loop], 1)
            yield loop
