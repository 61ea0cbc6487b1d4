"""Runs a producer, workers, a maintenance loop and workflows that wait for
their activities against fresh sheaf shards, then checks what they did;
exits 1 naming every check that failed.

    run_example.py --shards '0=postgres://...,1=postgres://...' [--tasks 60] [--seconds 60]

With more than one shard it publishes the topology on every shard first, so
the shards enforce placement, and routes through their placement functions.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys
import threading
import time
import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

import sheaf_fleet as sf

JOBS, ORDERS, ACTIVITIES, WORKFLOW = "py_jobs", "py_orders", "py_activities", "py_order"
ACTIVITY_ENDS = ("TaskCompleted", "TaskDeadLettered", "TaskCancelled")
VECTORS = pathlib.Path(__file__).resolve().parents[2] / "core/testdata/placement_vectors.json"


class Checks:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def check(self, ok: bool, what: str) -> None:
        print(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            self.failed.append(what)


def job_payload(seq: int) -> dict[str, Any]:
    """Every tenth task fails once, every twentieth is poison, every tenth
    snoozes once, and task 5 outlives its lease unless heartbeated."""
    return {"seq": seq, "fail_once": seq % 10 == 3, "poison": seq % 20 == 7,
            "snooze_once": seq % 10 == 8, "slow": seq == 5}


class App:
    """The handlers, and what they saw (shared by every worker thread)."""

    def __init__(self, lease: float) -> None:
        self.lease = lease
        self.lock = threading.Lock()
        self.settled: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
        self.snoozed: set[uuid.UUID] = set()
        self.slow_attempts: list[int] = []

    def done(self, task: sf.Task, how: str) -> None:
        if task.queue == JOBS:
            with self.lock:
                self.settled[how][task.payload["seq"]] += 1

    def handle(self, task: sf.Task) -> sf.Outcome:
        if task.kind == "workflow":
            return self.workflow_step(task)
        if task.queue == ACTIVITIES:
            return sf.Complete({"price": task.payload["item"] * 10})
        p = task.payload
        if p["poison"]:
            raise sf.DeadLetter(f"job {p['seq']} can never succeed")
        if p["fail_once"] and task.attempt == 1:
            raise sf.Retry("a transient failure", after=0.2)
        if p["snooze_once"]:
            with self.lock:
                first = task.task_id not in self.snoozed
                self.snoozed.add(task.task_id)
            if first:
                return sf.Snooze(0.2)
        if p["slow"]:
            with self.lock:
                self.slow_attempts.append(task.attempt)
            ends = time.monotonic() + self.lease * 1.5
            while time.monotonic() < ends:
                time.sleep(self.lease / 4)
                task.heartbeat()
        return sf.Complete({"seq": p["seq"]})

    def workflow_step(self, task: sf.Task) -> sf.Outcome:
        """The first step enqueues one activity per item and suspends; under
        the policy's `activity_ends: wake` each activity's end wakes the run
        (or, if a step is waiting already, leaves it to read the history), so
        a step counts the ends in the history and ends the run at the last."""
        conn, eid = task.session.conn(task.shard), task.execution_id
        items = task.payload.get("input", {}).get("items")
        with conn.transaction():
            if items is not None:
                for item in items:
                    conn.execute("SELECT sheaf.enqueue(%s, %s, %s)",
                                 (ACTIVITIES, Jsonb({"item": item}), Jsonb({"execution_id": str(eid)})))
                conn.execute("SELECT sheaf.complete(%s, %s)", (task.task_id, task.token))
                # No end can come before this commits: the activities are
                # not claimable yet.
                conn.execute("SELECT sheaf.suspend_execution(%s)", (eid,))
                return sf.Handled()
            events = conn.execute("SELECT event_type, payload FROM sheaf.history(%s)", (eid,)).fetchall()
            wanted = len(task.session.one(task.shard, "SELECT input->'items' FROM sheaf.get_execution(%s)", eid))
            ends = [(t, p) for t, p in events if t in ACTIVITY_ENDS and p["kind"] == "activity"]
            if len(ends) < wanted:
                # Not the last end: this step just ends, and the next end
                # brings the next step.
                conn.execute("SELECT sheaf.complete(%s, %s)", (task.task_id, task.token))
            elif all(t == "TaskCompleted" for t, _ in ends):
                conn.execute("SELECT sheaf.complete_task_and_execution(%s, %s, %s)", (
                    task.task_id, task.token, Jsonb({"total": sum(p["result"]["price"] for _, p in ends)})))
            else:
                conn.execute("SELECT sheaf.complete_task_and_fail_execution(%s, %s, %s)",
                             (task.task_id, task.token, f"{len(ends)} activities ended, not all completed"))
        return sf.Handled()


def publish(shards: dict[int, str], checks: Checks) -> str:
    """Publishes {"shards": [...]} on every shard; returns its digest."""
    projection = {"shards": sorted(shards)}
    vectors = json.loads(VECTORS.read_text())["topologies"]
    checks.check(all(sf.canonical(v["projection"]) == v["canonical"] and sf.digest(v["projection"]) == v["digest"]
                     for v in vectors), f"the canonical form and digest of all {len(vectors)} vector topologies")
    session = sf.Session(shards)
    published = {s: session.one(s, "SELECT digest FROM sheaf.publish_topology(%s, false)", Jsonb(projection))
                 for s in shards}
    session.close()
    checks.check(set(published.values()) == {sf.digest(projection)},
                 f"every shard published the digest computed here ({sf.digest(projection)})")
    return sf.digest(projection)


def misplaced_start_refused(session: sf.Session, checks: Checks) -> None:
    wid = "order-sent-astray"
    owner = session.owner_of_start(WORKFLOW, wid)
    other = next(s for s in session.shards if s != owner)
    try:
        session.rows(other, "SELECT * FROM sheaf.start_workflow(%s, %s, '{}')", WORKFLOW, wid)
        checks.check(False, f"a start on shard {other}, which does not own it, is refused")
    except psycopg.errors.CheckViolation as e:
        checks.check(sf.owner_in(e) == owner, f"a start on shard {other} refused with 23514 naming owner {owner}: {e.diag.message_primary}")
    checks.check(session.find(WORKFLOW, wid) == [], "the refused start wrote nothing on any shard")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", required=True, help="SHEAF_SHARDS form: 0=postgres://...,1=...")
    ap.add_argument("--tasks", type=int, default=60)
    ap.add_argument("--workflows", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=60, help="give up (and fail) after this long")
    args = ap.parse_args()
    shards = sf.parse_shards(args.shards)
    checks = Checks()
    digest = publish(shards, checks) if len(shards) > 1 else None
    session = sf.Session(shards, digest)
    for s in shards:
        session.one(s, "SELECT sheaf.declare_workflow(%s, %s)", WORKFLOW,
                    Jsonb({"queue": ORDERS, "activity_ends": "wake"}))
    if len(shards) > 1:
        misplaced_start_refused(session, checks)

    # The producer's first half lands before any worker runs: a repeat of a
    # key returns the unfinished task's id.
    half = args.tasks // 2
    placed = {seq: session.enqueue(JOBS, job_payload(seq), {"idempotency_key": f"job-{seq}"}) for seq in range(half)}
    again = session.enqueue(JOBS, job_payload(0), {"idempotency_key": "job-0"})
    checks.check(again == placed[0], "enqueueing job-0 again returned its unfinished task")

    app = App(lease=3.0)
    stop = threading.Event()
    threads = [threading.Thread(target=sf.maintain, args=(shards, 0.5, stop))]
    for s in shards:
        for n in range(2):
            opts = sf.WorkerOptions(f"py-worker-{s}-{n}", [ORDERS, ACTIVITIES, JOBS], lease=app.lease, idle_poll=0.5)
            threads.append(threading.Thread(target=sf.work, args=(shards, s, opts, app.handle, stop, app.done, digest)))
    for t in threads:
        t.start()
    started = time.monotonic()
    try:
        time.sleep(0.3)  # the workers drain the first half and sleep on LISTEN
        placed |= {seq: session.enqueue(JOBS, job_payload(seq), {"idempotency_key": f"job-{seq}"})
                   for seq in range(half, args.tasks)}
        runs = {f"order-{i}": [i + 1, i + 2, i + 3] for i in range(args.workflows)}
        homes = {wid: session.start_workflow(WORKFLOW, wid, {"items": items})[0] for wid, items in runs.items()}
        poison = {seq for seq in placed if job_payload(seq)["poison"]}
        while time.monotonic() - started < args.seconds:
            with app.lock:
                settled = len(app.settled["completed"]) + len(app.settled["dead_lettered"])
            ended = [r for wid in runs for _, r in session.find(WORKFLOW, wid) if r[1] not in ("RUNNING", "SUSPENDED")]
            if settled == len(placed) and len(ended) == len(runs):
                break
            time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join()
    print(f"ran {time.monotonic() - started:.1f}s on {len(shards)} shard(s): "
          + ", ".join(f"{k} {sum(v.values())}" for k, v in sorted(app.settled.items())))

    completed, dead = app.settled["completed"], app.settled["dead_lettered"]
    checks.check(sorted(completed) == sorted(set(placed) - poison) and set(completed.values()) == {1},
                 f"each of {len(placed) - len(poison)} tasks completed exactly once")
    checks.check(sorted(dead) == sorted(poison), f"the {len(poison)} poison tasks, and only they, dead-lettered")
    failing = sum(1 for seq in placed if job_payload(seq)["fail_once"] and seq not in poison)
    checks.check(app.settled["retried"].total() == failing and app.settled["snoozed"].total() == len(app.snoozed),
                 "the failing tasks were retried once, the snoozing ones snoozed once")
    checks.check(app.slow_attempts == [1], f"the slow task kept its lease by heartbeats (attempts {app.slow_attempts})")
    dead_rows = sum(len(session.rows(s, "SELECT task_id FROM sheaf.list_dead_letters(%s)", JOBS)) for s in shards)
    checks.check(dead_rows == len(poison), f"the dead letters across the shards: {dead_rows}")
    left = {(s, q): session.rows(s, "SELECT ready, scheduled, running, waiting FROM sheaf.queue_stats(%s)", q)[0]
            for s in shards for q in (JOBS, ORDERS, ACTIVITIES)}
    checks.check(all(v == (0, 0, 0, 0) for v in left.values()), "nothing left in any queue on any shard")
    task_shards = {s for s, _ in placed.values()}
    checks.check(task_shards == set(shards), f"keyed tasks placed on shards {sorted(task_shards)}")

    for wid, items in runs.items():
        found = session.find(WORKFLOW, wid)
        want = {"total": sum(10 * i for i in items)}
        checks.check([(s, r[1], r[2]) for s, r in found] == [(homes[wid], "COMPLETED", want)],
                     f"{wid}: found once across the shards, on shard {homes[wid]}, COMPLETED with {want}")
        if found:
            events = {t for (t,) in session.rows(found[0][0], "SELECT event_type FROM sheaf.history(%s)", found[0][1][0])}
            checks.check({"WorkflowSuspended", "WorkflowWoken"} <= events, f"{wid}: suspended, and woken by its activities")
    checks.check(set(homes.values()) == set(shards), f"the runs live on shards {sorted(set(homes.values()))}")

    listed: list[tuple[Any, ...]] = []
    after = None
    while True:
        page, after = session.list_page({"workflow_name": [WORKFLOW]}, after, 4)
        listed += page
        if after is None:
            break
    keys = [(r[1], r[2]) for r in listed]
    checks.check(sorted(r[4] for r in listed) == sorted(runs) and keys == sorted(keys, reverse=True),
                 f"listed across the shards in pages of 4: each of the {len(runs)} runs once, newest first")
    session.close()
    if checks.failed:
        print(f"{len(checks.failed)} check(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
