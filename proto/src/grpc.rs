//! How every Shoal process dials another: one place for the channel settings.
//!
//! HTTP/2 keep-alive pings matter: after a network cut heals, a connection whose peer vanished
//! (the packets went nowhere) looks open until TCP gives up, minutes later. Pinging every
//! second and dropping the connection when a ping is not answered within two seconds makes
//! the next call reconnect instead of timing out. (One second was too tight on a loaded
//! 2-core machine: a busy but healthy node missed it, and every call in flight on the
//! connection failed with "operation was canceled".) Servers ping too ([`server`]): a
//! connection whose caller vanished behind a network cut stays open on the server's side
//! otherwise, and a graceful shutdown waits for every open connection — a data node cut off
//! and reconnected once hung on `docker compose stop` until it was killed, waiting for the
//! acknowledgement of its GOAWAY ping on such a connection after the caller's container had
//! exited.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::{ErrorCode, ShoalError};

/// How often both ends of a connection ping, and how long they wait for the answer.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(2);

/// The server settings every node uses (see the module comment on keep-alive).
pub fn server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
}

/// A lazily connecting channel to `addr` (host:port).
pub fn channel(addr: &str, connect_timeout: Duration) -> Result<Channel, ShoalError> {
    let ep = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| ShoalError::new(ErrorCode::InvalidArgument, format!("address {addr}: {e}")))?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    Ok(ep.connect_lazy())
}
