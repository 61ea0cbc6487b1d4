-- list_queues: every queue with its settings and counts. Each state is
-- counted on its own index; the waiting and paused tasks (whose indexes
-- have no queue) are counted once, grouped.
-- No parameters.
SELECT q.name, q.aging_secs, q.fairness, q.notify, q.created_at,
       (SELECT count(*) FROM ready r WHERE r.queue = q.name),
       (SELECT count(*) FROM tasks t WHERE t.queue = q.name AND t.state = 'scheduled'),
       (SELECT count(*) FROM tasks t WHERE t.queue = q.name AND t.state = 'running'),
       coalesce(w.n, 0), coalesce(p.n, 0),
       (SELECT count(*) FROM dead_letters d WHERE d.queue = q.name),
       now() - (SELECT min(t.enqueued_at) FROM ready r JOIN tasks t ON t.id = r.task_id
                WHERE r.queue = q.name)
FROM queues q
LEFT JOIN (SELECT queue, count(*) AS n FROM tasks WHERE state = 'waiting' GROUP BY queue) w
  ON w.queue = q.name
LEFT JOIN (SELECT t.queue, count(*) AS n FROM executions e JOIN tasks t ON t.execution_id = e.id
           WHERE e.state = 'PAUSED' AND t.state = 'paused' GROUP BY t.queue) p
  ON p.queue = q.name
ORDER BY q.name
