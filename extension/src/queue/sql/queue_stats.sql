-- queue_stats: one queue's tasks by state, its dead letters, its live
-- workers, and the age of its oldest ready task.
-- $1 text:   the queue
-- $2 float8: seconds since a worker's last heartbeat that it counts as live
SELECT (SELECT count(*) FROM ready WHERE queue = $1),
       count(*) FILTER (WHERE state = 'scheduled'),
       count(*) FILTER (WHERE state = 'running'),
       count(*) FILTER (WHERE state = 'waiting'),
       (SELECT count(*) FROM dead_letters WHERE queue = $1),
       (SELECT count(*) FROM workers WHERE $1 = ANY(queues)
           AND last_seen_at > now() - make_interval(secs => $2)),
       now() - (SELECT min(t.enqueued_at) FROM ready r JOIN tasks t ON t.id = r.task_id
                WHERE r.queue = $1)
FROM tasks WHERE queue = $1
