//! Logs, traces and Prometheus metrics of the operator.

pub mod apps;
pub mod events;
pub mod logging;
pub mod metrics;

pub use metrics::Metrics;
