//! Enqueue and start inside the caller's own transaction on a shard (River's
//! `InsertTx`), for an application whose data lives in that shard's
//! database: the task or execution commits with the application's rows, or
//! rolls back with them.
//!
//! ```no_run
//! # async fn f(client: &sheaf_driver::Client, shard: sheaf_driver::ShardId) -> Result<(), Box<dyn std::error::Error>> {
//! use sheaf_driver::{EnqueueOptions, OnShard};
//! let mut conn = client.shard_connection(shard).await?;
//! let tx = conn.transaction().await?;
//! tx.execute("INSERT INTO orders (id) VALUES (1)", &[]).await?;
//! let on = OnShard::verify(&tx, shard).await?;
//! on.enqueue("emails", serde_json::json!({"order": 1}), EnqueueOptions::new()).await?;
//! tx.commit().await?; // the order and its task, or neither
//! # Ok(()) }
//! ```
//!
//! The transaction may come from anywhere (this client's pool through
//! [`Client::shard_connection`], or the application's own pool): every id is
//! minted for the shard, so [`OnShard::verify`] asks the database which shard
//! it is (`sheaf.shard_id()`) once, and a connection to another shard is
//! refused ([`ClientError::WrongState`]), never silently accepted (its ids
//! would route elsewhere). Calls here are not retried: a deadlock aborts the
//! caller's transaction, which is the caller's to retry.

use std::ops::{Deref, DerefMut};

use tokio_postgres::GenericClient;

use super::batch::{EnqueuedBatch, MAX_BATCH};
use super::options::placement_opt;
use super::{Call, Client, ClientError, EnqueueOptions, Enqueued, Owned, StartOptions, Started};
use crate::id::{ExecutionId, TaskId};
use crate::json::Json;
use crate::router::Placement;
use crate::topology::ShardId;

const SHARD_ID: &str = "SELECT sheaf.shard_id(), \
     (SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'sheaf')";
const ENQUEUE_BATCH: &str =
    "SELECT sheaf.enqueue_batch($1, $2, $3 || jsonb_build_object('run_at', $4::timestamptz))";
const START: &str = "SELECT execution_id, created, superseded \
     FROM sheaf.start_workflow($1, $2, $3, $4 || jsonb_build_object('run_at', $5::timestamptz))";

/// A connection from this client's pool for one shard (see the module):
/// open a transaction on it with [`ShardConnection::transaction`].
pub struct ShardConnection {
    conn: deadpool_postgres::Object,
    shard: ShardId,
}

impl std::fmt::Debug for ShardConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardConnection")
            .field("shard", &self.shard)
            .finish_non_exhaustive()
    }
}

impl ShardConnection {
    /// The shard the pool connects to.
    pub fn shard(&self) -> ShardId {
        self.shard
    }

    /// Begins a transaction (READ COMMITTED unless the session says
    /// otherwise: starts refuse stricter levels).
    pub async fn transaction(&mut self) -> Result<tokio_postgres::Transaction<'_>, ClientError> {
        let call = Call {
            shard: self.shard,
            owned: Owned::Shard,
        };
        let client: &mut tokio_postgres::Client = &mut self.conn;
        client.transaction().await.map_err(|e| call.error(e, 1))
    }
}

impl Deref for ShardConnection {
    type Target = tokio_postgres::Client;

    fn deref(&self) -> &tokio_postgres::Client {
        &self.conn
    }
}

impl DerefMut for ShardConnection {
    fn deref_mut(&mut self) -> &mut tokio_postgres::Client {
        &mut self.conn
    }
}

impl Client {
    /// A connection to `shard` from its pool (bounded wait, breaker and
    /// schema checks as for every call), for a transaction of the caller's.
    /// It goes back to the pool when dropped.
    pub async fn shard_connection(&self, shard: ShardId) -> Result<ShardConnection, ClientError> {
        let call = Call {
            shard,
            owned: Owned::Shard,
        };
        let conn = self.pools.get(shard).await.map_err(|e| call.unavailable(e))?;
        Ok(ShardConnection { conn, shard })
    }
}

/// A connection or transaction of the caller's, verified to be shard
/// `shard`: enqueues and starts run in it, with ids minted for that shard.
pub struct OnShard<'c, C> {
    conn: &'c C,
    shard: ShardId,
    /// Whether its schema takes `opts.placement` (0.3.0 on): keyed work
    /// and starts then say they are placed here, as the shard checks.
    takes_placement: bool,
}

impl<C> std::fmt::Debug for OnShard<'_, C> {
    /// The shard only: the connection is the caller's.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnShard")
            .field("shard", &self.shard)
            .finish_non_exhaustive()
    }
}

impl<'c, C: GenericClient + Sync> OnShard<'c, C> {
    /// Checks once that `conn` is shard `shard` (`sheaf.shard_id()`); any
    /// other shard, or an uninitialized database, is
    /// [`ClientError::WrongState`].
    pub async fn verify(conn: &'c C, shard: ShardId) -> Result<OnShard<'c, C>, ClientError> {
        let call = Call {
            shard,
            owned: Owned::Shard,
        };
        let row = conn
            .query_one(SHARD_ID, &[])
            .await
            .map_err(|e| call.error(e, 1))?;
        let reported: i32 = row.try_get(0).map_err(|e| call.error(e, 1))?;
        let schema: Option<String> = row.try_get(1).map_err(|e| call.error(e, 1))?;
        if reported != i32::from(shard.get()) {
            return Err(ClientError::WrongState {
                shard,
                message: format!(
                    "this connection's database is shard {reported}, not shard {shard}: ids minted for shard {shard} would route elsewhere"
                ),
            });
        }
        Ok(OnShard {
            conn,
            shard,
            takes_placement: schema.is_some_and(|v| crate::schema::takes_placement(&v)),
        })
    }

    /// The shard the connection is.
    pub fn shard(&self) -> ShardId {
        self.shard
    }

    /// Enqueues one task in the transaction. A task of an execution must
    /// be of an execution living on this shard, wherever it was born (one
    /// that moved away is [`ClientError::Moved`]); a placement other than
    /// this shard is refused ([`ClientError::BadRequest`]).
    pub async fn enqueue(
        &self,
        queue: &str,
        payload: impl Into<Json>,
        options: EnqueueOptions,
    ) -> Result<Enqueued, ClientError> {
        let batch = self.enqueue_batch(queue, [payload.into()], options).await?;
        match batch.task_ids.as_slice() {
            [task_id] => Ok(Enqueued {
                task_id: *task_id,
                shard: self.shard,
            }),
            ids => Err(ClientError::Database {
                shard: self.shard,
                code: None,
                message: format!("enqueueing one payload returned {} ids", ids.len()),
            }),
        }
    }

    /// Enqueues 1..=10,000 payloads in the transaction, ids in order.
    pub async fn enqueue_batch<P: Into<Json>>(
        &self,
        queue: &str,
        payloads: impl IntoIterator<Item = P>,
        options: EnqueueOptions,
    ) -> Result<EnqueuedBatch, ClientError> {
        let payloads: Vec<Json> = payloads.into_iter().map(Into::into).collect();
        if payloads.is_empty() || payloads.len() > MAX_BATCH {
            return Err(ClientError::BadRequest(format!(
                "a batch holds 1 to {MAX_BATCH} payloads, got {}",
                payloads.len()
            )));
        }
        // A task of an execution goes where the run lives, which its id
        // does not say (it may have moved here, or away): the shard decides,
        // refusing a run it does not hold (P0002) and one that moved away
        // (ClientError::Moved, naming where it lives).
        self.check_placement(options.placement.as_ref())?;
        let call = Call {
            shard: self.shard,
            owned: match options.execution {
                Some(id) => Owned::Execution(id),
                None => Owned::Queue(queue.to_owned()),
            },
        };
        let mut opts = options.to_sql_opts();
        // A keyed task here is placed here in so many words: the shard
        // checks its key's home otherwise.
        let keyed = options.idempotency_key.is_some() || options.rate_key.is_some();
        if keyed && options.execution.is_none() {
            self.place_here(&mut opts);
        }
        let rows = self
            .conn
            .query(ENQUEUE_BATCH, &[&queue, &payloads, &opts, &options.run_at])
            .await
            .map_err(|e| call.error(e, 1))?;
        let task_ids = rows
            .iter()
            .map(|row| row.try_get::<_, uuid::Uuid>(0).map(TaskId::from_uuid))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| call.error(e, 1))?;
        Ok(EnqueuedBatch {
            task_ids,
            shard: self.shard,
        })
    }

    /// Starts `name` with `workflow_id` in the transaction (or attaches to
    /// its active execution on this shard), with an id minted for this
    /// shard. The start goes here whatever the router would pick: look it
    /// up by id, or with [`Client::find_execution`] pinned to this shard.
    /// A placement other than this shard, or a tenant, is refused.
    pub async fn start_workflow(
        &self,
        name: &str,
        workflow_id: &str,
        input: impl Into<Json>,
        options: StartOptions,
    ) -> Result<Started, ClientError> {
        self.check_placement(options.placement.as_ref())?;
        if options.tenant.is_some() {
            return Err(ClientError::BadRequest(
                "a start in a transaction goes to its connection's shard; a tenant would place it".into(),
            ));
        }
        let input = input.into();
        let execution_id = ExecutionId::mint(self.shard)?;
        let mut opts = options.to_sql_opts(execution_id);
        self.place_here(&mut opts);
        let call = Call {
            shard: self.shard,
            owned: Owned::Workflow {
                name: name.to_owned(),
                workflow_id: workflow_id.to_owned(),
            },
        };
        let rows = self
            .conn
            .query(START, &[&name, &workflow_id, &input, &opts, &options.run_at])
            .await
            .map_err(|e| call.error(e, 1))?;
        super::executions::started_from_rows(&call, &rows)
    }

    /// Says in `opts` that the work is placed on this shard (a shard whose
    /// topology places it elsewhere takes it so).
    fn place_here(&self, opts: &mut serde_json::Value) {
        let placement = placement_opt(Some(&Placement::Shard(self.shard)), None);
        if let (true, serde_json::Value::Object(m), Some(p)) = (self.takes_placement, opts, placement) {
            m.insert("placement".into(), p);
        }
    }

    fn check_placement(&self, placement: Option<&Placement>) -> Result<(), ClientError> {
        match placement {
            None | Some(Placement::Auto) => Ok(()),
            Some(Placement::Shard(s)) if *s == self.shard => Ok(()),
            Some(_) => Err(ClientError::BadRequest(format!(
                "work enqueued or started in a transaction goes to its connection's shard ({}); it takes no other placement",
                self.shard
            ))),
        }
    }
}
