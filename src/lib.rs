//! Flotilla: a multi-tenant Kubernetes operator with metric-gated rollouts.

pub mod api;
pub mod app;
pub mod cli;
pub mod dashboard;
pub mod operator;
pub mod rollout;
pub mod sharding;
pub mod telemetry;
pub mod tenancy;
pub mod watch_cache;
pub mod webhook;
