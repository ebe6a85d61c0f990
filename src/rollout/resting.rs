//! Prometheus endpoints at rest for a tenant: once a query of a tenant's run to a dedicated
//! Prometheus (the tenant's own) timed out (no connection within the connect timeout, or no
//! whole answer within the query timeout), that tenant does not ask it
//! again for `REST`, and its runs are inconclusive without a turn meanwhile.
//!
//! A tenant whose Prometheus hangs would otherwise hold analysis turns for ten seconds per
//! run, again and again: turns go first to tenants that used them less (`turns`), but other
//! tenants still wait for one of those to come free. Resting keeps a hanging Prometheus from
//! holding turns most of the time, and from being hammered by every interval of every App.
//! Keyed by tenant and endpoint. A shared Prometheus never rests (`measure`): there one
//! tenant's heavy queries can make another's slow, and a rest would lengthen that into 30 s
//! of pause for the other.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// How long a tenant does not ask a Prometheus after one of its queries timed out.
pub const REST: Duration = Duration::from_secs(30);

/// Tenants' endpoints at rest, until when. Clones share them.
#[derive(Clone, Debug)]
pub struct Resting {
    until: Arc<Mutex<HashMap<(String, String), Instant>>>,
    /// `REST` (shorter in tests).
    rest: Duration,
}

impl Default for Resting {
    fn default() -> Self {
        Self::new(REST)
    }
}

impl Resting {
    pub fn new(rest: Duration) -> Self {
        Self { until: Arc::default(), rest }
    }

    /// How long an endpoint rests.
    pub fn duration(&self) -> Duration {
        self.rest
    }

    /// Whether `tenant` does not ask `url` now.
    pub fn rests(&self, tenant: &str, url: &str) -> bool {
        let until = self.until.lock().unwrap_or_else(|p| p.into_inner());
        until.get(&(tenant.to_string(), url.to_string())).is_some_and(|u| *u > Instant::now())
    }

    /// `tenant` does not ask `url` for the rest's duration from now.
    pub fn rest(&self, tenant: &str, url: &str) {
        let now = Instant::now();
        let mut until = self.until.lock().unwrap_or_else(|p| p.into_inner());
        // Rests that are over are forgotten: the map holds only endpoints at rest.
        until.retain(|_, u| *u > now);
        until.insert((tenant.to_string(), url.to_string()), now + self.rest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_endpoint_rests_for_one_tenant_for_a_while() {
        let r = Resting::default();
        r.rest("shop", "http://prometheus:9090");
        assert!(r.rests("shop", "http://prometheus:9090"));
        assert!(!r.rests("bank", "http://prometheus:9090"), "another tenant still asks it");
        assert!(!r.rests("shop", "http://other:9090"), "and the tenant asks its other endpoints");
        tokio::time::sleep(REST).await;
        assert!(!r.rests("shop", "http://prometheus:9090"), "asked again after the rest");
        r.rest("bank", "http://prometheus:9090");
        assert_eq!(r.until.lock().expect("map").len(), 1, "rests that are over are forgotten");
    }
}
