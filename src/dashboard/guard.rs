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

use http::HeaderMap;
use http::header::{HOST, ORIGIN};

/// Headers on every response.
pub const SECURITY_HEADERS: [(&str, &str); 6] = [
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
];

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("this dashboard answers only to {0}; the request named host {1:?}")]
    Host(String, String),
    #[error("the request came from another site ({0}); actions are taken only from the dashboard's own pages")]
    CrossSite(String),
    #[error("the form's token is missing or stale; reload the page and try again")]
    Token,
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
            let own = origin.strip_prefix("http://").is_some_and(|h| self.allows(h));
            if !own {
                return Err(Refused::CrossSite(format!("Origin: {origin}")));
            }
        }
        match sent {
            Some(s) if equal(s.as_bytes(), token.as_bytes()) => Ok(()),
            _ => Err(Refused::Token),
        }
    }
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
}
