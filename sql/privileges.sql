-- Least privilege. Runs last in the install script, after every function exists.
--
-- Three roles, created once per cluster (roles are cluster-wide, so a second
-- database's CREATE EXTENSION reuses them). None can touch a table: every
-- function is SECURITY DEFINER with a pinned search_path, so a role's rights are
-- exactly the functions granted to it.
--   sheaf_worker: enqueue, claim, complete, fail, heartbeat, start and drive
--                 executions, the mutex, and read-only helpers (the relay's
--                 and the outbox's backlogs among them: metrics read them).
--   sheaf_relay:  the protocol: the relay's steps (take, start and close a
--                 child, report its end, deliver the outbox) and settling a
--                 committed move (activate, repoint, report). A member of
--                 sheaf_worker, because the relay also reads and signals
--                 runs through the worker surface (get_execution,
--                 find_execution, signal, cancel_execution): one role per
--                 relay login.
--   sheaf_admin:  everything a worker and the relay may do, plus init,
--                 policies, limits, redrive, terminate/pause/resume, quota
--                 recounts and migration.
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'sheaf_worker') THEN
        CREATE ROLE sheaf_worker NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'sheaf_relay') THEN
        CREATE ROLE sheaf_relay NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'sheaf_admin') THEN
        CREATE ROLE sheaf_admin NOLOGIN;
    END IF;
END
$roles$;
GRANT sheaf_worker TO sheaf_relay;
GRANT sheaf_worker TO sheaf_admin;
GRANT sheaf_relay TO sheaf_admin;

REVOKE ALL ON ALL TABLES IN SCHEMA @extschema@ FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA @extschema@ FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA @extschema@ FROM PUBLIC;
GRANT USAGE ON SCHEMA @extschema@ TO sheaf_worker, sheaf_admin;

-- Worker surface.
GRANT EXECUTE ON FUNCTION
    @extschema@.shard_id(),
    @extschema@.version(),
    @extschema@.new_id(),
    @extschema@.id_shard(uuid),
    @extschema@.id_timestamp(uuid),
    @extschema@.enqueue(text, jsonb, jsonb),
    @extschema@.enqueue_batch(text, jsonb[], jsonb),
    @extschema@.claim(text, text, integer, interval),
    @extschema@.complete(uuid, bigint, jsonb),
    @extschema@.complete_batch(uuid[], bigint[]),
    @extschema@.complete_and_claim(text, text, uuid[], bigint[], integer, interval),
    @extschema@.fail(uuid, bigint, text, interval),
    @extschema@.release(uuid, bigint),
    @extschema@.snooze(uuid, bigint, interval),
    @extschema@.dead_letter(uuid, bigint, text),
    @extschema@.complete_task_and_execution(uuid, bigint, jsonb),
    @extschema@.complete_task_and_fail_execution(uuid, bigint, text),
    @extschema@.complete_task_and_continue_as_new(uuid, bigint, jsonb),
    @extschema@.heartbeat(uuid, bigint, interval),
    @extschema@.reap_expired(integer),
    @extschema@.maintain(),
    @extschema@.worker_heartbeat(text, text[]),
    @extschema@.worker_deregister(text),
    @extschema@.live_workers(),
    @extschema@.stranded_work(),
    @extschema@.queue_stats(text),
    @extschema@.get_task(uuid),
    @extschema@.find_task(text, text),
    @extschema@.list_tasks(text, text, jsonb, integer),
    @extschema@.list_dead_letters(text, jsonb, integer),
    @extschema@.list_queues(),
    @extschema@.set_progress(uuid, bigint, jsonb),
    @extschema@.retention(),
    @extschema@.list_schedules(),
    @extschema@.rate_limits(),
    @extschema@.pending_starts(text, integer, text),
    @extschema@.schedule_fires(text, timestamp with time zone, integer),
    @extschema@.concurrency_stats(),
    @extschema@.start_workflow(text, text, jsonb, jsonb),
    @extschema@.find_execution(text, text),
    @extschema@.get_execution(uuid),
    @extschema@.history(uuid, bigint, integer),
    @extschema@.append_event(uuid, text, jsonb),
    @extschema@.upsert_search_attrs(uuid, jsonb),
    @extschema@.list_executions(jsonb, jsonb, integer, text),
    @extschema@.record_usage(uuid, jsonb),
    @extschema@.signal(uuid, text, jsonb, jsonb),
    @extschema@.signal_with_start(text, text, jsonb, text, jsonb, jsonb),
    @extschema@.continue_as_new(uuid, jsonb),
    @extschema@.start_child(uuid, text, text, jsonb, jsonb),
    @extschema@.cancel_child(uuid, uuid, text),
    @extschema@.list_children(uuid, uuid, integer),
    @extschema@.relay_backlog(),
    @extschema@.signal_external(uuid, text, text, text, jsonb, jsonb),
    @extschema@.cancel_external(uuid, text, text, text, jsonb),
    @extschema@.outbox_backlog(),
    @extschema@.published_topology(),
    @extschema@.place_start(text, text, jsonb),
    @extschema@.place_task(text, jsonb),
    @extschema@.place_mutex(text),
    @extschema@.locate_id(uuid),
    @extschema@.topology_projections(),
    @extschema@.misplaced_runs(integer),
    @extschema@.fleet_config(),
    @extschema@.complete_execution(uuid, jsonb),
    @extschema@.fail_execution(uuid, text),
    @extschema@.cancel_execution(uuid, text),
    @extschema@.suspend_execution(uuid, timestamptz),
    @extschema@.wake_execution(uuid),
    @extschema@.quota_usage(text),
    @extschema@.mutex_acquire(text, uuid, interval),
    @extschema@.mutex_release(text, uuid, bigint),
    @extschema@.mutex_leave(text, uuid),
    @extschema@.mutex_renew(text, uuid, bigint, interval),
    @extschema@.mutex_reclaim(integer),
    @extschema@.mutex_status(text),
    @extschema@.list_mutexes(text, integer),
    @extschema@.count_executions(jsonb, integer)
TO sheaf_worker;

-- Protocol surface: the relay's and rebalancing's steps. Each one trusts what
-- its caller reports (a child's end, a committed move, where a forward
-- points), so a worker credential must not reach them.
GRANT EXECUTE ON FUNCTION
    @extschema@.relay_take(integer, interval, uuid[]),
    @extschema@.relay_report(uuid, bigint, jsonb),
    @extschema@.relay_start_child(uuid, uuid, text, text, jsonb),
    @extschema@.relay_close_child(uuid, uuid, text, text),
    @extschema@.relay_pulled(uuid),
    @extschema@.seals_due(integer),
    @extschema@.seal_run_ended(uuid),
    @extschema@.outbox_take(integer, interval),
    @extschema@.outbox_report(uuid, bigint, jsonb),
    @extschema@.migration_activate(uuid),
    @extschema@.migration_report(bigint, bigint, text, text),
    @extschema@.migration_stalled(interval, integer, integer[]),
    @extschema@.migration_repoint(uuid, integer)
TO sheaf_relay;

-- Admin surface.
GRANT EXECUTE ON FUNCTION
    @extschema@.init_shard(integer),
    @extschema@.configure_queue(text, jsonb),
    @extschema@.set_concurrency_limit(text, integer),
    @extschema@.redrive(uuid[]),
    @extschema@.redrive_queue(text, interval, integer),
    @extschema@.purge_dead_letters(text, interval),
    @extschema@.drop_queue(text, boolean),
    @extschema@.cancel_task(uuid, text),
    @extschema@.set_retention(jsonb),
    @extschema@.create_schedule(text, jsonb),
    @extschema@.update_schedule(text, jsonb),
    @extschema@.pause_schedule(text),
    @extschema@.resume_schedule(text),
    @extschema@.delete_schedule(text),
    @extschema@.trigger_schedule(text),
    @extschema@.declare_rate_limit(text, jsonb),
    @extschema@.set_rate_override(text, double precision, interval, timestamp with time zone),
    @extschema@.clear_rate_override(text),
    @extschema@.audit_note(text, text, text, jsonb),
    @extschema@.cancel_pending_start(text, text, text),
    @extschema@.declare_workflow(text, jsonb),
    @extschema@.terminate_execution(uuid, text),
    @extschema@.pause_execution(uuid),
    @extschema@.resume_execution(uuid),
    @extschema@.quota_recompute(text),
    @extschema@.usage_report(timestamp with time zone, timestamp with time zone, text),
    @extschema@.list_child_links(uuid, uuid, integer),
    @extschema@.known_children(uuid[]),
    @extschema@.publish_topology(jsonb, boolean),
    @extschema@.audit_log(bigint, integer),
    @extschema@.rebalance_candidates(uuid, integer),
    @extschema@.relay_rows_to(integer, uuid, integer),
    @extschema@.migration_begin(uuid, integer, interval),
    @extschema@.migration_stage(jsonb),
    @extschema@.migration_verify(bigint, bigint, text),
    @extschema@.migration_cutover(bigint, bigint),
    @extschema@.migration_takeover(bigint, interval),
    @extschema@.migration_discard(uuid, integer, bigint),
    @extschema@.migrations(boolean, integer),
    @extschema@.erase_payloads(uuid),
    @extschema@.migration_seals(uuid, integer),
    @extschema@.migration_adopt_seal(jsonb)
TO sheaf_admin;
