//! Whether this replica is stuck: its requests to the apiserver go unanswered while its
//! Leases still renew on their own connection. Such a replica would hold its shards forever
//! while doing nothing; once judged stuck it stops renewing (its peers take its shards after
//! the lease duration) and fails `/healthz`, so that the kubelet restarts it.
//!
//! Progress is measured on the path the work takes: a probe (`GET /version`) sent every
//! second through the same client, connection and bound on requests in flight as the
//! replica's controllers. A probe waits behind the requests queued before it, so requests
//! that hang (or a connection that stopped carrying bytes) keep it from being answered; a busy
//! replica whose requests complete gets it answered within seconds. Any answer counts, an
//! error status included: the apiserver was reached.

use kube::Client;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{error, warn};

/// Lease answers further apart than this break the run of answers the judgement counts
/// from: the shard manager is answered every half second when the apiserver is there.
pub const CONTROL_GAP: Duration = Duration::from_secs(10);

/// What the judgement is made from, in milliseconds of this replica's monotonic clock since
/// it started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signals {
    pub now_ms: u64,
    /// When a request on the workload path was last answered.
    pub workload_answered_ms: Option<u64>,
    /// When a Lease request was last answered.
    pub control_answered_ms: Option<u64>,
    /// Since when Lease requests have been answered without a gap longer than `CONTROL_GAP`.
    pub control_since_ms: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Working,
    /// The Leases are not answered either: the apiserver is away for every replica. The
    /// Leases lapse on their own and a restart would not bring it back.
    ApiserverAway,
    /// The workload path has been silent for `silent` while the Leases were answered.
    Stuck {
        silent: Duration,
    },
}

/// Judges one moment: stuck when no request on the workload path has been answered for longer
/// than `limit` of a time during which the Leases were answered without interruption (the
/// silence of the workload path is counted from the start when it was never answered, and at
/// most from when the Leases came back after an outage).
pub fn judge(s: Signals, limit: Duration) -> Verdict {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let workload = s.workload_answered_ms.unwrap_or(0);
    let control_live = s.control_answered_ms.is_some_and(|c| s.now_ms.saturating_sub(c) <= ms(CONTROL_GAP));
    let counted_from = workload.max(s.control_since_ms.unwrap_or(s.now_ms));
    if !control_live {
        return if s.now_ms.saturating_sub(workload) > ms(limit) { Verdict::ApiserverAway } else { Verdict::Working };
    }
    if s.now_ms.saturating_sub(counted_from) > ms(limit) {
        Verdict::Stuck { silent: Duration::from_millis(s.now_ms.saturating_sub(workload)) }
    } else {
        Verdict::Working
    }
}

/// The start of the run of Lease answers after one at `now_ms`, given the previous answer and
/// run start.
pub fn control_run(last_ms: Option<u64>, since_ms: Option<u64>, now_ms: u64) -> u64 {
    let gap = u64::try_from(CONTROL_GAP.as_millis()).unwrap_or(u64::MAX);
    match (last_ms, since_ms) {
        (Some(last), Some(since)) if now_ms.saturating_sub(last) <= gap => since,
        _ => now_ms,
    }
}

#[derive(Debug, Default)]
struct State {
    workload: Option<u64>,
    control: Option<u64>,
    control_since: Option<u64>,
    stuck: Option<Duration>,
}

/// Progress of one replica, fed by the probe and the Lease requests, read by the shard
/// manager, the singleton election and `/healthz`. Once stuck, a replica stays stuck until it
/// is restarted.
#[derive(Clone, Debug)]
pub struct Progress {
    start: Instant,
    state: Arc<Mutex<State>>,
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

impl Progress {
    pub fn new() -> Self {
        Self { start: Instant::now(), state: Arc::default() }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request on the workload path was answered.
    pub fn workload_answered(&self) {
        let now = self.now_ms();
        self.state().workload = Some(now);
    }

    /// A Lease request was answered.
    pub fn control_answered(&self) {
        let now = self.now_ms();
        let mut s = self.state();
        s.control_since = Some(control_run(s.control, s.control_since, now));
        s.control = Some(now);
    }

    /// How long the workload path had been silent when this replica was judged stuck.
    pub fn stuck(&self) -> Option<Duration> {
        self.state().stuck
    }

    /// Judges now, and remembers a Stuck verdict for good.
    pub fn judge(&self, limit: Duration) -> Verdict {
        let now = self.now_ms();
        let mut s = self.state();
        if let Some(silent) = s.stuck {
            return Verdict::Stuck { silent };
        }
        let signals = Signals {
            now_ms: now,
            workload_answered_ms: s.workload,
            control_answered_ms: s.control,
            control_since_ms: s.control_since,
        };
        let verdict = judge(signals, limit);
        if let Verdict::Stuck { silent } = verdict {
            s.stuck = Some(silent);
        }
        verdict
    }
}

/// How often the workload path is probed and the replica judged.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// Probes the workload path through `client` and judges the replica every second until
/// `shutdown`.
pub async fn watch_progress(client: Client, progress: Progress, limit: Duration, mut shutdown: watch::Receiver<bool>) {
    let prober = {
        let progress = progress.clone();
        async move {
            loop {
                match tokio::time::timeout(limit, client.apiserver_version()).await {
                    Ok(Ok(_)) | Ok(Err(kube::Error::Api(_))) => progress.workload_answered(),
                    Ok(Err(e)) => warn!(error = %e, "progress probe failed"),
                    Err(_) => warn!(after = ?limit, "progress probe not answered"),
                }
                tokio::time::sleep(PROBE_EVERY).await;
            }
        }
    };
    let judge = async {
        let mut tick = tokio::time::interval(PROBE_EVERY);
        loop {
            tick.tick().await;
            if let Verdict::Stuck { silent } = progress.judge(limit) {
                error!(
                    silent = ?silent,
                    limit = ?limit,
                    "no request to the apiserver answered while the Leases are: this replica is stuck; \
                     it stops renewing its shards and fails /healthz"
                );
                return;
            }
        }
    };
    let stuck = tokio::select! {
        _ = shutdown.wait_for(|s| *s) => false,
        _ = prober => false,
        _ = judge => true,
    };
    if stuck {
        // A stuck replica stays up (failing /healthz) until the kubelet restarts it.
        let _ = shutdown.wait_for(|s| *s).await.is_ok();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(30);

    #[test]
    fn stuck_only_when_the_work_is_silent_and_the_leases_are_not() {
        let s = |now_ms, workload, control, since| Signals {
            now_ms,
            workload_answered_ms: workload,
            control_answered_ms: control,
            control_since_ms: since,
        };
        let stuck = |ms| Verdict::Stuck { silent: Duration::from_millis(ms) };
        let cases = [
            ("answered just now", s(100_000, Some(99_000), Some(99_500), Some(0)), Verdict::Working),
            ("silent exactly the limit", s(130_000, Some(100_000), Some(129_000), Some(0)), Verdict::Working),
            (
                "silent past the limit, Leases answered",
                s(130_001, Some(100_000), Some(129_000), Some(0)),
                stuck(30_001),
            ),
            ("never answered, judged from the start", s(31_000, None, Some(30_000), Some(500)), stuck(31_000)),
            ("never answered, still starting", s(20_000, None, Some(19_000), Some(500)), Verdict::Working),
            (
                "both silent: the apiserver is away",
                s(200_000, Some(100_000), Some(100_500), Some(0)),
                Verdict::ApiserverAway,
            ),
            ("both silent, within the limit", s(120_000, Some(100_000), Some(100_500), Some(0)), Verdict::Working),
            ("Leases never answered", s(200_000, Some(100_000), None, None), Verdict::ApiserverAway),
            (
                "the apiserver came back 5 s ago after 60 s away: silence counted from then",
                s(165_000, Some(100_000), Some(164_500), Some(160_000)),
                Verdict::Working,
            ),
            (
                "the Leases came back 31 s ago, the work never did",
                s(191_001, Some(100_000), Some(191_000), Some(160_000)),
                stuck(91_001),
            ),
            (
                "Leases answered at the edge of the gap",
                s(200_000, Some(100_000), Some(190_000), Some(0)),
                stuck(100_000),
            ),
        ];
        for (what, signals, want) in cases {
            assert_eq!(judge(signals, LIMIT), want, "{what}");
        }
    }

    #[test]
    fn a_gap_in_lease_answers_starts_a_new_run() {
        assert_eq!(control_run(None, None, 5_000), 5_000, "first answer");
        assert_eq!(control_run(Some(5_000), Some(1_000), 14_000), 1_000, "9 s apart: same run");
        assert_eq!(control_run(Some(5_000), Some(1_000), 15_001), 15_001, "more than 10 s apart: a new run");
    }

    #[test]
    fn a_stuck_verdict_is_kept_until_restart() {
        let p = Progress::new();
        p.control_answered();
        assert_eq!(p.judge(Duration::from_secs(3600)), Verdict::Working, "silent since the start, within the limit");
        std::thread::sleep(Duration::from_millis(5));
        p.control_answered();
        assert!(matches!(p.judge(Duration::from_millis(1)), Verdict::Stuck { .. }));
        p.workload_answered();
        assert!(matches!(p.judge(Duration::from_millis(1)), Verdict::Stuck { .. }), "latched");
        assert!(p.stuck().is_some());
    }
}
