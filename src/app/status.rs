//! Status helpers around the rollout planner: the status shown when the operator itself is
//! blocked, and which analysis runs may go unwritten. Pure: no I/O.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::api::conditions::{DesiredCondition, PROGRESSING, READY, merge_conditions};
use crate::api::{AnalysisStatus, AppPhase, AppStatus};

/// How long a run that decides nothing new may go unwritten: an App in a long analysis (an
/// interval of a second, a step paused until promoted) writes its status at most once per
/// this for its fresh measurements, instead of once per run, each write a whole App sent to
/// every replica's watch.
pub const FRESH_FOR: Duration = Duration::from_secs(30);

/// Whether `after` may go unwritten over `stored`: it differs only by a newer analysis run
/// with the same outcome (the same failures, result as a whole, and check by check), and the
/// stored run is younger than `FRESH_FOR`. A run that fails, changes a result, or comes with
/// any other change of status (a step, a condition, a version) is written.
pub fn run_may_wait(stored: Option<&AppStatus>, after: &AppStatus, now: Timestamp) -> bool {
    let Some(stored) = stored else { return false };
    let (Some(before), Some(run)) = (&stored.analysis, &after.analysis) else { return false };
    let young = before
        .last_run
        .as_ref()
        .is_some_and(|t| now.duration_since(t.0).try_into().is_ok_and(|age: Duration| age < FRESH_FOR));
    young
        && same_outcome(before, run)
        && AppStatus { analysis: None, ..stored.clone() } == AppStatus { analysis: None, ..after.clone() }
}

/// Whether two runs judged alike: failures, result, and each check's name and result.
pub fn same_outcome(a: &AnalysisStatus, b: &AnalysisStatus) -> bool {
    a.failures == b.failures
        && a.last_result == b.last_result
        && a.measurements.len() == b.measurements.len()
        && a.measurements.iter().zip(&b.measurements).all(|(x, y)| x.name == y.name && x.result == y.result)
}

/// A problem that stops the operator from reaching the desired state, shown in status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocker {
    /// CamelCase reason, for example `Forbidden`.
    pub reason: String,
    pub message: String,
}

/// The planned status, overridden because the plan could not be applied: phase Degraded,
/// with the blocker as the reason of both conditions.
pub fn degraded(planned: &AppStatus, previous: &AppStatus, blocker: &Blocker, now: Timestamp) -> AppStatus {
    let conditions = [READY, PROGRESSING].map(|type_| DesiredCondition {
        type_,
        status: false,
        reason: blocker.reason.clone(),
        message: blocker.message.clone(),
    });
    AppStatus {
        phase: Some(AppPhase::Degraded),
        conditions: merge_conditions(&previous.conditions, &conditions, planned.observed_generation, now),
        ..planned.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Measurement, MeasurementResult};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).expect("ts")
    }

    fn run(second: i64, failures: i32, result: MeasurementResult, value: f64) -> AppStatus {
        let m = Measurement {
            name: "error-rate".into(),
            result,
            value: Some(value),
            min: None,
            max: Some(0.05),
            message: None,
        };
        AppStatus {
            target_version: Some("2".into()),
            analysis: Some(AnalysisStatus {
                failures,
                last_run: Some(Time(at(second))),
                last_result: Some(result),
                measurements: vec![m],
            }),
            ..AppStatus::default()
        }
    }

    #[test]
    fn only_a_fresh_run_that_decides_nothing_new_waits() {
        use MeasurementResult::{Fail, Inconclusive, Pass};
        let stored = run(0, 0, Pass, 0.01);
        assert!(run_may_wait(Some(&stored), &run(1, 0, Pass, 0.02), at(1)), "a new value of a passing check waits");
        assert!(run_may_wait(Some(&stored), &run(29, 0, Pass, 0.03), at(29)));
        assert!(
            !run_may_wait(Some(&stored), &run(30, 0, Pass, 0.03), at(30)),
            "written once the stored run is 30 s old"
        );
        assert!(!run_may_wait(Some(&stored), &run(2, 1, Fail, 0.2), at(2)), "a failed run is written");
        assert!(!run_may_wait(Some(&stored), &run(2, 0, Inconclusive, 0.0), at(2)), "a change of result is written");
        let mut stepped = run(2, 0, Pass, 0.02);
        stepped.target_version = Some("3".into());
        assert!(!run_may_wait(Some(&stored), &stepped, at(2)), "any other change is written");
        assert!(!run_may_wait(None, &run(2, 0, Pass, 0.02), at(2)), "nothing stored: written");
        assert!(!run_may_wait(Some(&AppStatus::default()), &run(2, 0, Pass, 0.02), at(2)), "the first run is written");
    }

    #[test]
    fn blocker_degrades_and_keeps_the_rollout_state() {
        let planned = AppStatus {
            current_version: Some("1".into()),
            target_version: Some("2".into()),
            phase: Some(AppPhase::Progressing),
            ..AppStatus::default()
        };
        let b = Blocker { reason: "Forbidden".into(), message: "no rights".into() };
        let s = degraded(&planned, &AppStatus::default(), &b, Timestamp::from_second(1).expect("ts"));
        assert_eq!(s.phase, Some(AppPhase::Degraded));
        assert_eq!(s.current_version.as_deref(), Some("1"));
        assert_eq!(s.target_version.as_deref(), Some("2"));
        assert!(s.conditions.iter().all(|c| c.reason == "Forbidden" && c.status == "False"));
    }
}
