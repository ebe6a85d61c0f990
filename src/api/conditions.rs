//! Helpers for status conditions that keep `lastTransitionTime` stable while nothing changes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Type of the condition that says whether the App serves its desired version with every replica.
pub const READY: &str = "Ready";
/// Type of the condition that says whether a rollout moves (or completed), and why not.
pub const PROGRESSING: &str = "Progressing";

/// Now, truncated to whole seconds as the apiserver stores condition times, so that a
/// status computed now compares equal to the one read back.
pub fn now_to_the_second() -> Timestamp {
    let now = Timestamp::now();
    Timestamp::from_second(now.as_second()).unwrap_or(now)
}

/// A condition as the planner wants it, before a transition time is attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredCondition {
    pub type_: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

/// Builds the new condition list: a condition whose status did not flip keeps its
/// `lastTransitionTime`, so that writing the same state twice writes the same bytes.
pub fn merge_conditions(
    existing: &[Condition],
    desired: &[DesiredCondition],
    observed_generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    desired
        .iter()
        .map(|d| {
            let status = if d.status { "True" } else { "False" }.to_string();
            let last_transition_time = existing
                .iter()
                .find(|c| c.type_ == d.type_ && c.status == status)
                .map(|c| c.last_transition_time.clone())
                .unwrap_or(Time(now));
            Condition {
                type_: d.type_.to_string(),
                status,
                reason: d.reason.clone(),
                message: d.message.clone(),
                observed_generation,
                last_transition_time,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(status: bool, reason: &str) -> DesiredCondition {
        DesiredCondition { type_: "Ready", status, reason: reason.into(), message: String::new() }
    }

    #[test]
    fn unchanged_status_keeps_transition_time() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let first = merge_conditions(&[], &[ready(true, "Available")], Some(1), t0);
        let second = merge_conditions(&first, &[ready(true, "Available")], Some(1), t1);
        assert_eq!(first, second);
    }

    #[test]
    fn flipped_status_takes_new_time() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let first = merge_conditions(&[], &[ready(true, "Available")], Some(1), t0);
        let second = merge_conditions(&first, &[ready(false, "Progressing")], Some(2), t1);
        assert_eq!(second[0].last_transition_time, Time(t1));
        assert_eq!(second[0].status, "False");
    }
}
