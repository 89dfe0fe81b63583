//! shoal-mgmd: the management daemon. Holds the cluster configuration, catalog, partition map
//! and epoch in a Raft-replicated state machine ([`state`]), detects data node failures, grants
//! leases and serves the cluster map.

pub mod state;
