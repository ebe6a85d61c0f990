//! Sharding: namespaces hash into shards, each shard is owned through a compare-and-swap
//! Lease by one replica at a time, and the cluster-wide singleton work runs on one replica.

pub mod budget;
pub mod fence;
pub mod handoff;
pub mod hash;
pub mod leases;
pub mod manager;
pub mod plan;
pub mod singleton;
pub mod stuck;
pub mod wake;

pub use hash::shard_of;
