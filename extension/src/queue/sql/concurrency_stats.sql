-- concurrency_stats: per concurrency key (capped, or with unfinished
-- tasks), its cap (NULL if uncapped) and its running, ready and waiting
-- tasks.
-- No parameters.
SELECT coalesce(c.key, t.concurrency_key), l.max_running,
       coalesce(t.running, 0), coalesce(t.ready, 0), coalesce(t.waiting, 0)
FROM (SELECT concurrency_key,
             count(*) FILTER (WHERE state = 'running') AS running,
             count(*) FILTER (WHERE state = 'ready') AS ready,
             count(*) FILTER (WHERE state = 'waiting') AS waiting
      FROM tasks WHERE concurrency_key IS NOT NULL GROUP BY concurrency_key) t
FULL JOIN (SELECT key FROM concurrency_limits) c ON c.key = t.concurrency_key
LEFT JOIN concurrency_limits l ON l.key = coalesce(c.key, t.concurrency_key)
ORDER BY 1
