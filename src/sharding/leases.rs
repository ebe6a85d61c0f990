//! Shard and membership Leases, written with compare-and-swap: every update carries the
//! resourceVersion that was read, so of two replicas racing for one Lease exactly one wins
//! (the other gets 409 Conflict). This is client-go's leader-election algorithm per shard.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use std::collections::BTreeMap;

/// Label that tells shard Leases and membership Leases apart from any other Lease.
pub const LABEL_LEASE: &str = "flotilla.dev/lease";

pub fn shard_lease_name(shard: u32) -> String {
    format!("flotilla-shard-{shard}")
}

/// The shard number of a shard Lease's name.
pub fn shard_of_lease(name: &str) -> Option<u32> {
    name.strip_prefix("flotilla-shard-")?.parse().ok()
}

/// Membership Lease of a replica; the replica id is reduced to a valid object name.
pub fn member_lease_name(replica: &str) -> String {
    let clean: String = replica
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '-' })
        .collect();
    let clean = clean.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_string();
    format!("flotilla-member-{}", &clean[..clean.len().min(200)])
}

/// Whether a Lease is a replica's membership Lease (and not a shard Lease).
pub fn is_member(lease: &Lease) -> bool {
    lease.metadata.labels.as_ref().and_then(|m| m.get(LABEL_LEASE)).map(String::as_str) == Some("member")
}

pub fn holder(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref()?.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// Label on membership Leases: the shard count the replica was started with.
pub const LABEL_SHARDS: &str = "flotilla.dev/shards";
/// Label on membership Leases: "true" while the replica's Apps fill its memory budget. Its
/// peers then share the shards it does not hold among themselves (see `plan::fair_share`).
pub const LABEL_FULL: &str = "flotilla.dev/full";

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("{action} Lease {name}: {source}")]
    Api {
        action: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("{action} Lease {name}: no answer within {after:?}")]
    Timeout { action: &'static str, name: String, after: std::time::Duration },
}

impl LeaseError {
    /// Whether the apiserver answered (with an error status): the path to it works.
    pub fn answered(&self) -> bool {
        matches!(self, LeaseError::Api { source: kube::Error::Api(_), .. })
    }
}

/// Reads and writes the operator's Leases in its own namespace.
#[derive(Clone)]
pub struct Leases {
    api: Api<Lease>,
    me: String,
    duration_secs: i32,
    shards: u32,
    /// Every Lease call gives up after this long, so one hung request cannot stall the
    /// manager past its renew deadline.
    call_timeout: std::time::Duration,
    /// Announced on the membership Lease at each heartbeat (`LABEL_FULL`).
    full: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// The stamp of a new acquisition: now, to the microsecond, which is what the apiserver
/// keeps, so that the stamp read back from the Lease is the stamp sent.
pub fn acquisition_stamp() -> MicroTime {
    let now = Timestamp::now();
    MicroTime(Timestamp::from_microsecond(now.as_microsecond()).unwrap_or(now))
}

/// When the holder of `lease` acquired it.
pub fn acquired_at(lease: &Lease) -> Option<&MicroTime> {
    lease.spec.as_ref()?.acquire_time.as_ref()
}

impl Leases {
    pub fn new(client: Client, namespace: &str, me: &str, duration: std::time::Duration, shards: u32) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            me: me.to_string(),
            duration_secs: i32::try_from(duration.as_secs().max(1)).unwrap_or(i32::MAX),
            shards,
            call_timeout: (duration / 3).max(std::time::Duration::from_millis(200)),
            full: Default::default(),
        }
    }

    /// How long any Lease call may take before it is given up.
    pub fn call_timeout(&self) -> std::time::Duration {
        self.call_timeout
    }

    /// Sets what the next heartbeats announce: whether this replica is at its memory budget.
    pub fn announce_full(&self, full: bool) {
        self.full.store(full, std::sync::atomic::Ordering::Relaxed);
    }

    /// The labels this replica's Leases of `kind` carry.
    fn labels(&self, kind: &str) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([
            (LABEL_LEASE.to_string(), kind.to_string()),
            (LABEL_SHARDS.to_string(), self.shards.to_string()),
        ]);
        if kind == "member" {
            let full = self.full.load(std::sync::atomic::Ordering::Relaxed);
            labels.insert(LABEL_FULL.to_string(), full.to_string());
        }
        labels
    }

    async fn bounded<T>(
        &self,
        action: &'static str,
        name: &str,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<Result<T, kube::Error>, LeaseError> {
        tokio::time::timeout(self.call_timeout, call).await.map_err(|_| LeaseError::Timeout {
            action,
            name: name.to_string(),
            after: self.call_timeout,
        })
    }

    /// Every shard and membership Lease, in one request.
    pub async fn list(&self) -> Result<Vec<Lease>, LeaseError> {
        self.bounded("listing", "*", self.api.list(&ListParams::default().labels(LABEL_LEASE)))
            .await?
            .map(|l| l.items)
            .map_err(|source| LeaseError::Api { action: "listing", name: "*".into(), source })
    }

    /// A watch of every shard and membership Lease (see `wake`), on the same connection.
    pub fn watch(
        &self,
    ) -> impl futures::Stream<Item = Result<kube::runtime::watcher::Event<Lease>, kube::runtime::watcher::Error>>
    + Send
    + 'static {
        kube::runtime::watcher(self.api.clone(), kube::runtime::watcher::Config::default().labels(LABEL_LEASE))
    }

    fn fresh(&self, name: &str, kind: &str) -> Lease {
        Lease {
            metadata: ObjectMeta { name: Some(name.into()), labels: Some(self.labels(kind)), ..ObjectMeta::default() },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.me.clone()),
                lease_duration_seconds: Some(self.duration_secs),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        }
    }

    /// Creates the Lease, or replaces the version that was read. `Ok(None)` when another
    /// replica wrote first (409): the caller lost the race and must not act as holder.
    async fn write(
        &self,
        name: &str,
        kind: &str,
        read: Option<&Lease>,
        edit: impl FnOnce(&mut LeaseSpec),
    ) -> Result<Option<Lease>, LeaseError> {
        let result = match read {
            None => {
                let mut lease = self.fresh(name, kind);
                if let Some(spec) = lease.spec.as_mut() {
                    edit(spec);
                }
                self.bounded("creating", name, self.api.create(&PostParams::default(), &lease)).await?
            }
            Some(existing) => {
                let mut lease = existing.clone();
                lease.metadata.managed_fields = None;
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                edit(spec);
                lease.metadata.labels.get_or_insert_with(BTreeMap::new).extend(self.labels(kind));
                // metadata.resourceVersion is kept from the read: the update is a compare-and-swap.
                self.bounded("updating", name, self.api.replace(name, &PostParams::default(), &lease)).await?
            }
        };
        match result {
            Ok(lease) => Ok(Some(lease)),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
            Err(source) => Err(LeaseError::Api { action: "writing", name: name.into(), source }),
        }
    }

    /// Takes a shard Lease that is free or expired (as judged by the caller), stamped as
    /// acquired at `stamp` (`acquisition_stamp`, or the stamp of this process's own
    /// acquisition when it takes its own stale Lease back).
    pub async fn acquire(
        &self,
        shard: u32,
        read: Option<&Lease>,
        stamp: MicroTime,
    ) -> Result<Option<Lease>, LeaseError> {
        let me = self.me.clone();
        let duration = self.duration_secs;
        let taken_from_other = read.and_then(holder).is_some_and(|h| h != me);
        self.write(&shard_lease_name(shard), "shard", read, |spec| {
            spec.holder_identity = Some(me);
            spec.lease_duration_seconds = Some(duration);
            spec.acquire_time = Some(stamp);
            spec.renew_time = Some(now());
            if taken_from_other || read.is_some() {
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
        })
        .await
    }

    /// Renews a Lease this replica holds, from the version it last wrote.
    pub async fn renew(&self, held: &Lease) -> Result<Option<Lease>, LeaseError> {
        let name = held.metadata.name.clone().unwrap_or_default();
        let kind =
            held.metadata.labels.as_ref().and_then(|l| l.get(LABEL_LEASE).cloned()).unwrap_or_else(|| "shard".into());
        self.write(&name, &kind, Some(held), |spec| spec.renew_time = Some(now())).await
    }

    /// Gives a shard Lease back so that a peer can take it at once. When the version held is
    /// stale (a renewal was in flight when the release was decided), the Lease is read again
    /// and released from that version if it is still the one this process acquired (it names
    /// this replica, with the same acquireTime: not a Lease another process took under the
    /// same id meanwhile).
    pub async fn release(&self, held: &Lease) -> Result<(), LeaseError> {
        let name = held.metadata.name.clone().unwrap_or_default();
        let clear = |spec: &mut LeaseSpec| {
            spec.holder_identity = None;
            spec.acquire_time = None;
            spec.renew_time = None;
        };
        if self.write(&name, "shard", Some(held), clear).await?.is_some() {
            return Ok(());
        }
        let current = self
            .bounded("reading", &name, self.api.get_opt(&name))
            .await?
            .map_err(|source| LeaseError::Api { action: "reading", name: name.clone(), source })?;
        match current {
            Some(lease) if holder(&lease) == Some(self.me.as_str()) && acquired_at(&lease) == acquired_at(held) => {
                self.write(&name, "shard", Some(&lease), clear).await.map(|_| ())
            }
            _ => Ok(()),
        }
    }

    /// Creates or renews this replica's membership Lease (no contention: one writer).
    pub async fn heartbeat(&self, last: Option<&Lease>) -> Result<Option<Lease>, LeaseError> {
        let name = member_lease_name(&self.me);
        match self.write(&name, "member", last, |spec| spec.renew_time = Some(now())).await? {
            Some(l) => Ok(Some(l)),
            // Our cached version was stale (for example after a restart with the same id): re-read once.
            None => {
                let current = self
                    .bounded("reading", &name, self.api.get_opt(&name))
                    .await?
                    .map_err(|source| LeaseError::Api { action: "reading", name: name.clone(), source })?;
                self.write(&name, "member", current.as_ref(), |spec| {
                    spec.holder_identity = Some(self.me.clone());
                    spec.renew_time = Some(now());
                })
                .await
            }
        }
    }

    /// Deletes the membership Lease of a replica that stopped renewing it, if it is still the
    /// version that was read (a replica that came back in between keeps its Lease).
    pub async fn forget_member(&self, stale: &Lease) {
        let Some(name) = stale.metadata.name.clone() else { return };
        let params = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                resource_version: stale.metadata.resource_version.clone(),
                uid: stale.metadata.uid.clone(),
            }),
            ..DeleteParams::default()
        };
        let _ = self.bounded("deleting", &name, self.api.delete(&name, &params)).await;
    }

    /// Removes this replica's membership Lease on shutdown.
    pub async fn leave(&self) {
        let name = member_lease_name(&self.me);
        let error = match self.bounded("deleting", &name, self.api.delete(&name, &DeleteParams::default())).await {
            Ok(Ok(_)) => return,
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => return,
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        tracing::warn!(
            lease = name,
            error,
            "could not delete the membership Lease: peers count this replica live until it expires"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_acquisition_stamp_reads_back_as_sent() {
        // What the apiserver keeps is the stamp as serialized: to the microsecond.
        let back = |t: &MicroTime| -> MicroTime {
            serde_json::from_value(serde_json::to_value(t).expect("serialized")).expect("parsed")
        };
        let stamp = acquisition_stamp();
        assert_eq!(back(&stamp), stamp);
        // A stamp to the nanosecond would not: it would never match the Lease read back.
        let fine = MicroTime("2026-12-05T06:00:01.123456789Z".parse().expect("a timestamp"));
        assert_ne!(back(&fine), fine);
    }

    #[test]
    fn names() {
        assert_eq!(shard_lease_name(7), "flotilla-shard-7");
        assert_eq!(shard_of_lease("flotilla-shard-31"), Some(31));
        assert_eq!(shard_of_lease("flotilla-member-x"), None);
        assert_eq!(member_lease_name("Host_1:42"), "flotilla-member-host-1-42");
    }
}
