//! Rollouts: the pure planner that moves an App from one version to the next, the judging
//! of measurements, and the Prometheus client that takes them.

pub mod analysis;
pub mod endpoints;
pub mod measure;
pub mod planner;
pub mod prometheus;
pub mod query_cost;
pub mod replicas;
pub mod resting;
pub mod scope;
pub mod turns;
pub mod workload;

pub use measure::{AnalysisLimits, Analyzer, Asker, Run};
