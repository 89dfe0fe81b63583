//! Where MySQL clients connect: the TCP address (`mysql_addr`) and, when configured, a Unix
//! socket (`socket`, MySQL's `--socket`) for clients on the same machine.
//!
//! Why a socket: on loopback TCP every answer runs the receiver's whole TCP stack (and, where
//! Docker is installed, netfilter's connection tracking) inside the sender's `sendto`; a Unix
//! socket hands the bytes over directly. A SQL node's worker serves many connections on one
//! thread, so what each answer costs it bounds its rate (benchmarks.md, "Thirty-eighth
//! session").

use std::io;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use shoal_proto::local_stream::LocalStream;
use tokio::net::{TcpListener, TcpStream, UnixListener};

/// The peer host of a socket client, as MySQL names it for account matching.
const SOCKET_PEER: &str = "localhost";

/// A client's connection, over either transport. Over the socket it is a [`LocalStream`]: it
/// wakes the worker only for data, where tokio's `UnixStream` would also wake it each time the
/// client reads an answer (room to write).
use shoal_proto::grpc::Conn as ClientStream;

/// A [`ClientStream`] detached from its runtime's reactor, to hand to another worker.
pub enum DetachedStream {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl DetachedStream {
    /// Registers the socket with the current runtime's reactor (it stays non-blocking).
    pub fn attach(self) -> io::Result<ClientStream> {
        Ok(match self {
            DetachedStream::Tcp(s) => ClientStream::Tcp(TcpStream::from_std(s)?),
            DetachedStream::Unix(s) => ClientStream::Unix(LocalStream::from_std(s)?),
        })
    }
}

/// The SQL node's listeners. Dropping them removes the socket file.
pub struct Listeners {
    tcp: TcpListener,
    unix: Option<(UnixListener, PathBuf)>,
}

impl Listeners {
    /// Listens on `tcp` and, if given, on the Unix socket `socket`. A socket file left behind
    /// by a node that is gone is replaced; one where a server still answers is an error.
    pub async fn bind(tcp: &str, socket: Option<&Path>) -> anyhow::Result<Listeners> {
        let tcp = TcpListener::bind(tcp).await.with_context(|| format!("listen on {tcp}"))?;
        let unix = match socket {
            Some(path) => Some((bind_socket(path)?, path.to_path_buf())),
            None => None,
        };
        Ok(Listeners { tcp, unix })
    }

    /// The next client, detached for the worker that will serve it, and its peer host
    /// (`localhost` for the socket).
    pub async fn accept(&self) -> io::Result<(DetachedStream, String)> {
        let unix = async {
            match &self.unix {
                Some((l, _)) => l.accept().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            a = self.tcp.accept() => {
                let (s, peer) = a?;
                // Answers go out as soon as they are written (they are written whole).
                let _ = s.set_nodelay(true);
                Ok((DetachedStream::Tcp(s.into_std()?), peer.to_string()))
            }
            a = unix => Ok((DetachedStream::Unix(a?.0.into_std()?), SOCKET_PEER.to_string())),
        }
    }
}

impl Drop for Listeners {
    fn drop(&mut self) {
        if let Some((_, path)) = &self.unix {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Binds the socket at `path`. Only a socket file nobody answers on is removed first: any
/// other file there (a mistyped path in the config) is left alone and the bind fails.
fn bind_socket(path: &Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt as _;
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!("another server listens on the socket {}", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("remove the stale socket {}", path.display()))?;
    }
    UnixListener::bind(path).with_context(|| format!("listen on the socket {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stale_socket_is_replaced_a_live_one_refused_and_other_files_kept() {
        let dir = std::env::temp_dir().join(format!("shoal-listen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        // A node killed with SIGKILL leaves its socket file behind.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let live = Listeners::bind("127.0.0.1:0", Some(&path)).await.expect("replaces the stale socket");
        let err = Listeners::bind("127.0.0.1:0", Some(&path)).await.err().expect("a live socket is refused");
        assert!(err.to_string().contains("another server listens"), "{err}");
        // A client on the socket is served as coming from localhost.
        let _c = std::os::unix::net::UnixStream::connect(&path).unwrap();
        let (stream, peer) = live.accept().await.unwrap();
        assert!(matches!(stream, DetachedStream::Unix(_)) && peer == SOCKET_PEER);
        assert!(matches!(stream.attach().unwrap(), ClientStream::Unix(_)));
        drop(live);
        assert!(!path.exists(), "the socket file goes with the listeners");
        // A file that is no socket is never removed.
        std::fs::write(&path, b"data").unwrap();
        assert!(Listeners::bind("127.0.0.1:0", Some(&path)).await.is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"data");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
