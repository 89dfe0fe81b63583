//! How every Shoal process dials another: one place for the channel settings.
//!
//! HTTP/2 keep-alive pings matter: after a network cut heals, a connection whose peer vanished
//! (the packets went nowhere) looks open until TCP gives up, minutes later. Pinging every
//! second and dropping the connection when a ping is not answered within two seconds makes
//! the next call reconnect instead of timing out. (One second was too tight on a loaded
//! 2-core machine: a busy but healthy node missed it, and every call in flight on the
//! connection failed with "operation was canceled".)

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::{ErrorCode, ShoalError};

/// A lazily connecting channel to `addr` (host:port).
pub fn channel(addr: &str, connect_timeout: Duration) -> Result<Channel, ShoalError> {
    let ep = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| ShoalError::new(ErrorCode::InvalidArgument, format!("address {addr}: {e}")))?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(1))
        .keep_alive_timeout(Duration::from_secs(2))
        .keep_alive_while_idle(true);
    Ok(ep.connect_lazy())
}
