//! The mgmd state machine: the replicated cluster model and the commands that change it.
//!
//! Pure and deterministic: Raft applies the same commands in the same order on every mgmd, so
//! nothing here reads the clock, the network or the disk. Time-based decisions (a node missed
//! its heartbeats) are taken by the leader outside and arrive here as commands.

use serde::{Deserialize, Serialize};
use shoal_proto::config::ClusterConfig;
use shoal_proto::users::{account_list, MAX_GRANTS_PER_USER, MAX_USERS};
use shoal_proto::{
    AccountName, ClusterState, Column, Epoch, ErrorCode, IndexSpec, Node, NodeId, NodeKind, NodeState,
    PartitionAssignment, PartitionId, PasswordHashes, Replica, RolledBack, ShoalError, Table, TableSpec, Trigger,
    UserAccount, MAX_INDEXES, MAX_RENAMES, MAX_TRIGGERS, MAX_TRIGGER_BODY_BYTES,
};

/// A replica's sync epoch until `apply` stamps it with the epoch of the command that set it.
const SYNC_EPOCH_PENDING: Epoch = Epoch::MAX;

/// Rolled-back GCI ranges the map remembers.
pub const MAX_ROLLED_BACK: usize = 16;

/// Most tables in one cluster.
pub const MAX_TABLES: usize = 4096;

/// The newest global checkpoint any data node of `group` can restore from its files.
fn newest_restorable(cluster: &ClusterState, group: u32) -> u64 {
    cluster
        .nodes
        .iter()
        .filter(|n| n.kind == NodeKind::DataNode && n.node_group == group)
        .map(|n| n.restorable_gci)
        .max()
        .unwrap_or(0)
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JoinInfo {
    pub id: NodeId,
    pub addr: String,
    pub pid: u32,
    pub incarnation: u64,
    /// The global checkpoint the node restored from its own files; None when it could not.
    #[serde(default)]
    pub loaded_gci: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// Sets the configuration and lays out the partition map. Ignored once bootstrapped.
    Bootstrap {
        config: ClusterConfig,
    },
    /// Data nodes (re)joining. Nodes of a group that has live primaries join as syncing
    /// replicas; nodes of a group with none start it together and share its primaries.
    Join {
        nodes: Vec<JoinInfo>,
    },
    /// A starting node finished copying every partition it holds.
    Synced {
        id: NodeId,
        incarnation: u64,
        sync_epoch: Epoch,
    },
    /// A data node failed (missed heartbeats, or a peer could not reach it).
    Down {
        id: NodeId,
        incarnation: u64,
        reason: String,
    },
    CreateTable {
        spec: TableSpec,
        if_not_exists: bool,
        /// Ordered indexes the table starts with (ids are assigned here).
        #[serde(default)]
        indexes: Vec<IndexSpec>,
    },
    DropTable {
        name: String,
        if_exists: bool,
    },
    /// Adds an ordered index; data nodes build it from their rows when they install the map.
    CreateIndex {
        table: String,
        index: IndexSpec,
        if_not_exists: bool,
    },
    DropIndex {
        table: String,
        name: String,
        if_exists: bool,
    },
    /// Refuses (or allows again) writes to a table: ALTER TABLE copies its rows meanwhile.
    SetReadOnly {
        table: String,
        read_only: bool,
    },
    /// The end of an ALTER TABLE by copy: table `with` takes `table`'s name, `table` goes.
    ReplaceTable {
        table: String,
        with: String,
    },
    /// RENAME TABLE: each `(from, to)` in order (a later pair may take a name an earlier one
    /// freed, so `a TO tmp, b TO a, tmp TO b` swaps), all or none. Only names change: the table
    /// id, and with it every row and index the data nodes hold, stays. Unique indexes' hidden
    /// tables follow their table into another database.
    RenameTables {
        renames: Vec<(String, String)>,
    },
    /// ALTER TABLE that renames columns or changes defaults only: `columns` replace the
    /// table's (see `Table::with_columns_renamed`); rows and indexes stay.
    SetColumns {
        table: String,
        columns: Vec<Column>,
    },
    /// ALTER TABLE … RENAME INDEX: only the name changes (the id, and with it the entries and a
    /// unique index's hidden table, stays).
    RenameIndex {
        table: String,
        from: String,
        to: String,
    },
    /// CREATE TRIGGER on `table` (`db.t`), fired after the table's other triggers of the same
    /// timing and event. Its name must be free in the table's database.
    CreateTrigger {
        table: String,
        trigger: Trigger,
        if_not_exists: bool,
    },
    /// DROP TRIGGER `database`.`name`.
    DropTrigger {
        database: String,
        name: String,
        if_exists: bool,
    },
    /// Moves primaries back to their preferred nodes, where those are up and complete.
    Rebalance,
    /// Global checkpoint `gci` is on disk on every live data node; `restorable` are the nodes
    /// whose own files can restore it. Changes no map, so it does not raise the epoch.
    GciComplete {
        gci: u64,
        restorable: Vec<NodeId>,
    },
    /// SQL users (all-or-nothing, like MySQL's account statements). User commands change no
    /// map, so they raise `users_version`, never the epoch.
    CreateUsers {
        users: Vec<UserAccount>,
        if_not_exists: bool,
    },
    DropUsers {
        accounts: Vec<AccountName>,
        if_exists: bool,
    },
    SetPassword {
        account: AccountName,
        password: PasswordHashes,
        if_exists: bool,
    },
    /// GRANT (or REVOKE, `revoke`) ALL PRIVILEGES ON `database`.* — ON *.* when None.
    Grant {
        accounts: Vec<AccountName>,
        database: Option<String>,
        revoke: bool,
    },
}

impl Command {
    /// Short name for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Command::Bootstrap { .. } => "bootstrap",
            Command::Join { .. } => "join",
            Command::Synced { .. } => "synced",
            Command::Down { .. } => "down",
            Command::CreateTable { .. } => "create-table",
            Command::DropTable { .. } => "drop-table",
            Command::CreateIndex { .. } => "create-index",
            Command::DropIndex { .. } => "drop-index",
            Command::SetReadOnly { .. } => "set-read-only",
            Command::ReplaceTable { .. } => "replace-table",
            Command::RenameTables { .. } => "rename-tables",
            Command::SetColumns { .. } => "set-columns",
            Command::RenameIndex { .. } => "rename-index",
            Command::CreateTrigger { .. } => "create-trigger",
            Command::DropTrigger { .. } => "drop-trigger",
            Command::Rebalance => "rebalance",
            Command::GciComplete { .. } => "gci-complete",
            Command::CreateUsers { .. } => "create-users",
            Command::DropUsers { .. } => "drop-users",
            Command::SetPassword { .. } => "set-password",
            Command::Grant { .. } => "grant",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub epoch: Epoch,
    pub table: Option<Table>,
    /// The users version after a user command.
    #[serde(default)]
    pub users_version: u64,
}

pub type CommandResult = Result<Outcome, ShoalError>;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Model {
    pub config: Option<ClusterConfig>,
    pub cluster: ClusterState,
    pub next_table_id: u32,
    /// The catalog's SQL users. A model saved before users existed loads with the initial root
    /// account, which is what SQL nodes then accepted.
    #[serde(default = "initial_users")]
    pub users: Vec<UserAccount>,
}

fn initial_users() -> Vec<UserAccount> {
    vec![UserAccount::initial_root()]
}

/// Where `account` is in `users`.
fn find_user(users: &[UserAccount], account: &AccountName) -> Option<usize> {
    users.iter().position(|u| u.account.is(&account.name, &account.host))
}

/// The database of a catalog table name `db.t`.
fn database_of(table: &str) -> &str {
    table.split_once('.').map_or("", |(db, _)| db)
}

fn err(code: ErrorCode, msg: impl Into<String>) -> ShoalError {
    ShoalError::new(code, msg)
}

/// The data node that should be primary of `partition` when its whole group is up: the
/// primaries of a group rotate over its members so each carries an equal share.
pub fn preferred_primary(cluster: &ClusterState, groups: u32, partition: &PartitionAssignment) -> Option<NodeId> {
    let members: Vec<NodeId> = cluster
        .nodes
        .iter()
        .filter(|n| n.kind == NodeKind::DataNode && n.node_group == partition.node_group)
        .map(|n| n.id)
        .collect();
    members.get(((partition.partition / groups.max(1)) as usize) % members.len().max(1)).copied()
}

/// See [`Model::misplaced_primaries`].
pub fn misplaced_primaries(cluster: &ClusterState, groups: u32) -> Vec<PartitionId> {
    cluster
        .partitions
        .iter()
        .filter(|p| p.primary.is_some())
        .filter(|p| {
            let Some(want) = preferred_primary(cluster, groups, p) else { return false };
            let up = cluster.node(want).is_some_and(|n| n.state == NodeState::Up);
            let complete = p.replica(want).is_some_and(|r| !r.syncing());
            p.primary != Some(want) && up && complete
        })
        .map(|p| p.partition)
        .collect()
}

impl Model {
    pub fn is_bootstrapped(&self) -> bool {
        self.config.is_some()
    }

    pub fn apply(&mut self, cmd: Command) -> CommandResult {
        let cmd = match cmd {
            Command::GciComplete { gci, restorable } => return self.gci_complete(gci, &restorable),
            Command::CreateUsers { .. }
            | Command::DropUsers { .. }
            | Command::SetPassword { .. }
            | Command::Grant { .. } => return self.users_command(cmd),
            cmd => cmd,
        };
        let before = self.cluster.clone();
        let result = match cmd {
            Command::Bootstrap { config } => self.bootstrap(config),
            Command::Join { nodes } => self.join(nodes),
            Command::Synced { id, incarnation, sync_epoch } => self.synced(id, incarnation, sync_epoch),
            Command::Down { id, incarnation, reason: _ } => self.down(id, incarnation),
            Command::CreateTable { spec, if_not_exists, indexes } => self.create_table(spec, if_not_exists, indexes),
            Command::DropTable { name, if_exists } => self.drop_table(&name, if_exists),
            Command::CreateIndex { table, index, if_not_exists } => self.create_index(&table, index, if_not_exists),
            Command::DropIndex { table, name, if_exists } => self.drop_index(&table, &name, if_exists),
            Command::SetReadOnly { table, read_only } => self.set_read_only(&table, read_only),
            Command::ReplaceTable { table, with } => self.replace_table(&table, &with),
            Command::RenameTables { renames } => self.rename_tables(&renames),
            Command::SetColumns { table, columns } => self.set_columns(&table, columns),
            Command::RenameIndex { table, from, to } => self.rename_index(&table, &from, &to),
            Command::CreateTrigger { table, trigger, if_not_exists } => {
                self.create_trigger(&table, trigger, if_not_exists)
            }
            Command::DropTrigger { database, name, if_exists } => self.drop_trigger(&database, &name, if_exists),
            Command::Rebalance => self.rebalance(),
            Command::GciComplete { .. }
            | Command::CreateUsers { .. }
            | Command::DropUsers { .. }
            | Command::SetPassword { .. }
            | Command::Grant { .. } => unreachable!("handled above"),
        };
        match result {
            Ok(mut out) => {
                // The epoch moves on every change of the map, and only then.
                if self.cluster != before {
                    self.cluster.epoch = before.epoch + 1;
                    self.stamp_new_terms(before.epoch + 1);
                }
                out.epoch = self.cluster.epoch;
                Ok(out)
            }
            Err(e) => {
                self.cluster = before;
                Err(e)
            }
        }
    }

    /// Primaries chosen by this command carry term 0 until here: they take the new epoch.
    fn stamp_new_terms(&mut self, epoch: Epoch) {
        for p in &mut self.cluster.partitions {
            if p.primary.is_some() && p.primary_term == 0 {
                p.primary_term = epoch;
            }
        }
        for n in &mut self.cluster.nodes {
            if n.state == NodeState::Starting && n.sync_epoch == 0 {
                n.sync_epoch = epoch;
            }
        }
        for r in self.cluster.partitions.iter_mut().flat_map(|p| p.replicas.iter_mut()) {
            if r.sync_epoch == SYNC_EPOCH_PENDING {
                r.sync_epoch = epoch;
            }
        }
    }

    fn gci_complete(&mut self, gci: u64, restorable: &[NodeId]) -> CommandResult {
        self.config()?;
        // Checkpoints complete in order; an old one arriving late changes nothing.
        if gci > self.cluster.gci_complete {
            self.cluster.gci_complete = gci;
            for n in self.cluster.nodes.iter_mut().filter(|n| restorable.contains(&n.id)) {
                n.restorable_gci = n.restorable_gci.max(gci);
            }
        }
        Ok(Outcome { epoch: self.cluster.epoch, ..Outcome::default() })
    }

    /// Applies a user command to a copy of the user table and keeps it only if the whole
    /// command succeeded and an account that can manage users is left.
    fn users_command(&mut self, cmd: Command) -> CommandResult {
        self.config()?;
        let mut users = self.users.clone();
        let mut failed: Vec<AccountName> = vec![];
        let failure_code = match cmd {
            Command::CreateUsers { users: new, if_not_exists } => {
                for u in new {
                    u.validate()?;
                    if find_user(&users, &u.account).is_some() {
                        if !if_not_exists {
                            failed.push(u.account);
                        }
                    } else {
                        users.push(u);
                    }
                }
                if users.len() > MAX_USERS {
                    return Err(err(ErrorCode::TooLarge, format!("the cluster holds at most {MAX_USERS} accounts")));
                }
                ErrorCode::UserExists
            }
            Command::DropUsers { accounts, if_exists } => {
                for a in accounts {
                    match find_user(&users, &a) {
                        Some(i) => {
                            users.remove(i);
                        }
                        None if !if_exists => failed.push(a),
                        None => {}
                    }
                }
                ErrorCode::NoSuchUser
            }
            Command::SetPassword { account, password, if_exists } => {
                password.validate()?;
                match find_user(&users, &account) {
                    Some(i) => users[i].password = password,
                    None if !if_exists => failed.push(account),
                    None => {}
                }
                ErrorCode::NoSuchUser
            }
            Command::Grant { accounts, database, revoke } => {
                if let Some(db) = &database {
                    shoal_proto::users::check_grant_db(db)?;
                }
                for a in accounts {
                    let Some(i) = find_user(&users, &a) else {
                        failed.push(a);
                        continue;
                    };
                    let u = &mut users[i];
                    let held = match &database {
                        None => u.global_all,
                        Some(db) => u.databases.iter().any(|d| d.eq_ignore_ascii_case(db)),
                    };
                    match (&database, revoke) {
                        (_, true) if !held => failed.push(a),
                        (None, _) => u.global_all = !revoke,
                        (Some(db), true) => u.databases.retain(|d| !d.eq_ignore_ascii_case(db)),
                        (Some(_), false) if held => {}
                        (Some(db), false) => {
                            if u.databases.len() >= MAX_GRANTS_PER_USER {
                                return Err(err(
                                    ErrorCode::TooLarge,
                                    format!("an account holds at most {MAX_GRANTS_PER_USER} database grants"),
                                ));
                            }
                            u.databases.push(db.clone());
                        }
                    }
                }
                if revoke {
                    ErrorCode::NoSuchGrant
                } else {
                    ErrorCode::NoSuchUser
                }
            }
            _ => unreachable!("only user commands come here"),
        };
        if !failed.is_empty() {
            // The message is the account list, as MySQL quotes it (see shoal.proto).
            return Err(err(failure_code, account_list(&failed)));
        }
        if !users.iter().any(|u| u.global_all) {
            return Err(err(
                ErrorCode::InvalidArgument,
                "the last account with ALL PRIVILEGES ON *.* cannot be dropped or lose them",
            ));
        }
        if users != self.users {
            self.users = users;
            self.cluster.users_version += 1;
        }
        Ok(Outcome { epoch: self.cluster.epoch, table: None, users_version: self.cluster.users_version })
    }

    /// Whether a node of a group with no live replica may start the group from its own files:
    /// it restored them, up to what mgmd recorded for it, and no member of its group has newer.
    pub fn can_start_group(cluster: &ClusterState, j: &JoinInfo) -> bool {
        let Some(me) = cluster.node(j.id) else { return false };
        j.loaded_gci == Some(me.restorable_gci) && me.restorable_gci == newest_restorable(cluster, me.node_group)
    }

    /// Whether `j` should restart and restore from its own files so its group can start: it
    /// was declared down while alive (the model still holds the incarnation that asks), so it
    /// loaded its files long ago, and they now hold the group's newest restorable state.
    pub fn should_restart_from_files(cluster: &ClusterState, j: &JoinInfo) -> bool {
        let Some(me) = cluster.node(j.id) else { return false };
        me.incarnation == j.incarnation
            && j.loaded_gci != Some(me.restorable_gci)
            && me.restorable_gci == newest_restorable(cluster, me.node_group)
    }

    /// Whether `j` restored its files to an older global checkpoint than mgmd records it can
    /// restore, and that record is its group's newest: it took its target from a map fetched
    /// before mgmd had applied the last `GciComplete` of its log (both restarting at once), so
    /// a reload with the map as it is now brings it to what its group can start from.
    pub fn restored_older_than_recorded(cluster: &ClusterState, j: &JoinInfo) -> bool {
        let Some(me) = cluster.node(j.id) else { return false };
        j.loaded_gci.is_some_and(|g| g < me.restorable_gci)
            && me.restorable_gci == newest_restorable(cluster, me.node_group)
    }

    fn config(&self) -> Result<&ClusterConfig, ShoalError> {
        self.config.as_ref().ok_or_else(|| err(ErrorCode::NodeNotReady, "cluster is not bootstrapped yet"))
    }

    fn bootstrap(&mut self, config: ClusterConfig) -> CommandResult {
        if self.config.is_some() {
            return Ok(Outcome::default());
        }
        config.validate().map_err(|e| err(ErrorCode::InvalidArgument, e))?;
        let mut nodes: Vec<Node> = config
            .mgmd
            .iter()
            .map(|m| Node {
                id: m.id,
                kind: NodeKind::Mgmd,
                addr: m.addr.clone(),
                state: NodeState::Up,
                node_group: 0,
                pid: 0,
                incarnation: 0,
                sync_epoch: 0,
                restorable_gci: 0,
            })
            .collect();
        nodes.extend(config.datanode.iter().map(|d| Node {
            id: d.id,
            kind: NodeKind::DataNode,
            addr: d.addr.clone(),
            state: NodeState::Down,
            node_group: d.node_group,
            pid: 0,
            incarnation: 0,
            sync_epoch: 0,
            restorable_gci: 0,
        }));
        let groups = config.node_groups();
        self.cluster.partitions = (0..config.partition_count())
            .map(|p| PartitionAssignment {
                partition: p,
                node_group: p % groups,
                primary: None,
                primary_term: 0,
                replicas: vec![],
            })
            .collect();
        self.cluster.nodes = nodes;
        self.next_table_id = 1;
        // A fresh cluster has one account, explicit in the catalog so its password can change.
        self.users = initial_users();
        self.cluster.users_version = 1;
        self.config = Some(config);
        Ok(Outcome::default())
    }

    fn node_mut(&mut self, id: NodeId) -> Result<&mut Node, ShoalError> {
        self.cluster
            .nodes
            .iter_mut()
            .find(|n| n.id == id && n.kind == NodeKind::DataNode)
            .ok_or_else(|| err(ErrorCode::InvalidArgument, format!("node {id} is not a configured data node")))
    }

    /// The data node that should be primary of `partition` when its whole group is up: the
    /// primaries of a group rotate over its members so each carries an equal share.
    fn preferred_primary(&self, partition: &PartitionAssignment) -> Option<NodeId> {
        preferred_primary(&self.cluster, self.config.as_ref()?.node_groups(), partition)
    }

    /// Partitions whose preferred primary is up with a complete replica but does not lead them
    /// (after a restart, say). [`Command::Rebalance`] moves them back.
    pub fn misplaced_primaries(&self) -> Vec<PartitionId> {
        let Some(config) = &self.config else { return vec![] };
        misplaced_primaries(&self.cluster, config.node_groups())
    }

    fn rebalance(&mut self) -> CommandResult {
        let groups = self.config()?.node_groups();
        for i in misplaced_primaries(&self.cluster, groups) {
            let p = &self.cluster.partitions[i as usize];
            let to = preferred_primary(&self.cluster, groups, p);
            let p = &mut self.cluster.partitions[i as usize];
            p.primary = to;
            p.primary_term = 0; // stamped with the new epoch in apply()
        }
        Ok(Outcome::default())
    }

    fn join(&mut self, nodes: Vec<JoinInfo>) -> CommandResult {
        self.config()?;
        // Groups that ran before: a start of theirs from disk may roll commits back. (A group
        // whose nodes never joined has stamped nothing.)
        let restarted_groups: std::collections::HashSet<u32> = self
            .cluster
            .nodes
            .iter()
            .filter(|n| n.kind == NodeKind::DataNode && n.incarnation != 0)
            .map(|n| n.node_group)
            .collect();
        for j in &nodes {
            let node = self.node_mut(j.id)?;
            if node.state != NodeState::Down && node.incarnation != j.incarnation {
                // Restarted faster than failure detection noticed: its old memory is gone.
                let inc = node.incarnation;
                self.down(j.id, inc)?;
            }
        }
        for j in nodes {
            let node = self.node_mut(j.id)?;
            if node.state != NodeState::Down {
                node.addr = j.addr;
                node.pid = j.pid;
                continue;
            }
            let group = node.node_group;
            let live_group = self.cluster.partitions.iter().any(|p| p.node_group == group && p.primary.is_some());
            if !live_group && !Model::can_start_group(&self.cluster, &j) {
                // Its files are older than a group peer's (or unreadable): starting the group
                // from them would lose commits. It waits for that peer, or for a live group
                // to copy from.
                continue;
            }
            if !live_group && restarted_groups.contains(&group) {
                // The group restarts from its files at the node's restorable GCI. Whatever its
                // nodes stamped after that (at most a few GCIs past the last complete one, see
                // gcp.rs) is gone: record it, so a `sync` writer waiting for such a GCI learns
                // its write was lost, and the group's nodes stamp only above the range.
                let after = self.cluster.node(j.id).map_or(0, |n| n.restorable_gci);
                let through = self.cluster.gci_complete + crate::gcp::MAX_STAMPED_PAST_COMPLETE;
                let range = RolledBack { node_group: group, after, through };
                if self.cluster.rolled_back.last() != Some(&range) {
                    self.cluster.rolled_back.push(range);
                    let excess = self.cluster.rolled_back.len().saturating_sub(MAX_ROLLED_BACK);
                    self.cluster.rolled_back.drain(..excess);
                }
            }
            let node = self.node_mut(j.id)?;
            node.addr = j.addr;
            node.pid = j.pid;
            node.incarnation = j.incarnation;
            if live_group {
                for p in self.cluster.partitions.iter_mut().filter(|p| p.node_group == group) {
                    if p.primary.is_some() {
                        p.replicas.push(Replica { node_id: j.id, sync_epoch: SYNC_EPOCH_PENDING });
                    }
                }
                let node = self.node_mut(j.id)?;
                node.state = NodeState::Starting;
                node.sync_epoch = 0; // stamped with the new epoch in apply()
            } else {
                self.node_mut(j.id)?.state = NodeState::Up;
            }
        }
        self.assign_orphans();
        Ok(Outcome::default())
    }

    /// Partitions without a primary take one from the up nodes of their group (preferring the
    /// rotation), starting from empty: no live replica means no data to copy.
    fn assign_orphans(&mut self) {
        for i in 0..self.cluster.partitions.len() {
            let p = &self.cluster.partitions[i];
            if p.primary.is_some() {
                continue;
            }
            let up: Vec<NodeId> = self
                .cluster
                .nodes
                .iter()
                .filter(|n| n.kind == NodeKind::DataNode && n.node_group == p.node_group && n.state == NodeState::Up)
                .map(|n| n.id)
                .collect();
            if up.is_empty() {
                continue;
            }
            let preferred = self.preferred_primary(p).filter(|id| up.contains(id));
            let p = &mut self.cluster.partitions[i];
            p.primary = Some(preferred.unwrap_or(up[(p.partition as usize) % up.len()]));
            p.primary_term = 0; // stamped with the new epoch in apply()
            p.replicas = up.iter().map(|&node_id| Replica::complete(node_id)).collect();
        }
    }

    fn synced(&mut self, id: NodeId, incarnation: u64, sync_epoch: Epoch) -> CommandResult {
        self.config()?;
        let node = self.node_mut(id)?;
        if node.state == NodeState::Down || node.incarnation != incarnation {
            return Err(err(ErrorCode::StaleEpoch, format!("node {id} is not live in that incarnation")));
        }
        let mut matched = false;
        if node.state == NodeState::Starting && node.sync_epoch == sync_epoch {
            node.state = NodeState::Up;
            node.sync_epoch = 0;
            matched = true;
        }
        for r in self.cluster.partitions.iter_mut().flat_map(|p| p.replicas.iter_mut()) {
            if r.node_id == id && r.sync_epoch == sync_epoch {
                r.sync_epoch = 0;
                matched = true;
            }
        }
        if !matched {
            return Err(err(ErrorCode::StaleEpoch, format!("node {id}: sync of epoch {sync_epoch} was superseded")));
        }
        Ok(Outcome::default())
    }

    fn down(&mut self, id: NodeId, incarnation: u64) -> CommandResult {
        self.config()?;
        let node = self.node_mut(id)?;
        if node.state == NodeState::Down || (incarnation != 0 && node.incarnation != incarnation) {
            return Ok(Outcome::default());
        }
        node.state = NodeState::Down;
        node.sync_epoch = 0;
        for p in &mut self.cluster.partitions {
            p.replicas.retain(|r| r.node_id != id);
            if p.primary == Some(id) {
                // Promote a caught-up backup; a syncing one holds only part of the data.
                p.primary = p.replicas.iter().find(|r| !r.syncing()).map(|r| r.node_id);
                p.primary_term = 0;
                if p.primary.is_none() {
                    // No complete copy is left: the partition is lost until its group restarts.
                    p.replicas.clear();
                }
                // A write the failed primary had in flight may have reached some backups and
                // not others. Acknowledged writes are on every replica, so the new primary's
                // copy is the truth: the other backups copy the partition from it again.
                let primary = p.primary;
                for r in p.replicas.iter_mut().filter(|r| Some(r.node_id) != primary && !r.syncing()) {
                    r.sync_epoch = SYNC_EPOCH_PENDING;
                }
            }
        }
        // A starting node whose source vanished has nothing left to copy from: restart it.
        let stranded: Vec<NodeId> = self
            .cluster
            .nodes
            .iter()
            .filter(|n| n.state == NodeState::Starting)
            .filter(|n| self.cluster.partitions.iter().any(|p| p.node_group == n.node_group && p.primary.is_none()))
            .map(|n| n.id)
            .collect();
        for n in stranded {
            self.down(n, 0)?;
        }
        Ok(Outcome::default())
    }

    fn create_table(&mut self, spec: TableSpec, if_not_exists: bool, indexes: Vec<IndexSpec>) -> CommandResult {
        let partition_count = self.config()?.partition_count();
        if let Some(t) = self.cluster.table(&spec.name) {
            if if_not_exists {
                return Ok(Outcome { epoch: 0, table: Some(t.clone()), ..Outcome::default() });
            }
            return Err(err(ErrorCode::TableExists, format!("table {} already exists", spec.name)));
        }
        if self.cluster.tables.len() >= MAX_TABLES {
            return Err(err(ErrorCode::TooLarge, format!("the cluster holds at most {MAX_TABLES} tables")));
        }
        let (spec, hidden_pk) = spec.normalize()?;
        let mut table = Table {
            id: self.next_table_id,
            spec,
            partition_count,
            schema_version: 1,
            hidden_pk,
            indexes: vec![],
            read_only: false,
            triggers: vec![],
        };
        for index in indexes {
            add_index(&mut table, index)?;
        }
        // Each unique index's hidden table comes into being with the table, in one command.
        let mut hidden = vec![];
        for ix in table.unique_indexes() {
            let (spec, _) = table.unique_table_spec(ix).normalize()?;
            let id = table.id + 1 + hidden.len() as u32;
            hidden.push(Table {
                id,
                spec,
                partition_count,
                schema_version: 1,
                hidden_pk: false,
                indexes: vec![],
                read_only: false,
                triggers: vec![],
            });
        }
        if self.cluster.tables.len() + 1 + hidden.len() > MAX_TABLES {
            return Err(err(ErrorCode::TooLarge, format!("the cluster holds at most {MAX_TABLES} tables")));
        }
        self.next_table_id += 1 + hidden.len() as u32;
        self.cluster.tables.push(table.clone());
        self.cluster.tables.extend(hidden);
        Ok(Outcome { epoch: 0, table: Some(table), ..Outcome::default() })
    }

    fn table_mut(&mut self, name: &str) -> Result<&mut Table, ShoalError> {
        self.cluster
            .tables
            .iter_mut()
            .find(|t| t.spec.name.eq_ignore_ascii_case(name))
            .ok_or_else(|| err(ErrorCode::NoSuchTable, format!("table {name} does not exist")))
    }

    fn create_index(&mut self, table: &str, index: IndexSpec, if_not_exists: bool) -> CommandResult {
        self.config()?;
        let t = self.table_mut(table)?;
        if t.indexes.iter().any(|i| i.name.eq_ignore_ascii_case(&index.name)) {
            if if_not_exists {
                return Ok(Outcome { epoch: 0, table: Some(t.clone()), ..Outcome::default() });
            }
            return Err(err(ErrorCode::TableExists, format!("index {} already exists on {table}", index.name)));
        }
        if index.unique {
            // Existing rows must be checked and entered first, with writers fenced off: the SQL
            // node does that by copying the table (ALTER TABLE … ADD UNIQUE).
            return Err(err(ErrorCode::InvalidArgument, "a unique index is added by copying the table"));
        }
        add_index(t, index)?;
        t.schema_version += 1;
        Ok(Outcome { epoch: 0, table: Some(t.clone()), ..Outcome::default() })
    }

    fn set_read_only(&mut self, table: &str, read_only: bool) -> CommandResult {
        self.config()?;
        let t = self.table_mut(table)?;
        t.read_only = read_only;
        Ok(Outcome { epoch: 0, table: Some(t.clone()), ..Outcome::default() })
    }

    fn replace_table(&mut self, table: &str, with: &str) -> CommandResult {
        self.config()?;
        let old = self.table_mut(table)?;
        if !old.read_only {
            // Writes came back (the ALTER's read-only lease ran out): the copy may miss some.
            return Err(err(
                ErrorCode::SchemaChanged,
                format!("table {table} took writes during the copy; the ALTER TABLE is abandoned"),
            ));
        }
        let (name, triggers) = (old.spec.name.clone(), old.triggers.clone());
        let new = self.table_mut(with)?;
        new.spec.name = name.clone();
        // The triggers stay with the table (ALTER TABLE keeps them in MySQL too).
        new.triggers = triggers;
        new.read_only = false;
        new.schema_version += 1;
        let id = new.id;
        let out = new.clone();
        let gone = self.unique_tables_of(|t| t.id != id && t.spec.name.eq_ignore_ascii_case(&name));
        self.cluster
            .tables
            .retain(|t| (t.id == id || !t.spec.name.eq_ignore_ascii_case(&name)) && !gone.contains(&t.spec.name));
        Ok(Outcome { epoch: 0, table: Some(out), ..Outcome::default() })
    }

    /// See [`Command::RenameTables`]. `apply` restores the map when one rename fails.
    fn rename_tables(&mut self, renames: &[(String, String)]) -> CommandResult {
        self.config()?;
        if renames.is_empty() || renames.len() > MAX_RENAMES {
            return Err(err(ErrorCode::InvalidArgument, format!("a rename names 1..={MAX_RENAMES} tables")));
        }
        let mut out = None;
        for (from, to) in renames {
            let t = self.table_mut(from)?;
            if t.read_only {
                // An ALTER TABLE is copying it and will swap its copy in under the old name.
                return Err(err(ErrorCode::SchemaChanged, format!("table {from} is being altered")));
            }
            let (id, old) = (t.id, t.clone());
            if !old.triggers.is_empty() && !database_of(from).eq_ignore_ascii_case(database_of(to)) {
                // Trigger names are unique per database (MySQL refuses this too, 1435).
                return Err(err(
                    ErrorCode::InvalidArgument,
                    format!("table {from} has triggers: it cannot move to another database"),
                ));
            }
            // A name may change its case only (names compare case-insensitively).
            if !from.eq_ignore_ascii_case(to) && self.cluster.table(to).is_some() {
                return Err(err(ErrorCode::TableExists, format!("table {to} already exists")));
            }
            let t = self.table_mut(from)?;
            t.spec.name = to.clone();
            t.schema_version += 1;
            let new = t.clone();
            for ix in old.unique_indexes() {
                let (was, now) = (old.unique_table_name(ix), new.unique_table_name(ix));
                if let Some(h) =
                    self.cluster.tables.iter_mut().find(|h| h.id != id && h.spec.name.eq_ignore_ascii_case(&was))
                {
                    h.spec.name = now;
                    h.schema_version += 1;
                }
            }
            out = Some(new);
        }
        Ok(Outcome { epoch: 0, table: out, ..Outcome::default() })
    }

    fn set_columns(&mut self, table: &str, columns: Vec<Column>) -> CommandResult {
        self.config()?;
        let t = self.table_mut(table)?;
        if t.read_only {
            // An ALTER TABLE is copying it and will swap its copy in under the old definition.
            return Err(err(ErrorCode::SchemaChanged, format!("table {table} is being altered")));
        }
        *t = t.with_columns_renamed(columns)?;
        Ok(Outcome { epoch: 0, table: Some(t.clone()), ..Outcome::default() })
    }

    fn rename_index(&mut self, table: &str, from: &str, to: &str) -> CommandResult {
        self.config()?;
        let t = self.table_mut(table)?;
        let primary = |n: &str| n.eq_ignore_ascii_case(IndexSpec::PRIMARY);
        if primary(from) || primary(to) || to.is_empty() {
            return Err(err(ErrorCode::InvalidArgument, format!("index {from} cannot be renamed to {to}")));
        }
        if !from.eq_ignore_ascii_case(to) && t.indexes.iter().any(|i| i.name.eq_ignore_ascii_case(to)) {
            return Err(err(ErrorCode::InvalidArgument, format!("index {to} already exists on {table}")));
        }
        let Some(ix) = t.indexes.iter_mut().find(|i| i.name.eq_ignore_ascii_case(from)) else {
            return Err(err(ErrorCode::InvalidArgument, format!("index {from} does not exist on {table}")));
        };
        ix.name = to.to_string();
        t.schema_version += 1;
        Ok(Outcome { epoch: 0, table: Some(t.clone()), ..Outcome::default() })
    }

    /// The table of database `db` holding trigger `name` (names compare case-insensitively).
    fn trigger_table(&self, db: &str, name: &str) -> Option<&Table> {
        self.cluster.tables.iter().find(|t| {
            database_of(&t.spec.name).eq_ignore_ascii_case(db)
                && t.triggers.iter().any(|tr| tr.name.eq_ignore_ascii_case(name))
        })
    }

    fn create_trigger(&mut self, table: &str, trigger: Trigger, if_not_exists: bool) -> CommandResult {
        self.config()?;
        if trigger.name.is_empty() || trigger.body.len() > MAX_TRIGGER_BODY_BYTES {
            return Err(err(ErrorCode::InvalidArgument, "a trigger needs a name and a body of at most 16 KiB"));
        }
        self.table_mut(table)?;
        if let Some(holder) = self.trigger_table(database_of(table), &trigger.name) {
            if if_not_exists {
                return Ok(Outcome { epoch: 0, table: Some(holder.clone()), ..Outcome::default() });
            }
            return Err(err(ErrorCode::TriggerExists, format!("trigger {} already exists", trigger.name)));
        }
        let t = self.table_mut(table)?;
        if t.triggers.len() >= MAX_TRIGGERS {
            return Err(err(ErrorCode::TooLarge, format!("a table has at most {MAX_TRIGGERS} triggers")));
        }
        t.triggers.push(trigger);
        Ok(Outcome { epoch: 0, table: Some(t.clone()), ..Outcome::default() })
    }

    fn drop_trigger(&mut self, db: &str, name: &str, if_exists: bool) -> CommandResult {
        self.config()?;
        let Some(id) = self.trigger_table(db, name).map(|t| t.id) else {
            if if_exists {
                return Ok(Outcome::default());
            }
            return Err(err(ErrorCode::NoSuchTrigger, format!("trigger {db}.{name} does not exist")));
        };
        let t = self.cluster.tables.iter_mut().find(|t| t.id == id).expect("found above");
        t.triggers.retain(|tr| !tr.name.eq_ignore_ascii_case(name));
        Ok(Outcome { epoch: 0, table: Some(t.clone()), ..Outcome::default() })
    }

    fn drop_index(&mut self, table: &str, name: &str, if_exists: bool) -> CommandResult {
        self.config()?;
        let t = self.table_mut(table)?;
        let Some(at) = t.indexes.iter().position(|i| i.name.eq_ignore_ascii_case(name)) else {
            if if_exists {
                return Ok(Outcome { epoch: 0, table: Some(t.clone()), ..Outcome::default() });
            }
            return Err(err(ErrorCode::InvalidArgument, format!("index {name} does not exist on {table}")));
        };
        let gone = t.indexes.remove(at);
        let hidden = gone.unique.then(|| t.unique_table_name(&gone));
        t.schema_version += 1;
        let out = t.clone();
        if let Some(hidden) = hidden {
            self.cluster.tables.retain(|t| t.spec.name != hidden);
        }
        Ok(Outcome { epoch: 0, table: Some(out), ..Outcome::default() })
    }

    /// Names of the hidden unique-index tables of the tables `which` picks.
    fn unique_tables_of(&self, which: impl Fn(&Table) -> bool) -> Vec<String> {
        let tables = self.cluster.tables.iter().filter(|t| which(t));
        tables.flat_map(|t| t.unique_indexes().map(|ix| t.unique_table_name(ix))).collect()
    }

    fn drop_table(&mut self, name: &str, if_exists: bool) -> CommandResult {
        self.config()?;
        let before = self.cluster.tables.len();
        let hidden = self.unique_tables_of(|t| t.spec.name.eq_ignore_ascii_case(name));
        self.cluster.tables.retain(|t| !t.spec.name.eq_ignore_ascii_case(name) && !hidden.contains(&t.spec.name));
        if self.cluster.tables.len() == before && !if_exists {
            return Err(err(ErrorCode::NoSuchTable, format!("table {name} does not exist")));
        }
        Ok(Outcome::default())
    }
}

/// Checks an index and gives it the table's next index id.
fn add_index(table: &mut Table, mut index: IndexSpec) -> Result<(), ShoalError> {
    if table.indexes.len() >= MAX_INDEXES {
        return Err(err(ErrorCode::TooLarge, format!("a table has at most {MAX_INDEXES} indexes")));
    }
    if table.indexes.iter().any(|i| i.name.eq_ignore_ascii_case(&index.name)) {
        return Err(err(ErrorCode::TableExists, format!("index {} is defined twice", index.name)));
    }
    index.check(&table.spec)?;
    index.id = table.indexes.iter().map(|i| i.id).max().unwrap_or(0) + 1;
    table.indexes.push(index);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::config::{ClusterSection, DataNodeConfig, MgmdConfig};
    use shoal_proto::ColumnType;

    fn config(groups: u32, replicas: u32) -> ClusterConfig {
        let mut datanode = vec![];
        for g in 0..groups {
            for r in 0..replicas {
                let id = 11 + g * replicas + r;
                datanode.push(DataNodeConfig {
                    id,
                    addr: format!("127.0.0.1:{}", 7000 + id),
                    node_group: g,
                    data_dir: format!("dn-{id}"),
                    data_memory_mb: 64,
                    threads: 0,
                    spin_us: 0,
                    await_spin_us: 0,
                    poll_idle_cpus: false,
                });
            }
        }
        ClusterConfig {
            cluster: ClusterSection { name: "t".into(), ..ClusterSection::new(replicas, 4) },
            mgmd: vec![MgmdConfig { id: 1, addr: "127.0.0.1:7001".into(), data_dir: "m1".into() }],
            datanode,
            sqlnode: vec![],
        }
    }

    fn join(id: NodeId, inc: u64) -> JoinInfo {
        JoinInfo { id, addr: format!("127.0.0.1:{}", 7000 + id), pid: 1, incarnation: inc, loaded_gci: Some(0) }
    }

    fn started(groups: u32, replicas: u32) -> Model {
        let mut m = Model::default();
        m.apply(Command::Bootstrap { config: config(groups, replicas) }).unwrap();
        let nodes = (0..groups * replicas).map(|i| join(11 + i, 1)).collect();
        m.apply(Command::Join { nodes }).unwrap();
        m
    }

    /// Invariants that must hold after every command.
    fn check(m: &Model) {
        for p in &m.cluster.partitions {
            if let Some(primary) = p.primary {
                let r = p.replica(primary).expect("primary is a replica");
                assert!(!r.syncing(), "a syncing replica is never primary");
                assert_eq!(m.cluster.node(primary).unwrap().state, NodeState::Up);
                assert!(p.primary_term > 0 && p.primary_term <= m.cluster.epoch);
            } else {
                assert!(p.replicas.is_empty());
            }
            for r in &p.replicas {
                let n = m.cluster.node(r.node_id).unwrap();
                assert_ne!(n.state, NodeState::Down, "down nodes hold no replica");
                assert_eq!(n.node_group, p.node_group);
            }
        }
    }

    #[test]
    fn group_start_spreads_primaries() {
        let m = started(2, 2);
        check(&m);
        assert_eq!(m.cluster.partitions.len(), 8);
        for node in 11..15 {
            let n = m.cluster.partitions.iter().filter(|p| p.primary == Some(node)).count();
            assert_eq!(n, 2, "node {node} should be primary of 2 of 8 partitions");
        }
        assert!(m.cluster.partitions.iter().all(|p| p.replicas.len() == 2));
    }

    #[test]
    fn failure_promotes_backup_with_new_term() {
        let mut m = started(1, 2);
        let e0 = m.cluster.epoch;
        let out = m.apply(Command::Down { id: 11, incarnation: 1, reason: "test".into() }).unwrap();
        check(&m);
        assert_eq!(out.epoch, e0 + 1);
        for p in &m.cluster.partitions {
            assert_eq!(p.primary, Some(12));
            assert_eq!(p.replicas.len(), 1);
        }
        // Partitions that 12 already led keep their term; taken-over ones get the new epoch.
        assert!(m.cluster.partitions.iter().any(|p| p.primary_term == e0 + 1));
        assert!(m.cluster.partitions.iter().any(|p| p.primary_term == e0));
        // A duplicate report changes nothing and does not raise the epoch.
        let out = m.apply(Command::Down { id: 11, incarnation: 1, reason: "again".into() }).unwrap();
        assert_eq!(out.epoch, e0 + 1);
    }

    #[test]
    fn checkpoints_complete_without_a_new_epoch_and_record_restorable_nodes() {
        let mut m = started(1, 2);
        let epoch = m.cluster.epoch;
        m.apply(Command::GciComplete { gci: 7, restorable: vec![11] }).unwrap();
        assert_eq!(m.cluster.epoch, epoch, "a checkpoint changes no map");
        assert_eq!(m.cluster.gci_complete, 7);
        assert_eq!(m.cluster.node(11).unwrap().restorable_gci, 7);
        assert_eq!(m.cluster.node(12).unwrap().restorable_gci, 0);
        // An older one arriving late changes nothing.
        m.apply(Command::GciComplete { gci: 5, restorable: vec![12] }).unwrap();
        assert_eq!(m.cluster.gci_complete, 7);
        assert_eq!(m.cluster.node(12).unwrap().restorable_gci, 0);
    }

    /// A node that restored to an older checkpoint than recorded for it (it read a map from
    /// before mgmd applied its last `GciComplete`) is told to reload; one whose own record is
    /// older than its group's newest, or that restored nothing, or restored what is recorded,
    /// is not.
    #[test]
    fn a_node_that_restored_older_than_its_record_reloads() {
        let mut m = started(1, 2);
        m.apply(Command::GciComplete { gci: 10, restorable: vec![11, 12] }).unwrap();
        m.apply(Command::GciComplete { gci: 12, restorable: vec![12] }).unwrap();
        m.apply(Command::Down { id: 11, incarnation: 1, reason: "crash".into() }).unwrap();
        m.apply(Command::Down { id: 12, incarnation: 1, reason: "crash".into() }).unwrap();
        let loaded = |id, gci| JoinInfo { loaded_gci: gci, ..join(id, 2) };
        assert!(Model::restored_older_than_recorded(&m.cluster, &loaded(12, Some(10))));
        assert!(!Model::restored_older_than_recorded(&m.cluster, &loaded(12, Some(12))));
        assert!(!Model::restored_older_than_recorded(&m.cluster, &loaded(12, None)));
        // Node 11's own record is 10, older than its group's newest: reloading gains nothing.
        assert!(!Model::restored_older_than_recorded(&m.cluster, &loaded(11, Some(10))));
        assert!(!Model::restored_older_than_recorded(&m.cluster, &loaded(11, Some(8))));
    }

    #[test]
    fn system_restart_starts_a_group_only_from_its_newest_files() {
        let mut m = started(1, 2);
        assert!(m.cluster.rolled_back.is_empty(), "a first start rolls nothing back");
        m.apply(Command::GciComplete { gci: 10, restorable: vec![11, 12] }).unwrap();
        m.apply(Command::Down { id: 11, incarnation: 1, reason: "crash".into() }).unwrap();
        // Node 12 carries on alone: only its files hold checkpoint 20.
        m.apply(Command::GciComplete { gci: 20, restorable: vec![12] }).unwrap();
        m.apply(Command::Down { id: 12, incarnation: 1, reason: "crash".into() }).unwrap();
        assert!(m.cluster.partitions.iter().all(|p| p.primary.is_none()));
        // Node 11 comes back first with older files: the group must not start from them.
        let mut j11 = join(11, 2);
        j11.loaded_gci = Some(10);
        m.apply(Command::Join { nodes: vec![j11.clone()] }).unwrap();
        assert_eq!(m.cluster.node(11).unwrap().state, NodeState::Down);
        // A node that could not read its files cannot start it either.
        let mut j12 = join(12, 2);
        j12.loaded_gci = None;
        assert!(!Model::can_start_group(&m.cluster, &j12));
        // Node 12 with its files restored to 20 starts the group; what was stamped after the
        // last complete checkpoint is recorded as rolled back.
        j12.loaded_gci = Some(20);
        m.apply(Command::Join { nodes: vec![j12] }).unwrap();
        assert_eq!(m.cluster.node(12).unwrap().state, NodeState::Up);
        assert!(m.cluster.partitions.iter().all(|p| p.primary == Some(12)));
        assert!(m.cluster.gci_durable(20, 0));
        assert!(!m.cluster.gci_durable(21, 0));
        assert_eq!(m.cluster.rolled_back.last(), Some(&RolledBack { node_group: 0, after: 20, through: 23 }));
        assert_eq!(m.cluster.gci_floor(0), 24);
        // Node 11 then joins the live group and copies.
        m.apply(Command::Join { nodes: vec![j11] }).unwrap();
        assert_eq!(m.cluster.node(11).unwrap().state, NodeState::Starting);
    }

    #[test]
    fn rejoin_syncs_before_serving() {
        let mut m = started(1, 2);
        m.apply(Command::Down { id: 11, incarnation: 1, reason: "test".into() }).unwrap();
        let out = m.apply(Command::Join { nodes: vec![join(11, 2)] }).unwrap();
        check(&m);
        assert_eq!(m.cluster.node(11).unwrap().state, NodeState::Starting);
        assert!(m.cluster.partitions.iter().all(|p| p.replica(11).unwrap().sync_epoch == out.epoch));
        // A stale sync report is refused.
        assert!(m.apply(Command::Synced { id: 11, incarnation: 2, sync_epoch: out.epoch - 1 }).is_err());
        m.apply(Command::Synced { id: 11, incarnation: 2, sync_epoch: out.epoch }).unwrap();
        check(&m);
        assert_eq!(m.cluster.node(11).unwrap().state, NodeState::Up);
        assert!(m.cluster.partitions.iter().all(|p| !p.replica(11).unwrap().syncing()));
    }

    #[test]
    fn rebalance_gives_a_restarted_node_its_primaries_back() {
        let mut m = started(1, 2);
        assert!(m.misplaced_primaries().is_empty());
        m.apply(Command::Down { id: 11, incarnation: 1, reason: "test".into() }).unwrap();
        let out = m.apply(Command::Join { nodes: vec![join(11, 2)] }).unwrap();
        assert!(m.misplaced_primaries().is_empty(), "a syncing node leads nothing");
        m.apply(Command::Synced { id: 11, incarnation: 2, sync_epoch: out.epoch }).unwrap();
        assert_eq!(m.misplaced_primaries().len(), 2, "half of the 4 partitions belong on node 11");
        let e = m.cluster.epoch;
        m.apply(Command::Rebalance).unwrap();
        check(&m);
        assert!(m.misplaced_primaries().is_empty());
        for node in [11, 12] {
            assert_eq!(m.cluster.partitions.iter().filter(|p| p.primary == Some(node)).count(), 2);
        }
        // Moved partitions start a new term; the others keep theirs.
        assert_eq!(m.cluster.partitions.iter().filter(|p| p.primary_term == e + 1).count(), 2);
        // Nothing to move: no new epoch.
        m.apply(Command::Rebalance).unwrap();
        assert_eq!(m.cluster.epoch, e + 1);
    }

    #[test]
    fn failover_with_three_replicas_resyncs_the_other_backup() {
        let mut m = started(1, 3);
        let before = m.cluster.clone();
        let out = m.apply(Command::Down { id: 11, incarnation: 1, reason: "crash".into() }).unwrap();
        check(&m);
        for (p, old) in m.cluster.partitions.iter().zip(&before.partitions) {
            let new_primary = p.primary.unwrap();
            assert_ne!(new_primary, 11);
            for r in &p.replicas {
                let resync = old.primary == Some(11) && r.node_id != new_primary;
                assert_eq!(
                    r.sync_epoch,
                    if resync { out.epoch } else { 0 },
                    "partition {} node {}",
                    p.partition,
                    r.node_id
                );
            }
        }
        // The resyncing node stays up (it serves its other partitions) and reports per epoch.
        let resyncing = m.cluster.partitions.iter().flat_map(|p| &p.replicas).find(|r| r.syncing()).unwrap().node_id;
        assert_eq!(m.cluster.node(resyncing).unwrap().state, NodeState::Up);
        assert!(m.apply(Command::Synced { id: resyncing, incarnation: 1, sync_epoch: out.epoch - 1 }).is_err());
        m.apply(Command::Synced { id: resyncing, incarnation: 1, sync_epoch: out.epoch }).unwrap();
        check(&m);
        assert!(m.cluster.partitions.iter().flat_map(|p| &p.replicas).all(|r| !r.syncing()));
    }

    #[test]
    fn losing_the_source_restarts_a_syncing_node() {
        let mut m = started(1, 2);
        m.apply(Command::Down { id: 11, incarnation: 1, reason: "t".into() }).unwrap();
        m.apply(Command::Join { nodes: vec![join(11, 2)] }).unwrap();
        m.apply(Command::Down { id: 12, incarnation: 1, reason: "t".into() }).unwrap();
        check(&m);
        assert!(m.cluster.partitions.iter().all(|p| p.primary.is_none()));
        assert_eq!(m.cluster.node(11).unwrap().state, NodeState::Down);
    }

    #[test]
    fn restart_with_new_incarnation_is_a_failure_then_a_join() {
        let mut m = started(1, 2);
        m.apply(Command::Join { nodes: vec![join(12, 9)] }).unwrap();
        check(&m);
        assert_eq!(m.cluster.node(12).unwrap().state, NodeState::Starting);
        assert!(m.cluster.partitions.iter().all(|p| p.primary == Some(11)));
    }

    #[test]
    fn tables_are_validated_and_unique() {
        let mut m = started(1, 2);
        let spec = TableSpec {
            name: "t".into(),
            columns: vec![Column::new("k", ColumnType::Int), Column::new("v", ColumnType::Text)],
            primary_key: vec![0],
            partition_key: vec![],
        };
        let out = m.apply(Command::CreateTable { spec: spec.clone(), if_not_exists: false, indexes: vec![] }).unwrap();
        assert_eq!(out.table.unwrap().partition_count, 4);
        let e =
            m.apply(Command::CreateTable { spec: spec.clone(), if_not_exists: false, indexes: vec![] }).unwrap_err();
        assert_eq!(e.code, ErrorCode::TableExists);
        let epoch = m.cluster.epoch;
        assert!(m.apply(Command::CreateTable { spec, if_not_exists: true, indexes: vec![] }).is_ok());
        assert_eq!(m.cluster.epoch, epoch, "a no-op does not raise the epoch");
        let e = m.apply(Command::DropTable { name: "nope".into(), if_exists: false }).unwrap_err();
        assert_eq!(e.code, ErrorCode::NoSuchTable);
        m.apply(Command::DropTable { name: "T".into(), if_exists: false }).unwrap();
        assert!(m.cluster.tables.is_empty());
        let bad = TableSpec { name: "".into(), columns: vec![], primary_key: vec![], partition_key: vec![] };
        assert_eq!(
            m.apply(Command::CreateTable { spec: bad, if_not_exists: false, indexes: vec![] }).unwrap_err().code,
            ErrorCode::InvalidArgument
        );
    }

    #[test]
    fn indexes_get_ids_raise_the_epoch_and_are_checked() {
        let mut m = started(1, 2);
        let spec = TableSpec {
            name: "t".into(),
            columns: vec![Column::new("k", ColumnType::Int), Column::new("v", ColumnType::Int)],
            primary_key: vec![0],
            partition_key: vec![],
        };
        let ix = |name: &str, cols: Vec<u32>| IndexSpec {
            id: 0,
            name: name.into(),
            columns: cols,
            unique: false,
            prefix_lens: vec![],
        };
        let out = m
            .apply(Command::CreateTable { spec, if_not_exists: false, indexes: vec![ix("PRIMARY", vec![0])] })
            .unwrap();
        assert_eq!(out.table.unwrap().indexes[0].id, 1);
        let epoch = m.cluster.epoch;
        let t = m
            .apply(Command::CreateIndex { table: "t".into(), index: ix("by_v", vec![1]), if_not_exists: false })
            .unwrap()
            .table
            .unwrap();
        assert_eq!((t.indexes[1].id, t.schema_version), (2, 2));
        assert_eq!(m.cluster.epoch, epoch + 1, "data nodes learn of the index through the map");
        let dup = Command::CreateIndex { table: "t".into(), index: ix("BY_V", vec![0]), if_not_exists: false };
        assert_eq!(m.apply(dup).unwrap_err().code, ErrorCode::TableExists);
        let bad = Command::CreateIndex { table: "t".into(), index: ix("x", vec![7]), if_not_exists: false };
        assert_eq!(m.apply(bad).unwrap_err().code, ErrorCode::InvalidArgument);
        let unique = IndexSpec { unique: true, ..ix("u", vec![1]) };
        let e = m.apply(Command::CreateIndex { table: "t".into(), index: unique, if_not_exists: false }).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument, "a unique index on existing rows is built by a copy");
        m.apply(Command::DropIndex { table: "t".into(), name: "by_v".into(), if_exists: false }).unwrap();
        let gone = Command::DropIndex { table: "t".into(), name: "by_v".into(), if_exists: false };
        assert!(m.apply(gone).is_err());
        assert_eq!(m.cluster.tables[0].indexes.len(), 1);
    }

    fn user(name: &str, host: &str) -> UserAccount {
        UserAccount {
            account: AccountName::new(name, host),
            password: PasswordHashes { plugin: Default::default(), native: vec![1; 20], sha2: vec![2; 32] },
            global_all: false,
            databases: vec![],
        }
    }

    #[test]
    fn users_start_with_root_and_change_all_or_nothing_without_a_new_epoch() {
        let mut m = started(1, 2);
        assert_eq!(m.users, vec![UserAccount::initial_root()], "a fresh cluster has root with no password");
        let (epoch, v0) = (m.cluster.epoch, m.cluster.users_version);
        assert!(v0 > 0);
        let out = m
            .apply(Command::CreateUsers {
                users: vec![user("ann", "%"), user("bob", "10.0.0.%")],
                if_not_exists: false,
            })
            .unwrap();
        assert_eq!(out.users_version, v0 + 1);
        assert_eq!(m.cluster.epoch, epoch, "users are no part of the map");
        // One existing account fails the whole statement, naming it.
        let e = m
            .apply(Command::CreateUsers { users: vec![user("cid", "%"), user("ann", "%")], if_not_exists: false })
            .unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (ErrorCode::UserExists, "'ann'@'%'"));
        assert_eq!(m.users.len(), 3);
        m.apply(Command::CreateUsers { users: vec![user("cid", "%"), user("ann", "%")], if_not_exists: true }).unwrap();
        assert_eq!(m.users.len(), 4);
        // Hosts compare case-insensitively, names exactly.
        let e = m.apply(Command::DropUsers { accounts: vec![AccountName::new("ANN", "%")], if_exists: false });
        assert_eq!(e.unwrap_err().code, ErrorCode::NoSuchUser);
        let v = m.cluster.users_version;
        m.apply(Command::DropUsers { accounts: vec![AccountName::new("nobody", "%")], if_exists: true }).unwrap();
        assert_eq!(m.cluster.users_version, v, "a no-op changes nothing");
        // Grants.
        let ann = || vec![AccountName::new("ann", "%")];
        m.apply(Command::Grant { accounts: ann(), database: Some("Shop".into()), revoke: false }).unwrap();
        m.apply(Command::Grant { accounts: ann(), database: Some("shop".into()), revoke: false }).unwrap();
        assert_eq!(m.users[1].databases, vec!["Shop".to_string()]);
        let e = m.apply(Command::Grant { accounts: ann(), database: None, revoke: true }).unwrap_err();
        assert_eq!(e.code, ErrorCode::NoSuchGrant);
        m.apply(Command::Grant { accounts: ann(), database: Some("SHOP".into()), revoke: true }).unwrap();
        assert!(m.users[1].databases.is_empty());
        let e = m
            .apply(Command::Grant { accounts: vec![AccountName::new("zed", "%")], database: None, revoke: false })
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::NoSuchUser);
        // Passwords.
        let pw = PasswordHashes {
            plugin: shoal_proto::AuthPlugin::CachingSha2Password,
            native: vec![3; 20],
            sha2: vec![4; 32],
        };
        m.apply(Command::SetPassword {
            account: AccountName::new("root", "%"),
            password: pw.clone(),
            if_exists: false,
        })
        .unwrap();
        assert_eq!(m.users[0].password, pw);
        let bad = PasswordHashes { native: vec![1; 3], ..pw };
        let e =
            m.apply(Command::SetPassword { account: AccountName::new("root", "%"), password: bad, if_exists: false });
        assert_eq!(e.unwrap_err().code, ErrorCode::InvalidArgument);
        // The last account that can manage users stays.
        let root = || vec![AccountName::new("root", "%")];
        let e = m.apply(Command::DropUsers { accounts: root(), if_exists: false }).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument);
        let e = m.apply(Command::Grant { accounts: root(), database: None, revoke: true }).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument);
        m.apply(Command::Grant { accounts: ann(), database: None, revoke: false }).unwrap();
        m.apply(Command::DropUsers { accounts: root(), if_exists: false }).unwrap();
        assert!(m.users.iter().all(|u| u.account.name != "root"));
        assert_eq!(m.cluster.epoch, epoch);
    }

    #[test]
    fn a_model_saved_before_users_loads_with_root() {
        let m = started(1, 2);
        let mut json: serde_json::Value = serde_json::to_value(&m).unwrap();
        json.as_object_mut().unwrap().remove("users");
        let back: Model = serde_json::from_value(json).unwrap();
        assert_eq!(back.users, vec![UserAccount::initial_root()]);
    }

    #[test]
    fn alter_by_copy_swaps_the_copy_in_under_the_old_name() {
        let mut m = started(1, 2);
        let spec = |name: &str, cols: usize| TableSpec {
            name: name.into(),
            columns: (0..cols).map(|i| Column::new(&format!("c{i}"), ColumnType::Int)).collect(),
            primary_key: vec![0],
            partition_key: vec![],
        };
        let create =
            |name: &str, cols| Command::CreateTable { spec: spec(name, cols), if_not_exists: false, indexes: vec![] };
        let old = m.apply(create("d.t", 2)).unwrap().table.unwrap();
        let copy = m.apply(create("d.#alter-t", 3)).unwrap().table.unwrap();
        let t = m.apply(Command::SetReadOnly { table: "d.t".into(), read_only: true }).unwrap().table.unwrap();
        assert!(t.read_only);
        let epoch = m.cluster.epoch;
        let done = m.apply(Command::ReplaceTable { table: "d.T".into(), with: "d.#alter-t".into() }).unwrap();
        assert_eq!(m.cluster.epoch, epoch + 1, "one map change");
        let t = done.table.unwrap();
        assert_eq!((t.id, t.spec.name.as_str(), t.read_only, t.columns().len()), (copy.id, "d.t", false, 3));
        assert_eq!(m.cluster.tables.len(), 1);
        assert!(m.cluster.table_by_id(old.id).is_none());
        // A table that is writable (its ALTER's lease ran out) is not replaced.
        m.apply(create("d.#alter-t", 4)).unwrap();
        let writable = Command::ReplaceTable { table: "d.t".into(), with: "d.#alter-t".into() };
        assert_eq!(m.apply(writable).unwrap_err().code, ErrorCode::SchemaChanged);
        m.apply(Command::SetReadOnly { table: "d.t".into(), read_only: true }).unwrap();
        let missing = Command::ReplaceTable { table: "d.t".into(), with: "d.nope".into() };
        assert_eq!(m.apply(missing).unwrap_err().code, ErrorCode::NoSuchTable);
        assert_eq!(m.cluster.tables.len(), 2, "a failed command changes nothing");
    }

    #[test]
    fn rename_tables_keeps_ids_and_moves_hidden_tables() {
        let mut m = started(1, 2);
        let spec = |name: &str| TableSpec {
            name: name.into(),
            columns: vec![Column::new("k", ColumnType::Int), Column::new("u", ColumnType::Int).nullable()],
            primary_key: vec![0],
            partition_key: vec![],
        };
        let unique = IndexSpec { id: 0, name: "u".into(), columns: vec![1], unique: true, prefix_lens: vec![] };
        let create = |name: &str, indexes: Vec<IndexSpec>| Command::CreateTable {
            spec: spec(name),
            if_not_exists: false,
            indexes,
        };
        let rename = |pairs: &[(&str, &str)]| Command::RenameTables {
            renames: pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect(),
        };
        let a = m.apply(create("d.a", vec![unique.clone()])).unwrap().table.unwrap();
        let b = m.apply(create("d.b", vec![])).unwrap().table.unwrap();
        // Into another database: the hidden table follows, the ids stay.
        let epoch = m.cluster.epoch;
        let out = m.apply(rename(&[("d.A", "e.a2")])).unwrap().table.unwrap();
        assert_eq!(m.cluster.epoch, epoch + 1, "one map change");
        assert_eq!((out.id, out.spec.name.as_str()), (a.id, "e.a2"));
        assert_eq!(out.schema_version, a.schema_version + 1);
        let hidden = m.cluster.table(&out.unique_table_name(&out.indexes[0])).expect("hidden table moved");
        assert_eq!(hidden.spec.name, format!("e.#unique-{}-1", a.id));
        assert!(m.cluster.table(&a.unique_table_name(&a.indexes[0])).is_none());
        assert_eq!(m.cluster.tables.len(), 3);
        // A swap through a free name, in one command.
        m.apply(rename(&[("e.a2", "d.tmp"), ("d.b", "e.a2"), ("d.tmp", "d.b")])).unwrap();
        assert_eq!(m.cluster.table("e.a2").unwrap().id, b.id);
        assert_eq!(m.cluster.table("d.b").unwrap().id, a.id);
        // Only the case of a name may change onto itself.
        m.apply(rename(&[("d.b", "d.B")])).unwrap();
        assert_eq!(m.cluster.table_by_id(a.id).unwrap().spec.name, "d.B");
        // Errors leave everything as it was, also renames before the failing one.
        let before = m.cluster.clone();
        let taken = m.apply(rename(&[("d.b", "d.c"), ("e.a2", "d.c")])).unwrap_err();
        assert_eq!(taken.code, ErrorCode::TableExists);
        let missing = m.apply(rename(&[("d.b", "d.c"), ("d.nope", "d.x")])).unwrap_err();
        assert_eq!(missing.code, ErrorCode::NoSuchTable);
        assert_eq!(m.apply(rename(&[])).unwrap_err().code, ErrorCode::InvalidArgument);
        m.apply(Command::SetReadOnly { table: "d.b".into(), read_only: true }).unwrap();
        let altered = m.apply(rename(&[("d.b", "d.c")])).unwrap_err();
        assert_eq!(altered.code, ErrorCode::SchemaChanged, "a table an ALTER is copying keeps its name");
        m.apply(Command::SetReadOnly { table: "d.b".into(), read_only: false }).unwrap();
        assert_eq!(m.cluster.tables, before.tables);
    }

    #[test]
    fn columns_change_names_and_defaults_in_place_and_nothing_else() {
        let mut m = started(1, 2);
        let cols = vec![Column::new("k", ColumnType::Int), Column::new("v", ColumnType::Int).nullable()];
        let spec = TableSpec { name: "d.t".into(), columns: cols.clone(), primary_key: vec![0], partition_key: vec![] };
        let t = m.apply(Command::CreateTable { spec, if_not_exists: false, indexes: vec![] }).unwrap().table.unwrap();
        let set = |columns: Vec<Column>| Command::SetColumns { table: "d.t".into(), columns };
        let mut renamed = cols.clone();
        renamed[1].name = "w".into();
        renamed[1].default = Some(shoal_proto::Value::Int(7));
        let out = m.apply(set(renamed.clone())).unwrap().table.unwrap();
        assert_eq!((out.id, out.schema_version, &out.spec.columns), (t.id, t.schema_version + 1, &renamed));
        let mut retyped = renamed.clone();
        retyped[1].nullable = false;
        assert_eq!(m.apply(set(retyped)).unwrap_err().code, ErrorCode::InvalidArgument);
        let mut clash = renamed.clone();
        clash[1].name = "K".into();
        assert_eq!(m.apply(set(clash)).unwrap_err().code, ErrorCode::InvalidArgument);
        assert_eq!(m.apply(set(renamed[..1].to_vec())).unwrap_err().code, ErrorCode::InvalidArgument);
        m.apply(Command::SetReadOnly { table: "d.t".into(), read_only: true }).unwrap();
        assert_eq!(m.apply(set(cols)).unwrap_err().code, ErrorCode::SchemaChanged, "an ALTER is copying it");
    }

    #[test]
    fn indexes_are_renamed_by_name_and_keep_their_ids() {
        let mut m = started(1, 2);
        let cols = vec![Column::new("k", ColumnType::Int), Column::new("v", ColumnType::Int).nullable()];
        let spec = TableSpec { name: "d.t".into(), columns: cols, primary_key: vec![0], partition_key: vec![] };
        let index =
            |name: &str, unique| IndexSpec { id: 0, name: name.into(), columns: vec![1], unique, prefix_lens: vec![] };
        let indexes = vec![index("a", false), index("u", true)];
        let t = m.apply(Command::CreateTable { spec, if_not_exists: false, indexes }).unwrap().table.unwrap();
        let rename =
            |from: &str, to: &str| Command::RenameIndex { table: "d.t".into(), from: from.into(), to: to.into() };
        let out = m.apply(rename("U", "u2")).unwrap().table.unwrap();
        let u = out.indexes.iter().find(|i| i.unique).unwrap();
        assert_eq!((u.name.as_str(), u.id), ("u2", t.indexes.iter().find(|i| i.unique).unwrap().id));
        assert!(m.cluster.table(&out.unique_table_name(u)).is_some(), "the hidden table keeps its name");
        m.apply(rename("a", "A")).unwrap();
        for (from, to) in [("a", "u2"), ("nope", "x"), ("PRIMARY", "x"), ("a", "primary"), ("a", "")] {
            assert_eq!(m.apply(rename(from, to)).unwrap_err().code, ErrorCode::InvalidArgument, "{from} {to}");
        }
    }

    #[test]
    fn triggers_are_named_once_per_database_and_live_and_die_with_their_table() {
        let mut m = started(1, 2);
        let create = |name: &str| Command::CreateTable {
            spec: TableSpec {
                name: name.into(),
                columns: vec![Column::new("k", ColumnType::Int)],
                primary_key: vec![0],
                partition_key: vec![],
            },
            if_not_exists: false,
            indexes: vec![],
        };
        let trigger = |name: &str| Trigger {
            name: name.into(),
            before: true,
            event: shoal_proto::TriggerEvent::Insert,
            body: "SET NEW.k = NEW.k + 1".into(),
            definer: "'root'@'%'".into(),
            created_ms: 1,
        };
        let add = |table: &str, name: &str, if_not_exists| Command::CreateTrigger {
            table: table.into(),
            trigger: trigger(name),
            if_not_exists,
        };
        let drop = |db: &str, name: &str, if_exists| Command::DropTrigger {
            database: db.into(),
            name: name.into(),
            if_exists,
        };
        m.apply(create("d.a")).unwrap();
        m.apply(create("d.b")).unwrap();
        m.apply(create("e.a")).unwrap();
        let epoch = m.cluster.epoch;
        let t = m.apply(add("d.a", "tr", false)).unwrap().table.unwrap();
        assert_eq!((t.triggers.len(), m.cluster.epoch), (1, epoch + 1), "a catalog change moves the epoch");
        // One name per database, whatever the table and the case; another database may reuse it.
        assert_eq!(m.apply(add("d.b", "TR", false)).unwrap_err().code, ErrorCode::TriggerExists);
        assert_eq!(m.apply(add("d.b", "tr", true)).unwrap().table.unwrap().spec.name, "d.a");
        m.apply(add("e.a", "tr", false)).unwrap();
        assert_eq!(m.apply(add("d.nope", "x", false)).unwrap_err().code, ErrorCode::NoSuchTable);
        // Within the database only; not into another one while it has triggers.
        let rename = |a: &str, b: &str| Command::RenameTables { renames: vec![(a.into(), b.into())] };
        m.apply(rename("d.a", "d.a2")).unwrap();
        assert_eq!(m.apply(rename("d.a2", "f.a2")).unwrap_err().code, ErrorCode::InvalidArgument);
        assert_eq!(m.apply(drop("d", "nope", false)).unwrap_err().code, ErrorCode::NoSuchTrigger);
        m.apply(drop("d", "nope", true)).unwrap();
        assert!(m.apply(drop("d", "Tr", false)).unwrap().table.unwrap().triggers.is_empty());
        assert_eq!(m.apply(drop("d", "tr", false)).unwrap_err().code, ErrorCode::NoSuchTrigger);
        // Dropped with the table: the name is free again.
        m.apply(add("d.b", "tr", false)).unwrap();
        m.apply(Command::DropTable { name: "d.b".into(), if_exists: false }).unwrap();
        m.apply(add("d.a2", "tr", false)).unwrap();
        assert_eq!(m.cluster.table("e.a").unwrap().triggers.len(), 1);
    }

    #[test]
    fn unique_indexes_have_hidden_tables_that_live_and_die_with_them() {
        let mut m = started(1, 2);
        let spec = |name: &str| TableSpec {
            name: name.into(),
            columns: vec![
                Column::new("k", ColumnType::Int),
                Column::new("u", ColumnType::Float).nullable(),
                Column::new("v", ColumnType::Text),
            ],
            primary_key: vec![0],
            partition_key: vec![],
        };
        let unique = |name: &str, cols: Vec<u32>| IndexSpec {
            id: 0,
            name: name.into(),
            columns: cols,
            unique: true,
            prefix_lens: vec![],
        };
        let create = |name: &str| Command::CreateTable {
            spec: spec(name),
            if_not_exists: false,
            indexes: vec![unique("u", vec![1]), unique("uv", vec![2, 1])],
        };
        let t = m.apply(create("d.t")).unwrap().table.unwrap();
        assert_eq!(m.cluster.tables.len(), 3, "the table and one hidden table per unique index");
        let hidden = m.cluster.table(&t.unique_table_name(&t.indexes[1])).unwrap().clone();
        assert_eq!(hidden.spec.name, format!("d.#unique-{}-2", t.id));
        let names: Vec<&str> = hidden.columns().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["k0", "k1", "p0"]);
        assert_eq!((hidden.spec.primary_key.clone(), hidden.columns()[1].ty), (vec![0, 1], ColumnType::Float));
        assert!(hidden.columns().iter().all(|c| !c.nullable));
        // DROP INDEX drops its hidden table; DROP TABLE the rest.
        m.apply(Command::DropIndex { table: "d.t".into(), name: "uv".into(), if_exists: false }).unwrap();
        assert!(m.cluster.table(&hidden.spec.name).is_none());
        assert_eq!(m.cluster.tables.len(), 2);
        m.apply(Command::DropTable { name: "d.t".into(), if_exists: false }).unwrap();
        assert!(m.cluster.tables.is_empty());
        // A copy swapped in takes its own hidden tables along; the old table's go.
        let old = m.apply(create("d.t")).unwrap().table.unwrap();
        let copy = m.apply(create("d.#alter-t")).unwrap().table.unwrap();
        m.apply(Command::SetReadOnly { table: "d.t".into(), read_only: true }).unwrap();
        m.apply(Command::ReplaceTable { table: "d.t".into(), with: "d.#alter-t".into() }).unwrap();
        let names: Vec<String> = m.cluster.tables.iter().map(|t| t.spec.name.clone()).collect();
        let expect = [format!("d.#unique-{}-1", copy.id), format!("d.#unique-{}-2", copy.id), "d.t".to_string()];
        let mut names = names;
        names.sort();
        assert_eq!(names, expect);
        assert!(m.cluster.tables.iter().all(|t| !t.spec.name.contains(&format!("-{}-", old.id))));
    }
}
