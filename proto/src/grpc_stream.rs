//! Bidirectional gRPC calls straight on an HTTP/2 connection (the `h2` crate), for the
//! long-lived call streams between nodes (`client/src/link.rs`). On the wire this is the gRPC
//! a tonic server expects: a POST to `/shoal.v1.DataNode/<Method>` with `content-type:
//! application/grpc`, each message framed by a compressed flag and a 4-byte length, the
//! status in the trailers.
//!
//! Why not tonic's client: through tonic and hyper, one message on a stream passes a channel
//! into a body, a piping task per stream that moves each frame from the body into h2, and on
//! the way back a decoder stacked in body wrappers. Here a sender encodes its message and
//! hands it to h2 itself, and one reader per stream decodes what arrives: the SQL node runs 8%
//! fewer instructions per point select and per `oltp_read_write` transaction (benchmarks.md,
//! "Twenty-seventh session"; h2's own connection task, which stays, is another 14%). Unary
//! calls stay on tonic.
//!
//! One HTTP/2 connection per node address ([`StreamConn`]) carries all the streams to it,
//! dialed as tonic's channels are ([`crate::grpc::dial_node`]) and kept alive by the same
//! pings (see `grpc.rs`): a ping unanswered in time drops the connection, and every stream on
//! it fails, so their callers reconnect instead of waiting for TCP to give up.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use h2::client::SendRequest;
use parking_lot::Mutex;

use crate::grpc::{Transport, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT, MAX_FRAME_BYTES};
use crate::{ErrorCode, ShoalError};

/// Flow-control windows this side announces (hyper's client defaults, which tonic used):
/// large enough that a stream of answers never waits for a window update on the way.
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 5 * 1024 * 1024;
/// The gRPC message header: a compressed flag and a big-endian length.
const HEADER: usize = 5;

fn unreachable(addr: &str, why: impl std::fmt::Display) -> ShoalError {
    ShoalError::new(ErrorCode::NodeNotReady, format!("{addr}: {why}"))
}

/// A connection and the number it was dialed as.
type Numbered = (u64, SendRequest<Bytes>);

/// The HTTP/2 connection for call streams to one node address, dialed on first use and again
/// after it breaks.
pub struct StreamConn {
    addr: String,
    transport: Transport,
    connect_timeout: Duration,
    /// Most bytes one answer may have.
    max_message: usize,
    /// The live connection, with the number it was dialed as: its driver task clears it when
    /// the connection ends, unless a newer one took its place.
    current: Arc<Mutex<Option<Numbered>>>,
    dialed: AtomicU64,
    /// Held while dialing, so concurrent callers dial once.
    dialing: tokio::sync::Mutex<()>,
}

impl StreamConn {
    pub fn new(addr: &str, connect_timeout: Duration, transport: Transport, max_message: usize) -> StreamConn {
        StreamConn {
            addr: addr.to_string(),
            transport,
            connect_timeout,
            max_message,
            current: Arc::new(Mutex::new(None)),
            dialed: AtomicU64::new(0),
            dialing: tokio::sync::Mutex::new(()),
        }
    }

    /// Opens a call of the streaming method at `path`: its sender and its reader.
    pub async fn open(&self, path: &'static str) -> Result<(CallSender, CallReader), ShoalError> {
        let req = || {
            http::Request::builder()
                .method(http::Method::POST)
                .uri(format!("http://{}{path}", self.addr))
                .header(http::header::CONTENT_TYPE, "application/grpc")
                .header(http::header::TE, "trailers")
                .body(())
                .map_err(|e| ShoalError::internal(format!("call request: {e}")))
        };
        let started = async |send: SendRequest<Bytes>, req| {
            let mut send = send.ready().await?;
            send.send_request(req, false)
        };
        let (number, send) = self.connection().await?;
        let (response, stream) = match started(send, req()?).await {
            Ok(r) => r,
            Err(e) => {
                // The connection went away (its peer restarted, or is stopping): once more on
                // a new one, so a caller does not pay for noticing it.
                self.forget(number);
                tracing::debug!(addr = self.addr, "call-stream connection gone: {e}");
                let (number, send) = self.connection().await?;
                started(send, req()?).await.map_err(|e| {
                    self.forget(number);
                    unreachable(&self.addr, e)
                })?
            }
        };
        // The server answers the headers at once for a streaming call, before any message.
        let response = tokio::time::timeout(self.connect_timeout.max(KEEPALIVE_TIMEOUT), response)
            .await
            .map_err(|_| unreachable(&self.addr, "no answer to a new call stream"))?
            .map_err(|e| unreachable(&self.addr, e))?;
        if response.status() != http::StatusCode::OK {
            return Err(unreachable(&self.addr, format!("call stream refused: HTTP {}", response.status())));
        }
        if let Some(status) = response.headers().get("grpc-status").filter(|s| s.as_bytes() != b"0") {
            let message = response.headers().get("grpc-message").and_then(|m| m.to_str().ok()).unwrap_or("");
            return Err(unreachable(&self.addr, format!("call stream refused: status {status:?} {message}")));
        }
        let reader = CallReader {
            addr: self.addr.clone(),
            body: response.into_body(),
            buf: BytesMut::new(),
            max_message: self.max_message,
        };
        Ok((CallSender { stream: Mutex::new(stream) }, reader))
    }

    /// The live connection and its number, dialing one if there is none.
    async fn connection(&self) -> Result<Numbered, ShoalError> {
        if let Some(c) = self.current.lock().clone() {
            return Ok(c);
        }
        let _dialing = self.dialing.lock().await;
        if let Some(c) = self.current.lock().clone() {
            return Ok(c);
        }
        let handshake = async {
            let io =
                crate::grpc::dial_node(&self.addr, self.transport).await.map_err(|e| unreachable(&self.addr, e))?;
            h2::client::Builder::new()
                .initial_window_size(STREAM_WINDOW)
                .initial_connection_window_size(CONNECTION_WINDOW)
                .max_frame_size(MAX_FRAME_BYTES)
                .handshake::<_, Bytes>(io)
                .await
                .map_err(|e| unreachable(&self.addr, e))
        };
        let (send, mut conn) = tokio::time::timeout(self.connect_timeout, handshake)
            .await
            .map_err(|_| unreachable(&self.addr, "connect timed out"))??;
        let number = self.dialed.fetch_add(1, Ordering::Relaxed) + 1;
        let pings = conn.ping_pong();
        let addr = self.addr.clone();
        let current = self.current.clone();
        tokio::spawn(async move {
            let keepalive = async move {
                let Some(mut pings) = pings else { return std::future::pending().await };
                loop {
                    tokio::time::sleep(KEEPALIVE_INTERVAL).await;
                    match tokio::time::timeout(KEEPALIVE_TIMEOUT, pings.ping(h2::Ping::opaque())).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => return format!("ping failed: {e}"),
                        Err(_) => return "ping not answered in time".to_string(),
                    }
                }
            };
            // Dropping the connection ends every stream on it with an error.
            let why = tokio::select! {
                r = &mut conn => r.err().map_or("closed".to_string(), |e| e.to_string()),
                why = keepalive => why,
            };
            tracing::debug!(addr, "call-stream connection ended: {why}");
            forget(&current, number);
        });
        *self.current.lock() = Some((number, send.clone()));
        Ok((number, send))
    }

    /// Forgets connection `number` (it broke): the next call dials a new one.
    fn forget(&self, number: u64) {
        forget(&self.current, number);
    }
}

fn forget(current: &Mutex<Option<Numbered>>, number: u64) {
    let mut current = current.lock();
    if current.as_ref().is_some_and(|(n, _)| *n == number) {
        *current = None;
    }
}

/// The sending half of a call stream; shared by every caller of the stream.
pub struct CallSender {
    stream: Mutex<h2::SendStream<Bytes>>,
}

impl CallSender {
    /// Encodes `msg` and queues it on the stream (h2 writes it when the connection task runs
    /// next). An error means the stream is broken.
    pub fn send<M: prost::Message>(&self, msg: &M) -> Result<(), h2::Error> {
        let len = msg.encoded_len();
        let mut buf = BytesMut::with_capacity(HEADER + len);
        buf.put_u8(0);
        buf.put_u32(len as u32);
        msg.encode(&mut buf).expect("the buffer holds the whole message");
        self.stream.lock().send_data(buf.freeze(), false)
    }
}

/// The receiving half of a call stream.
pub struct CallReader {
    addr: String,
    body: h2::RecvStream,
    buf: BytesMut,
    max_message: usize,
}

impl CallReader {
    /// Where the first message in `data` ends, if `data` holds all of it; an error for a
    /// message this reader refuses (compressed, or longer than `max_message`).
    fn whole(&self, data: &[u8]) -> Result<Option<usize>, ShoalError> {
        let Some(header) = data.get(..HEADER) else { return Ok(None) };
        if header[0] != 0 {
            return Err(unreachable(&self.addr, "a compressed message on a call stream"));
        }
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if len > self.max_message {
            return Err(unreachable(&self.addr, format!("a {len}-byte message on a call stream")));
        }
        Ok((data.len() >= HEADER + len).then_some(HEADER + len))
    }

    /// The next message, None when the stream ended with status OK; an error when it broke or
    /// ended otherwise.
    pub async fn message<M: prost::Message + Default>(&mut self) -> Result<Option<M>, ShoalError> {
        loop {
            if let Some(end) = self.whole(&self.buf)? {
                let mut frame = self.buf.split_to(end).freeze();
                frame.advance(HEADER);
                // Decoded from `Bytes`: the messages' `bytes` fields slice the frame.
                return M::decode(frame).map(Some).map_err(|e| unreachable(&self.addr, e));
            }
            match self.body.data().await {
                Some(Ok(chunk)) => {
                    let _ = self.body.flow_control().release_capacity(chunk.len());
                    // A chunk that is one whole message (the common case) is sliced, not copied.
                    if self.buf.is_empty() && self.whole(&chunk)? == Some(chunk.len()) {
                        return M::decode(chunk.slice(HEADER..)).map(Some).map_err(|e| unreachable(&self.addr, e));
                    }
                    self.buf.extend_from_slice(&chunk);
                }
                Some(Err(e)) => return Err(unreachable(&self.addr, e)),
                None => {
                    let trailers = self.body.trailers().await.map_err(|e| unreachable(&self.addr, e))?;
                    let status = trailers.as_ref().and_then(|t| t.get("grpc-status")).map(|s| s.as_bytes().to_vec());
                    return match status.as_deref() {
                        Some(b"0") => Ok(None),
                        _ => {
                            let message = trailers
                                .as_ref()
                                .and_then(|t| t.get("grpc-message"))
                                .and_then(|m| m.to_str().ok())
                                .unwrap_or("")
                                .to_string();
                            Err(unreachable(&self.addr, format!("call stream ended: {message}")))
                        }
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb;

    fn framed(msg: &pb::TaggedBatch) -> Vec<u8> {
        let body = prost::Message::encode_to_vec(msg);
        let mut out = vec![0];
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Messages arrive in whatever DATA frames the sender's h2 made: one per frame, several in
    /// one, one split over several, a header split in two. The reader gives each back whole
    /// and in order, then None at the OK trailers.
    #[tokio::test]
    async fn the_reader_reassembles_messages_across_and_within_data_frames() {
        let msgs: Vec<pb::TaggedBatch> = (1..=5)
            .map(|tag| pb::TaggedBatch {
                tag,
                batch: Some(pb::BatchRequest { epoch: tag * 1000, ..Default::default() }),
            })
            .collect();
        let all: Vec<u8> = msgs.iter().flat_map(framed).collect();
        let first = framed(&msgs[0]).len();
        // Frames: message 1 alone; then messages 2-5 cut at awkward places (inside a header,
        // inside a body, two messages in one frame).
        let cuts = [first, first + 3, first + 20, all.len() - 7, all.len()];

        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(async move {
            let mut conn = h2::server::handshake(server_io).await.unwrap();
            let (_req, mut respond) = conn.accept().await.unwrap().unwrap();
            let mut stream = respond.send_response(http::Response::new(()), false).unwrap();
            let mut from = 0;
            for to in cuts {
                stream.send_data(Bytes::copy_from_slice(&all[from..to]), false).unwrap();
                from = to;
            }
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", "0".parse().unwrap());
            stream.send_trailers(trailers).unwrap();
            while conn.accept().await.is_some() {}
        });
        let (send, conn) = h2::client::handshake(client_io).await.unwrap();
        tokio::spawn(conn);
        let mut send = send.ready().await.unwrap();
        let req = http::Request::builder().method("POST").uri("http://test/x").body(()).unwrap();
        let (response, _stream) = send.send_request(req, false).unwrap();
        let body = response.await.unwrap().into_body();
        let mut reader = CallReader { addr: "test".into(), body, buf: BytesMut::new(), max_message: 1 << 20 };
        for want in &msgs {
            let got: pb::TaggedBatch = reader.message().await.unwrap().expect("a message");
            assert_eq!(&got, want);
        }
        assert!(reader.message::<pb::TaggedBatch>().await.unwrap().is_none());
        server.abort();
    }
}
