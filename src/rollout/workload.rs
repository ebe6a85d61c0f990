//! The Deployments a plan asks for, in the planner's own terms: which track runs which
//! revision of which template, with how many replicas. `app::desired` renders them into
//! Deployments; the planner never builds one.

use crate::api::names::Track;
use crate::api::template::PodTemplate;

/// What the planner wants of one of the App's Deployments.
#[derive(Clone, Debug, PartialEq)]
pub struct DeploymentShape {
    pub track: Track,
    /// The revision to run: a version, with the template's fingerprint when the App has one.
    pub version: String,
    /// The App-level template of that revision.
    pub template: Option<PodTemplate>,
    /// `None` leaves the count to the autoscaler.
    pub replicas: Option<i32>,
    /// A paused Deployment does not roll its pods (a paused rolling update).
    pub paused: bool,
    /// When the Deployment already runs `version`, its pods stay as they are (their template
    /// and its fingerprint are kept, only the rest follows the spec): during a rollout, and
    /// after a rollback, only the new version changes pods, never the stable one.
    pub keep_running_pods: bool,
}

/// One of the App's Deployments, as the plan wants it.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    /// Rendered from the App's spec in this shape.
    Shape(Box<DeploymentShape>),
    /// Left exactly as observed, nothing written: a canary kept while the stable Deployment
    /// comes back after a rollback, or draining after its pods stopped taking requests.
    AsObserved,
}
