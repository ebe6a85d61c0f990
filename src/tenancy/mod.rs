//! Tenants: onboarding and offboarding of namespaces with namespaced RBAC and quotas, and the
//! set of namespaces the App controller may serve because of it.

pub mod claim;
pub mod controller;
pub mod desired;
pub mod reconcile;
pub mod served;
mod unchanged;

pub use desired::OperatorIdentity;
