//! The HTTP server loop, with the limits a public endpoint needs: anyone who can open a TCP
//! connection can otherwise hold one open forever (headers trickled a byte at a time, a body
//! sent at 1 B/s) until the server runs out of file descriptors.
//!
//! - Headers must arrive within [`HttpLimits::header_read_timeout`].
//! - A body must keep up at least [`HttpLimits::min_body_bytes_per_sec`] once
//!   [`HttpLimits::body_grace`] has passed ([`MinRateBody`]); a slower one ends the request.
//! - At most [`HttpLimits::max_connections`] connections are open, at most
//!   [`HttpLimits::max_connections_per_source`] from one address; past that a new connection
//!   is closed at once.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tower::ServiceExt;

/// Limits of the HTTP server.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Time a client has to send a request's headers.
    pub header_read_timeout: Duration,
    /// A body may start slowly for this long before its rate counts.
    pub body_grace: Duration,
    /// The slowest a body may arrive, averaged from its start, once the grace has passed.
    pub min_body_bytes_per_sec: u64,
    /// Connections open at once.
    pub max_connections: usize,
    /// Connections open at once from one address.
    pub max_connections_per_source: usize,
}

impl Default for HttpLimits {
    /// 10 s for headers; bodies at 16 KiB/s at least after 10 s (a 1 GiB file then takes at
    /// most 18 hours, a 64 MiB artifact an hour); 4 096 connections, 256 per source (well under
    /// the usual 65 536 open files, and more than any client of a tenant needs at once).
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            body_grace: Duration::from_secs(10),
            min_body_bytes_per_sec: 16 << 10,
            max_connections: 4_096,
            max_connections_per_source: 256,
        }
    }
}

/// Connections open now, in all and per source.
#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_source: HashMap<IpAddr, usize>,
}

/// Holds one connection's place in [`Open`] until dropped.
struct Admitted {
    open: Arc<Mutex<Open>>,
    source: IpAddr,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.by_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                open.by_source.remove(&self.source);
            }
        }
    }
}

fn admit(open: &Arc<Mutex<Open>>, source: IpAddr, limits: &HttpLimits) -> Option<Admitted> {
    let mut o = open.lock().unwrap_or_else(|p| p.into_inner());
    let from_source = o.by_source.get(&source).copied().unwrap_or(0);
    if o.total >= limits.max_connections || from_source >= limits.max_connections_per_source {
        return None;
    }
    o.total += 1;
    *o.by_source.entry(source).or_insert(0) += 1;
    Some(Admitted { open: open.clone(), source })
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets the connections in flight
/// finish their requests.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = router.layer(axum::middleware::from_fn(move |request: Request, next: axum::middleware::Next| {
        let request = request.map(|body| Body::new(MinRateBody::new(body, limits)));
        next.run(request)
    }));
    let open = Arc::new(Mutex::new(Open::default()));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    tokio::pin!(shutdown);
    let mut refused_logged = false;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Out of descriptors or a reset connection: the next accept may work.
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(admitted) = admit(&open, peer.ip(), &limits) else {
            if !refused_logged {
                tracing::warn!(source = %peer.ip(), "connection limit reached: closing new connections");
                refused_logged = true;
            }
            drop(stream);
            continue;
        };
        refused_logged = false;
        let router = router.clone();
        let service = hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            router.clone().oneshot(request.map(Body::new))
        });
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let _admitted = admitted;
            // A client that breaks off or times out is no error of the server's.
            let _ = connection.await;
        });
    }
    graceful.shutdown().await;
    Ok(())
}

/// A request body that fails once it falls behind a minimum rate (see [`HttpLimits`]).
pub struct MinRateBody {
    inner: Body,
    received: u64,
    min_per_sec: u64,
    started: tokio::time::Instant,
    grace: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl MinRateBody {
    fn new(inner: Body, limits: HttpLimits) -> Self {
        let started = tokio::time::Instant::now();
        Self {
            inner,
            received: 0,
            min_per_sec: limits.min_body_bytes_per_sec.max(1),
            started,
            grace: limits.body_grace,
            deadline: Box::pin(tokio::time::sleep_until(started + limits.body_grace)),
        }
    }

    /// When the bytes received so far stop being enough.
    fn next_deadline(&self) -> tokio::time::Instant {
        let allowed = Duration::from_secs_f64(self.received as f64 / self.min_per_sec as f64);
        self.started + self.grace + allowed
    }
}

impl std::fmt::Debug for MinRateBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MinRateBody").field("received", &self.received).finish_non_exhaustive()
    }
}

/// A body that fell behind the minimum rate.
#[derive(Debug, thiserror::Error)]
#[error("the request body arrived slower than {0} bytes/s; send it faster or split it")]
pub struct TooSlow(u64);

impl HttpBody for MinRateBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.received += data.len() as u64;
                    let next = self.next_deadline();
                    self.deadline.as_mut().reset(next);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(other) => Poll::Ready(other.map(|r| r.map_err(Into::into))),
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(TooSlow(self.min_per_sec))))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
