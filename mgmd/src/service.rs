//! The gRPC service `Mgmd`. Handlers only validate and convert (prost types stop here) and
//! delegate to [`Consensus`] and [`Leader`]. Domain errors travel in the responses' `error`
//! field with their stable codes; a gRPC `Status` means the call itself failed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use shoal_proto::convert::state_to_pb;
use shoal_proto::pb;
use shoal_proto::{
    AccountName, Column, ErrorCode, IndexSpec, PasswordHashes, ShoalError, TableSpec, Trigger, UserAccount,
    MAX_RENAMES, MAX_TABLE_NAME_BYTES,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::leader::{Heartbeat, Leader};
use crate::raft::{raft_id, Consensus};
use crate::state::{Command, CommandResult};

/// Cluster maps queued per watcher. The watch channel underneath keeps only the newest map,
/// so a slow watcher skips epochs instead of growing a queue.
pub const WATCH_QUEUE_DEPTH: usize = 4;
/// Most concurrent `WatchClusterState` streams one mgmd serves.
pub const MAX_WATCHERS: usize = 4096;
/// Longest address a data node may register.
pub const MAX_ADDR_BYTES: usize = 256;
/// Longest progress text a data node may report.
pub const MAX_PROGRESS_BYTES: usize = 200;
/// Longest failure reason kept in the log.
pub const MAX_REASON_BYTES: usize = 512;

pub struct MgmdService {
    consensus: Consensus,
    leader: Arc<Leader>,
    shutdown: watch::Receiver<bool>,
    watchers: Arc<AtomicUsize>,
}

impl MgmdService {
    pub fn new(consensus: Consensus, leader: Arc<Leader>, shutdown: watch::Receiver<bool>) -> MgmdService {
        MgmdService { consensus, leader, shutdown, watchers: Arc::default() }
    }

    fn epoch(&self) -> u64 {
        self.consensus.published.current().epoch
    }

    fn admin(&self, res: CommandResult) -> Response<pb::AdminResponse> {
        Response::new(match res {
            Ok(o) => pb::AdminResponse {
                error: None,
                epoch: o.epoch,
                table: o.table.as_ref().map(pb::Table::from),
                users_version: o.users_version,
            },
            Err(e) => pb::AdminResponse { error: Some(e.into()), epoch: self.epoch(), table: None, users_version: 0 },
        })
    }

    /// Proposes `cmd` if this node leads; followers answer NOT_LEADER with a hint.
    async fn on_leader(&self, cmd: Command) -> CommandResult {
        if !self.consensus.is_leader() {
            return Err(self.consensus.not_leader(self.consensus.leader()));
        }
        self.consensus.propose(cmd).await
    }
}

fn invalid(msg: impl Into<String>) -> ShoalError {
    ShoalError::new(ErrorCode::InvalidArgument, msg)
}

fn nonzero(what: &str, v: u64) -> Result<(), ShoalError> {
    if v == 0 {
        return Err(invalid(format!("{what} must not be 0")));
    }
    Ok(())
}

fn heartbeat_from_pb(r: pb::HeartbeatRequest) -> Result<Heartbeat, ShoalError> {
    nonzero("node_id", r.node_id.into())?;
    nonzero("incarnation", r.incarnation)?;
    if r.addr.is_empty() || r.addr.len() > MAX_ADDR_BYTES || r.addr.chars().any(|c| c.is_control()) {
        return Err(invalid(format!("addr must be 1..={MAX_ADDR_BYTES} printable bytes")));
    }
    Ok(Heartbeat {
        node_id: r.node_id,
        incarnation: r.incarnation,
        addr: r.addr,
        pid: r.pid,
        epoch: r.epoch,
        loaded_gci: r.loaded.then_some(r.loaded_gci),
        restoring: r.restoring,
        progress: clip(r.progress, MAX_PROGRESS_BYTES),
    })
}

/// Cuts `s` to at most `max` bytes on a character boundary.
fn clip(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Releases a watcher slot when its stream task ends.
struct WatcherSlot(Arc<AtomicUsize>);

impl Drop for WatcherSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[tonic::async_trait]
impl pb::mgmd_server::Mgmd for MgmdService {
    async fn get_cluster_state(&self, _: Request<pb::Empty>) -> Result<Response<pb::ClusterState>, Status> {
        Ok(Response::new(pb::ClusterState::from(&*self.consensus.published.current())))
    }

    type WatchClusterStateStream = ReceiverStream<Result<pb::ClusterState, Status>>;

    async fn watch_cluster_state(
        &self,
        req: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchClusterStateStream>, Status> {
        if self.watchers.fetch_add(1, Ordering::Relaxed) >= MAX_WATCHERS {
            self.watchers.fetch_sub(1, Ordering::Relaxed);
            return Err(Status::resource_exhausted(format!("this mgmd serves at most {MAX_WATCHERS} watchers")));
        }
        let slot = WatcherSlot(self.watchers.clone());
        // Sent on every new epoch, every completed global checkpoint and every change of users.
        let mut last = (req.into_inner().known_epoch, 0, 0);
        let (tx, rx) = mpsc::channel(WATCH_QUEUE_DEPTH);
        let mut states = self.consensus.published.subscribe();
        let mut shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let _slot = slot;
            loop {
                let cur = states.borrow_and_update().clone();
                if (cur.epoch, cur.gci_complete, cur.users_version) != last {
                    last = (cur.epoch, cur.gci_complete, cur.users_version);
                    tokio::select! {
                        r = tx.send(Ok(pb::ClusterState::from(&*cur))) => if r.is_err() { break },
                        _ = shutdown.wait_for(|&s| s) => break,
                    }
                }
                tokio::select! {
                    r = states.changed() => if r.is_err() { break },
                    _ = tx.closed() => break,
                    _ = shutdown.wait_for(|&s| s) => break,
                }
            }
            // Dropping `tx` ends the stream cleanly (status OK) for the client.
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn status(&self, _: Request<pb::Empty>) -> Result<Response<pb::StatusResponse>, Status> {
        let m = self.consensus.raft.metrics().borrow().clone();
        let state = self.consensus.published.current();
        let mgmds = self
            .consensus
            .mgmds
            .iter()
            .map(|(&id, addr)| {
                let rid = raft_id(id);
                let leader = m.current_leader == Some(rid);
                let (raft_term, last_applied) = if id == self.consensus.id {
                    (m.current_term, m.last_applied.map_or(0, |l| l.index))
                } else {
                    // Of a peer we know its term only if it leads us, and, if we lead, how far
                    // its log matches ours (a lower bound of what it can apply).
                    let matched = m.replication.as_ref().and_then(|r| r.get(&rid)).and_then(|l| l.as_ref());
                    (if leader { m.current_term } else { 0 }, matched.map_or(0, |l| l.index))
                };
                pb::MgmdInfo { id, addr: addr.clone(), leader, raft_term, last_applied }
            })
            .collect();
        let progress = self
            .leader
            .progress()
            .into_iter()
            .map(|(node_id, progress)| pb::NodeProgress { node_id, progress })
            .collect();
        Ok(Response::new(pb::StatusResponse { state: Some(pb::ClusterState::from(&*state)), mgmds, progress }))
    }

    async fn heartbeat(&self, req: Request<pb::HeartbeatRequest>) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let res = heartbeat_from_pb(req.into_inner()).and_then(|hb| self.leader.heartbeat(hb));
        Ok(Response::new(match res {
            Ok(a) => pb::HeartbeatResponse {
                error: None,
                lease_ms: a.lease_ms,
                state: state_to_pb(a.state) as i32,
                epoch: a.epoch,
                restart_from_files: a.restart_from_files,
            },
            Err(e) => pb::HeartbeatResponse {
                error: Some(e.into()),
                lease_ms: 0,
                state: 0,
                epoch: self.epoch(),
                restart_from_files: false,
            },
        }))
    }

    async fn hurry_checkpoint(&self, req: Request<pb::HurryRequest>) -> Result<Response<pb::AdminResponse>, Status> {
        let error = match self.leader.hurry_checkpoint(req.into_inner().gci) {
            Ok(()) => None,
            Err(e) => Some(e.into()),
        };
        Ok(Response::new(pb::AdminResponse { error, epoch: 0, table: None, users_version: 0 }))
    }

    async fn node_synced(&self, req: Request<pb::NodeSyncedRequest>) -> Result<Response<pb::AdminResponse>, Status> {
        let r = req.into_inner();
        let res = match nonzero("node_id", r.node_id.into()).and(nonzero("incarnation", r.incarnation)) {
            Err(e) => Err(e),
            Ok(()) => {
                tracing::info!(node = r.node_id, sync_epoch = r.sync_epoch, "data node {} reports synced", r.node_id);
                self.on_leader(Command::Synced { id: r.node_id, incarnation: r.incarnation, sync_epoch: r.sync_epoch })
                    .await
            }
        };
        Ok(self.admin(res))
    }

    async fn report_failure(
        &self,
        req: Request<pb::ReportFailureRequest>,
    ) -> Result<Response<pb::AdminResponse>, Status> {
        let r = req.into_inner();
        let res = match nonzero("node_id", r.node_id.into()) {
            Err(e) => Err(e),
            Ok(()) => self.leader.report_failure(r.reporter, r.node_id, &clip(r.reason, MAX_REASON_BYTES)).await,
        };
        Ok(self.admin(res))
    }

    async fn create_table(&self, req: Request<pb::CreateTableRequest>) -> Result<Response<pb::AdminResponse>, Status> {
        let r = req.into_inner();
        let spec = r.spec.ok_or_else(|| invalid("missing table spec")).and_then(TableSpec::try_from);
        let res = match spec {
            Err(e) => Err(e),
            Ok(spec) => {
                tracing::info!(table = %spec.name, "create table {}", spec.name);
                let indexes = r.indexes.into_iter().map(IndexSpec::from).collect();
                self.on_leader(Command::CreateTable { spec, if_not_exists: r.if_not_exists, indexes }).await
            }
        };
        Ok(self.admin(res))
    }

    async fn create_index(&self, req: Request<pb::CreateIndexRequest>) -> Result<Response<pb::AdminResponse>, Status> {
        let r = req.into_inner();
        let res = match r.index {
            None => Err(invalid("missing index")),
            Some(_) if table_name_bad(&r.table) => Err(bad_table_name()),
            Some(index) => {
                let index = IndexSpec::from(index);
                tracing::info!(table = %r.table, "create index {}", index.name);
                self.on_leader(Command::CreateIndex { table: r.table, index, if_not_exists: r.if_not_exists }).await
            }
        };
        Ok(self.admin(res))
    }

    async fn set_read_only(&self, req: Request<pb::SetReadOnlyRequest>) -> Result<Response<pb::AdminResponse>, Status> {
        let r = req.into_inner();
        let res = if table_name_bad(&r.table) {
            Err(bad_table_name())
        } else {
            tracing::debug!(table = %r.table, read_only = r.read_only, "set read-only");
            if r.read_only {
                self.leader.renew_read_only(&r.table);
            }
            self.on_leader(Command::SetReadOnly { table: r.table, read_only: r.read_only }).await
        };
        Ok(self.admin(res))
    }

    async fn replace_table(
        &self,
        req: Request<pb::ReplaceTableRequest>,
    ) -> Result<Response<pb::AdminResponse>, Status> {
        let r = req.into_inner();
        let res = if table_name_bad(&r.table) || table_name_bad(&r.with) {
            Err(bad_table_name())
        } else {
            tracing::info!(table = %r.table, with = %r.with, "replace table");
            self.on_leader(Command::ReplaceTable { table: r.table, with: r.with }).await
        };
        Ok(self.admin(res))
    }

    async fn rename_tables(
        &self,
        req: Request<pb::RenameTablesRequest>,
    ) -> Result<Response<pb::AdminResponse>, Status> {
        let r = req.into_inner();
        let res = if r.renames.is_empty() || r.renames.len() > MAX_RENAMES {
            Err(invalid(format!("a rename names 1..={MAX_RENAMES} tables")))
        } else if r.renames.iter().any(|x| table_name_bad(&x.from) || table_name_bad(&x.to)) {
            Err(bad_table_name())
        } else {
            let renames: Vec<(String, String)> = r.renames.into_iter().map(|x| (x.from, x.to)).collect();
            tracing::info!(?renames, "rename tables");
            self.on_leader(Command::RenameTables { renames }).await
        };
        Ok(self.admin(res))
    }

    async fn set_columns(&self, req: Request<pb::SetColumnsRequest>) -> Result<Response<pb::AdminResponse>, Status> {
        let r = req.into_inner();
        let columns: Result<Vec<Column>, ShoalError> = r.columns.into_iter().map(Column::try_from).collect();
        let res = match columns {
            _ if table_name_bad(&r.table) => Err(bad_table_name()),
            Err(e) => Err(e),
            Ok(columns) => {
                tracing::info!(table = %r.table, "set columns");
                self.on_leader(Command::SetColumns { table: r.table, columns }).await
            }
        };
        Ok(self.admin(res))
    }

    async fn rename_index(&self, req: Request<pb::RenameIndexRequest>) -> Result<Response<pb::AdminResponse>, Status> {
        let r = req.into_inner();
        let res = if table_name_bad(&r.table) {
            Err(bad_table_name())
        } else if table_name_bad(&r.from) || table_name_bad(&r.to) {
            Err(invalid(format!("index names must be 1..={MAX_TABLE_NAME_BYTES} bytes")))
        } else {
            tracing::info!(table = %r.table, from = %r.from, to = %r.to, "rename index");
            self.on_leader(Command::RenameIndex { table: r.table, from: r.from, to: r.to }).await
        };
        Ok(self.admin(res))
    }

    async fn create_trigger(
        &self,
        req: Request<pb::CreateTriggerRequest>,
    ) -> Result<Response<pb::AdminResponse>, Status> {
        let r = req.into_inner();
        let trigger = r.trigger.ok_or_else(|| invalid("missing trigger")).and_then(Trigger::try_from);
        let res = match trigger {
            _ if table_name_bad(&r.table) => Err(bad_table_name()),
            Err(e) => Err(e),
            Ok(trigger) => {
                tracing::info!(table = %r.table, trigger = %trigger.name, "create trigger");
                self.on_leader(Command::CreateTrigger { table: r.table, trigger, if_not_exists: r.if_not_exists }).await
            }
        };
        Ok(self.admin(res))
    }

    async fn drop_trigger(&self, req: Request<pb::DropTriggerRequest>) -> Result<Response<pb::AdminResponse>, Status> {
        let r = req.into_inner();
        let res = if table_name_bad(&r.name) || table_name_bad(&r.database) {
            Err(invalid(format!("trigger and database names must be 1..={MAX_TABLE_NAME_BYTES} bytes")))
        } else {
            tracing::info!(database = %r.database, trigger = %r.name, "drop trigger");
            self.on_leader(Command::DropTrigger { database: r.database, name: r.name, if_exists: r.if_exists }).await
        };
        Ok(self.admin(res))
    }

    async fn drop_index(&self, req: Request<pb::DropIndexRequest>) -> Result<Response<pb::AdminResponse>, Status> {
        let r = req.into_inner();
        let res = if table_name_bad(&r.table) {
            Err(bad_table_name())
        } else {
            tracing::info!(table = %r.table, "drop index {}", r.name);
            self.on_leader(Command::DropIndex { table: r.table, name: r.name, if_exists: r.if_exists }).await
        };
        Ok(self.admin(res))
    }

    async fn create_users(&self, req: Request<pb::CreateUsersRequest>) -> Result<Response<pb::AdminResponse>, Status> {
        Ok(self.users_command(UserRequest::Create(req.into_inner())).await)
    }

    async fn drop_users(&self, req: Request<pb::DropUsersRequest>) -> Result<Response<pb::AdminResponse>, Status> {
        Ok(self.users_command(UserRequest::Drop(req.into_inner())).await)
    }

    async fn set_password(&self, req: Request<pb::SetPasswordRequest>) -> Result<Response<pb::AdminResponse>, Status> {
        Ok(self.users_command(UserRequest::SetPassword(req.into_inner())).await)
    }

    async fn grant(&self, req: Request<pb::GrantRequest>) -> Result<Response<pb::AdminResponse>, Status> {
        Ok(self.users_command(UserRequest::Grant(req.into_inner())).await)
    }

    async fn list_users(&self, _: Request<pb::Empty>) -> Result<Response<pb::UsersResponse>, Status> {
        let users = self.consensus.published.users();
        Ok(Response::new(pb::UsersResponse {
            error: None,
            users_version: users.0,
            users: users.1.iter().map(pb::UserAccount::from).collect(),
        }))
    }

    async fn drop_table(&self, req: Request<pb::DropTableRequest>) -> Result<Response<pb::AdminResponse>, Status> {
        let r = req.into_inner();
        let res = if table_name_bad(&r.name) {
            Err(bad_table_name())
        } else {
            tracing::info!(table = %r.name, "drop table {}", r.name);
            self.on_leader(Command::DropTable { name: r.name, if_exists: r.if_exists }).await
        };
        Ok(self.admin(res))
    }
}

/// At most this many accounts in one request (MAX_USERS bounds the table anyway).
pub const MAX_ACCOUNTS_PER_REQUEST: usize = shoal_proto::users::MAX_USERS;

fn accounts_from_pb(accounts: Vec<pb::AccountName>) -> Result<Vec<AccountName>, ShoalError> {
    if accounts.is_empty() || accounts.len() > MAX_ACCOUNTS_PER_REQUEST {
        return Err(invalid(format!("name 1..={MAX_ACCOUNTS_PER_REQUEST} accounts")));
    }
    accounts.into_iter().map(AccountName::try_from).collect()
}

fn users_command_from_pb(req: UserRequest) -> Result<Command, ShoalError> {
    Ok(match req {
        UserRequest::Create(r) => {
            if r.users.is_empty() || r.users.len() > MAX_ACCOUNTS_PER_REQUEST {
                return Err(invalid(format!("name 1..={MAX_ACCOUNTS_PER_REQUEST} accounts")));
            }
            let users = r.users.into_iter().map(UserAccount::try_from).collect::<Result<_, _>>()?;
            Command::CreateUsers { users, if_not_exists: r.if_not_exists }
        }
        UserRequest::Drop(r) => Command::DropUsers { accounts: accounts_from_pb(r.accounts)?, if_exists: r.if_exists },
        UserRequest::SetPassword(r) => {
            let if_exists = r.if_exists;
            let (account, password) = <(AccountName, PasswordHashes)>::try_from(r)?;
            Command::SetPassword { account, password, if_exists }
        }
        UserRequest::Grant(r) => {
            let database = (!r.database.is_empty()).then_some(r.database);
            if let Some(db) = &database {
                shoal_proto::users::check_grant_db(db)?;
            }
            Command::Grant { accounts: accounts_from_pb(r.accounts)?, database, revoke: r.revoke }
        }
    })
}

/// The user-changing requests, converted in one place.
enum UserRequest {
    Create(pb::CreateUsersRequest),
    Drop(pb::DropUsersRequest),
    SetPassword(pb::SetPasswordRequest),
    Grant(pb::GrantRequest),
}

impl MgmdService {
    async fn users_command(&self, req: UserRequest) -> Response<pb::AdminResponse> {
        let res = match users_command_from_pb(req) {
            Err(e) => Err(e),
            Ok(cmd) => {
                // Names only: never the hashes.
                tracing::info!("{} requested", cmd.kind());
                self.on_leader(cmd).await
            }
        };
        self.admin(res)
    }
}

/// Whether a table name in a request is out of bounds (the catalog checks the rest).
fn table_name_bad(name: &str) -> bool {
    name.is_empty() || name.len() > MAX_TABLE_NAME_BYTES
}

fn bad_table_name() -> ShoalError {
    invalid(format!("table name must be 1..={MAX_TABLE_NAME_BYTES} bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_validation() {
        let ok = pb::HeartbeatRequest {
            node_id: 3,
            incarnation: 9,
            addr: "127.0.0.1:1".into(),
            pid: 1,
            epoch: 0,
            loaded: true,
            loaded_gci: 0,
            restoring: false,
            progress: String::new(),
        };
        assert!(heartbeat_from_pb(ok.clone()).is_ok());
        for bad in [
            pb::HeartbeatRequest { node_id: 0, ..ok.clone() },
            pb::HeartbeatRequest { incarnation: 0, ..ok.clone() },
            pb::HeartbeatRequest { addr: String::new(), ..ok.clone() },
            pb::HeartbeatRequest { addr: "x".repeat(MAX_ADDR_BYTES + 1), ..ok.clone() },
            pb::HeartbeatRequest { addr: "a\nb".into(), ..ok.clone() },
        ] {
            assert_eq!(heartbeat_from_pb(bad).unwrap_err().code, ErrorCode::InvalidArgument);
        }
    }

    #[test]
    fn user_requests_are_validated_at_the_edge() {
        let ann = || pb::AccountName { name: "ann".into(), host: "%".into() };
        let user = pb::UserAccount {
            name: "ann".into(),
            host: "%".into(),
            plugin: pb::AuthPlugin::NativePassword as i32,
            native_hash: vec![1; 20],
            sha2_hash: vec![2; 32],
            global_all: false,
            databases: vec!["shop".into()],
        };
        let create =
            |u: pb::UserAccount| UserRequest::Create(pb::CreateUsersRequest { users: vec![u], if_not_exists: false });
        assert!(matches!(users_command_from_pb(create(user.clone())), Ok(Command::CreateUsers { .. })));
        for bad in [
            pb::UserAccount { name: String::new(), ..user.clone() },
            pb::UserAccount { host: "x".repeat(300), ..user.clone() },
            pb::UserAccount { plugin: 0, ..user.clone() },
            pb::UserAccount { native_hash: vec![1; 19], ..user.clone() },
            pb::UserAccount { sha2_hash: vec![], ..user.clone() },
            pb::UserAccount { databases: vec![String::new()], ..user.clone() },
        ] {
            assert_eq!(users_command_from_pb(create(bad)).unwrap_err().code, ErrorCode::InvalidArgument);
        }
        let none = UserRequest::Create(pb::CreateUsersRequest { users: vec![], if_not_exists: false });
        assert!(users_command_from_pb(none).is_err());
        let drop = UserRequest::Drop(pb::DropUsersRequest { accounts: vec![], if_exists: true });
        assert!(users_command_from_pb(drop).is_err());
        let grant =
            UserRequest::Grant(pb::GrantRequest { accounts: vec![ann()], database: String::new(), revoke: false });
        assert!(matches!(users_command_from_pb(grant), Ok(Command::Grant { database: None, .. })));
        let pw = UserRequest::SetPassword(pb::SetPasswordRequest {
            account: None,
            plugin: pb::AuthPlugin::NativePassword as i32,
            native_hash: vec![],
            sha2_hash: vec![],
            if_exists: false,
        });
        assert!(users_command_from_pb(pw).is_err(), "an account is required");
    }

    #[test]
    fn clip_keeps_char_boundaries() {
        assert_eq!(clip("héllo".into(), 2), "h");
        assert_eq!(clip("abc".into(), 10), "abc");
    }
}
