//! What keeps other web pages and other hosts away from a dashboard that acts with the user's
//! credentials. Pure checks of request headers, and the headers every response carries.
//!
//! - DNS rebinding: a page of `evil.example` whose name is made to resolve to 127.0.0.1 would
//!   be same-origin with the dashboard. Every request must name the dashboard itself in `Host`
//!   (the address it listens on, `localhost` or a `--public-host`), else 421.
//! - Cross-site requests: a page elsewhere can post a form to 127.0.0.1 (it cannot read the
//!   answer). Every write carries a token that only pages of the dashboard hold, and a write
//!   whose `Origin` or `Sec-Fetch-Site` says it came from another site is refused.
//! - Framing: a page elsewhere could show the dashboard in a frame and trick a click on
//!   "Abort". Responses forbid framing and inline scripts.
//! - Other users and programs of the machine can reach 127.0.0.1 too. The URL the dashboard
//!   prints carries a secret; opening it sets a cookie (HttpOnly, SameSite=Strict) that every
//!   other request must carry. A cross-site request never carries it, so it costs nothing.
//! - Names in paths reach apiserver URLs: a namespace or name that is not a Kubernetes name
//!   (`web%3Fx=y`, `web%2Fstatus`) is refused before any request.

use http::HeaderMap;
use http::header::{HOST, ORIGIN};

/// Headers on every response.
pub const SECURITY_HEADERS: [(&str, &str); 7] = [
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
         form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    ),
    ("x-frame-options", "DENY"),
    ("x-content-type-options", "nosniff"),
    // Not `no-referrer`: with it, browsers send `Origin: null` on the page's own form posts.
    ("referrer-policy", "same-origin"),
    ("cache-control", "no-store"),
    ("cross-origin-opener-policy", "same-origin"),
    ("cross-origin-resource-policy", "same-origin"),
];

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("this dashboard answers only to {0}; the request named host {1:?}")]
    Host(String, String),
    #[error("the request came from another site ({0}); actions are taken only from the dashboard's own pages")]
    CrossSite(String),
    #[error("the form's token is missing or stale; reload the page and try again")]
    Token,
    #[error("open the URL `flotilla dashboard` printed (it carries the key of this session)")]
    Session,
    #[error("{0} is not a Kubernetes name")]
    Name(String),
}

/// The `Host` values the dashboard answers to.
#[derive(Clone, Debug)]
pub struct Hosts(Vec<String>);

impl Hosts {
    /// `host:port` for the address it listens on, for `localhost`, and for each public host.
    pub fn new(listen: std::net::SocketAddr, public: &[String]) -> Hosts {
        let port = listen.port();
        let mut hosts = vec![format!("localhost:{port}"), format!("127.0.0.1:{port}"), format!("[::1]:{port}")];
        if !listen.ip().is_unspecified() {
            hosts.push(match listen {
                std::net::SocketAddr::V4(a) => format!("{}:{port}", a.ip()),
                std::net::SocketAddr::V6(a) => format!("[{}]:{port}", a.ip()),
            });
        }
        for h in public {
            hosts.push(if h.contains(':') && !h.starts_with('[') { h.clone() } else { format!("{h}:{port}") });
        }
        hosts.sort();
        hosts.dedup();
        Hosts(hosts)
    }

    fn allows(&self, host: &str) -> bool {
        self.0.iter().any(|h| h.eq_ignore_ascii_case(host))
    }

    /// Checks the `Host` of any request.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), Refused> {
        let host = headers.get(HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
        if self.allows(host) { Ok(()) } else { Err(Refused::Host(self.0.join(", "), host.to_string())) }
    }

    /// Checks a write: same-site, and carrying `token`.
    pub fn check_write(&self, headers: &HeaderMap, token: &str, sent: Option<&str>) -> Result<(), Refused> {
        self.check(headers)?;
        if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok())
            && !matches!(site, "same-origin" | "none")
        {
            return Err(Refused::CrossSite(format!("Sec-Fetch-Site: {site}")));
        }
        if let Some(origin) = headers.get(ORIGIN).map(|v| v.to_str().unwrap_or("?")) {
            let own = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                .is_some_and(|h| self.allows(h) || self.allows(&format!("{h}:443")));
            if !own {
                return Err(Refused::CrossSite(format!("Origin: {origin}")));
            }
        }
        match sent {
            Some(s) if equal(s.as_bytes(), token.as_bytes()) => Ok(()),
            _ => Err(Refused::Token),
        }
    }

    /// Refuses what another site's page asks for, other than opening a page by a link:
    /// sub-resources, fetches and forms (the cookie is not sent with them anyway).
    pub fn check_fetch(&self, headers: &HeaderMap, method: &http::Method) -> Result<(), Refused> {
        let site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
        let mode = headers.get("sec-fetch-mode").and_then(|v| v.to_str().ok());
        match site {
            Some("cross-site" | "same-site") if !(method == http::Method::GET && mode == Some("navigate")) => {
                Err(Refused::CrossSite(format!("Sec-Fetch-Site: {}", site.unwrap_or_default())))
            }
            _ => Ok(()),
        }
    }
}

/// The cookie that carries the session key; named after the port, so that dashboards on other
/// ports of the same host (cookies ignore ports) keep their own.
pub fn cookie_name(port: u16) -> String {
    format!("flotilla-dashboard-{port}")
}

/// Whether the `Cookie` headers carry `key` under `name`.
pub fn has_session(headers: &HeaderMap, name: &str, key: &str) -> bool {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .any(|(n, v)| n == name && equal(v.as_bytes(), key.as_bytes()))
}

/// The `Set-Cookie` value that opens a session.
pub fn session_cookie(name: &str, key: &str) -> String {
    format!("{name}={key}; Path=/; HttpOnly; SameSite=Strict")
}

/// Checks that `namespace` is a DNS label and `name` a DNS subdomain, as Kubernetes names
/// of namespaces and custom resources are.
pub fn check_names(namespace: &str, name: &str) -> Result<(), Refused> {
    if !dns_label(namespace) {
        return Err(Refused::Name(format!("namespace {namespace:?}")));
    }
    if name.len() > 253 || name.split('.').any(|part| !dns_label(part)) {
        return Err(Refused::Name(format!("name {name:?}")));
    }
    Ok(())
}

fn dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Whether a key sent equals the session's, compared in constant time.
pub fn same_key(sent: &str, key: &str) -> bool {
    equal(sent.as_bytes(), key.as_bytes())
}

/// Compares in time independent of where the first difference is.
fn equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A token for the forms of this process: 32 random bytes, hex.
pub fn new_token() -> Result<String, ring::error::Unspecified> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new().fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    fn hosts() -> Hosts {
        Hosts::new("127.0.0.1:3100".parse().expect("addr"), &[])
    }

    #[test]
    fn only_its_own_host_names() {
        for ok in ["127.0.0.1:3100", "localhost:3100", "LOCALHOST:3100", "[::1]:3100"] {
            assert_eq!(hosts().check(&headers(&[("host", ok)])), Ok(()), "{ok}");
        }
        // A rebound name, another port, no Host at all.
        for bad in ["evil.example:3100", "127.0.0.1:3101", "127.0.0.1", "localhost"] {
            assert!(matches!(hosts().check(&headers(&[("host", bad)])), Err(Refused::Host(..))), "{bad}");
        }
        assert!(hosts().check(&HeaderMap::new()).is_err());
        let public = Hosts::new("0.0.0.0:3100".parse().expect("addr"), &["dash.example".into()]);
        assert_eq!(public.check(&headers(&[("host", "dash.example:3100")])), Ok(()));
        assert!(public.check(&headers(&[("host", "0.0.0.0:3100")])).is_err());
    }

    #[test]
    fn writes_need_the_token_and_the_same_site() {
        let own = [("host", "127.0.0.1:3100"), ("origin", "http://127.0.0.1:3100"), ("sec-fetch-site", "same-origin")];
        assert_eq!(hosts().check_write(&headers(&own), "abc", Some("abc")), Ok(()));
        assert_eq!(hosts().check_write(&headers(&own), "abc", Some("abd")), Err(Refused::Token));
        assert_eq!(hosts().check_write(&headers(&own), "abc", Some("ab")), Err(Refused::Token));
        assert_eq!(hosts().check_write(&headers(&own), "abc", None), Err(Refused::Token));
        // A form posted by another site's page, with the right token guessed or not.
        let other = [("host", "127.0.0.1:3100"), ("origin", "http://evil.example"), ("sec-fetch-site", "cross-site")];
        assert!(matches!(hosts().check_write(&headers(&other), "abc", Some("abc")), Err(Refused::CrossSite(_))));
        let origin_only = [("host", "127.0.0.1:3100"), ("origin", "null")];
        assert!(matches!(hosts().check_write(&headers(&origin_only), "abc", Some("abc")), Err(Refused::CrossSite(_))));
        // A client that sends neither header (curl) still needs the token.
        assert_eq!(hosts().check_write(&headers(&[("host", "localhost:3100")]), "abc", Some("abc")), Ok(()));
    }

    #[test]
    fn tokens_are_random() {
        let (a, b) = (new_token().expect("token"), new_token().expect("token"));
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
    }

    #[test]
    fn sessions_need_the_key_under_this_port_name() {
        let name = cookie_name(3100);
        let with = |v: &'static str| headers(&[("cookie", v)]);
        assert!(has_session(&with("a=b; flotilla-dashboard-3100=k3y"), &name, "k3y"));
        assert!(!has_session(&with("flotilla-dashboard-3100=k3"), &name, "k3y"));
        assert!(!has_session(&with("flotilla-dashboard-3101=k3y"), &name, "k3y"), "another port's session");
        assert!(!has_session(&HeaderMap::new(), &name, "k3y"));
        assert_eq!(session_cookie(&name, "k"), "flotilla-dashboard-3100=k; Path=/; HttpOnly; SameSite=Strict");
    }

    #[test]
    fn other_sites_may_only_link_to_a_page() {
        let get = http::Method::GET;
        let link = [("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "navigate")];
        assert_eq!(hosts().check_fetch(&headers(&link), &get), Ok(()));
        let fetch = [("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "no-cors")];
        assert!(hosts().check_fetch(&headers(&fetch), &get).is_err());
        assert!(hosts().check_fetch(&headers(&link), &http::Method::POST).is_err());
        assert_eq!(hosts().check_fetch(&headers(&[("sec-fetch-site", "same-origin")]), &get), Ok(()));
        assert_eq!(hosts().check_fetch(&HeaderMap::new(), &get), Ok(()), "curl sends none");
    }

    #[test]
    fn names_in_paths_are_kubernetes_names() {
        assert_eq!(check_names("shop-prod", "web"), Ok(()));
        assert_eq!(check_names("shop", "web.v2"), Ok(()));
        for (ns, name) in [
            ("shop", "web?x=y"),
            ("shop", "web/status"),
            ("shop", "web,other"),
            ("shop", "Web"),
            ("shop", ""),
            ("shop", "-web"),
            ("sh/op", "web"),
            ("shop.x", "web"),
            ("", "web"),
        ] {
            assert!(check_names(ns, name).is_err(), "{ns}/{name}");
        }
        assert!(check_names(&"a".repeat(64), "web").is_err());
        assert!(check_names("shop", &"a".repeat(254)).is_err());
    }

    #[test]
    fn an_https_public_host_may_write() {
        let public = Hosts::new("127.0.0.1:3100".parse().expect("addr"), &["dash.example:443".into()]);
        let h = [("host", "dash.example:443"), ("origin", "https://dash.example")];
        assert_eq!(public.check_write(&headers(&h), "t", Some("t")), Ok(()));
    }
}
