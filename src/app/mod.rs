//! The App controller: desired objects (pure), status (pure), and the reconciler that applies them.

pub mod applied;
pub mod config;
pub mod config_map_key;
pub mod config_readers;
pub mod context;
pub mod controller;
pub mod desired;
pub mod error;
pub mod first_deployment;
pub mod guard;
pub mod lenient;
pub mod light;
pub mod memos;
pub mod namespace_turns;
pub mod pod_policy;
pub mod projection;
pub mod quota;
pub mod reconcile;
pub mod route;
pub mod service_projection;
pub mod service_routing;
pub mod status;
pub mod tenant_pods;

pub use context::Context;
