//! Structured logs through `tracing`, and OTLP trace export when an endpoint is configured.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::{EnvFilter, Layer, layer::SubscriberExt, util::SubscriberInitExt};

/// Keeps the trace exporter alive; dropping it flushes pending spans.
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            let _ = p.shutdown();
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("building the OTLP span exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("installing the tracing subscriber: {0}")]
    Subscriber(#[from] tracing_subscriber::util::TryInitError),
}

/// Installs the global subscriber: human-readable or JSON logs filtered by `RUST_LOG`
/// (default `info`), plus OTLP/HTTP export when `OTEL_EXPORTER_OTLP_ENDPOINT` or
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (the exporter reads the standard variables).
pub fn init(json: bool, service_name: &str) -> Result<TelemetryGuard, TelemetryError> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let otlp_wanted = ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()));
    let provider = if otlp_wanted {
        let exporter = opentelemetry_otlp::SpanExporter::builder().with_http().build()?;
        let resource = opentelemetry_sdk::Resource::builder().with_service_name(service_name.to_string()).build();
        Some(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
    } else {
        None
    };
    // Traces get every reconcile span and, as its children, the API calls (the HTTP spans of
    // kube's client and of the replica's own, `operator::clients`, are at debug level),
    // whatever the log level.
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("flotilla"))
            .with_filter(EnvFilter::new("info,kube_client=debug,flotilla::operator::clients=debug"))
    });
    let registry = tracing_subscriber::registry().with(otel);
    if json {
        registry
            .with(
                tracing_subscriber::fmt::layer().json().flatten_event(true).with_current_span(true).with_filter(filter),
            )
            .try_init()?;
    } else {
        registry.with(tracing_subscriber::fmt::layer().with_filter(filter)).try_init()?;
    }
    Ok(TelemetryGuard { provider })
}
