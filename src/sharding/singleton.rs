//! Cluster-wide singleton work (the Tenant controller) on one replica, elected with
//! kube-leader-election's LeaseLock.
//!
//! That crate acquires and renews with merge patches without a resourceVersion precondition
//! and judges expiry by comparing its wall clock with a renewTime written by another
//! machine, so for a moment two replicas can both believe they lead. That is harmless here:
//! the Tenant controller's writes are idempotent server-side applies of the same desired
//! objects, and its deletes tolerate 404. It would not be harmless for shard ownership,
//! where two owners would reconcile one App at once; shards use the compare-and-swap
//! Leases of `leases.rs` instead.

use kube::Client;
use kube_leader_election::{LeaseLock, LeaseLockParams, LeaseLockResult};
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::stuck::Progress;

/// Name of the singleton Lease in the operator's namespace.
pub const SINGLETON_LEASE: &str = "flotilla-singleton";

/// Runs `work` (given a stop signal) while this replica leads; steps down on `shutdown`. A
/// replica judged stuck (`progress`) stops the work and stops renewing, so a peer is elected
/// once the Lease expires.
pub async fn run_singleton<W, F>(
    client: Client,
    namespace: &str,
    me: &str,
    ttl: Duration,
    progress: Progress,
    mut shutdown: watch::Receiver<bool>,
    work: W,
) where
    W: Fn(watch::Receiver<bool>) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let lock = LeaseLock::new(
        client,
        namespace,
        LeaseLockParams { holder_id: me.to_string(), lease_name: SINGLETON_LEASE.to_string(), lease_ttl: ttl },
    );
    let mut running: Option<(watch::Sender<bool>, JoinHandle<()>)> = None;
    let mut last_renewed: Option<std::time::Instant> = None;
    let mut tick = tokio::time::interval(ttl / 3);
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => break,
            _ = tick.tick() => {}
        }
        if progress.stuck().is_some() {
            if let Some(work) = running.take() {
                warn!("stuck: stopping singleton work and no longer renewing its Lease");
                cancel(work).await;
            }
            continue;
        }
        let leading = match tokio::time::timeout(ttl / 3, lock.try_acquire_or_renew()).await {
            Ok(Ok(LeaseLockResult::Acquired(_))) => {
                last_renewed = Some(std::time::Instant::now());
                true
            }
            Ok(Ok(LeaseLockResult::NotAcquired(_))) => false,
            failed => {
                // Keep leading only while our last renewal is younger than two thirds of the
                // TTL: after that a peer may take the Lease.
                let fresh = last_renewed.is_some_and(|t| t.elapsed() < ttl * 2 / 3);
                let reason = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "no answer".to_string(),
                };
                warn!(error = reason, keep_leading = running.is_some() && fresh, "singleton election failed");
                running.is_some() && fresh
            }
        };
        match (leading, running.is_some()) {
            (true, false) => {
                info!("elected for singleton work (Tenant controller)");
                let (stop_tx, stop_rx) = watch::channel(false);
                running = Some((stop_tx, tokio::spawn(work(stop_rx))));
            }
            (false, true) => {
                info!("no longer elected; stopping singleton work");
                if let Some(work) = running.take() {
                    cancel(work).await;
                }
            }
            _ => {}
        }
    }
    if let Some(work) = running.take() {
        cancel(work).await;
        if let Err(e) = lock.step_down().await {
            warn!(error = %e, "could not step down from the singleton Lease");
        }
    }
}

/// Stops singleton work at once: its in-flight reconciles are cancelled, not awaited. Another
/// replica may lead as soon as this one stops renewing, and a reconcile waiting on a slow
/// apiserver (up to --request-timeout) would go on writing beside it, or hold up a shutdown.
async fn cancel((stop, task): (watch::Sender<bool>, JoinHandle<()>)) {
    let _ = stop.send(true);
    task.abort();
    let _ = task.await;
}
