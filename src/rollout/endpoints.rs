//! Which Prometheus an App's analysis may ask, and whether its queries are limited to its
//! namespace there. The platform decides: the operator's `--prometheus-url` (shared by every
//! tenant, so always limited) and the endpoints a Tenant lists in
//! `spec.prometheusEndpoints` (limited unless marked `Dedicated`). An App naming any other
//! address is refused before anything is fetched. Pure: no I/O.

use crate::api::{PrometheusIsolation, TenantPrometheus};

use super::prometheus::shown;

/// Where an App's checks are sent, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The URL as the platform wrote it (never the App's text).
    pub url: String,
    /// Every selector gets `namespace="<the App's namespace>"` (a Prometheus shared by tenants).
    pub scoped: bool,
}

/// Why an App's analysis may not ask the Prometheus it names.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "spec.rollout.analysis.prometheusUrl: {named} is not a Prometheus this App may use (allowed: {allowed}); nothing was fetched. The platform lists endpoints in the Tenant's spec.prometheusEndpoints"
    )]
    NotAllowed { named: String, allowed: String },
    #[error(
        "no Prometheus to ask: the operator has no --prometheus-url and spec.rollout.analysis.prometheusUrl is unset (allowed: {allowed})"
    )]
    NoneConfigured { allowed: String },
}

impl Refusal {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::NotAllowed { .. } => "PrometheusNotAllowed",
            Refusal::NoneConfigured { .. } => "NoPrometheus",
        }
    }
}

/// The URL as written, trimmed and without trailing slashes (what is asked and shown).
fn trimmed(url: &str) -> &str {
    url.trim().trim_end_matches('/')
}

/// A URL's parts as compared: scheme, credentials, host, port, path and query. Parsed, with
/// the scheme and host in lower case, the scheme's default port written out, no trailing
/// slashes or trailing dot, and a Service's `.svc` and `.svc.cluster.local` suffixes dropped
/// (`prometheus.monitoring.svc.cluster.local` is `prometheus.monitoring`). `None` for text
/// that is not a URL. An IP address and a name of it still differ (no DNS is asked).
struct Address {
    scheme: String,
    credentials: String,
    host_port: String,
    rest: String,
}

fn address(url: &str) -> Option<Address> {
    let parsed = url::Url::parse(trimmed(url)).ok()?;
    let host = match parsed.host() {
        Some(url::Host::Domain(d)) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            let labels: Vec<&str> = d.split('.').collect();
            match labels.as_slice() {
                [service, namespace, "svc"] | [service, namespace, "svc", "cluster", "local"] => {
                    format!("{service}.{namespace}")
                }
                _ => d,
            }
        }
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let credentials = match (parsed.username(), parsed.password()) {
        ("", None) => String::new(),
        (user, password) => format!("{user}:{}@", password.unwrap_or_default()),
    };
    Some(Address {
        scheme: parsed.scheme().to_string(),
        credentials,
        host_port: format!("{host}:{}", parsed.port_or_known_default().map(|p| p.to_string()).unwrap_or_default()),
        rest: format!(
            "{}{}",
            parsed.path().trim_end_matches('/'),
            parsed.query().map(|q| format!("?{q}")).unwrap_or_default()
        ),
    })
}

/// The form two URLs are compared in, so that spellings of one address compare equal
/// (`Address`). Credentials, the path and the query stay: another path is another endpoint.
/// Text that is not a URL is compared trimmed.
fn same_address(url: &str) -> String {
    match address(url) {
        Some(a) => format!("{}://{}{}{}", a.scheme, a.credentials, a.host_port, a.rest),
        None => trimmed(url).to_string(),
    }
}

/// Whether `url` is served where `default` is (the same host and port, whatever the scheme,
/// credentials or path): a Tenant's endpoint there is limited like the default, even if
/// listed as dedicated.
fn at_the_default(url: &str, default: Option<&str>) -> bool {
    match (address(url), default.and_then(address)) {
        (Some(a), Some(d)) => a.host_port == d.host_port,
        _ => false,
    }
}

/// The endpoint for an App that names `named` (its `prometheusUrl`), given the operator's
/// default and its Tenant's list (empty without a Tenant).
pub fn choose(named: Option<&str>, default: Option<&str>, tenant: &[TenantPrometheus]) -> Result<Endpoint, Refusal> {
    let default = default.map(trimmed).filter(|d| !d.is_empty());
    let allowed = || {
        let list: Vec<String> = default.iter().map(|d| shown(d)).chain(tenant.iter().map(|t| shown(&t.url))).collect();
        if list.is_empty() { "none".to_string() } else { list.join(", ") }
    };
    let Some(named) = named.map(trimmed) else {
        return default
            .map(|d| Endpoint { url: d.to_string(), scoped: true })
            .ok_or_else(|| Refusal::NoneConfigured { allowed: allowed() });
    };
    let named_address = same_address(named);
    // The operator's default first: it is shared, so it stays limited even if a Tenant also
    // lists it as dedicated, under whatever spelling.
    if let Some(d) = default.filter(|d| same_address(d) == named_address) {
        return Ok(Endpoint { url: d.to_string(), scoped: true });
    }
    // The entry written as named first, then one of the same address. What is asked is
    // always the platform's spelling, never the App's.
    let listed = tenant
        .iter()
        .find(|t| trimmed(&t.url) == named)
        .or_else(|| tenant.iter().find(|t| same_address(&t.url) == named_address));
    match listed {
        Some(t) => Ok(Endpoint {
            url: trimmed(&t.url).to_string(),
            scoped: t.isolation != PrometheusIsolation::Dedicated || at_the_default(&t.url, default),
        }),
        None => Err(Refusal::NotAllowed { named: shown(named), allowed: allowed() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(url: &str, isolation: PrometheusIsolation) -> TenantPrometheus {
        TenantPrometheus { url: url.into(), isolation }
    }

    #[test]
    fn table_of_choices() {
        use PrometheusIsolation::*;
        let default = Some("http://prometheus.monitoring:9090/");
        let tenant = [listed("http://thanos.shop:9090", Shared), listed("http://prometheus.shop:9090/", Dedicated)];
        let ok = |url: &str, scoped| Ok(Endpoint { url: url.into(), scoped });
        type Case<'a> = (&'a str, Option<&'a str>, Option<&'a str>, &'a [TenantPrometheus], Result<Endpoint, &'a str>);
        let cases: [Case; 9] = [
            ("unset: the default, limited", None, default, &tenant, ok("http://prometheus.monitoring:9090", true)),
            (
                "the default by name",
                Some("http://prometheus.monitoring:9090"),
                default,
                &[],
                ok("http://prometheus.monitoring:9090", true),
            ),
            (
                "a shared tenant endpoint",
                Some("http://thanos.shop:9090/"),
                default,
                &tenant,
                ok("http://thanos.shop:9090", true),
            ),
            (
                "a dedicated tenant endpoint",
                Some("http://prometheus.shop:9090"),
                default,
                &tenant,
                ok("http://prometheus.shop:9090", false),
            ),
            ("cloud metadata", Some("http://169.254.169.254/latest"), default, &tenant, Err("PrometheusNotAllowed")),
            ("the apiserver", Some("https://kubernetes.default.svc"), default, &tenant, Err("PrometheusNotAllowed")),
            (
                "another path on an allowed host",
                Some("http://thanos.shop:9090/x"),
                default,
                &tenant,
                Err("PrometheusNotAllowed"),
            ),
            ("credentials added", Some("http://a:b@thanos.shop:9090"), default, &tenant, Err("PrometheusNotAllowed")),
            ("nothing configured", None, None, &[], Err("NoPrometheus")),
        ];
        for (name, named, default, tenant, want) in cases {
            let got = choose(named, default, tenant);
            match (got, want) {
                (Ok(e), Ok(w)) => assert_eq!(e, w, "{name}"),
                (Err(r), Err(reason)) => assert_eq!(r.reason(), reason, "{name}"),
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn the_default_stays_limited_even_when_a_tenant_lists_it_as_dedicated() {
        let tenant = [listed("http://prometheus.monitoring:9090", PrometheusIsolation::Dedicated)];
        let e = choose(Some("http://prometheus.monitoring:9090"), Some("http://prometheus.monitoring:9090"), &tenant);
        assert_eq!(e.map(|e| e.scoped), Ok(true));
    }

    /// A Tenant listing the operator's default as Dedicated under another spelling of it does
    /// not make its queries there unscoped: whichever spelling the App names, what is asked is
    /// the default, limited to the App's namespace.
    #[test]
    fn the_default_stays_limited_under_any_spelling() {
        let default = Some("http://prometheus.monitoring:9090");
        let limited = Ok(Endpoint { url: "http://prometheus.monitoring:9090".into(), scoped: true });
        for spelling in [
            "http://Prometheus.MONITORING:9090",
            "HTTP://prometheus.monitoring:9090/",
            "http://prometheus.monitoring.:9090",
            "http://prometheus.monitoring.svc:9090",
            "http://prometheus.monitoring.svc.cluster.local:9090//",
        ] {
            let tenant = [listed(spelling, PrometheusIsolation::Dedicated)];
            assert_eq!(choose(Some(spelling), default, &tenant), limited, "{spelling}");
            assert_eq!(choose(Some("http://prometheus.monitoring:9090"), default, &tenant), limited, "{spelling}");
        }
        let default = Some("https://prometheus.monitoring");
        let tenant = [listed("https://prometheus.monitoring:443/", PrometheusIsolation::Dedicated)];
        let limited = Ok(Endpoint { url: "https://prometheus.monitoring".into(), scoped: true });
        assert_eq!(choose(Some("https://prometheus.monitoring:443"), default, &tenant), limited, "the default port");
    }

    /// Another port, scheme, path, query or credentials is another endpoint: an App naming it
    /// is refused. A Tenant's dedicated endpoint elsewhere stays dedicated; one served where
    /// the default is (its host and port) is limited like the default.
    #[test]
    fn other_addresses_stay_other() {
        let default = Some("http://prometheus.monitoring:9090");
        let elsewhere = [
            "http://prometheus.monitoring:9091",
            "http://prometheus.other:9090",
            "http://prometheus.monitoring.example.com:9090",
            "http://prometheus.monitoring.svc.elsewhere.example:9090",
            "http://10.0.0.1:9090",
        ];
        let at_the_default = [
            "https://prometheus.monitoring:9090",
            "http://prometheus.monitoring:9090/api",
            "http://prometheus.monitoring:9090?x=1",
            "http://admin:x@prometheus.monitoring:9090",
            "http://x@prometheus.monitoring.svc:9090",
        ];
        for other in elsewhere.iter().chain(&at_the_default) {
            assert_eq!(
                choose(Some(other), default, &[]).map_err(|r| r.reason()),
                Err("PrometheusNotAllowed"),
                "{other}"
            );
        }
        for (urls, scoped) in [(&elsewhere, false), (&at_the_default, true)] {
            for url in urls {
                let tenant = [listed(url, PrometheusIsolation::Dedicated)];
                let e = choose(Some(url), default, &tenant);
                assert_eq!(e, Ok(Endpoint { url: url.to_string(), scoped }), "{url}");
            }
        }
    }

    /// Two entries of one address: the one written as the App names it is used.
    #[test]
    fn the_entry_written_as_named_comes_first() {
        use PrometheusIsolation::*;
        let tenant =
            [listed("http://prometheus.shop.svc:9090", Shared), listed("http://prometheus.shop:9090", Dedicated)];
        let e = choose(Some("http://prometheus.shop:9090"), None, &tenant);
        assert_eq!(e, Ok(Endpoint { url: "http://prometheus.shop:9090".into(), scoped: false }));
        let e = choose(Some("http://PROMETHEUS.shop:9090"), None, &tenant);
        assert_eq!(e.map(|e| e.scoped), Ok(true), "else the first of that address");
    }

    /// An App may name a listed endpoint under another spelling; what is asked is the
    /// platform's spelling.
    #[test]
    fn what_is_asked_is_the_platforms_spelling() {
        let tenant = [listed("http://prometheus.shop:9090/", PrometheusIsolation::Dedicated)];
        let e = choose(Some("http://PROMETHEUS.shop.svc.cluster.local:9090"), None, &tenant);
        assert_eq!(e, Ok(Endpoint { url: "http://prometheus.shop:9090".into(), scoped: false }));
    }

    #[test]
    fn the_refusal_names_the_field_and_shows_no_credentials() {
        let r = choose(Some("http://user:secret@10.0.0.1:8080/"), None, &[]).expect_err("refused");
        let m = r.to_string();
        assert!(m.starts_with("spec.rollout.analysis.prometheusUrl: http://10.0.0.1:8080 is not"), "{m}");
        assert!(!m.contains("secret"), "{m}");
        assert!(m.contains("nothing was fetched"), "{m}");
    }
}
