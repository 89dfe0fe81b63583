//! Raft messages between mgmds, over the gRPC service `Raft`.
//!
//! Requests and replies are openraft's own types as JSON inside `RaftPayload`: the control
//! plane is small and rare, and JSON keeps this layer free of a second schema. The reply is
//! the remote call's whole `Result`, so a remote Raft error comes back as
//! [`RPCError::RemoteError`] rather than as a transport failure.
//!
//! Each peer gets one long-lived, lazily connected tonic channel that every RPC to it shares;
//! a channel per RPC would pay a TCP and HTTP/2 handshake per heartbeat.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    Fatal, Infallible, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::BasicNode;
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::Serialize;
use shoal_proto::pb;
use shoal_proto::pb::raft_client::RaftClient;
use tonic::transport::{Channel, Endpoint};

use super::types::{RaftNodeId, TypeConfig};

/// Largest Raft message either side accepts. Snapshot chunks are kept well below it.
pub const MAX_RAFT_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// How long to wait for a TCP connection to a peer before calling it unreachable.
pub const CONNECT_TIMEOUT_MS: u64 = 500;
/// How long openraft waits before retrying an unreachable peer. Shorter than openraft's
/// default (500 ms) because a restarted mgmd on loopback is back within a fraction of that.
pub const UNREACHABLE_BACKOFF_MS: u64 = 200;

/// What append-entries and vote send back: they fail only when the remote Raft stopped.
pub(crate) type PlainReply<T> = Result<T, Fatal<RaftNodeId>>;
/// What install-snapshot sends back.
pub(crate) type SnapshotReply =
    Result<InstallSnapshotResponse<RaftNodeId>, RaftError<RaftNodeId, InstallSnapshotError>>;

/// Drops the impossible API error of calls whose error type is `Infallible`.
pub(crate) fn only_fatal(e: RaftError<RaftNodeId>) -> Fatal<RaftNodeId> {
    match e {
        RaftError::Fatal(f) => f,
        RaftError::APIError(never) => match never {},
    }
}

pub struct Network {
    my_id: RaftNodeId,
    /// Peer id → (address, channel). Replaced only if the peer's address changes.
    channels: Arc<Mutex<HashMap<RaftNodeId, (String, Channel)>>>,
}

impl Network {
    pub fn new(my_id: RaftNodeId) -> Network {
        Network { my_id, channels: Arc::default() }
    }
}

fn channel_to(addr: &str) -> Result<Channel, tonic::transport::Error> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(1))
        .keep_alive_timeout(Duration::from_secs(1))
        .keep_alive_while_idle(true)
        .connect_lazy())
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: RaftNodeId, node: &BasicNode) -> PeerClient {
        let client = {
            let mut channels = self.channels.lock();
            match channels.get(&target) {
                Some((addr, ch)) if *addr == node.addr => Ok(ch.clone()),
                _ => match channel_to(&node.addr) {
                    Ok(ch) => {
                        channels.insert(target, (node.addr.clone(), ch.clone()));
                        Ok(ch)
                    }
                    Err(e) => Err(format!("bad address {:?} for mgmd {target}: {e}", node.addr)),
                },
            }
        }
        .map(|ch| {
            RaftClient::new(ch)
                .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES)
        });
        PeerClient { my_id: self.my_id, target, node: node.clone(), client }
    }
}

pub struct PeerClient {
    my_id: RaftNodeId,
    target: RaftNodeId,
    node: BasicNode,
    client: Result<RaftClient<Channel>, String>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Msg(String);

// The error types are openraft's, fixed by the `RaftNetwork` trait; boxing them here would
// only move the unboxing to every caller.
#[allow(clippy::result_large_err)]
impl PeerClient {
    /// Sends `req` as `action` and returns the remote result's payload, still undecoded.
    async fn call<E: std::error::Error>(
        &mut self,
        action: RPCTypes,
        req: &impl Serialize,
        option: &RPCOption,
    ) -> Result<Vec<u8>, RPCError<RaftNodeId, BasicNode, E>> {
        let mut client = match &self.client {
            Ok(c) => c.clone(),
            Err(e) => return Err(Unreachable::new(&Msg(e.clone())).into()),
        };
        let json = serde_json::to_vec(req).map_err(|e| NetworkError::new(&e))?;
        let ttl = option.hard_ttl();
        let mut request = tonic::Request::new(pb::RaftPayload { json });
        request.set_timeout(ttl);
        let fut = async move {
            match action {
                RPCTypes::AppendEntries => client.append_entries(request).await,
                RPCTypes::Vote => client.vote(request).await,
                RPCTypes::InstallSnapshot => client.install_snapshot(request).await,
            }
        };
        let timeout = || Timeout { action, id: self.my_id, target: self.target, timeout: ttl };
        match tokio::time::timeout(ttl, fut).await {
            Err(_) => Err(timeout().into()),
            Ok(Ok(resp)) => Ok(resp.into_inner().json),
            Ok(Err(status)) => Err(match status.code() {
                // Connection refused or reset: let openraft back off instead of spinning.
                tonic::Code::Unavailable => Unreachable::new(&status).into(),
                tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => timeout().into(),
                _ => NetworkError::new(&status).into(),
            }),
        }
    }

    fn decode<T: DeserializeOwned, E: std::error::Error>(
        &self,
        bytes: &[u8],
    ) -> Result<T, RPCError<RaftNodeId, BasicNode, E>> {
        serde_json::from_slice(bytes).map_err(|e| NetworkError::new(&e).into())
    }

    fn remote<E: std::error::Error>(&self, e: E) -> RPCError<RaftNodeId, BasicNode, E> {
        RemoteError::new_with_node(self.target, self.node.clone(), e).into()
    }

    async fn plain<Req: Serialize, Resp: DeserializeOwned>(
        &mut self,
        action: RPCTypes,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<RaftNodeId, BasicNode, RaftError<RaftNodeId, Infallible>>> {
        let bytes = self.call(action, req, option).await?;
        match self.decode::<PlainReply<Resp>, _>(&bytes)? {
            Ok(r) => Ok(r),
            Err(fatal) => Err(self.remote(RaftError::Fatal(fatal))),
        }
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<RaftNodeId>, RPCError<RaftNodeId, BasicNode, RaftError<RaftNodeId>>> {
        self.plain(RPCTypes::AppendEntries, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<RaftNodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<RaftNodeId>, RPCError<RaftNodeId, BasicNode, RaftError<RaftNodeId>>> {
        self.plain(RPCTypes::Vote, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<RaftNodeId>,
        RPCError<RaftNodeId, BasicNode, RaftError<RaftNodeId, InstallSnapshotError>>,
    > {
        let bytes = self.call(RPCTypes::InstallSnapshot, &rpc, &option).await?;
        match self.decode::<SnapshotReply, _>(&bytes)? {
            Ok(r) => Ok(r),
            Err(e) => Err(self.remote(e)),
        }
    }

    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(std::iter::repeat(Duration::from_millis(UNREACHABLE_BACKOFF_MS)))
    }
}
