"""sheaf from Python with psycopg 3: placement asked of the shards, a worker
loop, a maintenance loop, fan-out reads. Every call is plain SQL; what each
one means is in docs/guides/any-language.md."""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import psycopg
from psycopg.types.json import Jsonb

Json = Any


def parse_shards(spec: str) -> dict[int, str]:
    """`0=postgres://...,1=postgres://...` (SHEAF_SHARDS; newlines work too)."""
    shards: dict[int, str] = {}
    for item in spec.replace("\n", ",").split(","):
        if item.strip():
            sid, _, url = item.strip().partition("=")
            shards[int(sid)] = url
    if not shards:
        raise ValueError("no shards given")
    return shards


def canonical(projection: dict[str, Json]) -> str:
    """A projection's canonical form (docs/reference/placement.md): defaults
    filled in, sets ascending, residency by the key's UTF-8 bytes, forwards
    by id; `ensure_ascii=False` escapes exactly what serde_json does."""
    shards = sorted(projection["shards"])
    readable = sorted(projection.get("readable", shards))
    writable = sorted(projection.get("writable", readable))
    reserved = sorted(projection.get("reserved", []))
    default = projection.get("default", min((s for s in readable if s not in reserved), default=None))
    residency = sorted(projection.get("residency", {}).items(), key=lambda kv: kv[0].encode())
    forwards = sorted((int(k), v) for k, v in projection.get("forwards", {}).items())

    def dump(v: Json) -> str:
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"))

    out = (
        f'{{"shards":{dump(shards)},"readable":{dump(readable)},"writable":{dump(writable)},'
        f'"reserved":{dump(reserved)},"default":{dump(default)},'
        f'"residency":{{{",".join(f"{dump(k)}:{v}" for k, v in residency)}}},'
        f'"forwards":{{{",".join(f"{dump(str(k))}:{v}" for k, v in forwards)}}}'
    )
    if projection.get("tenants", "per_workflow") != "per_workflow":
        out += f',"tenants":{dump(projection["tenants"])}'
    return out + "}"


def digest(projection: dict[str, Json]) -> str:
    return "sha256:" + hashlib.sha256(canonical(projection).encode()).hexdigest()


class Misplaced(Exception):
    """23514: the shard does not own this start or keyed task."""

    def __init__(self, shard: int, owner_shard: int, message: str) -> None:
        super().__init__(f"shard {shard}: {message} (owner_shard {owner_shard})")
        self.owner_shard = owner_shard


def owner_in(error: psycopg.errors.CheckViolation) -> int:
    """The owning shard a 23514 refusal names in its DETAIL."""
    return int(json.loads(error.diag.message_detail or "{}")["owner_shard"])


class Session:
    """One autocommit connection per shard, opened on first use. Not
    thread-safe: one per thread, like a psycopg connection."""

    def __init__(self, shards: dict[int, str], digest: str | None = None) -> None:
        self.shards = shards
        # Declared on every connection, as the Rust driver does: a shard with
        # another topology published refuses this client's placed work.
        self.options = f"-c sheaf.topology_digest={digest}" if digest else ""
        self._conns: dict[int, psycopg.Connection[Any]] = {}
        self._next = itertools.cycle(sorted(shards))

    def conn(self, shard: int) -> psycopg.Connection[Any]:
        if shard not in self._conns or self._conns[shard].closed:
            self._conns[shard] = psycopg.connect(self.shards[shard], autocommit=True, options=self.options)
        return self._conns[shard]

    def rows(self, shard: int, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return self.conn(shard).execute(sql, params).fetchall()

    def one(self, shard: int, sql: str, *params: Any) -> Any:
        return self.rows(shard, sql, *params)[0][0]

    def close(self) -> None:
        for c in self._conns.values():
            c.close()

    # Placement: one shard owns everything; else any shard answers for the
    # topology published on it (the first that answers is asked).
    def _place(self, sql: str, *params: Any) -> int | None:
        if len(self.shards) == 1:
            return next(iter(self.shards))
        errors = []
        for shard in sorted(self.shards):
            try:
                owner: int | None = self.one(shard, sql, *params)
                return owner
            except psycopg.OperationalError as e:
                errors.append(f"shard {shard}: {e}")
        raise ConnectionError("no shard answered placement: " + "; ".join(errors))

    def owner_of_start(self, name: str, workflow_id: str, opts: dict[str, Json] | None = None) -> int:
        owner = self._place("SELECT sheaf.place_start(%s, %s, %s)", name, workflow_id, Jsonb(opts or {}))
        assert owner is not None, "place_start always names a shard"
        return owner

    def start_workflow(self, name: str, workflow_id: str, payload: Json, opts: dict[str, Json] | None = None) -> tuple[int, uuid.UUID, bool]:
        shard = self.owner_of_start(name, workflow_id, opts)
        try:
            eid, created = self.rows(
                shard, "SELECT execution_id, created FROM sheaf.start_workflow(%s, %s, %s, %s)",
                name, workflow_id, Jsonb(payload), Jsonb(opts or {}),
            )[0]
        except psycopg.errors.CheckViolation as e:
            raise Misplaced(shard, owner_in(e), str(e)) from e
        return shard, eid, created

    def enqueue(self, queue: str, payload: Json, opts: dict[str, Json] | None = None) -> tuple[int, uuid.UUID]:
        owner = self._place("SELECT sheaf.place_task(%s, %s)", queue, Jsonb(opts or {}))
        shard = owner if owner is not None else next(self._next)  # no key: any writable shard
        try:
            return shard, self.one(shard, "SELECT sheaf.enqueue(%s, %s, %s)", queue, Jsonb(payload), Jsonb(opts or {}))
        except psycopg.errors.CheckViolation as e:
            raise Misplaced(shard, owner_in(e), str(e)) from e

    # Fan-out reads: every shard is asked; one that cannot answer raises
    # (never a silent gap).
    def find(self, name: str, workflow_id: str) -> list[tuple[int, tuple[Any, ...]]]:
        """Every shard's run of (name, workflow_id): its active one, else its latest ended."""
        found = []
        for shard in sorted(self.shards):
            found += [(shard, r) for r in self.rows(
                shard, "SELECT execution_id, state, result FROM sheaf.find_execution(%s, %s)", name, workflow_id)]
        return found

    def list_page(self, filter: dict[str, Json], after: dict[str, str] | None, page: int) -> tuple[list[tuple[Any, ...]], dict[str, str] | None]:
        """One page of executions across shards, newest first. Each shard
        sends page + 1 rows after the same keyset anchor (the order is
        global); the merge keeps `page`; the next anchor is the last row's
        (created_at, execution_id), None at the end."""
        per_shard = [
            [(shard, *r) for r in self.rows(
                shard, "SELECT created_at, execution_id, workflow_name, workflow_id, state "
                "FROM sheaf.list_executions(%s, %s, %s, 'desc')",
                Jsonb(filter), Jsonb(after) if after else None, page + 1)]
            for shard in sorted(self.shards)
        ]
        merged = list(itertools.islice(heapq.merge(*per_shard, key=lambda r: (r[1], r[2]), reverse=True), page + 1))
        rows = merged[:page]
        more = len(merged) > page
        return rows, ({"created_at": rows[-1][1].isoformat(), "execution_id": str(rows[-1][2])} if more else None)


# The worker loop.

@dataclass
class Complete:
    result: Json = None


@dataclass
class Snooze:
    seconds: float


class Handled:
    """The handler finished the task itself (in a transaction of its own)."""


class Retry(Exception):
    def __init__(self, error: str, after: float | None = None) -> None:
        super().__init__(error)
        self.after = after


class DeadLetter(Exception):
    pass


@dataclass
class Task:
    shard: int
    task_id: uuid.UUID
    token: int
    payload: Json
    attempt: int
    execution_id: uuid.UUID | None
    kind: str
    queue: str
    session: Session
    heartbeat: Callable[[], None] = field(repr=False)


Outcome = Complete | Snooze | Handled
Handler = Callable[[Task], Outcome]


@dataclass
class WorkerOptions:
    name: str
    queues: list[str]
    lease: float = 30.0  # seconds; heartbeats every third of it
    batch: int = 10
    idle_poll: float = 1.0  # LISTEN cannot replace it: tasks coming due notify no one
    register_every: float = 20.0  # the registry forgets a worker after 60 s


Done = Callable[[Task, str], None]


def work(shards: dict[int, str], shard: int, opts: WorkerOptions, handler: Handler, stop: threading.Event,
         done: Done = lambda task, how: None, digest: str | None = None) -> None:
    """Claims from `opts.queues` on `shard` until `stop`, handling each task;
    `done(task, how)` after each call that settled it (`completed`,
    `retried`, `dead_lettered`, `snoozed`, `handled`) took effect."""
    session = Session(shards, digest)
    conn = session.conn(shard)
    listener = psycopg.connect(shards[shard], autocommit=True)
    listener.execute("LISTEN sheaf_ready")
    lease = f"{opts.lease} seconds"
    registered = 0.0
    try:
        while not stop.is_set():
            if time.monotonic() - registered > opts.register_every:
                conn.execute("SELECT sheaf.worker_heartbeat(%s, %s)", (opts.name, opts.queues))
                registered = time.monotonic()
            claimed = 0
            for queue in opts.queues:
                rows = conn.execute(
                    "SELECT task_id, token, payload, attempt, execution_id, kind FROM sheaf.claim(%s, %s, %s, %s)",
                    (queue, opts.name, opts.batch, lease)).fetchall()
                claimed += len(rows)
                _handle_batch(session, shard, queue, rows, opts.lease, handler, done)
            if not claimed:
                # Sleep until a queue of this shard gets ready work, or the poll.
                for _ in listener.notifies(timeout=opts.idle_poll, stop_after=1):
                    pass
        conn.execute("SELECT sheaf.worker_deregister(%s)", (opts.name,))
    finally:
        listener.close()
        session.close()


def _handle_batch(session: Session, shard: int, queue: str, rows: Iterable[tuple[Any, ...]], lease: float, handler: Handler, done: Done) -> None:
    conn = session.conn(shard)
    in_hand = {r[0]: r[1] for r in rows}
    last_beat = time.monotonic()

    def beat() -> None:
        """Extends the lease of every task in hand (a long handler calls it)."""
        nonlocal last_beat
        for tid, token in list(in_hand.items()):
            try:
                conn.execute("SELECT sheaf.heartbeat(%s, %s)", (tid, token))
            except psycopg.Error as e:
                if not _lost(conn, tid, token, e):
                    raise
                in_hand.pop(tid)
        last_beat = time.monotonic()

    for tid, token, payload, attempt, eid, kind in rows:
        if time.monotonic() - last_beat > lease / 3:
            beat()
        if tid not in in_hand:
            continue
        task = Task(shard, tid, token, payload, attempt, eid, kind, queue, session, beat)
        try:
            try:
                outcome = handler(task)
            except Retry as e:
                conn.execute("SELECT * FROM sheaf.fail(%s, %s, %s, %s)",
                             (tid, token, str(e), None if e.after is None else f"{e.after} seconds"))
                how = "retried"
            except DeadLetter as e:
                conn.execute("SELECT sheaf.dead_letter(%s, %s, %s)", (tid, token, str(e)))
                how = "dead_lettered"
            except Exception as e:  # a bug or an outage in the handler: retried with backoff
                conn.execute("SELECT * FROM sheaf.fail(%s, %s, %s)", (tid, token, repr(e)))
                how = "retried"
            else:
                if isinstance(outcome, Complete):
                    conn.execute("SELECT sheaf.complete(%s, %s, %s)",
                                 (tid, token, None if outcome.result is None else Jsonb(outcome.result)))
                    how = "completed"
                elif isinstance(outcome, Snooze):
                    conn.execute("SELECT sheaf.snooze(%s, %s, %s)", (tid, token, f"{outcome.seconds} seconds"))
                    how = "snoozed"
                else:
                    how = "handled"
            done(task, how)
        except psycopg.Error as e:
            if not _lost(conn, tid, token, e):
                raise
        in_hand.pop(tid, None)


def _lost(conn: psycopg.Connection[Any], tid: uuid.UUID, token: int, e: psycopg.Error) -> bool:
    """Whether `e` says the task is no longer this worker's to finish: 55P03
    (the lease was lost, the task went back or to another claim), P0002 (it
    is gone), 57000 (an operator cancelled it: give it back, which ends it)."""
    if isinstance(e, psycopg.errors.OperatorIntervention):
        conn.execute("SELECT sheaf.release(%s, %s)", (tid, token))
    return isinstance(e, (psycopg.errors.LockNotAvailable, psycopg.errors.NoDataFound,
                          psycopg.errors.OperatorIntervention))


def maintain(shards: dict[int, str], every: float, stop: threading.Event) -> int:
    """`sheaf.maintain()` on every shard every `every` seconds until `stop`;
    returns how many rounds it ran. Several of these may run at once."""
    session = Session(shards)
    rounds = 0
    try:
        while True:
            for shard in sorted(shards):
                session.one(shard, "SELECT sheaf.maintain()")
            rounds += 1
            if stop.wait(every):
                return rounds
    finally:
        session.close()
