//! One connection pool per shard, [`ShardPools`].

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime};

use crate::breaker::{Breaker, BreakerState};
use crate::topology::{ShardId, Topology};

/// Pool sizing and the timeouts that keep every call bounded.
/// `PoolOptions::new()` takes the defaults; each setter says what it sets.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PoolOptions {
    pub(crate) max_size: usize,
    pub(crate) acquire_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) query_timeout: Duration,
    pub(crate) breaker_threshold: u32,
    pub(crate) breaker_cooldown: Duration,
    pub(crate) keepalive_idle: Option<Duration>,
    pub(crate) declare_topology: bool,
    pub(crate) actor: Option<String>,
}

impl PoolOptions {
    /// The defaults (as [`Default`]).
    pub fn new() -> PoolOptions {
        PoolOptions::default()
    }

    /// Connections per shard (a worker's claim loop holds one per shard).
    pub fn max_size(mut self, max_size: usize) -> Self {
        self.max_size = max_size;
        self
    }

    /// How long a caller waits for a free connection.
    pub fn acquire_timeout(mut self, acquire_timeout: Duration) -> Self {
        self.acquire_timeout = acquire_timeout;
        self
    }

    /// How long opening a new connection may take.
    pub fn connect_timeout(mut self, connect_timeout: Duration) -> Self {
        self.connect_timeout = connect_timeout;
        self
    }

    /// How long a call's statement may take, its retries after transient
    /// conflicts (deadlock, serialization failure) and the pauses between
    /// them included, before the call gives up, cancels it on the server
    /// and discards the connection. Getting a connection is bounded apart
    /// (`acquire_timeout`, and `connect_timeout` for a new one).
    pub fn query_timeout(mut self, query_timeout: Duration) -> Self {
        self.query_timeout = query_timeout;
        self
    }

    /// Consecutive connection failures that open a shard's breaker.
    pub fn breaker_threshold(mut self, breaker_threshold: u32) -> Self {
        self.breaker_threshold = breaker_threshold;
        self
    }

    /// How long an open breaker short-circuits before one probe.
    pub fn breaker_cooldown(mut self, breaker_cooldown: Duration) -> Self {
        self.breaker_cooldown = breaker_cooldown;
        self
    }

    /// TCP keepalives on every shard connection: the first probe after the
    /// connection has been this long idle, then one every third of it, and
    /// the kernel closes it after three unanswered. A pooled connection whose
    /// peer is gone (a host that died, a NAT or firewall that dropped the
    /// flow) is then closed within twice this, and the pool opens a new one,
    /// instead of the next call learning it only at its query timeout. The
    /// operating system's default is two hours. At least 3 s (the kernel
    /// counts whole seconds); `None` leaves the connections as the system
    /// makes them.
    pub fn keepalive_idle(mut self, keepalive_idle: Option<Duration>) -> Self {
        self.keepalive_idle = keepalive_idle;
        self
    }

    /// Declare the topology's digest ([`crate::Topology::digest`]) on every
    /// connection (the startup option `-c sheaf.topology_digest=…`), so a
    /// shard that published the fleet's digest refuses placed work from a
    /// client configured otherwise. Off for a proxy that refuses startup
    /// options (the shard then checks nothing for this client).
    pub fn declare_topology(mut self, declare_topology: bool) -> Self {
        self.declare_topology = declare_topology;
        self
    }

    /// Who this client acts for, recorded as `actor` in each shard's audit
    /// log (the session setting `sheaf.actor`); `None`: the login role.
    pub fn actor(mut self, actor: Option<String>) -> Self {
        self.actor = actor;
        self
    }
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            max_size: 16,
            acquire_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            query_timeout: Duration::from_secs(30),
            breaker_threshold: 3,
            breaker_cooldown: Duration::from_secs(5),
            keepalive_idle: Some(Duration::from_secs(30)),
            declare_topology: true,
            actor: None,
        }
    }
}

/// Why a shard could not serve a call. Each names the one shard involved
/// (never the whole set) and says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShardError {
    /// No connection could be opened, or it was lost mid-call.
    #[error(
        "shard {shard} is unreachable ({cause}); the work it owns is unavailable until it is back: \
         check that database, or drain the shard from the topology"
    )]
    Unreachable {
        /// The shard.
        shard: ShardId,
        /// What the connection attempt said.
        cause: String,
    },
    /// The shard's breaker is open; nothing was sent.
    #[error("shard {shard} is short-circuited after repeated connection failures; retry after the cooldown")]
    ShortCircuited {
        /// The shard.
        shard: ShardId,
    },
    /// The topology has the shard but this client has no pool for it.
    #[error(
        "this client has no pool for shard {shard}; it does not route there (fails closed, never elsewhere)"
    )]
    NoPool {
        /// The shard.
        shard: ShardId,
    },
    /// Every connection of the shard's pool stayed busy.
    #[error("no connection to shard {shard} was free within {waited:?}; the pool is exhausted")]
    Exhausted {
        /// The shard.
        shard: ShardId,
        /// How long the call waited.
        waited: Duration,
    },
    /// A statement outlived `PoolOptions::query_timeout`.
    #[error(
        "shard {shard} did not answer within {waited:?}; the statement was cancelled, so it took effect \
         only if it had already committed"
    )]
    Timeout {
        /// The shard.
        shard: ShardId,
        /// How long the call waited.
        waited: Duration,
    },
    /// The shard's schema is not one this driver works with
    /// ([`crate::COMPATIBLE_SCHEMAS`]); nothing was sent to it.
    #[error("shard {shard} cannot serve this driver: {}", crate::schema::incompatibility(schema.as_deref()))]
    IncompatibleSchema {
        /// The shard.
        shard: ShardId,
        /// Its schema version (`None`: no sheaf extension there).
        schema: Option<String>,
    },
}

impl ShardError {
    /// The one shard it is about.
    pub fn shard(&self) -> ShardId {
        match self {
            ShardError::Unreachable { shard, .. }
            | ShardError::ShortCircuited { shard }
            | ShardError::NoPool { shard }
            | ShardError::Exhausted { shard, .. }
            | ShardError::Timeout { shard, .. }
            | ShardError::IncompatibleSchema { shard, .. } => *shard,
        }
    }
}

struct ShardPool {
    pool: Pool,
    /// How its connections (and cancel requests) are made.
    tls: crate::tls::Tls,
    breaker: Mutex<Breaker>,
    /// The shard's schema version as last read, and when.
    schema: Mutex<Option<(Option<String>, Instant)>>,
}

/// The shortest `PoolOptions::keepalive_idle`: its probes go every third of
/// it, and the kernel takes whole seconds.
const MIN_KEEPALIVE_IDLE: Duration = Duration::from_secs(3);

/// How long a shard's schema version is trusted before it is read again, so
/// an `ALTER EXTENSION sheaf UPDATE` is noticed within this long.
const SCHEMA_RECHECK: Duration = Duration::from_secs(10);

/// A value in the startup `options` string: Postgres splits it on spaces,
/// which a backslash escapes (and a backslash itself).
fn escape_option(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars().filter(|c| !c.is_control()) {
        if c == ' ' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The pools of every shard in a topology.
///
/// One connection pool per shard, each with bounded acquire and connect
/// timeouts and its own circuit breaker. A caller never parks forever on a
/// pool, and an unreachable shard fails loudly, by name, without slowing the
/// others down.
pub struct ShardPools {
    pools: BTreeMap<ShardId, ShardPool>,
    options: PoolOptions,
}

impl ShardPools {
    /// Builds a pool per shard. No connection is opened yet; a bad
    /// connection string is an error now, not at the first call.
    pub fn new(topology: &Topology, options: PoolOptions) -> Result<ShardPools, ShardError> {
        let mut pools = BTreeMap::new();
        for shard in topology.shards() {
            let (mut config, tls) =
                crate::tls::shard_config(&shard.url).map_err(|cause| ShardError::Unreachable {
                    shard: shard.id,
                    cause,
                })?;
            config.connect_timeout(options.connect_timeout);
            let mut settings = Vec::new();
            if options.declare_topology {
                settings.push(format!("-c sheaf.topology_digest={}", topology.digest()));
            }
            if let Some(actor) = &options.actor {
                settings.push(format!("-c sheaf.actor={}", escape_option(actor)));
            }
            if !settings.is_empty() {
                if let Some(given) = config.get_options().filter(|g| !g.trim().is_empty()) {
                    settings.insert(0, given.to_owned());
                }
                config.options(settings.join(" "));
            }
            if let Some(idle) = options.keepalive_idle {
                if idle < MIN_KEEPALIVE_IDLE {
                    return Err(ShardError::Unreachable {
                        shard: shard.id,
                        cause: format!(
                            "PoolOptions::keepalive_idle is {idle:?}: at least {MIN_KEEPALIVE_IDLE:?} \
                             (the kernel counts keepalive times in whole seconds, probing every third)"
                        ),
                    });
                }
                config
                    .keepalives(true)
                    .keepalives_idle(idle)
                    .keepalives_interval(idle / 3)
                    .keepalives_retries(3);
            }
            let manager = Manager::from_config(
                config,
                tls.clone(),
                ManagerConfig {
                    recycling_method: RecyclingMethod::Fast,
                },
            );
            let pool = Pool::builder(manager)
                .max_size(options.max_size)
                .wait_timeout(Some(options.acquire_timeout))
                .create_timeout(Some(options.connect_timeout))
                .recycle_timeout(Some(options.connect_timeout))
                .runtime(Runtime::Tokio1)
                .build()
                .map_err(|e| ShardError::Unreachable {
                    shard: shard.id,
                    cause: e.to_string(),
                })?;
            let breaker = Breaker::new(options.breaker_threshold, options.breaker_cooldown);
            pools.insert(
                shard.id,
                ShardPool {
                    pool,
                    tls,
                    breaker: Mutex::new(breaker),
                    schema: Mutex::new(None),
                },
            );
        }
        Ok(ShardPools { pools, options })
    }

    /// A connection to `shard`, within the acquire timeout, unless its
    /// breaker is open. A new connection closes the breaker (it answered a
    /// handshake); a recycled one proves nothing (its peer may have gone
    /// half-open since it was last used), so the call that uses it reports
    /// the outcome ([`ShardPools::record_success`], [`ShardPools::record_failure`]).
    /// The schema check it may run is bounded by the query timeout.
    pub async fn get(&self, shard: ShardId) -> Result<Object, ShardError> {
        let entry = self.pools.get(&shard).ok_or(ShardError::NoPool { shard })?;
        let probe = {
            let mut breaker = lock(&entry.breaker);
            let now = Instant::now();
            let probe = breaker.state(now) == BreakerState::HalfOpen;
            if !breaker.allow(now) {
                return Err(ShardError::ShortCircuited { shard });
            }
            probe
        };
        match entry.pool.get().await {
            Ok(conn) => {
                if Object::metrics(&conn).recycle_count == 0 {
                    lock(&entry.breaker).record_success();
                } else if probe && let Err(e) = self.verify_probe(shard, entry, &conn).await {
                    drop(Object::take(conn));
                    return Err(e);
                }
                let limit = self.options.query_timeout;
                match tokio::time::timeout(limit, self.check_schema(shard, entry, &conn)).await {
                    Ok(checked) => checked?,
                    Err(_) => {
                        // A reply may still come: never reuse this connection.
                        drop(Object::take(conn));
                        lock(&entry.breaker).record_failure(Instant::now());
                        tracing::warn!(%shard, waited = ?limit, "reading the schema version timed out");
                        return Err(ShardError::Timeout { shard, waited: limit });
                    }
                }
                Ok(conn)
            }
            Err(PoolError::Timeout(deadpool_postgres::TimeoutType::Wait)) => Err(ShardError::Exhausted {
                shard,
                waited: self.options.acquire_timeout,
            }),
            Err(e) => {
                lock(&entry.breaker).record_failure(Instant::now());
                // With its causes: a TLS handshake's says what was wrong
                // with the certificate. tokio-postgres' errors never carry
                // the connection string.
                let cause = crate::status::with_causes(&e);
                tracing::warn!(%shard, error = %cause, "shard connection failed");
                Err(ShardError::Unreachable { shard, cause })
            }
        }
    }

    /// The half-open probe got a pooled connection, which proves nothing
    /// (its peer may have gone half-open): one round trip on it, bounded by
    /// the connect timeout, decides the breaker.
    async fn verify_probe(&self, shard: ShardId, entry: &ShardPool, conn: &Object) -> Result<(), ShardError> {
        let limit = self.options.connect_timeout;
        let outcome = tokio::time::timeout(limit, conn.simple_query("")).await;
        let mut breaker = lock(&entry.breaker);
        match outcome {
            Ok(Ok(_)) => {
                breaker.record_success();
                Ok(())
            }
            Ok(Err(e)) => {
                breaker.record_failure(Instant::now());
                Err(ShardError::Unreachable {
                    shard,
                    cause: e.to_string(),
                })
            }
            Err(_) => {
                breaker.record_failure(Instant::now());
                Err(ShardError::Timeout { shard, waited: limit })
            }
        }
    }

    /// Refuses a shard whose schema this driver does not work with, reading
    /// the version on `conn` when the last reading is older than
    /// [`SCHEMA_RECHECK`].
    async fn check_schema(&self, shard: ShardId, entry: &ShardPool, conn: &Object) -> Result<(), ShardError> {
        let known = lock(&entry.schema)
            .as_ref()
            .filter(|(_, at)| at.elapsed() < SCHEMA_RECHECK)
            .map(|(v, _)| v.clone());
        let version = match known {
            Some(v) => v,
            None => {
                let row = conn
                    .query_one(crate::schema::SCHEMA_VERSION, &[])
                    .await
                    .map_err(|e| ShardError::Unreachable {
                        shard,
                        cause: format!("reading its schema version: {e}"),
                    })?;
                let v: Option<String> = row.try_get(0).map_err(|e| ShardError::Unreachable {
                    shard,
                    cause: format!("reading its schema version: {e}"),
                })?;
                *lock(&entry.schema) = Some((v.clone(), Instant::now()));
                v
            }
        };
        match version {
            Some(v) if crate::schema::is_compatible(&v) => Ok(()),
            schema => Err(ShardError::IncompatibleSchema { shard, schema }),
        }
    }

    /// `shard`'s schema version as last read (`None`: not read yet; the
    /// inner `None`: no extension).
    pub fn schema_version(&self, shard: ShardId) -> Option<Option<String>> {
        let entry = self.pools.get(&shard)?;
        lock(&entry.schema).as_ref().map(|(v, _)| v.clone())
    }

    /// Forgets what `shard`'s schema version was, so the next call reads it
    /// (a call found a function missing).
    pub fn recheck_schema(&self, shard: ShardId) {
        if let Some(entry) = self.pools.get(&shard) {
            *lock(&entry.schema) = None;
        }
    }

    /// Feeds an answer from the shard (a result or a refusal: either proves
    /// it is up) to its breaker, closing it.
    pub fn record_success(&self, shard: ShardId) {
        if let Some(entry) = self.pools.get(&shard) {
            lock(&entry.breaker).record_success();
        }
    }

    /// Feeds a failure seen after the connection was handed out (lost
    /// mid-call, or no answer in time) to the shard's breaker.
    pub fn record_failure(&self, shard: ShardId) {
        if let Some(entry) = self.pools.get(&shard) {
            lock(&entry.breaker).record_failure(Instant::now());
        }
    }

    /// The options the pools were built with.
    pub fn options(&self) -> &PoolOptions {
        &self.options
    }

    /// How connections to `shard` are made (for a cancel request).
    pub(crate) fn tls(&self, shard: ShardId) -> Option<crate::tls::Tls> {
        self.pools.get(&shard).map(|p| p.tls.clone())
    }

    /// The shard's breaker state now; `None` for a shard with no pool.
    pub fn breaker_state(&self, shard: ShardId) -> Option<BreakerState> {
        self.pools
            .get(&shard)
            .map(|p| lock(&p.breaker).state(Instant::now()))
    }
}

/// These locks are never held across an await, so a poisoned lock can only
/// come from a panic in the breaker's state machine or a plain assignment;
/// the state is still usable.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::escape_option;

    #[test]
    fn startup_option_values_escape_spaces_and_backslashes() {
        assert_eq!(escape_option("ann"), "ann");
        assert_eq!(escape_option("ann smith"), "ann\\ smith");
        assert_eq!(escape_option("a\\b"), "a\\\\b");
        assert_eq!(escape_option("a\nb"), "ab", "control characters are dropped");
    }
}
