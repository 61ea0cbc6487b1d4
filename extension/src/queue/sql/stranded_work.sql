-- stranded_work: each queue with ready tasks and no live worker serving
-- it, with its ready count and the age of its oldest ready task.
-- $1 float8: seconds since a worker's last heartbeat that it counts as live
SELECT q.name,
       (SELECT count(*) FROM ready r WHERE r.queue = q.name),
       now() - (SELECT min(t.enqueued_at) FROM ready r JOIN tasks t ON t.id = r.task_id
                WHERE r.queue = q.name)
FROM queues q
WHERE EXISTS (SELECT 1 FROM ready r WHERE r.queue = q.name)
  AND NOT EXISTS (SELECT 1 FROM workers w WHERE q.name = ANY(w.queues)
                  AND w.last_seen_at > now() - make_interval(secs => $1))
ORDER BY q.name
