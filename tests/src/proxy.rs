//! A TCP proxy for network-fault tests: it sits between the driver and one
//! real shard and is switched at run time between forwarding, half-open
//! (nothing forwarded either way, nothing closed: every connection, old or
//! new, hangs) and reset (every connection reset, new ones reset on accept).
//!
//! A connection that saw the proxy half-open stays frozen after it heals,
//! as a connection whose peer lost its state does: only new connections
//! work again (a reset still ends it). So a client recovers only if it
//! gives up on connections that stopped answering.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does to traffic now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forwards both ways.
    None,
    /// Forwards nothing, closes nothing; accepts new connections and never
    /// answers them (a startup packet goes unanswered).
    HalfOpen,
    /// Resets every connection (RST, no FIN) and every new one on accept.
    Reset,
}

/// A running proxy; stops (dropping every connection) when dropped.
pub struct Proxy {
    addr: SocketAddr,
    fault: watch::Sender<Fault>,
    accepted: Arc<AtomicUsize>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// A proxy on a free local port forwarding to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (fault, _) = watch::channel(Fault::None);
        let accepted = Arc::new(AtomicUsize::new(0));
        let accept = tokio::spawn(accept_loop(listener, target, fault.clone(), accepted.clone()));
        Ok(Proxy {
            addr,
            fault,
            accepted,
            accept,
        })
    }

    /// A proxy in front of the shard at `url` (`postgres://user@host:port/db`),
    /// and the same URL pointing through it.
    pub async fn in_front_of(url: &str) -> std::io::Result<(Proxy, String)> {
        let (target, rest) = split_url(url)?;
        let proxy = Proxy::start(target).await?;
        let through = format!("{}{}{}", rest.0, proxy.addr, rest.1);
        Ok((proxy, through))
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches the fault on (or off with [`Fault::None`]).
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// Forwards again (connections frozen meanwhile stay frozen).
    pub fn heal(&self) {
        self.set(Fault::None);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Every connection task ends when the sender goes away.
        self.set(Fault::Reset);
    }
}

/// `postgres://user@host:port/db` → (host:port, (prefix, suffix)).
fn split_url(url: &str) -> std::io::Result<(SocketAddr, (String, String))> {
    let bad = || std::io::Error::other(format!("not a postgres://user@host:port/db URL: {url}"));
    let after_scheme = url.find("://").ok_or_else(bad)? + 3;
    let host_start = url[after_scheme..]
        .find('@')
        .map_or(after_scheme, |i| after_scheme + i + 1);
    let host_end = url[host_start..].find('/').map_or(url.len(), |i| host_start + i);
    let target: SocketAddr = url[host_start..host_end].parse().map_err(|_| bad())?;
    Ok((target, (url[..host_start].to_owned(), url[host_end..].to_owned())))
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    fault: watch::Sender<Fault>,
    accepted: Arc<AtomicUsize>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        accepted.fetch_add(1, Ordering::Relaxed);
        let rx = fault.subscribe();
        let now = *rx.borrow();
        match now {
            Fault::Reset => reset(client),
            Fault::HalfOpen => {
                tokio::spawn(frozen(vec![client], rx));
            }
            Fault::None => {
                tokio::spawn(forward(client, target, rx));
            }
        }
    }
}

/// Closes with RST: linger 0, then drop.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// Holds the sockets open, reading and writing nothing, until a reset (or
/// the proxy goes away).
async fn frozen(streams: Vec<TcpStream>, mut rx: watch::Receiver<Fault>) {
    while rx.changed().await.is_ok() {
        if *rx.borrow() == Fault::Reset {
            break;
        }
    }
    for s in streams {
        reset(s);
    }
}

async fn forward(mut client: TcpStream, target: SocketAddr, mut rx: watch::Receiver<Fault>) {
    let Ok(mut upstream) = TcpStream::connect(target).await else {
        reset(client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (mut a, mut b) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    loop {
        if *rx.borrow_and_update() != Fault::None {
            break;
        }
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { break },
            n = client.read(&mut a) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => if upstream.write_all(&a[..n]).await.is_err() { break },
            },
            n = upstream.read(&mut b) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => if client.write_all(&b[..n]).await.is_err() { break },
            },
        }
    }
    let now = *rx.borrow();
    match now {
        Fault::HalfOpen => frozen(vec![client, upstream], rx).await,
        _ => {
            reset(client);
            reset(upstream);
        }
    }
}
