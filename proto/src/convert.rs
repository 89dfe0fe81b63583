//! Protobuf ⇄ domain conversions. Incoming messages are validated here (`TryFrom`), so code
//! past the RPC layer never sees an unchecked enum or a missing field.

use crate::error::{ErrorCode, ShoalError};
use crate::pb;
use crate::types::*;
use crate::users::{AccountName, AuthPlugin, PasswordHashes, UserAccount};

fn bad(msg: impl Into<String>) -> ShoalError {
    ShoalError::new(ErrorCode::InvalidArgument, msg)
}

impl From<&Value> for pb::Value {
    fn from(v: &Value) -> pb::Value {
        use pb::value::Kind;
        let kind = match v {
            Value::Null => Kind::Null(true),
            Value::Int(i) => Kind::Int(*i),
            Value::Uint(u) => Kind::Uint(*u),
            Value::Float(f) => Kind::Float(*f),
            Value::Text(s) => Kind::Text(s.clone()),
            Value::Bytes(b) => Kind::Bin(b.clone()),
            Value::Bool(b) => Kind::Boolean(*b),
        };
        pb::Value { kind: Some(kind) }
    }
}

impl From<Value> for pb::Value {
    fn from(v: Value) -> pb::Value {
        use pb::value::Kind;
        let kind = match v {
            Value::Text(s) => Kind::Text(s),
            Value::Bytes(b) => Kind::Bin(b),
            other => return pb::Value::from(&other),
        };
        pb::Value { kind: Some(kind) }
    }
}

impl From<pb::Value> for Value {
    fn from(v: pb::Value) -> Value {
        use pb::value::Kind;
        match v.kind {
            None | Some(Kind::Null(_)) => Value::Null,
            Some(Kind::Int(i)) => Value::Int(i),
            Some(Kind::Uint(u)) => Value::Uint(u),
            Some(Kind::Float(f)) => Value::Float(f),
            Some(Kind::Text(s)) => Value::Text(s),
            Some(Kind::Bin(b)) => Value::Bytes(b),
            Some(Kind::Boolean(b)) => Value::Bool(b),
        }
    }
}

impl pb::Op {
    /// How many keys the operation addresses, as a data node counts it against its batch
    /// limit: a many-key or range read one per key, anything else one.
    pub fn weight(&self) -> usize {
        self.keys.len().max(self.range_count as usize).max(1)
    }
}

pub fn deltas_to_pb(deltas: &[crate::Delta]) -> Vec<pb::Delta> {
    deltas.iter().map(|d| pb::Delta { column: d.column, by: d.by, min: d.min, max: d.max }).collect()
}

pub fn deltas_from_pb(deltas: Vec<pb::Delta>) -> Vec<crate::Delta> {
    deltas.into_iter().map(|d| crate::Delta { column: d.column, by: d.by, min: d.min, max: d.max }).collect()
}

pub fn values_to_pb(values: Vec<Value>) -> Vec<pb::Value> {
    values.into_iter().map(pb::Value::from).collect()
}

pub fn values_from_pb(values: Vec<pb::Value>) -> Vec<Value> {
    values.into_iter().map(Value::from).collect()
}

fn column_type_to_pb(t: ColumnType) -> pb::ColumnType {
    match t {
        ColumnType::Int => pb::ColumnType::Int,
        ColumnType::Uint => pb::ColumnType::Uint,
        ColumnType::Float => pb::ColumnType::Float,
        ColumnType::Text => pb::ColumnType::Text,
        ColumnType::Bytes => pb::ColumnType::Bytes,
        ColumnType::Bool => pb::ColumnType::Bool,
    }
}

impl TryFrom<pb::Column> for Column {
    type Error = ShoalError;
    fn try_from(c: pb::Column) -> Result<Column, ShoalError> {
        let ty = match pb::ColumnType::try_from(c.r#type) {
            Ok(pb::ColumnType::Int) => ColumnType::Int,
            Ok(pb::ColumnType::Uint) => ColumnType::Uint,
            Ok(pb::ColumnType::Float) => ColumnType::Float,
            Ok(pb::ColumnType::Text) => ColumnType::Text,
            Ok(pb::ColumnType::Bytes) => ColumnType::Bytes,
            Ok(pb::ColumnType::Bool) => ColumnType::Bool,
            _ => return Err(bad(format!("column {}: unknown type {}", c.name, c.r#type))),
        };
        Ok(Column {
            name: c.name,
            ty,
            nullable: c.nullable,
            max_len: c.max_len,
            sql_type: c.sql_type,
            auto_increment: c.auto_increment,
            default: c.default.map(Value::from),
        })
    }
}

impl From<&Column> for pb::Column {
    fn from(c: &Column) -> pb::Column {
        pb::Column {
            name: c.name.clone(),
            r#type: column_type_to_pb(c.ty) as i32,
            nullable: c.nullable,
            max_len: c.max_len,
            sql_type: c.sql_type.clone(),
            auto_increment: c.auto_increment,
            default: c.default.as_ref().map(pb::Value::from),
        }
    }
}

impl TryFrom<pb::TableSpec> for TableSpec {
    type Error = ShoalError;
    fn try_from(s: pb::TableSpec) -> Result<TableSpec, ShoalError> {
        if s.columns.len() > MAX_COLUMNS {
            return Err(bad("too many columns"));
        }
        Ok(TableSpec {
            name: s.name,
            columns: s.columns.into_iter().map(Column::try_from).collect::<Result<_, _>>()?,
            primary_key: s.primary_key,
            partition_key: s.partition_key,
        })
    }
}

impl From<&TableSpec> for pb::TableSpec {
    fn from(s: &TableSpec) -> pb::TableSpec {
        pb::TableSpec {
            name: s.name.clone(),
            columns: s.columns.iter().map(pb::Column::from).collect(),
            primary_key: s.primary_key.clone(),
            partition_key: s.partition_key.clone(),
        }
    }
}

impl From<&Table> for pb::Table {
    fn from(t: &Table) -> pb::Table {
        pb::Table {
            id: t.id,
            spec: Some(pb::TableSpec::from(&t.spec)),
            partition_count: t.partition_count,
            schema_version: t.schema_version,
            hidden_pk: t.hidden_pk,
            indexes: t.indexes.iter().map(pb::IndexSpec::from).collect(),
            read_only: t.read_only,
            triggers: t.triggers.iter().map(pb::Trigger::from).collect(),
        }
    }
}

impl From<&Trigger> for pb::Trigger {
    fn from(t: &Trigger) -> pb::Trigger {
        let event = match t.event {
            TriggerEvent::Insert => pb::TriggerEvent::Insert,
            TriggerEvent::Update => pb::TriggerEvent::Update,
            TriggerEvent::Delete => pb::TriggerEvent::Delete,
        };
        pb::Trigger {
            name: t.name.clone(),
            before: t.before,
            event: event as i32,
            body: t.body.clone(),
            definer: t.definer.clone(),
            created_ms: t.created_ms,
        }
    }
}

impl TryFrom<pb::Trigger> for Trigger {
    type Error = ShoalError;
    fn try_from(t: pb::Trigger) -> Result<Trigger, ShoalError> {
        let event = match pb::TriggerEvent::try_from(t.event) {
            Ok(pb::TriggerEvent::Insert) => TriggerEvent::Insert,
            Ok(pb::TriggerEvent::Update) => TriggerEvent::Update,
            Ok(pb::TriggerEvent::Delete) => TriggerEvent::Delete,
            _ => return Err(bad(format!("trigger {} has no event", t.name))),
        };
        if t.name.is_empty() || t.body.len() > MAX_TRIGGER_BODY_BYTES {
            return Err(bad("a trigger needs a name and a body of at most 16 KiB"));
        }
        Ok(Trigger {
            name: t.name,
            before: t.before,
            event,
            body: t.body,
            definer: t.definer,
            created_ms: t.created_ms,
        })
    }
}

impl From<&IndexSpec> for pb::IndexSpec {
    fn from(i: &IndexSpec) -> pb::IndexSpec {
        pb::IndexSpec {
            id: i.id,
            name: i.name.clone(),
            columns: i.columns.clone(),
            unique: i.unique,
            prefix_lens: i.prefix_lens.clone(),
        }
    }
}

impl From<pb::IndexSpec> for IndexSpec {
    fn from(i: pb::IndexSpec) -> IndexSpec {
        IndexSpec { id: i.id, name: i.name, columns: i.columns, unique: i.unique, prefix_lens: i.prefix_lens }
    }
}

impl TryFrom<pb::Table> for Table {
    type Error = ShoalError;
    fn try_from(t: pb::Table) -> Result<Table, ShoalError> {
        let spec = TableSpec::try_from(t.spec.ok_or_else(|| bad("table without spec"))?)?;
        if t.partition_count == 0 {
            return Err(bad(format!("table {} has no partitions", spec.name)));
        }
        Ok(Table {
            id: t.id,
            spec,
            partition_count: t.partition_count,
            schema_version: t.schema_version,
            hidden_pk: t.hidden_pk,
            indexes: t.indexes.into_iter().map(IndexSpec::from).collect(),
            read_only: t.read_only,
            triggers: t.triggers.into_iter().map(Trigger::try_from).collect::<Result<_, _>>()?,
        })
    }
}

fn kind_to_pb(k: NodeKind) -> pb::NodeKind {
    match k {
        NodeKind::Mgmd => pb::NodeKind::Mgmd,
        NodeKind::DataNode => pb::NodeKind::Datanode,
        NodeKind::SqlNode => pb::NodeKind::Sqlnode,
    }
}

pub fn state_to_pb(s: NodeState) -> pb::NodeState {
    match s {
        NodeState::Down => pb::NodeState::Down,
        NodeState::Starting => pb::NodeState::Starting,
        NodeState::Up => pb::NodeState::Up,
    }
}

pub fn state_from_pb(s: i32) -> Result<NodeState, ShoalError> {
    match pb::NodeState::try_from(s) {
        Ok(pb::NodeState::Down) => Ok(NodeState::Down),
        Ok(pb::NodeState::Starting) => Ok(NodeState::Starting),
        Ok(pb::NodeState::Up) => Ok(NodeState::Up),
        _ => Err(bad(format!("unknown node state {s}"))),
    }
}

impl From<&ClusterState> for pb::ClusterState {
    fn from(s: &ClusterState) -> pb::ClusterState {
        pb::ClusterState {
            epoch: s.epoch,
            nodes: s
                .nodes
                .iter()
                .map(|n| pb::Node {
                    id: n.id,
                    kind: kind_to_pb(n.kind) as i32,
                    addr: n.addr.clone(),
                    state: state_to_pb(n.state) as i32,
                    node_group: n.node_group,
                    pid: n.pid,
                    incarnation: n.incarnation,
                    sync_epoch: n.sync_epoch,
                    restorable_gci: n.restorable_gci,
                })
                .collect(),
            tables: s.tables.iter().map(pb::Table::from).collect(),
            partitions: s
                .partitions
                .iter()
                .map(|p| pb::PartitionAssignment {
                    partition: p.partition,
                    node_group: p.node_group,
                    primary: p.primary.unwrap_or(0),
                    primary_term: p.primary_term,
                    replicas: p
                        .replicas
                        .iter()
                        .map(|r| pb::Replica { node_id: r.node_id, syncing: r.syncing(), sync_epoch: r.sync_epoch })
                        .collect(),
                })
                .collect(),
            leader_id: s.leader_id,
            gci_complete: s.gci_complete,
            rolled_back: s
                .rolled_back
                .iter()
                .map(|r| pb::GciRange { after: r.after, through: r.through, node_group: r.node_group })
                .collect(),
            users_version: s.users_version,
        }
    }
}

impl TryFrom<pb::ClusterState> for ClusterState {
    type Error = ShoalError;
    fn try_from(s: pb::ClusterState) -> Result<ClusterState, ShoalError> {
        let nodes = s
            .nodes
            .into_iter()
            .map(|n| {
                let kind = match pb::NodeKind::try_from(n.kind) {
                    Ok(pb::NodeKind::Mgmd) => NodeKind::Mgmd,
                    Ok(pb::NodeKind::Datanode) => NodeKind::DataNode,
                    Ok(pb::NodeKind::Sqlnode) => NodeKind::SqlNode,
                    _ => return Err(bad(format!("node {}: unknown kind", n.id))),
                };
                Ok(Node {
                    id: n.id,
                    kind,
                    addr: n.addr,
                    state: state_from_pb(n.state)?,
                    node_group: n.node_group,
                    pid: n.pid,
                    incarnation: n.incarnation,
                    sync_epoch: n.sync_epoch,
                    restorable_gci: n.restorable_gci,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let tables = s.tables.into_iter().map(Table::try_from).collect::<Result<Vec<_>, _>>()?;
        let partitions: Vec<PartitionAssignment> = s
            .partitions
            .into_iter()
            .map(|p| PartitionAssignment {
                partition: p.partition,
                node_group: p.node_group,
                primary: (p.primary != 0).then_some(p.primary),
                primary_term: p.primary_term,
                replicas: p
                    .replicas
                    .into_iter()
                    .map(|r| Replica {
                        node_id: r.node_id,
                        sync_epoch: if r.syncing { r.sync_epoch.max(1) } else { 0 },
                    })
                    .collect(),
            })
            .collect();
        if partitions.iter().enumerate().any(|(i, p)| p.partition as usize != i) {
            return Err(bad("partition map is not indexed by partition id"));
        }
        Ok(ClusterState {
            epoch: s.epoch,
            nodes,
            tables,
            partitions,
            leader_id: s.leader_id,
            gci_complete: s.gci_complete,
            rolled_back: s
                .rolled_back
                .into_iter()
                .map(|r| crate::types::RolledBack { node_group: r.node_group, after: r.after, through: r.through })
                .collect(),
            users_version: s.users_version,
            table_index: Default::default(),
        })
    }
}

// ----- SQL users -----

pub fn auth_plugin_to_pb(p: AuthPlugin) -> pb::AuthPlugin {
    match p {
        AuthPlugin::NativePassword => pb::AuthPlugin::NativePassword,
        AuthPlugin::CachingSha2Password => pb::AuthPlugin::CachingSha2Password,
    }
}

pub fn auth_plugin_from_pb(p: i32) -> Result<AuthPlugin, ShoalError> {
    match pb::AuthPlugin::try_from(p) {
        Ok(pb::AuthPlugin::NativePassword) => Ok(AuthPlugin::NativePassword),
        Ok(pb::AuthPlugin::CachingSha2Password) => Ok(AuthPlugin::CachingSha2Password),
        _ => Err(bad(format!("unknown authentication plugin {p}"))),
    }
}

impl From<&AccountName> for pb::AccountName {
    fn from(a: &AccountName) -> pb::AccountName {
        pb::AccountName { name: a.name.clone(), host: a.host.clone() }
    }
}

impl TryFrom<pb::AccountName> for AccountName {
    type Error = ShoalError;
    fn try_from(a: pb::AccountName) -> Result<AccountName, ShoalError> {
        let a = AccountName { name: a.name, host: a.host };
        a.validate()?;
        Ok(a)
    }
}

impl TryFrom<pb::SetPasswordRequest> for (AccountName, PasswordHashes) {
    type Error = ShoalError;
    fn try_from(r: pb::SetPasswordRequest) -> Result<(AccountName, PasswordHashes), ShoalError> {
        let account = AccountName::try_from(r.account.ok_or_else(|| bad("missing account"))?)?;
        let hashes =
            PasswordHashes { plugin: auth_plugin_from_pb(r.plugin)?, native: r.native_hash, sha2: r.sha2_hash };
        hashes.validate()?;
        Ok((account, hashes))
    }
}

impl From<&UserAccount> for pb::UserAccount {
    fn from(u: &UserAccount) -> pb::UserAccount {
        pb::UserAccount {
            name: u.account.name.clone(),
            host: u.account.host.clone(),
            plugin: auth_plugin_to_pb(u.password.plugin) as i32,
            native_hash: u.password.native.clone(),
            sha2_hash: u.password.sha2.clone(),
            global_all: u.global_all,
            databases: u.databases.clone(),
        }
    }
}

impl TryFrom<pb::UserAccount> for UserAccount {
    type Error = ShoalError;
    fn try_from(u: pb::UserAccount) -> Result<UserAccount, ShoalError> {
        let user = UserAccount {
            account: AccountName { name: u.name, host: u.host },
            password: PasswordHashes {
                plugin: auth_plugin_from_pb(u.plugin)?,
                native: u.native_hash,
                sha2: u.sha2_hash,
            },
            global_all: u.global_all,
            databases: u.databases,
        };
        user.validate()?;
        Ok(user)
    }
}

impl From<&ShoalError> for pb::Error {
    fn from(e: &ShoalError) -> pb::Error {
        pb::Error {
            code: e.code.number(),
            message: e.message.clone(),
            current_epoch: e.current_epoch,
            hint: e.hint,
            hint_addr: e.hint_addr.clone(),
        }
    }
}

impl From<ShoalError> for pb::Error {
    fn from(e: ShoalError) -> pb::Error {
        pb::Error::from(&e)
    }
}

impl From<pb::Error> for ShoalError {
    fn from(e: pb::Error) -> ShoalError {
        ShoalError {
            code: ErrorCode::from_number(e.code),
            message: e.message,
            current_epoch: e.current_epoch,
            hint: e.hint,
            hint_addr: e.hint_addr,
        }
    }
}

/// `Some(error)` → `Err`, `None` → `Ok`: the optional error field of responses.
pub fn check(e: Option<pb::Error>) -> Result<(), ShoalError> {
    match e {
        Some(e) if e.code != 0 => Err(ShoalError::from(e)),
        _ => Ok(()),
    }
}
