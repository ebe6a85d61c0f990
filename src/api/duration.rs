//! Durations written in specs (`30s`, `2m`, `1m30s`, `500ms`).

use std::time::Duration;

/// A duration in a spec that cannot be read. The CRD's schema rejects these already; this
/// covers objects stored before a rule existed.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {text:?} is not a duration such as 30s, 2m or 1m30s: {source}")]
pub struct DurationError {
    pub field: &'static str,
    pub text: String,
    #[source]
    pub source: humantime::DurationError,
}

/// Parses `text` (one or more `<digits><unit>`, unit ms, s, m or h).
pub fn parse(field: &'static str, text: &str) -> Result<Duration, DurationError> {
    humantime::parse_duration(text).map_err(|source| DurationError { field, text: text.to_string(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_durations() {
        let p = |t| parse("f", t).map(|d| d.as_millis()).ok();
        assert_eq!(p("30s"), Some(30_000));
        assert_eq!(p("2m"), Some(120_000));
        assert_eq!(p("1m30s"), Some(90_000));
        assert_eq!(p("500ms"), Some(500));
        assert_eq!(p("1h"), Some(3_600_000));
        assert_eq!(p("soon"), None);
        let err = parse("spec.analysis.interval", "soon").expect_err("invalid");
        assert!(err.to_string().starts_with("spec.analysis.interval: \"soon\""), "{err}");
    }
}
