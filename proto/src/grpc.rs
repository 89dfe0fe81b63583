//! How every Shoal process dials another, and how a node accepts: one place for the channel
//! and server settings and the transports.
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
//!
//! **Local sockets.** A node that serves on TCP address `A` also listens on the Unix socket
//! named `shoal/A` in Linux's abstract namespace, and a caller dials that name first, falling
//! back to TCP when nobody listens there. This is NDB's shared-memory transporter in spirit:
//! nodes on one host skip the TCP/IP stack. On the 2-core test VM a loopback TCP round trip
//! cost 44–57 µs of system time per side against 20–23 µs over a Unix socket
//! (benchmarks.md, "Fifteenth session"). The abstract namespace belongs to the network
//! namespace, exactly like the loopback address and the port: the name `shoal/A` is visible
//! precisely to the processes that share the network the node's TCP address lives in, so a
//! caller in another container or on another host never reaches it and uses TCP. Abstract
//! names leave no file behind, so a node killed with -9 leaves nothing stale to clean up.
//! `SHOAL_TCP_ONLY=1` in a process's environment turns both sides off (for measuring).

use std::io;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tonic::transport::server::Connected;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::local_stream::LocalStream;
use crate::{ErrorCode, ShoalError};

/// How a caller reaches a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// The node's local socket when it is in this network namespace, else TCP.
    Auto,
    /// TCP always: a benchmark's client that must pay what a remote application pays.
    Tcp,
}

/// How often both ends of a connection ping, and how long they wait for the answer.
pub(crate) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
pub(crate) const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a stopping server waits for its open connections to finish their requests before
/// it drops them: a caller that stopped answering must not keep a node from exiting (compose
/// would kill it after its grace period, with a failure code).
pub const SERVER_DRAIN: Duration = Duration::from_secs(3);

/// Largest HTTP/2 frame either end of a connection accepts (the default is 16 KiB). A DATA
/// frame bigger than a couple of hundred bytes goes out in a write of its own, so at 16 KiB an
/// answer of 30 KiB (a batch of range reads) cost its sender three `writev`s; it now costs one.
pub const MAX_FRAME_BYTES: u32 = 1 << 20;

/// The server settings every node uses (see the module comment on keep-alive).
pub fn server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .max_frame_size(Some(MAX_FRAME_BYTES))
}

/// A lazily connecting channel to `addr` (host:port).
pub fn channel(addr: &str, connect_timeout: Duration) -> Result<Channel, ShoalError> {
    channel_over(addr, connect_timeout, Transport::Auto)
}

/// [`channel`], saying how to reach the node.
pub fn channel_over(addr: &str, connect_timeout: Duration, transport: Transport) -> Result<Channel, ShoalError> {
    let ep = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| ShoalError::new(ErrorCode::InvalidArgument, format!("address {addr}: {e}")))?
        .connect_timeout(connect_timeout)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .max_frame_size(MAX_FRAME_BYTES);
    let local = (transport == Transport::Auto && local_sockets_enabled()).then(|| local_name(addr));
    let addr = addr.to_string();
    Ok(ep.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
        let (addr, local) = (addr.clone(), local.clone());
        async move { dial(&addr, local.as_deref()).await.map(TokioIo::new) }
    })))
}

/// Dials the node serving on `addr` (host:port) as [`channel_over`]'s connections do: its
/// local socket first when `transport` allows, else TCP.
pub async fn dial_node(addr: &str, transport: Transport) -> io::Result<Conn> {
    let local = (transport == Transport::Auto && local_sockets_enabled()).then(|| local_name(addr));
    dial(addr, local.as_deref()).await
}

async fn dial(addr: &str, local: Option<&str>) -> io::Result<Conn> {
    if let Some(name) = local {
        // Refused at once when no node of this namespace listens under the name.
        if let Ok(s) = UnixStream::connect(name).await {
            return Ok(Conn::Unix(LocalStream::new(s)?));
        }
    }
    let s = TcpStream::connect(addr).await?;
    // Small replies held back 40 ms by delayed ACKs would dominate every latency.
    s.set_nodelay(true)?;
    Ok(Conn::Tcp(s))
}

/// The abstract-namespace name of the local socket of the node serving on `addr` (the leading
/// NUL is what makes tokio bind and dial it as an abstract name).
fn local_name(addr: &str) -> String {
    format!("\0shoal/{addr}")
}

fn local_sockets_enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("SHOAL_TCP_ONLY").map_or(true, |v| v.is_empty() || v == "0"))
}

/// The connections a server accepts: from `tcp`, with Nagle's algorithm off (`Server::tcp_nodelay`
/// does not apply to a listener bound by the caller), and, given the address the node
/// advertises as `local`, from that address's local socket when it can be bound. A name already
/// taken (another process of this namespace serving as that address, which cannot happen while
/// we hold its TCP port) leaves the node on TCP alone, with a warning.
pub fn incoming(tcp: TcpListener, local: Option<&str>) -> impl futures::Stream<Item = io::Result<Conn>> {
    use futures::StreamExt;
    use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
    let tcp = TcpListenerStream::new(tcp).map(|s| {
        let s = s?;
        let _ = s.set_nodelay(true);
        Ok(Conn::Tcp(s))
    });
    let unix = local.filter(|_| local_sockets_enabled()).and_then(|addr| match UnixListener::bind(local_name(addr)) {
        Ok(l) => Some(UnixListenerStream::new(l).map(|s| s.and_then(LocalStream::new).map(Conn::Unix))),
        Err(e) => {
            tracing::warn!("no local socket for {addr}: {e}; serving on TCP only");
            None
        }
    });
    futures::stream::select(tcp, futures::stream::iter(unix).flatten())
}

/// One accepted or dialed connection, over TCP or the local socket.
pub enum Conn {
    Tcp(TcpStream),
    Unix(LocalStream),
}

impl Connected for Conn {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_flush(cx),
            Conn::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    /// A node's local socket is dialed when it serves one, TCP otherwise, and a connection
    /// carries bytes both ways either way.
    #[tokio::test]
    async fn dials_the_local_socket_and_falls_back_to_tcp() {
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = tcp.local_addr().expect("addr").to_string();
        let mut accepted = Box::pin(incoming(tcp, Some(&addr)));
        let pairs = [(Some(local_name(&addr)), "unix"), (None, "tcp")];
        for (local, want) in pairs {
            let mut c = dial(&addr, local.as_deref()).await.expect("dial");
            let mut s = accepted.next().await.expect("a connection").expect("accepted");
            let kind = |c: &Conn| if matches!(c, Conn::Unix(_)) { "unix" } else { "tcp" };
            assert_eq!((kind(&c), kind(&s)), (want, want));
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            c.write_all(b"ping").await.expect("write");
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).await.expect("read");
            assert_eq!(&buf, b"ping");
        }
        // Nobody serves a local socket for this address: TCP.
        let other = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let other_addr = other.local_addr().expect("addr").to_string();
        let c = dial(&other_addr, Some(&local_name(&other_addr))).await.expect("dial");
        assert!(matches!(c, Conn::Tcp(_)));
    }
}
