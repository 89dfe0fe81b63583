//! What only the Raft leader does, all from memory it rebuilds each term: answer data node
//! heartbeats and grant leases, batch joins, detect failures, bootstrap the model.
//!
//! Leases keep invariant 3 (at most one primary per partition): a data node serves as primary
//! only while it holds a lease, and a lease is granted only while this leader was confirmed
//! by a Raft quorum within [`LEADER_CONFIRM_WINDOW_MS`]. A node is declared down only after
//! `failure_timeout_ms` without heartbeats, which the config keeps above
//! `lease_ms + LEADER_CONFIRM_WINDOW_MS`, so its last lease has run out first. A new leader
//! has no history, so it starts every node's clock at its own election (a grace period); that
//! also covers leases the previous leader granted, which it could only do while confirmed,
//! i.e. before this leader was elected.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::{RaftMetrics, ServerState};
use parking_lot::Mutex;
use shoal_proto::config::{ClusterConfig, LEADER_CONFIRM_WINDOW_MS};
use shoal_proto::{ClusterState, Epoch, ErrorCode, NodeId, NodeKind, NodeState, ShoalError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::raft::{node_id, Consensus};
use crate::state::{Command, CommandResult, JoinInfo, Model, Outcome};

/// How often the leader checks for failures, due joins and its quorum confirmation.
pub const LEADER_TICK_MS: u64 = 50;
/// A group with no live primary waits this long after its first join request for the rest
/// of its nodes, so that they start together and share the primaries.
pub const GROUP_START_WAIT_MS: u64 = 3000;
/// A primary away from its preferred (up, complete) node this long is moved back.
pub const REBALANCE_AFTER_MS: u64 = 1000;
/// Pause before proposing a join or bootstrap again after a failed attempt.
pub const RETRY_AFTER_MS: u64 = 500;
/// A gap this long between two runs of the decision loop (normally `LEADER_TICK_MS`) means this
/// mgmd was stalled; see `Term::silence_floor`.
pub const STALL_MS: u64 = 300;
/// Upper bound on one quorum confirmation round.
pub const CONFIRM_TIMEOUT_MS: u64 = 500;

/// A data node's heartbeat, validated.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    pub node_id: NodeId,
    pub incarnation: u64,
    pub addr: String,
    pub pid: u32,
    pub epoch: Epoch,
    /// The global checkpoint the node restored from its own files (None: it could not).
    pub loaded_gci: Option<u64>,
    /// Still loading its files: report progress, do not join yet.
    pub restoring: bool,
    pub progress: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct HeartbeatAnswer {
    /// 0: no lease; the node must not serve as primary.
    pub lease_ms: u64,
    pub state: NodeState,
    pub epoch: Epoch,
    /// Restart and restore from your own files (see `Term::restart_asked`).
    pub restart_from_files: bool,
}

struct PendingJoin {
    info: JoinInfo,
    first_asked: Instant,
    last_asked: Instant,
    in_flight: bool,
    not_before: Instant,
}

/// The leader's memory for one term.
struct Term {
    term: u64,
    /// When this node became leader.
    since: Instant,
    /// The failure detector counts a node's silence from no earlier than this: when this node
    /// became leader, or when its own decision loop last resumed after a stall. A leader that
    /// was itself frozen (a paused VM, a starved process) heard nothing in that time; taking the
    /// gap for silence would declare every data node down at once.
    silence_floor: Instant,
    /// When the decision loop last ran.
    last_tick: Instant,
    /// The state machine has applied everything committed before this term: decisions may
    /// be taken from the local model.
    caught_up: bool,
    /// Start of the last quorum confirmation that succeeded.
    confirmed_at: Option<Instant>,
    /// Last heartbeat per data node, with the incarnation it came from.
    last_seen: HashMap<NodeId, (Instant, u64)>,
    /// Last lease granted per data node (time the heartbeat arrived; the lease runs from
    /// before then, so it has surely run out `lease_ms` after this).
    granted: HashMap<NodeId, Instant>,
    joins: BTreeMap<NodeId, PendingJoin>,
    downs_in_flight: HashSet<NodeId>,
    bootstrap_in_flight: bool,
    bootstrap_not_before: Instant,
    /// Since when some primary has been away from its preferred node.
    misplaced_since: Option<Instant>,
    /// Last time a node group that cannot start yet was logged.
    group_wait_logged: Instant,
    /// Restart progress data nodes reported, with when.
    progress: HashMap<NodeId, (String, Instant)>,
    rebalance_in_flight: bool,
    /// Read-only tables (an ALTER TABLE copying them) and when their ALTER last renewed the
    /// flag; a table not renewed for `READ_ONLY_LEASE_MS` gets its writes back.
    read_only_renewed: HashMap<String, Instant>,
    read_only_release_in_flight: HashSet<String>,
    /// Nodes (with the incarnation) told to restart and restore from their own files: they were
    /// declared down while alive, so they hold in memory only what they loaded at start plus
    /// what came after, and no node of their group can start it from that. Asked once per
    /// incarnation: a node that restarted and still cannot start the group must not loop.
    restart_asked: HashMap<NodeId, u64>,
    /// Nodes asked to restart because they restored an older global checkpoint than recorded
    /// for them (`Model::restored_older_than_recorded`): once per node and term, so a node
    /// whose newer files turn out unreadable does not restart again and again.
    reload_asked: HashSet<NodeId>,
}

impl Term {
    fn new(term: u64, now: Instant) -> Term {
        Term {
            term,
            since: now,
            silence_floor: now,
            last_tick: now,
            caught_up: false,
            confirmed_at: None,
            last_seen: HashMap::new(),
            granted: HashMap::new(),
            joins: BTreeMap::new(),
            downs_in_flight: HashSet::new(),
            bootstrap_in_flight: false,
            bootstrap_not_before: now,
            misplaced_since: None,
            rebalance_in_flight: false,
            group_wait_logged: now.checked_sub(Duration::from_secs(60)).unwrap_or(now),
            progress: HashMap::new(),
            read_only_renewed: HashMap::new(),
            read_only_release_in_flight: HashSet::new(),
            restart_asked: HashMap::new(),
            reload_asked: HashSet::new(),
        }
    }

    fn confirmed(&self, now: Instant) -> bool {
        self.caught_up
            && self
                .confirmed_at
                .is_some_and(|c| now.saturating_duration_since(c) < Duration::from_millis(LEADER_CONFIRM_WINDOW_MS))
    }
}

/// How long a table stays read-only without its ALTER TABLE renewing the mark.
const READ_ONLY_LEASE_MS: u64 = 10_000;

pub struct Leader {
    consensus: Consensus,
    /// Highest GCI a `sync` writer waits for; the checkpoint driver runs rounds back to back
    /// until it is complete.
    pub(crate) hurry_to: std::sync::atomic::AtomicU64,
    pub(crate) hurry: tokio::sync::Notify,
    /// The config file this mgmd started with: bootstraps the model, and names the data nodes
    /// until the model does.
    file_config: Arc<ClusterConfig>,
    term: Mutex<Option<Term>>,
}

fn err(code: ErrorCode, msg: impl Into<String>) -> ShoalError {
    ShoalError::new(code, msg)
}

impl Leader {
    pub fn new(consensus: Consensus, file_config: Arc<ClusterConfig>) -> Arc<Leader> {
        Arc::new(Leader {
            consensus,
            file_config,
            term: Mutex::new(None),
            hurry_to: Default::default(),
            hurry: tokio::sync::Notify::new(),
        })
    }

    /// The configuration in force: the replicated one once bootstrapped.
    fn config(&self) -> Arc<ClusterConfig> {
        self.consensus.published.config().unwrap_or_else(|| self.file_config.clone())
    }

    /// Starts the leader's background tasks; they end when `shutdown` turns true.
    pub fn spawn(self: &Arc<Self>, shutdown: watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
        vec![
            tokio::spawn(self.clone().follow_metrics(shutdown.clone())),
            tokio::spawn(self.clone().confirm_loop(shutdown.clone())),
            tokio::spawn(self.clone().tick_loop(shutdown.clone())),
            tokio::spawn(crate::gcp::gcp_loop(self.clone(), shutdown)),
        ]
    }

    /// A `sync` writer waits for `gci`: wake the checkpoint driver.
    /// An ALTER TABLE (re)marked `table` read-only: its lease starts now.
    pub fn renew_read_only(&self, table: &str) {
        if let Some(t) = self.term.lock().as_mut() {
            t.read_only_renewed.insert(table.to_ascii_lowercase(), Instant::now());
        }
    }

    pub fn hurry_checkpoint(&self, gci: u64) -> Result<(), ShoalError> {
        if !self.is_acting() {
            return Err(self.consensus.not_leader(self.consensus.leader()));
        }
        if self.hurry_to.fetch_max(gci, std::sync::atomic::Ordering::AcqRel) < gci {
            self.hurry.notify_one();
        }
        Ok(())
    }

    /// Restart progress reported by data nodes in the last few seconds (leader only).
    pub fn progress(&self) -> Vec<(NodeId, String)> {
        let guard = self.term.lock();
        let Some(t) = guard.as_ref() else { return vec![] };
        let mut out: Vec<(NodeId, String)> = t
            .progress
            .iter()
            .filter(|(_, (_, at))| at.elapsed() < Duration::from_secs(5))
            .map(|(&id, (p, _))| (id, p.clone()))
            .collect();
        out.sort();
        out
    }

    /// Whether this mgmd leads and has applied everything committed before its term.
    pub fn is_acting(&self) -> bool {
        self.term.lock().as_ref().is_some_and(|t| t.caught_up)
    }

    pub fn consensus(&self) -> &Consensus {
        &self.consensus
    }

    pub fn cluster_config(&self) -> Arc<ClusterConfig> {
        self.config()
    }

    /// Tracks leadership: a fresh [`Term`] when this node becomes leader, none otherwise; and
    /// the leader id in the published cluster map.
    async fn follow_metrics(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut metrics = self.consensus.raft.metrics();
        loop {
            self.on_metrics(&metrics.borrow_and_update());
            tokio::select! {
                r = metrics.changed() => if r.is_err() { break },
                _ = shutdown.wait_for(|&s| s) => break,
            }
        }
        *self.term.lock() = None;
    }

    fn on_metrics(&self, m: &RaftMetrics<u64, openraft::BasicNode>) {
        self.consensus.published.set_leader(m.current_leader.map(node_id).unwrap_or(0));
        let leading = m.state == ServerState::Leader && m.running_state.is_ok();
        let mut term = self.term.lock();
        match (&*term, leading) {
            (Some(t), true) if t.term == m.current_term => {}
            (_, true) => {
                tracing::info!(term = m.current_term, "mgmd {} became raft leader", self.consensus.id);
                *term = Some(Term::new(m.current_term, Instant::now()));
            }
            (Some(t), false) => {
                tracing::info!(term = t.term, "mgmd {} is no longer raft leader", self.consensus.id);
                *term = None;
            }
            (None, false) => {}
        }
    }

    /// While leader, asks a quorum every tick whether we still lead. Leases are granted only
    /// within [`LEADER_CONFIRM_WINDOW_MS`] of the start of the last successful round.
    async fn confirm_loop(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(Duration::from_millis(LEADER_TICK_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.wait_for(|&s| s) => break,
            }
            let Some(term) = self.term.lock().as_ref().map(|t| t.term) else {
                continue;
            };
            let start = Instant::now();
            let res =
                tokio::time::timeout(Duration::from_millis(CONFIRM_TIMEOUT_MS), self.consensus.raft.get_read_log_id())
                    .await;
            if let Ok(Ok((read, applied))) = res {
                let mut guard = self.term.lock();
                if let Some(t) = guard.as_mut().filter(|t| t.term == term) {
                    t.confirmed_at = Some(start);
                    if !t.caught_up && applied >= read {
                        t.caught_up = true;
                        tracing::info!(term, "mgmd {} leader caught up; taking decisions", self.consensus.id);
                    }
                }
            }
        }
    }

    async fn tick_loop(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(Duration::from_millis(LEADER_TICK_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.wait_for(|&s| s) => break,
            }
            self.tick(Instant::now());
        }
    }

    /// One round of leader decisions. Proposals run in their own tasks so a slow commit
    /// never delays failure detection; in-flight flags keep them from being proposed twice.
    fn tick(self: &Arc<Self>, now: Instant) {
        let mut guard = self.term.lock();
        let Some(t) = guard.as_mut() else { return };
        let gap = now.saturating_duration_since(t.last_tick);
        t.last_tick = now;
        if gap > Duration::from_millis(STALL_MS) {
            // Heartbeats that arrived during the stall are still queued: count from now.
            tracing::warn!(
                ms = gap.as_millis() as u64,
                "mgmd {}: decision loop stalled; failure detection starts over",
                self.consensus.id
            );
            t.silence_floor = now;
        }
        if !t.caught_up {
            return;
        }
        // Read under the term lock, like `heartbeat`, so both decide from the same map.
        let cluster = self.consensus.published.current();
        let config = self.config();
        if cluster.epoch == 0 {
            // Not bootstrapped: nothing else makes sense until it is.
            if !t.bootstrap_in_flight && now >= t.bootstrap_not_before {
                t.bootstrap_in_flight = true;
                tracing::info!("mgmd {} proposing bootstrap of cluster {:?}", self.consensus.id, config.cluster.name);
                self.spawn_bootstrap(t.term);
            }
            return;
        }
        self.detect_failures(t, &cluster, &config, now);
        self.propose_due_joins(t, &cluster, &config, now);
        self.propose_rebalance(t, &cluster, &config, now);
        self.release_abandoned_read_only(t, &cluster, now);
    }

    /// A table stays read-only only while the ALTER TABLE that marked it renews the mark: one
    /// whose SQL node died must not keep the table from writes for ever. (A new leader gives
    /// every read-only table a whole lease first.) The ALTER's final swap refuses a table that
    /// is writable again, so a copy that outlived its lease is thrown away, never swapped in.
    fn release_abandoned_read_only(self: &Arc<Self>, t: &mut Term, cluster: &ClusterState, now: Instant) {
        let read_only: Vec<String> =
            cluster.tables.iter().filter(|x| x.read_only).map(|x| x.spec.name.to_ascii_lowercase()).collect();
        t.read_only_renewed.retain(|name, _| read_only.contains(name));
        t.read_only_release_in_flight.retain(|name| read_only.contains(name));
        for name in read_only {
            let renewed = *t.read_only_renewed.entry(name.clone()).or_insert(now);
            if now.saturating_duration_since(renewed) < Duration::from_millis(READ_ONLY_LEASE_MS)
                || !t.read_only_release_in_flight.insert(name.clone())
            {
                continue;
            }
            tracing::warn!(table = %name, "the ALTER TABLE of {name} stopped renewing its read-only mark: writes are allowed again");
            let (me, term) = (self.clone(), t.term);
            tokio::spawn(async move {
                let res = me.consensus.propose(Command::SetReadOnly { table: name.clone(), read_only: false }).await;
                log_result("release read-only", &res);
                if let Some(t) = me.term.lock().as_mut().filter(|t| t.term == term) {
                    t.read_only_release_in_flight.remove(&name);
                }
            });
        }
    }

    /// Moves primaries back to their preferred nodes once those have been up and complete for
    /// a while (after a node restart), so every node again leads its share. The data nodes'
    /// activation barrier makes the hand-over safe.
    fn propose_rebalance(self: &Arc<Self>, t: &mut Term, cluster: &ClusterState, config: &ClusterConfig, now: Instant) {
        let misplaced = crate::state::misplaced_primaries(cluster, config.node_groups());
        if misplaced.is_empty() {
            t.misplaced_since = None;
            return;
        }
        let since = *t.misplaced_since.get_or_insert(now);
        if t.rebalance_in_flight || now.saturating_duration_since(since) < Duration::from_millis(REBALANCE_AFTER_MS) {
            return;
        }
        t.rebalance_in_flight = true;
        tracing::info!(partitions = ?misplaced, "moving primaries back to their preferred nodes");
        let (me, term) = (self.clone(), t.term);
        tokio::spawn(async move {
            let res = me.consensus.propose(Command::Rebalance).await;
            log_result("rebalance", &res);
            if let Some(t) = me.term.lock().as_mut().filter(|t| t.term == term) {
                t.rebalance_in_flight = false;
                t.misplaced_since = None;
            }
        });
    }

    fn spawn_bootstrap(self: &Arc<Self>, term: u64) {
        let me = self.clone();
        tokio::spawn(async move {
            let res = me.consensus.propose(Command::Bootstrap { config: (*me.file_config).clone() }).await;
            if let Err(e) = &res {
                tracing::warn!("bootstrap failed: {e}");
            }
            if let Some(t) = me.term.lock().as_mut().filter(|t| t.term == term) {
                t.bootstrap_in_flight = false;
                if res.is_err() {
                    t.bootstrap_not_before = Instant::now() + Duration::from_millis(RETRY_AFTER_MS);
                }
            }
        });
    }

    fn detect_failures(self: &Arc<Self>, t: &mut Term, cluster: &ClusterState, config: &ClusterConfig, now: Instant) {
        let timeout = Duration::from_millis(config.cluster.failure_timeout_ms);
        for n in &cluster.nodes {
            if n.kind != NodeKind::DataNode || n.state == NodeState::Down || t.downs_in_flight.contains(&n.id) {
                continue;
            }
            let last = match t.last_seen.get(&n.id) {
                Some(&(at, inc)) if inc == n.incarnation => at.max(t.silence_floor),
                _ => t.silence_floor,
            };
            let silent = now.saturating_duration_since(last);
            if silent <= timeout {
                continue;
            }
            let reason = format!("no heartbeat for {} ms", silent.as_millis());
            tracing::info!(
                node = n.id,
                incarnation = n.incarnation,
                state = n.state.name(),
                "failure detector: declaring data node {} down: {reason}",
                n.id
            );
            t.downs_in_flight.insert(n.id);
            let cmd = Command::Down { id: n.id, incarnation: n.incarnation, reason };
            let (me, term, id) = (self.clone(), t.term, n.id);
            tokio::spawn(async move {
                let res = me.consensus.propose(cmd).await;
                log_result(&format!("down of data node {id}"), &res);
                if let Some(t) = me.term.lock().as_mut().filter(|t| t.term == term) {
                    t.downs_in_flight.remove(&id);
                }
            });
        }
    }

    fn propose_due_joins(self: &Arc<Self>, t: &mut Term, cluster: &ClusterState, config: &ClusterConfig, now: Instant) {
        // Forget nodes that asked once and went quiet: they will ask again.
        let forget_after = Duration::from_millis(config.cluster.failure_timeout_ms);
        t.joins.retain(|_, p| p.in_flight || now.saturating_duration_since(p.last_asked) <= forget_after);

        let mut groups: BTreeMap<u32, Vec<NodeId>> = BTreeMap::new();
        for (&id, p) in &t.joins {
            if p.in_flight || now < p.not_before {
                continue;
            }
            if let Some(group) = config.datanode.iter().find(|d| d.id == id).map(|d| d.node_group) {
                groups.entry(group).or_default().push(id);
            }
        }
        for (group, mut ids) in groups {
            // Primaries held by other nodes than the ones asking (a node asking again with a new
            // incarnation loses its old role in the join itself).
            let others: Vec<NodeId> = cluster
                .partitions
                .iter()
                .filter(|p| p.node_group == group)
                .filter_map(|p| p.primary)
                .filter(|id| !ids.contains(id))
                .collect();
            let live = !others.is_empty();
            // After an mgmd restart the model may still show primaries that died with it. A
            // join into such a group would copy from a dead node and drop what the joiner
            // restored from disk, so wait until each primary has heartbeated to this leader
            // (or the failure detector took it out, which makes the group start from disk).
            let unseen = others.iter().find(|&&id| {
                let inc = cluster.node(id).map(|n| n.incarnation);
                !matches!(t.last_seen.get(&id), Some(&(_, seen)) if Some(seen) == inc)
            });
            if let Some(&id) = unseen {
                if now.saturating_duration_since(t.group_wait_logged) >= Duration::from_secs(5) {
                    t.group_wait_logged = now;
                    tracing::info!(group, asking = ?ids, "joins to node group {group} wait until primary {id} is heard from or declared down");
                }
                continue;
            }
            if !live {
                // Only nodes holding the group's newest restorable state may start it.
                let able: Vec<NodeId> = ids
                    .iter()
                    .copied()
                    .filter(|id| t.joins.get(id).is_some_and(|p| Model::can_start_group(cluster, &p.info)))
                    .collect();
                if able.is_empty() {
                    for &id in &ids {
                        let Some(p) = t.joins.get(&id) else { continue };
                        let inc = p.info.incarnation;
                        if Model::should_restart_from_files(cluster, &p.info)
                            && t.restart_asked.insert(id, inc) != Some(inc)
                        {
                            tracing::warn!(
                                group,
                                node = id,
                                "node group {group} is down and node {id} was declared down while alive: asking it to restart from its own files"
                            );
                        } else if Model::restored_older_than_recorded(cluster, &p.info) && t.reload_asked.insert(id) {
                            t.restart_asked.insert(id, inc);
                            tracing::warn!(
                                group,
                                node = id,
                                loaded = ?p.info.loaded_gci,
                                "node group {group} is down and node {id} restored an older global checkpoint than recorded for it: asking it to restore again"
                            );
                        }
                    }
                    if now.saturating_duration_since(t.group_wait_logged) >= Duration::from_secs(5) {
                        t.group_wait_logged = now;
                        let newest = cluster
                            .nodes
                            .iter()
                            .filter(|n| n.kind == NodeKind::DataNode && n.node_group == group)
                            .max_by_key(|n| n.restorable_gci);
                        tracing::warn!(
                            group,
                            asking = ?ids,
                            "node group {group} cannot start yet: the nodes asking restored nothing newer than a peer holds; waiting for node {} (restorable global checkpoint {})",
                            newest.map_or(0, |n| n.id),
                            newest.map_or(0, |n| n.restorable_gci)
                        );
                    }
                    continue;
                }
                ids = able;
                let members = config.datanode.iter().filter(|d| d.node_group == group);
                let all_asked = members.clone().all(|d| ids.contains(&d.id));
                let first = ids.iter().filter_map(|id| t.joins.get(id)).map(|p| p.first_asked).min();
                let waited = first
                    .is_some_and(|f| now.saturating_duration_since(f) >= Duration::from_millis(GROUP_START_WAIT_MS));
                if !all_asked && !waited {
                    continue;
                }
                tracing::info!(
                    group,
                    nodes = ?ids,
                    "starting node group {group} with {} of {} nodes{}",
                    ids.len(),
                    members.count(),
                    if all_asked { "" } else { " (waited long enough for the rest)" }
                );
            } else {
                tracing::info!(group, nodes = ?ids, "data nodes {ids:?} joining live node group {group}");
            }
            let mut nodes: Vec<JoinInfo> = Vec::with_capacity(ids.len());
            for id in &ids {
                if let Some(p) = t.joins.get_mut(id) {
                    p.in_flight = true;
                    nodes.push(p.info.clone());
                }
            }
            let (me, term) = (self.clone(), t.term);
            tokio::spawn(async move {
                let res = me.consensus.propose(Command::Join { nodes: nodes.clone() }).await;
                log_result(&format!("join of {ids:?}"), &res);
                let mut guard = me.term.lock();
                let Some(t) = guard.as_mut().filter(|t| t.term == term) else {
                    return;
                };
                for j in nodes {
                    let Some(p) = t.joins.get_mut(&j.id) else {
                        continue;
                    };
                    if res.is_ok() && p.info.incarnation == j.incarnation {
                        t.joins.remove(&j.id);
                    } else {
                        p.in_flight = false;
                        p.not_before = Instant::now() + Duration::from_millis(RETRY_AFTER_MS);
                    }
                }
            });
        }
    }

    /// Answers a data node's heartbeat; see the module docs for when a lease is granted.
    pub fn heartbeat(&self, hb: Heartbeat) -> Result<HeartbeatAnswer, ShoalError> {
        let now = Instant::now();
        let mut guard = self.term.lock();
        let Some(t) = guard.as_mut() else {
            return Err(self.consensus.not_leader(self.consensus.leader()));
        };
        // Read the map under the term lock: a Down decided concurrently is then either still
        // in flight (no lease below) or already applied (the node is down in this map).
        let cluster = self.consensus.published.current();
        let config = self.config();
        if !config.datanode.iter().any(|d| d.id == hb.node_id) {
            return Err(err(ErrorCode::InvalidArgument, format!("node {} is not a configured data node", hb.node_id)));
        }
        if hb.progress.is_empty() {
            t.progress.remove(&hb.node_id);
        } else {
            t.progress.insert(hb.node_id, (hb.progress.clone(), now));
        }
        if hb.restoring {
            // Loading its files: nothing to grant, and no join yet.
            return Ok(HeartbeatAnswer {
                lease_ms: 0,
                state: NodeState::Down,
                epoch: cluster.epoch,
                restart_from_files: false,
            });
        }
        t.last_seen.insert(hb.node_id, (now, hb.incarnation));
        let node = cluster.node(hb.node_id).filter(|n| n.kind == NodeKind::DataNode);
        if let Some(n) = node.filter(|n| n.state != NodeState::Down && n.incarnation == hb.incarnation) {
            if t.joins.get(&hb.node_id).is_some_and(|p| !p.in_flight) {
                t.joins.remove(&hb.node_id);
            }
            // A node being declared down gets no new lease: its backups are about to be
            // promoted on the assumption that its last lease has run out.
            let lease_ms =
                if t.confirmed(now) && !t.downs_in_flight.contains(&hb.node_id) { config.cluster.lease_ms } else { 0 };
            if lease_ms > 0 {
                t.granted.insert(hb.node_id, now);
            }
            return Ok(HeartbeatAnswer { lease_ms, state: n.state, epoch: cluster.epoch, restart_from_files: false });
        }
        // Down, restarted (new incarnation) or not in the model yet: it has to join first.
        let info = JoinInfo {
            id: hb.node_id,
            addr: hb.addr,
            pid: hb.pid,
            incarnation: hb.incarnation,
            loaded_gci: hb.loaded_gci,
        };
        let p = t.joins.entry(hb.node_id).or_insert_with(|| {
            tracing::info!(node = hb.node_id, incarnation = hb.incarnation, "data node {} asks to join", hb.node_id);
            PendingJoin { info: info.clone(), first_asked: now, last_asked: now, in_flight: false, not_before: now }
        });
        p.last_asked = now;
        if !p.in_flight {
            p.info = info;
        }
        // The model's state belongs to an older incarnation: for this one the node is down.
        let restart_from_files = t.restart_asked.get(&hb.node_id) == Some(&hb.incarnation);
        Ok(HeartbeatAnswer { lease_ms: 0, state: NodeState::Down, epoch: cluster.epoch, restart_from_files })
    }

    /// A peer could not reach `node_id`. Declares it down, but only once every lease it may
    /// still hold has run out, so its backups are never promoted while it may act as primary.
    pub async fn report_failure(self: &Arc<Self>, reporter: NodeId, node_id: NodeId, reason: &str) -> CommandResult {
        let (node, fence_until, term, epoch) = {
            let mut guard = self.term.lock();
            let Some(t) = guard.as_mut() else {
                return Err(self.consensus.not_leader(self.consensus.leader()));
            };
            if !t.caught_up {
                return Err(err(ErrorCode::NodeNotReady, "the new mgmd leader is still catching up; retry"));
            }
            let cluster = self.consensus.published.current();
            let lease = Duration::from_millis(self.config().cluster.lease_ms);
            let Some(node) = cluster.node(node_id).filter(|n| n.kind == NodeKind::DataNode).cloned() else {
                return Err(err(ErrorCode::InvalidArgument, format!("node {node_id} is not a configured data node")));
            };
            // A report from a node that is not up, or that mgmd itself has not heard from
            // lately (cut off, then reconnected with a queue of old reports), says more about
            // the reporter than about the node it names.
            let reporter_live = cluster.node(reporter).is_some_and(|r| {
                r.state == NodeState::Up
                    && t.last_seen.get(&reporter).is_some_and(|&(at, inc)| {
                        inc == r.incarnation
                            && at.elapsed() < Duration::from_millis(self.config().cluster.failure_timeout_ms)
                    })
            });
            if !reporter_live {
                tracing::info!(
                    "ignoring a failure report about node {node_id} from node {reporter}, which is not up: {reason}"
                );
                return Ok(Outcome { epoch: cluster.epoch, ..Outcome::default() });
            }
            if node.state == NodeState::Down || t.downs_in_flight.contains(&node_id) {
                tracing::info!(
                    "data node {node_id} reported failed by {reporter} ({reason}): already down or going down"
                );
                return Ok(Outcome { epoch: cluster.epoch, ..Outcome::default() });
            }
            // From here on heartbeats get no new lease, so the fence below cannot move.
            t.downs_in_flight.insert(node_id);
            // Leases granted by a previous leader end at most a confirmation window plus a
            // lease after this leader took over.
            let previous = t.since + Duration::from_millis(LEADER_CONFIRM_WINDOW_MS) + lease;
            let mine = t.granted.get(&node_id).map(|&g| g + lease);
            (node, mine.map_or(previous, |m| m.max(previous)), t.term, cluster.epoch)
        };
        let wait = fence_until.saturating_duration_since(Instant::now());
        tracing::info!(
            node = node_id,
            incarnation = node.incarnation,
            reporter,
            epoch,
            "data node {node_id} reported failed by {reporter}: {reason}; declaring it down in {} ms, when its lease has run out",
            wait.as_millis()
        );
        // In its own task: once decided, the down goes through even if the reporter hangs
        // up, and the in-flight mark is always cleared.
        let me = self.clone();
        let reason = format!("reported by node {reporter}: {reason}");
        let task = tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let cmd = Command::Down { id: node_id, incarnation: node.incarnation, reason };
            let res = me.consensus.propose(cmd).await;
            log_result(&format!("down of data node {node_id}"), &res);
            if let Some(t) = me.term.lock().as_mut().filter(|t| t.term == term) {
                t.downs_in_flight.remove(&node_id);
            }
            res
        });
        task.await.unwrap_or_else(|e| Err(ShoalError::internal(format!("declare node down: {e}"))))
    }
}

fn log_result(what: &str, res: &CommandResult) {
    match res {
        Ok(o) => tracing::info!(epoch = o.epoch, "{what} committed"),
        Err(e) if e.code == ErrorCode::NotLeader => tracing::info!("{what} not committed: {e}"),
        Err(e) => tracing::warn!("{what} failed: {e}"),
    }
}
