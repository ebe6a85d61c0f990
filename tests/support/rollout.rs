//! A rollout test rig: a namespace, an exporter whose traffic per version the test sets, a
//! real Prometheus scraping it, and an operator replica pointed at that Prometheus.
#![allow(dead_code)]

use super::prometheus::{Exporter, Prometheus, Traffic};
use super::{Operator, TestNamespace, admin_client, install_crds, kubeconfig, wait_for};
use flotilla::api::{App, AppPhase};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::time::Duration;

/// Longest wait for any one rollout milestone.
pub const MILESTONE: Duration = Duration::from_secs(90);

/// Error ratio of one App version over the last 10 s, from the exporter's series.
pub const ERROR_RATE: &str = r#"sum(rate(http_requests_total{namespace="{{namespace}}",app="{{app}}",version="{{version}}",code="500"}[10s])) / sum(rate(http_requests_total{namespace="{{namespace}}",app="{{app}}",version="{{version}}"}[10s]))"#;

/// p99 latency in milliseconds of one App version over the last 10 s.
pub const P99_MS: &str = r#"histogram_quantile(0.99, sum by (le) (rate(http_request_duration_seconds_bucket{namespace="{{namespace}}",app="{{app}}",version="{{version}}"}[10s]))) * 1000"#;

pub struct Rig {
    pub client: Client,
    pub ns: TestNamespace,
    pub exporter: Exporter,
    pub prometheus: Prometheus,
    pub operator: Operator,
    pub apps: Api<App>,
    pub deployments: Api<Deployment>,
}

impl Rig {
    pub async fn start(prefix: &str) -> Self {
        let client = admin_client().await;
        install_crds(&client).await;
        // The replica serves the conversion webhook, whose certificate lives in the operator's
        // namespace: a rollout test run alone on a new cluster needs it too.
        super::install_operator_rbac();
        let ns = TestNamespace::create(&client, prefix).await;
        let exporter = Exporter::start().await;
        let prometheus = Prometheus::start(&[("exporter", exporter.addr())], &[]).await;
        let operator = Operator::start_with(
            kubeconfig(),
            &["--namespace", &ns.name, "--prometheus-url", &prometheus.url()],
            &format!("e2e-{}", ns.name),
        )
        .await;
        let apps = Api::namespaced(client.clone(), &ns.name);
        let deployments = Api::namespaced(client.clone(), &ns.name);
        Self { client, ns, exporter, prometheus, operator, apps, deployments }
    }

    /// Sets what `version` of `app` serves, as the exporter reports it.
    pub fn traffic(&self, app: &str, version: &str, error_ratio: f64, latency_seconds: f64) {
        self.exporter.set(
            &self.ns.name,
            app,
            version,
            Traffic { requests_per_scrape: 100.0, error_ratio, latency_seconds },
        );
    }

    /// Waits until Prometheus has enough samples of `version` of `app` for the error ratio
    /// over 10 s to have a value.
    pub async fn wait_for_data(&self, app: &str, version: &str) {
        let query =
            ERROR_RATE.replace("{{namespace}}", &self.ns.name).replace("{{app}}", app).replace("{{version}}", version);
        self.prometheus.wait_for_value(&query, Duration::from_secs(30)).await;
    }

    /// Creates an App at version 1 and waits until it is Healthy.
    pub async fn create(&self, name: &str, spec: Value) -> App {
        let mut spec = spec;
        let fields = spec.as_object_mut().expect("spec object");
        fields.entry("image").or_insert(json!(format!("registry.example.com/tests/{name}")));
        fields.entry("version").or_insert(json!("1"));
        let app: App = serde_json::from_value(json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
            "metadata": {"name": name, "namespace": self.ns.name},
            "spec": spec,
        }))
        .expect("valid App");
        self.apps.create(&PostParams::default(), &app).await.expect("creating App");
        self.wait_healthy(name, "1").await
    }

    pub async fn set_version(&self, name: &str, version: &str) {
        self.patch_spec(name, json!({"version": version})).await;
    }

    pub async fn patch_spec(&self, name: &str, spec: Value) {
        self.apps
            .patch(name, &PatchParams::default(), &Patch::Merge(json!({"spec": spec})))
            .await
            .expect("patching App spec");
    }

    pub async fn wait_healthy(&self, name: &str, version: &str) -> App {
        self.wait_until(name, &format!("Healthy at {version}"), |app| {
            let s = app.status.as_ref()?;
            (s.phase == Some(AppPhase::Healthy)
                && s.current_version.as_deref() == Some(version)
                && s.observed_generation == app.metadata.generation)
                .then_some(())
        })
        .await
    }

    pub async fn wait_phase(&self, name: &str, phase: AppPhase) -> App {
        self.wait_until(name, &format!("in phase {phase:?}"), |app| {
            let s = app.status.as_ref()?;
            (s.phase == Some(phase) && s.observed_generation == app.metadata.generation).then_some(())
        })
        .await
    }

    /// Polls App `name` until `check` says yes; returns the App as it was then.
    pub async fn wait_until(&self, name: &str, what: &str, check: impl Fn(&App) -> Option<()>) -> App {
        wait_for(MILESTONE, &format!("App {name}: {what}"), || async {
            let app = self.apps.get(name).await.ok()?;
            check(&app).map(|_| app)
        })
        .await
    }

    pub async fn app(&self, name: &str) -> App {
        self.apps.get(name).await.expect("reading App")
    }

    pub async fn deployment(&self, name: &str) -> Option<Deployment> {
        self.deployments.get_opt(name).await.expect("reading Deployment")
    }

    /// Reasons of the Events recorded for App `name`, oldest first.
    pub async fn event_reasons(&self, name: &str) -> Vec<String> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), &self.ns.name);
        let mut list = events
            .list(&ListParams::default().fields(&format!("regarding.name={name},regarding.kind=App")))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        list.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
        list.into_iter().filter_map(|e| e.reason).collect()
    }

    /// Waits until App `name` has an Event with each of `reasons`.
    pub async fn wait_events(&self, name: &str, reasons: &[&str]) {
        wait_for(Duration::from_secs(15), &format!("Events {reasons:?} on App {name}"), || async {
            let seen = self.event_reasons(name).await;
            reasons.iter().all(|r| seen.iter().any(|s| s == r)).then_some(())
        })
        .await;
    }
}

/// The image of a Deployment's application container.
pub fn image_of(d: &Deployment) -> String {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

/// The message of one of the App's conditions.
pub fn condition(app: &App, type_: &str) -> (String, String, String) {
    app.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        .unwrap_or_default()
}

/// An analysis block checking the error ratio (and optionally p99 latency) every 2 s.
pub fn analysis(metrics: Value) -> Value {
    json!({"interval": "2s", "failureLimit": 2, "metrics": metrics})
}

pub fn error_rate_check() -> Value {
    json!([{"name": "error-rate", "query": ERROR_RATE, "max": 0.05}])
}
