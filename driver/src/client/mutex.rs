//! The durable mutex: typed calls, and [`MutexGuard`], a held lock that
//! renews its lease in the background, reports a lost lease, and releases
//! when dropped.
//!
//! **Routing.** A mutex is shard-local: contending owners must meet on one
//! shard, one home per key at a time. A [`MutexKey`] says which: by default
//! the key is placed as a start is (routing key `mutex__<key>`, key bytes
//! `0x01 ‖ "mutex__" ‖ key`): rendezvous hashing over every shard, a winner
//! that is not writable and unreserved re-hashed among those that are, so
//! adding a read-only shard (the first step of a rollout) moves no key. A
//! change of the writable set moves ~1/N of the keys at once, for each
//! client as it reloads its topology; `mutex_acquire` checks the client's
//! declared topology digest as placed work does, so a client the shards no
//! longer accept is refused, but a lock held across such a change can get a
//! second holder at the key's new home: let contended keys go idle across
//! it, or pin them with [`MutexKey::on_shard`].
//! [`MutexKey::of_execution`] puts the lock on the shard the execution's id
//! names, its *origin*, not where it lives now: contenders must meet on one
//! shard however the run moves, and the origin is the one every holder of
//! the id can compute. The execution ending releases such a lock while it
//! lives there; after it moved away, the lock's lease ends it.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;
use sheaf_core::listing::listing_hash;
use sheaf_core::page::SortOrder;

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use super::listing::{check_page, paginate, shard_cursor};
use super::{Admin, Call, Client, ClientError, ListPage, Owned, first_column, single};
use crate::id::ExecutionId;
use crate::topology::ShardId;

const ACQUIRE: &str =
    "SELECT granted, token, queue_position FROM sheaf.mutex_acquire($1, $2, make_interval(secs => $3))";
const RELEASE: &str = "SELECT sheaf.mutex_release($1, $2, $3)";
const RENEW: &str = "SELECT sheaf.mutex_renew($1, $2, $3, make_interval(secs => $4))";
const LEAVE: &str = "SELECT sheaf.mutex_leave($1, $2)";
const STATUS: &str = "SELECT holder, token, lease_expires_at, waiters FROM sheaf.mutex_status($1)";
const RECLAIM: &str = "SELECT sheaf.mutex_reclaim($1)";
const LIST: &str = "SELECT key, holder, token, acquired_at, lease_expires_at, waiters \
     FROM sheaf.list_mutexes($1, $2)";

/// A mutex key and the shard it lives on (see the module's "Routing").
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MutexKey {
    key: String,
    route: Route,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Route {
    Hashed,
    Shard(ShardId),
    Execution(ExecutionId),
}

impl MutexKey {
    /// `key` on the shard its rendezvous hash picks, as a start's.
    pub fn new(key: impl Into<String>) -> MutexKey {
        MutexKey {
            key: key.into(),
            route: Route::Hashed,
        }
    }

    /// `key` on exactly `shard`.
    pub fn on_shard(key: impl Into<String>, shard: ShardId) -> MutexKey {
        MutexKey {
            key: key.into(),
            route: Route::Shard(shard),
        }
    }

    /// `key` on the shard `execution`'s id names (its origin; see the
    /// module's "Routing"): an owner that is that execution releases it
    /// when the execution ends there.
    pub fn of_execution(key: impl Into<String>, execution: ExecutionId) -> MutexKey {
        MutexKey {
            key: key.into(),
            route: Route::Execution(execution),
        }
    }

    /// The key, as the shard knows it.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl From<&str> for MutexKey {
    fn from(key: &str) -> MutexKey {
        MutexKey::new(key)
    }
}

impl From<String> for MutexKey {
    fn from(key: String) -> MutexKey {
        MutexKey::new(key)
    }
}

/// What `mutex_acquire` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Acquired {
    /// The owner holds the lock under this fencing token (a later holder
    /// always gets a larger one).
    Granted {
        /// The fencing token: release and renew must carry it.
        token: i64,
    },
    /// The owner waits in the FIFO line; acquiring again within a third of
    /// the lease keeps the place.
    Queued {
        /// 1 = next.
        position: i32,
    },
}

/// A mutex key's state (`sheaf.mutex_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MutexStatus {
    /// The holder; `None` when free.
    pub holder: Option<uuid::Uuid>,
    /// The holder's fencing token.
    pub token: Option<i64>,
    /// When the holder's lease ends unless renewed.
    pub lease_expires_at: Option<SystemTime>,
    /// How many owners wait in line.
    pub waiters: i32,
}

impl Client {
    /// The shard `key` lives on (see the module's "Routing").
    pub fn mutex_shard(&self, key: &MutexKey) -> ShardId {
        match key.route {
            Route::Shard(shard) => shard,
            // Origin, not residence: the one shard every contender computes
            // from the id alone, whatever moves the run made.
            Route::Execution(id) => id.route(&self.topology),
            Route::Hashed => self.topology.mutex_home(&key.key),
        }
    }

    fn mutex_call(&self, key: &MutexKey) -> Call {
        Call {
            shard: self.mutex_shard(key),
            owned: Owned::Mutex(key.key.clone()),
        }
    }

    /// Acquires `key` for `owner` under a lease, or queues the owner (FIFO).
    /// Acquiring again within a third of the lease keeps the place (and
    /// renews it) and returns the grant once it comes (the lease starts
    /// then); an owner that waited longer without asking lost its place and
    /// joins at the back. The holder acquiring again gets the same token.
    pub async fn mutex_acquire(
        &self,
        key: &MutexKey,
        owner: uuid::Uuid,
        lease: Duration,
    ) -> Result<Acquired, ClientError> {
        let call = self.mutex_call(key);
        let rows = self
            .query(&call, ACQUIRE, &[&key.key, &owner, &lease.as_secs_f64()])
            .await?;
        let row = single(&call, &rows)?;
        let read = || -> Result<(bool, Option<i64>, i32), tokio_postgres::Error> {
            Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
        };
        match read().map_err(|e| call.error(e, 1))? {
            (true, Some(token), _) => Ok(Acquired::Granted { token }),
            (false, _, position) => Ok(Acquired::Queued { position }),
            (true, None, _) => Err(ClientError::Database {
                shard: call.shard,
                code: None,
                message: "mutex_acquire granted the lock without a token".into(),
            }),
        }
    }

    /// Releases `key` held by `owner` under `token`; the next holder, if a
    /// waiter was handed the lock. [`ClientError::StaleToken`] if `owner`
    /// does not hold it under `token` (nothing changes).
    pub async fn mutex_release(
        &self,
        key: &MutexKey,
        owner: uuid::Uuid,
        token: i64,
    ) -> Result<Option<uuid::Uuid>, ClientError> {
        let call = self.mutex_call(key);
        let rows = self.query(&call, RELEASE, &[&key.key, &owner, &token]).await?;
        first_column(&call, &rows)
    }

    /// `owner` gives up waiting for `key`: it leaves the line, and a lock it
    /// holds (a grant handed to it that it never picked up) goes to the next
    /// waiter, returned (`None` if none, or if `owner` held nothing).
    pub async fn mutex_leave(
        &self,
        key: &MutexKey,
        owner: uuid::Uuid,
    ) -> Result<Option<uuid::Uuid>, ClientError> {
        let call = self.mutex_call(key);
        let rows = self.query(&call, LEAVE, &[&key.key, &owner]).await?;
        first_column(&call, &rows)
    }

    /// Extends the holder's lease to now + `lease`; the new end.
    /// [`ClientError::StaleToken`] if the lock is no longer `owner`'s under `token`.
    pub async fn mutex_renew(
        &self,
        key: &MutexKey,
        owner: uuid::Uuid,
        token: i64,
        lease: Duration,
    ) -> Result<SystemTime, ClientError> {
        let call = self.mutex_call(key);
        let rows = self
            .query(&call, RENEW, &[&key.key, &owner, &token, &lease.as_secs_f64()])
            .await?;
        first_column(&call, &rows)
    }

    /// `key`'s holder and line.
    pub async fn mutex_status(&self, key: &MutexKey) -> Result<MutexStatus, ClientError> {
        let call = self.mutex_call(key);
        let rows = self.query(&call, STATUS, &[&key.key]).await?;
        let Some(row) = rows.first() else {
            return Ok(MutexStatus {
                holder: None,
                token: None,
                lease_expires_at: None,
                waiters: 0,
            });
        };
        let read = || -> Result<MutexStatus, tokio_postgres::Error> {
            Ok(MutexStatus {
                holder: row.try_get(0)?,
                token: row.try_get(1)?,
                lease_expires_at: row.try_get(2)?,
                waiters: row.try_get(3)?,
            })
        };
        read().map_err(|e| call.error(e, 1))
    }

    /// Waits for `key` (FIFO, polling every `options.poll` times its place in
    /// line, and at least three times per place lease: a ninth of the lease)
    /// and returns the
    /// held lock as a [`MutexGuard`].
    /// Call within a tokio runtime.
    ///
    /// Dropping this future while it waits (a `select!`, a timeout) does not
    /// leave the owner in line holding up the others: a spawned task takes it
    /// out of the line ([`Client::mutex_leave`]).
    pub async fn lock(
        self: &Arc<Self>,
        key: impl Into<MutexKey>,
        options: LockOptions,
    ) -> Result<MutexGuard, ClientError> {
        let key = key.into();
        let owner = options.owner.unwrap_or_else(uuid::Uuid::new_v4);
        let mut waiting = Waiting {
            client: Arc::clone(self),
            key: key.clone(),
            owner,
            options: options.clone(),
            armed: true,
        };
        let token = loop {
            match self.mutex_acquire(&key, owner, options.lease).await {
                Ok(Acquired::Granted { token }) => break token,
                Ok(Acquired::Queued { position }) => tokio::time::sleep(options.waiting_poll(position)).await,
                Err(e) => {
                    // Nothing was granted if the call failed before the shard
                    // answered; the leave task settles a grant it missed.
                    return Err(e);
                }
            }
        };
        waiting.armed = false;
        Ok(MutexGuard::start(Arc::clone(self), key, owner, token, options))
    }

    /// [`Client::lock`], giving up after `wait`: `None` then (and the
    /// owner's place in line is given up as when `lock` is dropped).
    pub async fn try_lock(
        self: &Arc<Self>,
        key: impl Into<MutexKey>,
        options: LockOptions,
        wait: Duration,
    ) -> Result<Option<MutexGuard>, ClientError> {
        match tokio::time::timeout(wait, self.lock(key, options)).await {
            Ok(result) => result.map(Some),
            Err(_) => Ok(None),
        }
    }
}

/// A held mutex in a listing ([`Admin::list_mutexes`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ListedMutex {
    /// The shard that holds it (each shard's mutexes are its own).
    pub shard: ShardId,
    /// Its key.
    pub key: String,
    /// Its holder: the owner id its acquire named (as a rule an execution
    /// id, or a [`LockOptions::owner`]).
    pub holder: uuid::Uuid,
    /// The holder's fencing token.
    pub token: i64,
    /// When it was granted to its holder.
    pub acquired_at: SystemTime,
    /// When its lease ends; past: expired, passed on at the key's next
    /// acquire or reclaim.
    pub lease_expires_at: SystemTime,
    /// Owners waiting in its line (lapsed places not counted).
    pub waiters: i32,
}

impl Admin<'_> {
    /// Passes up to `max_rows` expired locks on `shard` to their next
    /// waiters (also done by `maintain` and by any acquire of the key); how many.
    pub async fn mutex_reclaim(self, shard: ShardId, max_rows: i32) -> Result<i32, ClientError> {
        let (call, rows) = self
            .client
            .on_shard(shard, Owned::Shard, RECLAIM, &[&max_rows])
            .await?;
        first_column(&call, &rows)
    }

    /// One page of the held mutexes of every readable shard, by key (then
    /// shard: a key may be held on two shards, each its own lock); a free
    /// key is not stored, so not listed. `cursor` is a page's
    /// `next_cursor`; `page_size` 1 to [`MAX_TASK_PAGE`](crate::MAX_TASK_PAGE).
    /// Each shard walks its key index from its own anchor, so paging to
    /// the end lists every lock that stayed held exactly once.
    pub async fn list_mutexes(
        self,
        cursor: Option<&str>,
        page_size: usize,
    ) -> Result<ListPage<ListedMutex>, ClientError> {
        check_page(page_size)?;
        let cursor = shard_cursor(cursor, listing_hash(&["mutexes"]))?;
        // Each shard's anchor is the last key listed from it.
        if !cursor.anchors.values().all(Value::is_string) {
            return Err(ClientError::BadRequest(
                "cursor: not a cursor a listing of mutexes returned".into(),
            ));
        }
        let ask = (page_size + 1) as i32;
        let report = self
            .client
            .fan_out(self.client.readable_shards(), |shard| {
                let after = cursor.anchors.get(&shard.get()).and_then(Value::as_str);
                async move {
                    let call = Call {
                        shard,
                        owned: Owned::Listing("listing mutexes"),
                    };
                    let rows = self.client.query(&call, LIST, &[&after, &ask]).await?;
                    rows.iter().map(|row| listed_mutex(&call, row)).collect()
                }
            })
            .await;
        // Keys merge in byte order: the shards' own order when their
        // collation is C (as `sheaf shards` makes them); under another, a
        // page still takes a prefix of each shard's walk.
        paginate(
            report,
            cursor,
            page_size,
            SortOrder::Asc,
            |m: &ListedMutex| (m.key.clone(), m.shard),
            |m: &ListedMutex| (m.shard, Value::String(m.key.clone())),
        )
    }
}

fn listed_mutex(call: &Call, row: &tokio_postgres::Row) -> Result<ListedMutex, ClientError> {
    let read = || -> Result<ListedMutex, tokio_postgres::Error> {
        Ok(ListedMutex {
            shard: call.shard,
            key: row.try_get("key")?,
            holder: row.try_get("holder")?,
            token: row.try_get("token")?,
            acquired_at: row.try_get("acquired_at")?,
            lease_expires_at: row.try_get("lease_expires_at")?,
            waiters: row.try_get("waiters")?,
        })
    };
    read().map_err(|e| call.error(e, 1))
}

/// How [`Client::lock`] holds a lock. `LockOptions::new()` takes the
/// defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockOptions {
    lease: Duration,
    poll: Duration,
    owner: Option<uuid::Uuid>,
}

impl Default for LockOptions {
    fn default() -> LockOptions {
        LockOptions {
            lease: Duration::from_secs(60),
            poll: Duration::from_millis(200),
            owner: None,
        }
    }
}

impl LockOptions {
    /// A 60 s lease, renewed every 20 s; polls every 200 ms while waiting;
    /// a fresh owner id.
    pub fn new() -> LockOptions {
        LockOptions::default()
    }

    /// The lease (1 s..1 day): how long the lock outlives a crashed holder.
    /// The guard renews it every third of it.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often the next waiter asks again (one further back asks this
    /// times its place in line). A waiter's place in line lapses when
    /// it does not ask again within a third of its lease (its process died),
    /// so it asks at least every ninth of the lease, whatever this says.
    pub fn poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// The poll interval of a waiter at `position` (1 = next): `poll` times
    /// its place, since the line ahead moves at most one place per grant, so
    /// a long line costs the shard as much as a short one; capped so that two
    /// polls in a row can fail before its place (a third of the lease) lapses.
    fn waiting_poll(&self, position: i32) -> Duration {
        let places = u32::try_from(position).unwrap_or(1).clamp(1, 1000);
        self.poll.saturating_mul(places).min(self.lease / 9)
    }

    /// The owner id (default: a fresh one per lock), e.g. an execution's
    /// `as_uuid()`, whose end then releases the lock too.
    pub fn owner(mut self, owner: uuid::Uuid) -> Self {
        self.owner = Some(owner);
        self
    }
}

/// An owner waiting in a line; dropped while armed, it leaves the line.
struct Waiting {
    client: Arc<Client>,
    key: MutexKey,
    owner: uuid::Uuid,
    options: LockOptions,
    armed: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Leave the line at once (`mutex_leave`), handing on a grant this
        // owner never saw, so no one waits on it. (If this process dies
        // first, the place lapses, and a grant handed to it before that costs
        // the line a third of a lease.)
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, key, owner, options) = (
            Arc::clone(&self.client),
            self.key.clone(),
            self.owner,
            self.options.clone(),
        );
        runtime.spawn(async move {
            match client.mutex_leave(&key, owner).await {
                Ok(_) => {}
                // A 0.1.0 shard has no mutex_leave: wait for the grant there
                // and hand it on.
                Err(ClientError::Database { code: Some(code), .. }) if code == UNDEFINED_FUNCTION => {
                    wait_and_hand_on(&client, &key, owner, &options).await;
                }
                Err(e) => {
                    tracing::warn!(key = key.key(), error = %e, "giving up a lock wait: the owner's place lapses within a third of its lease, and so does a grant handed to it before that");
                }
            }
        });
    }
}

/// The SQLSTATE of a call to a function the shard's schema lacks.
const UNDEFINED_FUNCTION: &str = "42883";

/// Gives up a wait on a shard without `mutex_leave`: asks until the grant
/// comes and releases it at once.
async fn wait_and_hand_on(client: &Client, key: &MutexKey, owner: uuid::Uuid, options: &LockOptions) {
    loop {
        match client.mutex_acquire(key, owner, options.lease).await {
            Ok(Acquired::Granted { token }) => {
                if let Err(e) = client.mutex_release(key, owner, token).await {
                    tracing::warn!(key = key.key(), error = %e, "giving up a lock wait: the release failed; the lease runs out");
                }
                return;
            }
            Ok(Acquired::Queued { position }) => tokio::time::sleep(options.waiting_poll(position)).await,
            Err(e) => {
                tracing::warn!(key = key.key(), error = %e, "giving up a lock wait: the owner's place lapses within a third of its lease, and so does a grant handed to it before that");
                return;
            }
        }
    }
}

/// A held durable lock. While it lives, a background task renews the lease
/// every third of it; if a renewal is refused (the lease ran out and the
/// lock passed on: a stale token) or none succeeded within a lease, the
/// guard counts it lost: [`MutexGuard::lost`] completes and protected work
/// must stop. Pass [`MutexGuard::token`] to the resource you protect, so it
/// can refuse a stale holder (fencing).
///
/// Dropping it releases the lock on a spawned task (the drop cannot wait).
/// Dropped outside a tokio runtime, nothing can be sent: the lock is held
/// until its lease runs out, then passes on. [`MutexGuard::release`] releases
/// and reports the outcome.
#[derive(Debug)]
pub struct MutexGuard {
    client: Arc<Client>,
    key: MutexKey,
    owner: uuid::Uuid,
    token: i64,
    shard: ShardId,
    lost: CancellationToken,
    renewer: Option<tokio::task::JoinHandle<()>>,
}

impl MutexGuard {
    fn start(
        client: Arc<Client>,
        key: MutexKey,
        owner: uuid::Uuid,
        token: i64,
        options: LockOptions,
    ) -> MutexGuard {
        let lost = CancellationToken::new();
        let shard = client.mutex_shard(&key);
        let renewer = tokio::spawn(renew_loop(
            Arc::clone(&client),
            key.clone(),
            owner,
            token,
            options.lease,
            lost.clone(),
        ));
        MutexGuard {
            client,
            key,
            owner,
            token,
            shard,
            lost,
            renewer: Some(renewer),
        }
    }

    /// The fencing token of this grant (each grant of a key gets a larger one).
    pub fn token(&self) -> i64 {
        self.token
    }

    /// The owner id the lock is held under.
    pub fn owner(&self) -> uuid::Uuid {
        self.owner
    }

    /// The key.
    pub fn key(&self) -> &MutexKey {
        &self.key
    }

    /// The shard the lock lives on.
    pub fn shard(&self) -> ShardId {
        self.shard
    }

    /// Whether the lease was lost (see [`MutexGuard::lost`]).
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Completes when the lease is lost: another owner may hold the lock now.
    pub fn lost(&self) -> WaitForCancellationFuture<'_> {
        self.lost.cancelled()
    }

    /// A token cancelled when the lease is lost, for tasks of their own.
    pub fn lost_token(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Releases the lock now; the owner it passed to, if one waited.
    /// [`ClientError::StaleToken`] if it had been lost.
    pub async fn release(mut self) -> Result<Option<uuid::Uuid>, ClientError> {
        self.stop_renewing();
        let result = self.client.mutex_release(&self.key, self.owner, self.token).await;
        // Released (or refused as stale): either way nothing is left to drop.
        self.lost.cancel();
        result
    }

    fn stop_renewing(&mut self) {
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
    }
}

impl Drop for MutexGuard {
    fn drop(&mut self) {
        self.stop_renewing();
        if self.lost.is_cancelled() {
            return;
        }
        self.lost.cancel();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                key = self.key.key(),
                "a mutex guard dropped outside a tokio runtime: the lock is held until its lease runs out"
            );
            return;
        };
        let (client, key, owner, token) =
            (Arc::clone(&self.client), self.key.clone(), self.owner, self.token);
        runtime.spawn(async move {
            if let Err(e) = client.mutex_release(&key, owner, token).await {
                tracing::warn!(key = key.key(), error = %e, "releasing a dropped mutex guard failed; the lock passes on when its lease runs out");
            }
        });
    }
}

/// Renews every third of the lease. A stale token is a lost lock; so is no
/// successful renewal for a whole lease (the shard may have passed it on).
async fn renew_loop(
    client: Arc<Client>,
    key: MutexKey,
    owner: uuid::Uuid,
    token: i64,
    lease: Duration,
    lost: CancellationToken,
) {
    let mut held_until = Instant::now() + lease;
    loop {
        tokio::select! {
            _ = lost.cancelled() => return,
            _ = tokio::time::sleep(lease / 3) => {}
        }
        let asked = Instant::now();
        match client.mutex_renew(&key, owner, token, lease).await {
            Ok(_) => held_until = asked + lease,
            Err(ClientError::StaleToken { .. }) => {
                tracing::warn!(key = key.key(), token, "mutex lease lost: the lock passed on");
                lost.cancel();
                return;
            }
            Err(e) if Instant::now() >= held_until => {
                tracing::warn!(key = key.key(), error = %e, "mutex lease ran out without a renewal: counted lost");
                lost.cancel();
                return;
            }
            Err(e) => tracing::debug!(key = key.key(), error = %e, "mutex renewal failed; retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::PoolOptions;
    use crate::topology::Topology;

    /// `n` shards, the first `writable` of them writable.
    fn client(n: u32, writable: u32) -> Client {
        let t = (0..n)
            .fold(Topology::builder(), |b, i| {
                b.shard(i, format!("postgres://h{i}/d"))
            })
            .writable(0..writable)
            .build()
            .unwrap();
        Client::new(t, PoolOptions::default()).unwrap()
    }

    #[test]
    fn a_hashed_key_is_placed_as_a_start_and_a_read_only_shard_moves_none() {
        let c = client(4, 4);
        let staged = client(5, 4);
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..64 {
            let key = format!("k{i}");
            use sheaf_core::hrw;
            let h = hrw::key_hash(&hrw::routing_key(&format!("mutex__{key}")));
            let expected = hrw::pick(h, 0..4u16).unwrap();
            let shard = c.mutex_shard(&MutexKey::new(key.as_str()));
            assert_eq!(shard.get(), expected);
            assert_eq!(
                staged.mutex_shard(&MutexKey::new(key.as_str())),
                shard,
                "adding a read-only shard moves no key"
            );
            seen.insert(shard.get());
        }
        assert_eq!(seen.len(), 4, "{seen:?}");
        // A shard that is not writable holds no hashed key.
        let one = client(4, 1);
        for i in 0..64 {
            assert_eq!(one.mutex_shard(&MutexKey::new(format!("k{i}"))).get(), 0);
        }
        let pinned = ShardId::new(3).unwrap();
        assert_eq!(c.mutex_shard(&MutexKey::on_shard("k", pinned)), pinned);
        let id = ExecutionId::mint(ShardId::new(2).unwrap()).unwrap();
        assert_eq!(c.mutex_shard(&MutexKey::of_execution("k", id)).get(), 2);
    }
}
