//! `LISTEN` on one shard: a dedicated connection outside the pools, kept up
//! with backoff, whose notifications go to a callback. The worker listens
//! on `sheaf_ready` (and `sheaf_relay` for its relay) on one connection per
//! shard; a standalone relay on `sheaf_relay`.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::topology::ShardId;

/// How often a quiet listening connection is checked (`SELECT 1`, bounded
/// by the query timeout): a connection whose peer went away without a
/// word (half-open) would otherwise wait for notifications forever.
const LISTEN_PING: Duration = Duration::from_secs(5);
/// The longest pause between two attempts to listen again.
const LISTEN_MAX_PAUSE: Duration = Duration::from_secs(10);

/// What a listener heard.
pub(crate) enum Heard<'a> {
    /// It listens (again): anything notified meanwhile was missed, so the
    /// listener's owner polls now. Also after a failed ping.
    Connected,
    /// A notification.
    Notification {
        /// Its channel.
        channel: &'a str,
        /// Its payload.
        payload: &'a str,
    },
}

struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Listens on `channels` of `shard` until `stop`, reconnecting with
/// backoff (from the start again after a connection that listened).
pub(crate) async fn listen(
    client: &Client,
    shard: ShardId,
    url: &str,
    channels: &[&str],
    stop: &CancellationToken,
    on: impl Fn(Heard<'_>),
) {
    let first = Duration::from_millis(500);
    let mut pause = first;
    loop {
        match listen_once(client, url, channels, stop, &on).await {
            Ok(()) => return,
            Err((listened, e)) => {
                tracing::debug!(%shard, error = %e, "listener connection ended");
                if listened {
                    pause = first;
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(LISTEN_MAX_PAUSE);
    }
}

/// One listening connection; `Ok` once stopped, `Err` when the connection
/// is lost or stops answering (with whether it got to listen). Connecting
/// is bounded by the connect timeout (the handshake included), every
/// statement by the query timeout.
async fn listen_once(
    client: &Client,
    url: &str,
    channels: &[&str],
    stop: &CancellationToken,
    on: &impl Fn(Heard<'_>),
) -> Result<(), (bool, String)> {
    let options = client.admin().pools().options();
    let (connect_timeout, query_timeout) = (options.connect_timeout, options.query_timeout);
    let (mut config, tls) = crate::tls::shard_config(url).map_err(|e| (false, e))?;
    config.connect_timeout(connect_timeout);
    let connecting = tokio::select! {
        _ = stop.cancelled() => return Ok(()),
        c = tokio::time::timeout(connect_timeout, config.connect(tls)) => c,
    };
    let (conn, mut connection) = match connecting {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err((false, format!("{e}"))),
        Err(_) => return Err((false, format!("no connection within {connect_timeout:?}"))),
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let driver = AbortOnDrop(tokio::spawn(async move {
        while let Some(message) = futures::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if tx.send((n.channel().to_owned(), n.payload().to_owned())).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    }));
    let bounded = |sql: String| {
        let conn = &conn;
        async move {
            match tokio::time::timeout(query_timeout, conn.batch_execute(&sql)).await {
                Ok(result) => result.map_err(|e| format!("{e}")),
                Err(_) => Err(format!("{sql}: no answer within {query_timeout:?}")),
            }
        }
    };
    let listen: String = channels.iter().map(|c| format!("LISTEN {c};")).collect();
    bounded(listen).await.map_err(|e| (false, e))?;
    on(Heard::Connected);
    let mut ping = tokio::time::interval_at(Instant::now() + LISTEN_PING, LISTEN_PING);
    let result = loop {
        tokio::select! {
            _ = stop.cancelled() => break Ok(()),
            message = rx.recv() => match message {
                Some((channel, payload)) => on(Heard::Notification { channel: &channel, payload: &payload }),
                None => break Err((true, "the connection closed".to_owned())),
            },
            _ = ping.tick() => {
                if let Err(e) = bounded("SELECT 1".to_owned()).await {
                    // Notifications may have been missed meanwhile: poll now.
                    on(Heard::Connected);
                    break Err((true, e));
                }
            }
        }
    };
    drop(driver);
    result
}
