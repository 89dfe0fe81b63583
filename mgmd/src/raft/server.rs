//! The receiving side of [`network`](super::network): the gRPC service `Raft`. Decodes the
//! openraft request, hands it to the local Raft, and sends the whole result back.

use serde::de::DeserializeOwned;
use serde::Serialize;
use shoal_proto::pb;
use tonic::{Request, Response, Status};

use super::network::{only_fatal, PlainReply, SnapshotReply};
use super::types::MgmdRaft;

pub struct RaftService {
    raft: MgmdRaft,
}

impl RaftService {
    pub fn new(raft: MgmdRaft) -> RaftService {
        RaftService { raft }
    }
}

fn decode<T: DeserializeOwned>(req: Request<pb::RaftPayload>) -> Result<T, Status> {
    serde_json::from_slice(&req.into_inner().json)
        .map_err(|e| Status::invalid_argument(format!("decode raft message: {e}")))
}

fn encode<T: Serialize>(reply: &T) -> Result<Response<pb::RaftPayload>, Status> {
    serde_json::to_vec(reply)
        .map(|json| Response::new(pb::RaftPayload { json }))
        .map_err(|e| Status::internal(format!("encode raft reply: {e}")))
}

#[tonic::async_trait]
impl pb::raft_server::Raft for RaftService {
    async fn append_entries(&self, req: Request<pb::RaftPayload>) -> Result<Response<pb::RaftPayload>, Status> {
        let reply: PlainReply<_> = self.raft.append_entries(decode(req)?).await.map_err(only_fatal);
        encode(&reply)
    }

    async fn vote(&self, req: Request<pb::RaftPayload>) -> Result<Response<pb::RaftPayload>, Status> {
        let reply: PlainReply<_> = self.raft.vote(decode(req)?).await.map_err(only_fatal);
        encode(&reply)
    }

    async fn install_snapshot(&self, req: Request<pb::RaftPayload>) -> Result<Response<pb::RaftPayload>, Status> {
        let reply: SnapshotReply = self.raft.install_snapshot(decode(req)?).await;
        encode(&reply)
    }
}
