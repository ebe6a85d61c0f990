//! The Prometheus fixture itself: the exporter's counters advance per scrape, and a real
//! Prometheus scraping it computes the error ratio and latency the test set, across a
//! stop and a restart. Needs no cluster.

mod support;

use std::time::Duration;
use support::http_get;
use support::prometheus::{Exporter, Prometheus, Traffic};

const ERROR_RATIO: &str = r#"sum(rate(http_requests_total{app="web",version="2",code=~"5.."}[5s])) / sum(rate(http_requests_total{app="web",version="2"}[5s]))"#;
const P99: &str =
    r#"histogram_quantile(0.99, sum by (le) (rate(http_request_duration_seconds_bucket{app="web",version="2"}[5s])))"#;

/// The value of the one line of `body` that starts with `series` followed by a space.
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn exporter_advances_its_counters_at_every_scrape() {
    let exporter = Exporter::start().await;
    exporter.set("shop", "web", "2", Traffic { error_ratio: 0.25, latency_seconds: 0.3, ..Traffic::default() });
    let labels = r#"namespace="shop",app="web",version="2""#;
    let errors = format!("http_requests_total{{{labels},code=\"500\"}}");
    let ok = format!("http_requests_total{{{labels},code=\"200\"}}");
    let below = format!("http_request_duration_seconds_bucket{{{labels},le=\"0.25\"}}");
    let above = format!("http_request_duration_seconds_bucket{{{labels},le=\"0.5\"}}");
    let count = format!("http_request_duration_seconds_count{{{labels}}}");
    for scrape in 1..=2 {
        let (code, body) = http_get(&exporter.addr(), "/metrics").await.expect("the exporter answers");
        assert_eq!(code, 200);
        let n = f64::from(scrape);
        assert_eq!(sample(&body, &errors), Some(25.0 * n), "{body}");
        assert_eq!(sample(&body, &ok), Some(75.0 * n), "{body}");
        assert_eq!(sample(&body, &below), Some(0.0), "{body}");
        assert_eq!(sample(&body, &above), Some(100.0 * n), "{body}");
        assert_eq!(sample(&body, &count), Some(100.0 * n), "{body}");
    }
    exporter.remove("shop", "web", "2");
    let (_, body) = http_get(&exporter.addr(), "/metrics").await.expect("the exporter answers");
    assert!(!body.contains("shop"), "removed series are gone: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_computes_the_traffic_of_the_exporter_across_a_restart() {
    let exporter = Exporter::start().await;
    exporter.set("shop", "web", "2", Traffic { error_ratio: 0.2, latency_seconds: 0.3, ..Traffic::default() });
    let mut prom = Prometheus::start(&[("apps", exporter.addr())], &[]).await;
    assert_eq!(prom.url(), format!("http://{}", prom.addr()));

    let ratio = prom.wait_for_value(ERROR_RATIO, Duration::from_secs(30)).await;
    assert!((ratio - 0.2).abs() < 0.05, "error ratio {ratio}");
    let p99 = prom.wait_for_value(P99, Duration::from_secs(30)).await;
    assert!((0.25..=0.5).contains(&p99), "p99 latency {p99}");

    let before_stop = prom.wait_for_value(r#"timestamp(up{job="apps"})"#, Duration::from_secs(5)).await;

    prom.stop().await;
    assert!(tokio::net::TcpStream::connect(prom.addr()).await.is_err(), "a stopped Prometheus refuses connections");

    prom.restart().await;
    let ratio = prom.wait_for_value(ERROR_RATIO, Duration::from_secs(30)).await;
    assert!((ratio - 0.2).abs() < 0.05, "error ratio after the restart {ratio}");
    // The samples from before the stop survived it.
    let up = prom.wait_for_value(&format!(r#"up{{job="apps"}} @ {before_stop}"#), Duration::from_secs(5)).await;
    assert_eq!(up, 1.0);
    // And scraping resumed: a new error ratio shows.
    exporter.set("shop", "web", "2", Traffic { error_ratio: 0.5, latency_seconds: 0.3, ..Traffic::default() });
    support::wait_for(Duration::from_secs(30), "the new error ratio", || async {
        let ratio = prom.wait_for_value(ERROR_RATIO, Duration::from_secs(5)).await;
        ((ratio - 0.5).abs() < 0.05).then_some(())
    })
    .await;
}
