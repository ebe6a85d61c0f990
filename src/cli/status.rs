//! `flotilla status`: a readable view of one App's rollout. Pure: the App and the time in, text out.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::api::conditions::{PROGRESSING, READY};
use crate::api::rollout::{ANNOTATION_ACTION, ANNOTATION_PAUSED};
use crate::api::{
    AnalysisStatus, App, AppStatus, BlueGreenStage, BlueGreenStatus, CanaryStatus, Measurement, MeasurementResult,
    RolloutProgress, RolloutResult, StrategyType,
};
use crate::app::lenient::{LenientApp, Unreadable};
use crate::rollout::planner::DEFAULT_FAILURE_LIMIT;

/// Finished rollouts shown, newest first.
const HISTORY_SHOWN: usize = 5;
/// Width of the label column.
const LABEL_WIDTH: usize = 13;

/// The text `flotilla status` prints for `app` at time `now`.
pub fn render_status(app: &App, now: Timestamp) -> String {
    let empty = AppStatus::default();
    let status = app.status.as_ref().unwrap_or(&empty);
    let mut out = Text::default();
    out.field("App", &format!("{}/{}", app.namespace().unwrap_or_default(), app.name_any()));
    out.field("Phase", status.phase.map_or("(not reconciled yet)", |p| p.as_str()));
    if let (Some(seen), Some(generation)) = (status.observed_generation, app.metadata.generation)
        && seen < generation
    {
        out.field(
            "Observed",
            &format!("generation {seen} of {generation}: the operator has not acted on the latest change yet"),
        );
    }
    out.field("Version", &version(app, status));
    out.field("Strategy", &strategy(app));
    if let Some(c) = &status.canary {
        out.field("Canary", &canary(c, now));
    }
    if let Some(b) = &status.blue_green {
        out.field("BlueGreen", &blue_green(&app.name_any(), b, now));
    }
    if let Some(t) = &status.traffic_routing {
        out.field("Route", &route(&app.name_any(), t));
    }
    if let Some(r) = &status.rollout {
        out.field("Rollout", &rollout(r, now));
    }
    let progressing = condition(status, PROGRESSING);
    out.field("Ready", &ready(status, progressing));
    if let Some(c) = progressing {
        out.field("Progressing", &format!("{}: {}", c.reason, c.message));
    }
    if paused_by_user(app) {
        out.field("Paused", &format!("by a user ({ANNOTATION_PAUSED}=true); `flotilla resume` lets the rollout go on"));
    }
    if let Some(request) = request(app, status) {
        out.field("Request", &request);
    }
    if let Some(f) = &status.failed_version {
        out.field(
            "Failed",
            &format!(
                "version {} at generation {}, {}: {}; `flotilla retry` tries it again",
                f.version, f.generation, f.reason, f.message
            ),
        );
    }
    if app.spec.analysis().is_some() || status.analysis.is_some() {
        analysis(&mut out, app, status.analysis.as_ref(), now);
    }
    if !status.history.is_empty() {
        out.field("History", "");
        let mut rows = vec![row(["VERSION", "RESULT", "WHEN", "MESSAGE"])];
        rows.extend(status.history.iter().take(HISTORY_SHOWN).map(|h| {
            vec![
                h.version.clone(),
                rollout_result(h.result).into(),
                ago(&h.at, now),
                h.message.clone().unwrap_or_default(),
            ]
        }));
        out.table(&rows);
    }
    out.0
}

/// The text `flotilla status` prints for an App as read: its view, or why it cannot be read.
pub fn render(app: &LenientApp, now: Timestamp) -> String {
    match app.app() {
        Ok(readable) => render_status(readable, now),
        Err(why) => render_unreadable(app, why),
    }
}

/// An App that does not read as one: its name, why, and what its status last said.
pub fn render_unreadable(app: &LenientApp, why: &Unreadable) -> String {
    let mut out = Text::default();
    out.field("App", &format!("{}/{}", app.namespace().unwrap_or_default(), app.name_any()));
    out.field(
        "Invalid",
        &format!(
            "cannot be read as a flotilla.dev/v1beta1 App: {}; the operator does nothing for it until it is changed",
            why.error
        ),
    );
    if let Some(status) = &why.status {
        let phase = status.phase.map_or("(not reconciled yet)", |p| p.as_str());
        out.field("Phase", &format!("{phase} (as last reported)"));
        out.field("Version", status.current_version.as_deref().unwrap_or("(none)"));
        out.field("Ready", &ready(status, condition(status, PROGRESSING)));
    }
    out.0
}

/// Text built line by line.
#[derive(Default)]
struct Text(String);

impl Text {
    fn field(&mut self, label: &str, value: &str) {
        let line = format!("{:<LABEL_WIDTH$}{value}", format!("{label}:"));
        self.0.push_str(line.trim_end());
        self.0.push('\n');
    }

    /// Rows indented by two spaces, every column but the last padded to its widest cell.
    fn table(&mut self, rows: &[Vec<String>]) {
        let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|i| rows.iter().filter_map(|r| r.get(i)).map(|c| c.chars().count()).max().unwrap_or(0))
            .collect();
        for r in rows {
            let mut line = String::new();
            for (i, cell) in r.iter().enumerate() {
                let width = if i + 1 == r.len() { 0 } else { widths[i] };
                line.push_str(&format!("  {cell:<width$}"));
            }
            self.0.push_str(line.trim_end());
            self.0.push('\n');
        }
    }
}

fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

pub(crate) fn condition<'a>(status: &'a AppStatus, type_: &str) -> Option<&'a Condition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

pub(crate) fn paused_by_user(app: &App) -> bool {
    app.annotations().get(ANNOTATION_PAUSED).is_some_and(|v| v.trim() == "true")
}

/// `current → target`, or the one version when no rollout is under way, and what the spec
/// asks for when the operator does not run it.
pub(crate) fn version(app: &App, status: &AppStatus) -> String {
    let current = status.current_version.as_deref();
    let target = status.target_version.as_deref();
    let mut text = match (current, target) {
        (Some(c), Some(t)) if c != t => format!("{c} → {t}"),
        (Some(c), _) => c.to_string(),
        (None, Some(t)) => format!("(none) → {t}"),
        (None, None) => "(none)".to_string(),
    };
    // Versions here are revisions: `1.4.2`, or `1.4.2+<template fingerprint>` with a template.
    let desired = crate::api::template::revision(&app.spec.version, app.spec.template.as_ref());
    // A template that reads ConfigMaps is stamped with their state by the operator
    // (`app::config`), which this command does not read: only the version can be compared.
    let reads_config = app.spec.template.as_ref().is_some_and(|t| !crate::app::config::config_maps_of(t).is_empty());
    let picked_up = match target.or(current) {
        Some(rev) if reads_config => crate::api::template::version_of(rev) == app.spec.version,
        other => other == Some(desired.as_str()),
    };
    if !picked_up {
        let rolled_back = status.failed_version.as_ref().is_some_and(|f| f.version == desired);
        let field = if app.spec.template.is_some() { "spec.version+template" } else { "spec.version" };
        if rolled_back {
            text.push_str(&format!(" ({field} {desired} was rolled back)"));
        } else {
            text.push_str(&format!(" ({field} {desired} not picked up yet)"));
        }
    }
    text
}

pub(crate) fn strategy(app: &App) -> String {
    let strategy = app.spec.strategy();
    let mut text = match strategy.map(|s| s.type_) {
        Some(StrategyType::Canary) => {
            let steps = strategy.and_then(|s| s.canary.as_ref()).map(|c| c.steps.as_slice()).unwrap_or_default();
            let listed: Vec<String> = steps
                .iter()
                .map(|s| match &s.pause {
                    Some(p) if p == crate::api::rollout::PAUSE_UNTIL_PROMOTED => {
                        format!("{}% until promoted", s.weight)
                    }
                    Some(p) => format!("{}% for {p}", s.weight),
                    None => format!("{}%", s.weight),
                })
                .collect();
            match steps.len() {
                0 => "Canary".to_string(),
                1 => format!("Canary, 1 step: {}", listed.join(", ")),
                n => format!("Canary, {n} steps: {}", listed.join(", ")),
            }
        }
        Some(StrategyType::BlueGreen) => {
            let bg = strategy.and_then(|s| s.blue_green.clone()).unwrap_or_default();
            let delay = bg.scale_down_delay.unwrap_or_else(|| "30s".to_string());
            let promotion = if bg.auto_promotion.unwrap_or(true) { "automatic" } else { "by flotilla promote" };
            format!("BlueGreen (switch {promotion}, old version kept {delay} after it)")
        }
        Some(StrategyType::Rolling) | None => {
            let rolling = strategy.and_then(|s| s.rolling.as_ref());
            let bounds: Vec<String> = [
                ("maxSurge", rolling.and_then(|r| r.max_surge.as_ref())),
                ("maxUnavailable", rolling.and_then(|r| r.max_unavailable.as_ref())),
            ]
            .into_iter()
            .filter_map(|(name, v)| v.map(|v| format!("{name} {}", int_or_string(v))))
            .collect();
            if bounds.is_empty() { "Rolling".to_string() } else { format!("Rolling ({})", bounds.join(", ")) }
        }
    };
    if !app.spec.auto_rollback() {
        text.push_str("; autoRollback off");
    }
    text
}

fn int_or_string(v: &IntOrString) -> String {
    match v {
        IntOrString::Int(i) => i.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

/// `2/3 at 50% (canary 2 replicas, stable 2), step began 45s ago`.
pub(crate) fn canary(c: &CanaryStatus, now: Timestamp) -> String {
    let replicas = format!("canary {}, stable {}", plural(c.replicas, "replica"), c.stable_replicas);
    if c.step >= c.steps {
        format!("promoting after {0}/{0} steps at {1}% ({replicas})", c.steps, c.weight)
    } else {
        format!(
            "{}/{} at {}% ({replicas}), step began {}",
            c.step.saturating_add(1),
            c.steps,
            c.weight,
            ago(&c.step_started_at, now)
        )
    }
}

/// `switched: the Service selects the new version (4 replicas), began 12s ago`.
/// A routed canary's HTTPRoute: the split it carries, or why it cannot be used.
pub(crate) fn route(app: &str, t: &crate::api::TrafficRoutingStatus) -> String {
    let canary = crate::api::names::canary_service_name(app);
    match &t.problem {
        Some(why) => format!("HTTPRoute {}: not usable, the rollout waits: {why}", t.http_route),
        None => {
            format!("HTTPRoute {}: {}% to {app}, {}% to {canary}", t.http_route, 100 - t.canary_weight, t.canary_weight)
        }
    }
}

pub(crate) fn blue_green(app: &str, b: &BlueGreenStatus, now: Timestamp) -> String {
    let stage = match b.stage {
        BlueGreenStage::Preview => format!("preview behind {}", crate::api::names::preview_service_name(app)),
        BlueGreenStage::Switched => "switched: the Service selects the new version".to_string(),
        BlueGreenStage::Promoting => "promoting: the stable Deployment moves to the new version".to_string(),
    };
    format!("{stage} ({}), began {}", plural(b.replicas, "replica"), ago(&b.since, now))
}

pub(crate) fn rollout(r: &RolloutProgress, now: Timestamp) -> String {
    let mut text = format!("started {}", ago(&r.started_at, now));
    if r.promoted_by_user {
        text.push_str("; promoted by a user: remaining steps and checks are skipped");
    }
    text
}

/// `ready/replicas`, with why the App is not ready when the Progressing condition does not say it.
pub(crate) fn ready(status: &AppStatus, progressing: Option<&Condition>) -> String {
    let mut text = status.ready.clone().unwrap_or_else(|| "-".to_string());
    if let Some(c) = condition(status, READY)
        && c.status == "False"
        && progressing.is_none_or(|p| p.message != c.message)
    {
        text.push_str(&format!(" ({}: {})", c.reason, c.message));
    }
    text
}

/// The `flotilla.dev/action` request, or the last one handled.
pub(crate) fn request(app: &App, status: &AppStatus) -> Option<String> {
    let asked = app.annotations().get(ANNOTATION_ACTION).map(|a| a.trim()).filter(|a| !a.is_empty());
    let handled = status.handled_action.as_deref();
    match (asked, handled) {
        (Some(a), Some(h)) if a == h => Some(format!("{a}, handled")),
        (Some(a), _) => Some(format!("{a}, not acted on yet")),
        (None, Some(h)) => Some(format!("{h}, handled")),
        (None, None) => None,
    }
}

fn analysis(out: &mut Text, app: &App, status: Option<&AnalysisStatus>, now: Timestamp) {
    let spec = app.spec.analysis();
    let limit = spec.and_then(|a| a.failure_limit).unwrap_or(DEFAULT_FAILURE_LIMIT).max(1);
    let failures = status.map_or(0, |a| a.failures);
    let mut text = format!("failures {failures}/{limit}");
    match (status.and_then(|a| a.last_run.as_ref()), status.and_then(|a| a.last_result)) {
        (Some(at), Some(result)) => {
            text.push_str(&format!(", last run {}: {}", ago(at, now), measurement_result(result)))
        }
        (Some(at), None) => text.push_str(&format!(", last run {}", ago(at, now))),
        (None, _) => text.push_str(", no run yet"),
    }
    if let Some(interval) = spec.and_then(|a| a.interval.as_deref()) {
        text.push_str(&format!(", every {interval}"));
    }
    out.field("Analysis", &text);
    let measurements = status.map(|a| a.measurements.as_slice()).unwrap_or_default();
    if measurements.is_empty() {
        return;
    }
    let mut rows = vec![row(["NAME", "VALUE", "BOUNDS", "RESULT", "MESSAGE"])];
    rows.extend(measurements.iter().map(measurement_row));
    out.table(&rows);
}

fn measurement_row(m: &Measurement) -> Vec<String> {
    vec![
        m.name.clone(),
        m.value.map_or_else(|| "-".to_string(), number),
        bounds(m.min, m.max),
        measurement_result(m.result).to_string(),
        m.message.clone().unwrap_or_default(),
    ]
}

/// `<= 0.05`, `>= 10` or `1..5`.
pub(crate) fn bounds(min: Option<f64>, max: Option<f64>) -> String {
    match (min, max) {
        (Some(lo), Some(hi)) => format!("{}..{}", number(lo), number(hi)),
        (None, Some(hi)) => format!("<= {}", number(hi)),
        (Some(lo), None) => format!(">= {}", number(lo)),
        (None, None) => "-".to_string(),
    }
}

/// A measured value, short: at most four decimals, scientific notation when tiny or huge.
pub(crate) fn number(v: f64) -> String {
    let magnitude = v.abs();
    if v == 0.0 || (1e-3..1e9).contains(&magnitude) {
        let fixed = format!("{v:.4}");
        fixed.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{v:.3e}")
    }
}

pub(crate) fn measurement_result(r: MeasurementResult) -> &'static str {
    match r {
        MeasurementResult::Pass => "Pass",
        MeasurementResult::Fail => "Fail",
        MeasurementResult::Inconclusive => "Inconclusive",
        MeasurementResult::Invalid => "Invalid",
    }
}

pub(crate) fn rollout_result(r: RolloutResult) -> &'static str {
    match r {
        RolloutResult::Promoted => "Promoted",
        RolloutResult::RolledBack => "RolledBack",
        RolloutResult::Reverted => "Reverted",
        RolloutResult::Superseded => "Superseded",
    }
}

/// `3m 10s ago` or `2d 4h ago`: the two largest units, to the second.
pub(crate) fn ago(t: &Time, now: Timestamp) -> String {
    let secs = u64::try_from(now.as_second().saturating_sub(t.0.as_second())).unwrap_or(0);
    let units = [(secs / 86_400, "d"), (secs / 3_600 % 24, "h"), (secs / 60 % 60, "m"), (secs % 60, "s")];
    let first = units.iter().position(|(n, _)| *n > 0).unwrap_or(units.len() - 1);
    let shown: Vec<String> =
        units[first..].iter().take(2).filter(|(n, _)| *n > 0 || secs == 0).map(|(n, u)| format!("{n}{u}")).collect();
    format!("{} ago", shown.join(" "))
}

fn plural(n: i32, word: &str) -> String {
    if n == 1 { format!("{n} {word}") } else { format!("{n} {word}s") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> Timestamp {
        "2025-11-30T07:40:00Z".parse().expect("timestamp")
    }

    fn app(value: serde_json::Value) -> App {
        serde_json::from_value(value).expect("App fixture")
    }

    fn condition(type_: &str, status: &str, reason: &str, message: &str) -> serde_json::Value {
        json!({"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": "2025-11-30T07:00:00Z"})
    }

    fn canary_mid_step() -> App {
        app(json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
            "metadata": {"name": "checkout", "namespace": "shop", "generation": 4,
                         "annotations": {"flotilla.dev/action": "promote 1764488400123"}},
            "spec": {
                "image": "registry.example.com/shop/checkout", "version": "1.5.0", "replicas": 4,
                "rollout": {
                    "strategy": {"type": "Canary", "canary": {"steps": [
                        {"weight": 25, "pause": "1m"}, {"weight": 50, "pause": "2m"}, {"weight": 75}]}},
                    "analysis": {"interval": "30s", "failureLimit": 2, "metrics": [
                        {"name": "error-rate", "query": "q", "max": 0.05},
                        {"name": "rps", "query": "q", "min": 10.0},
                        {"name": "latency-p99", "query": "q", "min": 0.1, "max": 0.5}]}
                }
            },
            "status": {
                "observedGeneration": 4, "currentVersion": "1.4.2", "targetVersion": "1.5.0",
                "phase": "Progressing", "ready": "4/4", "replicas": 4,
                "rollout": {"startedAt": "2025-11-30T07:30:00Z"},
                "canary": {"step": 1, "steps": 3, "weight": 50, "replicas": 2, "stableReplicas": 2,
                           "stepStartedAt": "2025-11-30T07:39:15Z"},
                "analysis": {"failures": 1, "lastRun": "2025-11-30T07:39:48Z", "lastResult": "Fail", "measurements": [
                    {"name": "error-rate", "result": "Fail", "value": 0.071234, "max": 0.05,
                     "message": "0.0712 is above the maximum 0.05"},
                    {"name": "rps", "result": "Pass", "value": 42.5, "min": 10.0},
                    {"name": "latency-p99", "result": "Inconclusive", "min": 0.1, "max": 0.5,
                     "message": "the query returned no data"}]},
                "handledAction": "promote 1764488400123",
                "conditions": [
                    condition("Ready", "False", "CanaryStep", "the canary of 1.5.0 is at step 2 of 3 (50%)"),
                    condition("Progressing", "True", "CanaryStep", "the canary of 1.5.0 is at step 2 of 3 (50%)")],
                "history": [{"version": "1.4.2", "result": "Promoted", "at": "2025-11-29T07:40:00Z",
                             "message": "version 1.4.2 replaced 1.4.1 and is available with 4 replicas"}]
            }
        }))
    }

    fn rolled_back() -> App {
        let history: Vec<serde_json::Value> = (0..7)
            .map(|i| {
                json!({"version": format!("1.{}.0", 5 - i), "result": if i == 0 { "RolledBack" } else { "Promoted" },
                       "at": format!("2025-11-{:02}T07:40:00Z", 29 - i), "message": format!("entry {i}")})
            })
            .collect();
        app(json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
            "metadata": {"name": "checkout", "namespace": "shop", "generation": 3},
            "spec": {"image": "registry.example.com/shop/checkout", "version": "1.5.0", "replicas": 3,
                     "rollout": {"analysis": {"metrics": [{"name": "error-rate", "query": "q", "max": 0.05}]}}},
            "status": {
                "observedGeneration": 3, "currentVersion": "1.4.2", "targetVersion": "1.4.2",
                "phase": "RolledBack", "ready": "3/3",
                "analysis": {"failures": 2, "lastRun": "2025-11-30T07:35:00Z", "lastResult": "Fail", "measurements": [
                    {"name": "error-rate", "result": "Fail", "value": 0.12, "max": 0.05, "message": "0.12 is above the maximum 0.05"}]},
                "failedVersion": {"version": "1.5.0", "generation": 3, "reason": "AnalysisFailed",
                                  "message": "analysis failed: error-rate 0.12 above 0.05"},
                "conditions": [
                    condition("Ready", "False", "AnalysisFailed", "version 1.5.0 was rolled back"),
                    condition("Progressing", "False", "AnalysisFailed", "version 1.5.0 was rolled back")],
                "history": history
            }
        }))
    }

    fn healthy() -> App {
        app(json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
            "metadata": {"name": "web", "namespace": "shop", "generation": 1},
            "spec": {"image": "nginx", "version": "1.27"},
            "status": {
                "observedGeneration": 1, "currentVersion": "1.27", "targetVersion": "1.27", "phase": "Healthy",
                "ready": "1/1", "replicas": 1,
                "conditions": [
                    condition("Ready", "True", "Available", "version 1.27 is available with 1/1 replicas ready"),
                    condition("Progressing", "True", "Available", "version 1.27 is available with 1/1 replicas ready")]
            }
        }))
    }

    fn new_and_paused() -> App {
        app(json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
            "metadata": {"name": "web", "namespace": "shop", "generation": 1,
                         "annotations": {"flotilla.dev/paused": "true", "flotilla.dev/action": "abort 7"}},
            "spec": {"image": "nginx", "version": "1.27", "rollout": {"strategy": {"type": "Rolling", "rolling": {"maxSurge": "25%", "maxUnavailable": 0}},
                     "autoRollback": false}}
        }))
    }

    #[test]
    fn canary_mid_step_in_full() {
        let want = "\
App:         shop/checkout
Phase:       Progressing
Version:     1.4.2 → 1.5.0
Strategy:    Canary, 3 steps: 25% for 1m, 50% for 2m, 75%
Canary:      2/3 at 50% (canary 2 replicas, stable 2), step began 45s ago
Rollout:     started 10m ago
Ready:       4/4
Progressing: CanaryStep: the canary of 1.5.0 is at step 2 of 3 (50%)
Request:     promote 1764488400123, handled
Analysis:    failures 1/2, last run 12s ago: Fail, every 30s
  NAME         VALUE   BOUNDS    RESULT        MESSAGE
  error-rate   0.0712  <= 0.05   Fail          0.0712 is above the maximum 0.05
  rps          42.5    >= 10     Pass
  latency-p99  -       0.1..0.5  Inconclusive  the query returned no data
History:
  VERSION  RESULT    WHEN    MESSAGE
  1.4.2    Promoted  1d ago  version 1.4.2 replaced 1.4.1 and is available with 4 replicas
";
        assert_eq!(render_status(&canary_mid_step(), now()), want);
    }

    #[test]
    fn lines() {
        let cases: [(&str, App, &[&str], &[&str]); 4] = [
            (
                "rolled back",
                rolled_back(),
                &[
                    "Phase:       RolledBack",
                    "Version:     1.4.2 (spec.version 1.5.0 was rolled back)",
                    "Strategy:    Rolling",
                    "Ready:       3/3",
                    "Progressing: AnalysisFailed: version 1.5.0 was rolled back",
                    "Failed:      version 1.5.0 at generation 3, AnalysisFailed: analysis failed: error-rate 0.12 above 0.05; `flotilla retry` tries it again",
                    "Analysis:    failures 2/2, last run 5m ago: Fail",
                    "  error-rate  0.12   <= 0.05  Fail    0.12 is above the maximum 0.05",
                    "  1.5.0    RolledBack  1d ago  entry 0",
                    "  1.1.0    Promoted    5d ago  entry 4",
                ],
                &["Canary:", "Rollout:", "Paused:", "Request:", "1.0.0", "1.-1.0"],
            ),
            (
                "healthy, no rollout",
                healthy(),
                &[
                    "App:         shop/web",
                    "Phase:       Healthy",
                    "Version:     1.27",
                    "Strategy:    Rolling",
                    "Ready:       1/1",
                ],
                &["→", "Canary:", "Rollout:", "Analysis:", "History:", "Failed:", "Paused:", "Request:"],
            ),
            (
                "not reconciled, paused, with a request",
                new_and_paused(),
                &[
                    "Phase:       (not reconciled yet)",
                    "Version:     (none) (spec.version 1.27 not picked up yet)",
                    "Strategy:    Rolling (maxSurge 25%, maxUnavailable 0); autoRollback off",
                    "Ready:       -",
                    "Paused:      by a user (flotilla.dev/paused=true); `flotilla resume` lets the rollout go on",
                    "Request:     abort 7, not acted on yet",
                ],
                &["Progressing:", "Analysis:", "History:"],
            ),
            (
                "status behind the spec",
                {
                    let mut a = healthy();
                    a.metadata.generation = Some(2);
                    a.spec.version = "1.28".into();
                    a
                },
                &[
                    "Observed:    generation 1 of 2: the operator has not acted on the latest change yet",
                    "Version:     1.27 (spec.version 1.28 not picked up yet)",
                ],
                &[],
            ),
        ];
        for (name, app, present, absent) in cases {
            let text = render_status(&app, now());
            for line in present {
                assert!(text.lines().any(|l| l == *line), "{name}: no line {line:?} in\n{text}");
            }
            for fragment in absent {
                assert!(!text.contains(fragment), "{name}: {fragment:?} should not be in\n{text}");
            }
        }
    }

    #[test]
    fn an_unreadable_app_is_shown_with_why() {
        let read = |status: serde_json::Value| -> LenientApp {
            serde_json::from_value(json!({"apiVersion": "flotilla.dev/v1beta1", "kind": "App",
                "metadata": {"name": "web", "namespace": "shop"},
                "spec": {"image": "nginx", "version": "1.27", "template": "x"}, "status": status}))
            .expect("any App reads")
        };
        let text = render(&read(json!({"phase": "Healthy", "currentVersion": "1.26", "ready": "1/1"})), now());
        let want = "\
App:         shop/web
Invalid:     cannot be read as a flotilla.dev/v1beta1 App: spec.template: invalid type: string \"x\", expected struct PodTemplate; the operator does nothing for it until it is changed
Phase:       Healthy (as last reported)
Version:     1.26
Ready:       1/1
";
        assert_eq!(text, want);
        let bare = render(&read(serde_json::Value::Null), now());
        assert_eq!(bare.lines().count(), 2, "no status, no lines of it: {bare}");
        assert_eq!(render(&LenientApp::from(healthy()), now()), render_status(&healthy(), now()));
    }

    #[test]
    fn promoting_canary() {
        let mut a = canary_mid_step();
        if let Some(c) = a.status.as_mut().and_then(|s| s.canary.as_mut()) {
            (c.step, c.weight, c.replicas, c.stable_replicas) = (3, 100, 4, 0);
        }
        let text = render_status(&a, now());
        assert!(
            text.contains("Canary:      promoting after 3/3 steps at 100% (canary 4 replicas, stable 0)\n"),
            "{text}"
        );
    }

    #[test]
    fn a_routed_canary_shows_its_split_or_why_it_waits() {
        let mut a = canary_mid_step();
        let routed = crate::api::TrafficRoutingStatus {
            http_route: "shop".into(),
            canary_weight: 5,
            problem: None,
            retired_at: None,
        };
        a.status.as_mut().expect("status").traffic_routing = Some(routed.clone());
        let text = render_status(&a, now());
        assert!(text.contains("Route:       HTTPRoute shop: 95% to checkout, 5% to checkout-canary\n"), "{text}");
        let missing = crate::api::TrafficRoutingStatus { problem: Some("it does not exist".into()), ..routed };
        a.status.as_mut().expect("status").traffic_routing = Some(missing);
        let text = render_status(&a, now());
        assert!(
            text.contains("Route:       HTTPRoute shop: not usable, the rollout waits: it does not exist\n"),
            "{text}"
        );
    }

    #[test]
    fn ages() {
        for (secs, want) in [
            (0, "0s ago"),
            (45, "45s ago"),
            (600, "10m ago"),
            (610, "10m 10s ago"),
            (86_401, "1d ago"),
            (90_061, "1d 1h ago"),
        ] {
            let then = Time(Timestamp::from_second(now().as_second() - secs).expect("timestamp"));
            assert_eq!(ago(&then, now()), want);
        }
        let future = Time(Timestamp::from_second(now().as_second() + 5).expect("timestamp"));
        assert_eq!(ago(&future, now()), "0s ago", "a clock behind the apiserver's shows no negative age");
    }

    #[test]
    fn numbers_and_bounds() {
        let cases = [
            (bounds(None, Some(0.05)), "<= 0.05"),
            (bounds(Some(10.0), None), ">= 10"),
            (bounds(Some(1.0), Some(5.0)), "1..5"),
            (bounds(None, None), "-"),
            (number(0.0), "0"),
            (number(100.0), "100"),
            (number(0.123456), "0.1235"),
            (number(-2.5), "-2.5"),
            (number(0.00001234), "1.234e-5"),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
        }
    }
}
