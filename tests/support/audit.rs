//! The apiserver audit log as evidence of who wrote what, and when: shard Lease writes become
//! ownership intervals, every other write by a replica into a tenant namespace is checked
//! against them. Parsing and checking are pure functions over records, so the checker is
//! itself tested on hand-made records (a clean history and each kind of violation).
//!
//! Times are microseconds since the Unix epoch, as the apiserver stamped them:
//! `received` is `requestReceivedTimestamp`, `completed` is `stageTimestamp` of the
//! ResponseComplete stage.
#![allow(dead_code)]

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// A successful create or update of a shard Lease, as the audit log shows it (the policy
/// logs Leases at Request level, so the holder that was written is known).
#[derive(Clone, Debug, PartialEq)]
pub struct LeaseWrite {
    pub shard: u32,
    /// The replica that sent it (from its User-Agent).
    pub writer: String,
    /// `spec.holderIdentity` written; `None` is a release.
    pub holder: Option<String>,
    pub received: i64,
    pub completed: i64,
    /// `spec.leaseDurationSeconds` written, in microseconds.
    pub duration: i64,
}

/// A write (create, update, patch, delete) by a replica into a namespace.
#[derive(Clone, Debug, PartialEq)]
pub struct NsWrite {
    pub replica: String,
    pub namespace: String,
    pub shard: u32,
    pub verb: String,
    /// `resource` or `resource/subresource`.
    pub resource: String,
    pub name: String,
    pub code: i64,
    pub received: i64,
    pub completed: i64,
}

impl NsWrite {
    /// Whether the apiserver applied it (a refused write, 409 or 412, cannot have won).
    pub fn applied(&self) -> bool {
        (200..300).contains(&self.code)
    }
}

/// One holder's uninterrupted ownership of a shard: from the completion of the write that
/// made it holder until the first of (a) the arrival of the next write naming someone else or
/// no one, (b) its last renewal's arrival plus the lease duration. Both ends are taken in the
/// writer's favour: a namespace write is only blamed when it arrived inside another's interval.
#[derive(Clone, Debug, PartialEq)]
pub struct Interval {
    pub shard: u32,
    pub holder: String,
    pub from: i64,
    pub until: i64,
}

/// Ownership intervals of every shard, from its Lease writes (in any order).
pub fn ownership(leases: &[LeaseWrite]) -> Vec<Interval> {
    let mut by_shard: BTreeMap<u32, Vec<&LeaseWrite>> = BTreeMap::new();
    for l in leases {
        by_shard.entry(l.shard).or_default().push(l);
    }
    let mut out = Vec::new();
    for (shard, mut writes) in by_shard {
        // Compare-and-swap makes the writes of one Lease sequential: the apiserver finished
        // them in this order.
        writes.sort_by_key(|w| (w.completed, w.received));
        // (holder, from, last renewal's arrival, its duration)
        let mut open: Option<(String, i64, i64, i64)> = None;
        for w in writes {
            if let Some((holder, from, last, duration)) = open.take() {
                let renewal = w.holder.as_deref() == Some(holder.as_str()) && w.received < last + duration;
                if renewal {
                    open = Some((holder, from, w.received, w.duration));
                    continue;
                }
                out.push(Interval { shard, holder, from, until: w.received.min(last + duration) });
            }
            if let Some(h) = &w.holder {
                open = Some((h.clone(), w.completed, w.received, w.duration));
            }
        }
        if let Some((holder, from, last, duration)) = open {
            out.push(Interval { shard, holder, from, until: last + duration });
        }
    }
    out
}

/// What a namespace write did wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// It arrived while another replica held the namespace's shard.
    Overlap,
    /// It arrived when its writer held no current Lease on the shard: never acquired,
    /// released, taken over, or last renewed longer ago than the lease duration.
    Stale,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Violation {
    pub kind: Kind,
    pub write: NsWrite,
    /// For an overlap, the replica that held the shard then.
    pub other: Option<String>,
}

/// The checker's findings over one audit log.
#[derive(Debug, Default, PartialEq)]
pub struct Findings {
    /// Namespace writes the apiserver applied, each checked.
    pub writes_checked: usize,
    /// Namespace writes the apiserver refused (conflicts, failed preconditions...).
    pub writes_refused: usize,
    /// Refused writes that would have been violations: stale writers stopped by a precondition
    /// or by the apiserver's shard fence.
    pub stale_refused: usize,
    /// Writes the apiserver refused with 403: in a tenant namespace, where the operator has
    /// the rights, that is the shard fence (rbac/shard-fence.yaml).
    pub forbidden: usize,
    pub lease_writes: usize,
    /// Ownership changes (intervals) over all shards.
    pub intervals: usize,
    /// Applied writes that broke a rule; one write may break both.
    pub violations: Vec<Violation>,
}

impl Findings {
    pub fn count(&self, kind: Kind) -> usize {
        self.violations.iter().filter(|v| v.kind == kind).count()
    }

    /// Writes with at least one violation.
    pub fn violating_writes(&self) -> usize {
        let mut seen: Vec<&NsWrite> = self.violations.iter().map(|v| &v.write).collect();
        seen.dedup();
        seen.len()
    }
}

/// Checks every namespace write against the ownership intervals: an applied write must
/// arrive inside an interval of its own writer and inside no other replica's interval.
pub fn check(leases: &[LeaseWrite], writes: &[NsWrite]) -> Findings {
    let intervals = ownership(leases);
    let mut by_shard: BTreeMap<u32, Vec<&Interval>> = BTreeMap::new();
    for i in &intervals {
        by_shard.entry(i.shard).or_default().push(i);
    }
    let mut f = Findings { lease_writes: leases.len(), intervals: intervals.len(), ..Findings::default() };
    for w in writes {
        let t = w.received;
        let live: Vec<&&Interval> = by_shard
            .get(&w.shard)
            .map(|v| v.iter().filter(|i| i.from <= t && t < i.until).collect())
            .unwrap_or_default();
        let other = live.iter().find(|i| i.holder != w.replica).map(|i| i.holder.clone());
        let own = live.iter().any(|i| i.holder == w.replica);
        let mut found = Vec::new();
        if let Some(other) = other {
            found.push(Violation { kind: Kind::Overlap, write: w.clone(), other: Some(other) });
        }
        if !own {
            found.push(Violation { kind: Kind::Stale, write: w.clone(), other: None });
        }
        if w.applied() {
            f.writes_checked += 1;
            f.violations.extend(found);
        } else {
            f.writes_refused += 1;
            f.stale_refused += usize::from(!found.is_empty());
            f.forbidden += usize::from(w.code == 403);
        }
    }
    f
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AuditError {
    #[error(
        "the audit log {path} is missing or unreadable ({reason}): is the cluster started by hack/cluster.sh, with its audit policy?"
    )]
    Unreadable { path: String, reason: String },
    #[error(
        "the audit log {path} holds no event since the test started: the audit policy of hack/cluster.sh logs the operator's ServiceAccounts"
    )]
    Empty { path: String },
    #[error("no shard Lease write in the audit log since the test started: nothing to take ownership from")]
    NoLeaseWrites,
    #[error("Lease write at line {line} has no requestObject: hack/cluster.sh must log Leases at Request level")]
    LeaseWithoutBody { line: usize },
}

/// What `parse` keeps of an audit log.
#[derive(Debug, Default)]
pub struct Parsed {
    pub events: usize,
    pub leases: Vec<LeaseWrite>,
    pub writes: Vec<NsWrite>,
    /// Writes left out of the check (Events, and the Tenant controller's singleton work).
    pub ignored: BTreeMap<String, usize>,
}

/// Resources the shard fence does not cover: the Tenant controller is a singleton (its own
/// election, unfenced by design), and Events are informational.
pub const UNFENCED: [&str; 8] = [
    "rolebindings",
    "resourcequotas",
    "limitranges",
    "networkpolicies",
    "namespaces",
    "tenants",
    "events",
    "tenants/status",
];

fn micros(v: &Value) -> Option<i64> {
    v.as_str()?.parse::<k8s_openapi::jiff::Timestamp>().ok().map(|t| t.as_microsecond())
}

/// The replica id in a User-Agent `flotilla/<version> (<id>)`.
pub fn replica_of(agent: &str) -> Option<&str> {
    let rest = agent.strip_prefix("flotilla/")?;
    let open = rest.find(" (")?;
    rest[open + 2..].strip_suffix(')')
}

/// Parses audit log lines (JSON, one event each) of events completed at or after `since`.
/// `shard_of` maps a namespace to its shard; `operator_ns` holds the Leases.
pub fn parse(text: &str, since: i64, operator_ns: &str, shard_of: impl Fn(&str) -> u32) -> Result<Parsed, AuditError> {
    let mut p = Parsed::default();
    for (n, line) in text.lines().enumerate() {
        let Ok(e) = serde_json::from_str::<Value>(line) else { continue };
        if e["stage"] != "ResponseComplete" {
            continue;
        }
        let (Some(received), Some(completed)) = (micros(&e["requestReceivedTimestamp"]), micros(&e["stageTimestamp"]))
        else {
            continue;
        };
        if completed < since {
            continue;
        }
        p.events += 1;
        let Some(replica) = e["userAgent"].as_str().and_then(replica_of) else { continue };
        let verb = e["verb"].as_str().unwrap_or_default();
        if !matches!(verb, "create" | "update" | "patch" | "delete" | "deletecollection") {
            continue;
        }
        let object = &e["objectRef"];
        let resource = match object["subresource"].as_str() {
            Some(sub) if !sub.is_empty() => format!("{}/{sub}", object["resource"].as_str().unwrap_or_default()),
            _ => object["resource"].as_str().unwrap_or_default().to_string(),
        };
        let namespace = object["namespace"].as_str().unwrap_or_default();
        let name = object["name"].as_str().unwrap_or_default().to_string();
        let code = e["responseStatus"]["code"].as_i64().unwrap_or(0);
        if resource == "leases" && namespace == operator_ns {
            let Some(shard) = name.strip_prefix("flotilla-shard-").and_then(|s| s.parse().ok()) else { continue };
            if !(200..300).contains(&code) || verb == "delete" {
                continue;
            }
            let spec = &e["requestObject"]["spec"];
            if e["requestObject"].is_null() {
                return Err(AuditError::LeaseWithoutBody { line: n + 1 });
            }
            p.leases.push(LeaseWrite {
                shard,
                writer: replica.to_string(),
                holder: spec["holderIdentity"].as_str().filter(|h| !h.is_empty()).map(str::to_string),
                received,
                completed,
                duration: spec["leaseDurationSeconds"].as_i64().unwrap_or(0) * 1_000_000,
            });
            continue;
        }
        if namespace.is_empty() || namespace == operator_ns || UNFENCED.contains(&resource.as_str()) {
            *p.ignored.entry(resource).or_default() += 1;
            continue;
        }
        p.writes.push(NsWrite {
            replica: replica.to_string(),
            namespace: namespace.to_string(),
            shard: shard_of(namespace),
            verb: verb.to_string(),
            resource,
            name,
            code,
            received,
            completed,
        });
    }
    if p.events == 0 {
        return Err(AuditError::Empty { path: String::new() });
    }
    if p.leases.is_empty() {
        return Err(AuditError::NoLeaseWrites);
    }
    Ok(p)
}

/// The files of the audit log at `path`, oldest first: kube-apiserver rotates it at
/// `--audit-log-maxsize` (100 MiB) into `audit-<timestamp>.log` beside it. Reading only the
/// current file would start the history in the middle: writes just after the rotation would
/// look as if their writer had never renewed its shard (a 500-App chaos run rotated after
/// 15 minutes and reported 9 such writes, all within the first second of the new file).
fn log_files(path: &Path) -> Vec<std::path::PathBuf> {
    let (Some(dir), Some(stem), Some(ext)) = (path.parent(), path.file_stem(), path.extension()) else {
        return vec![path.to_path_buf()];
    };
    let prefix = format!("{}-", stem.to_string_lossy());
    let ext = ext.to_string_lossy();
    let mut rotated: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            name.starts_with(&prefix) && name.ends_with(&format!(".{ext}"))
        })
        .collect();
    rotated.sort(); // the timestamps in the names sort in time order
    rotated.push(path.to_path_buf());
    rotated
}

/// Reads and parses the audit log at `path` (with its rotated files); a missing, unreadable
/// or empty log is an error that says so, never an empty history that would pass every check.
pub fn read(path: &Path, since: i64, operator_ns: &str, shard_of: impl Fn(&str) -> u32) -> Result<Parsed, AuditError> {
    let mut text = String::new();
    for file in log_files(path) {
        let part = std::fs::read_to_string(&file)
            .map_err(|e| AuditError::Unreadable { path: file.display().to_string(), reason: e.to_string() })?;
        text.push_str(&part);
        if !text.ends_with('\n') && !text.is_empty() {
            text.push('\n');
        }
    }
    if text.trim().is_empty() {
        return Err(AuditError::Empty { path: path.display().to_string() });
    }
    parse(&text, since, operator_ns, shard_of).map_err(|e| match e {
        AuditError::Empty { .. } => AuditError::Empty { path: path.display().to_string() },
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;
    const LEASE: i64 = 6 * S;

    fn lease(shard: u32, writer: &str, holder: Option<&str>, at: i64) -> LeaseWrite {
        LeaseWrite {
            shard,
            writer: writer.into(),
            holder: holder.map(str::to_string),
            received: at,
            completed: at + 1_000,
            duration: LEASE,
        }
    }

    fn write(replica: &str, shard: u32, at: i64, code: i64) -> NsWrite {
        NsWrite {
            replica: replica.into(),
            namespace: format!("ns-{shard}"),
            shard,
            verb: "patch".into(),
            resource: "apps/status".into(),
            name: "web".into(),
            code,
            received: at,
            completed: at + 2_000,
        }
    }

    /// a holds shard 0 (renewing every 2 s), releases it at 10 s; b takes it at 11 s.
    fn handover() -> Vec<LeaseWrite> {
        vec![
            lease(0, "a", Some("a"), 0),
            lease(0, "a", Some("a"), 2 * S),
            lease(0, "a", Some("a"), 4 * S),
            lease(0, "a", Some("a"), 6 * S),
            lease(0, "a", None, 10 * S),
            lease(0, "b", Some("b"), 11 * S),
            lease(0, "b", Some("b"), 13 * S),
        ]
    }

    #[test]
    fn rotated_files_are_read_first_in_time_order() {
        let dir = std::env::temp_dir().join(format!("flotilla-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        for name in ["audit-2026-12-01T23-58-19.232.log", "audit-2026-12-01T23-50-00.000.log", "audit.log", "other.log"]
        {
            std::fs::write(dir.join(name), "").expect("file");
        }
        let names: Vec<String> = log_files(&dir.join("audit.log"))
            .iter()
            .map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default())
            .collect();
        assert_eq!(names, ["audit-2026-12-01T23-50-00.000.log", "audit-2026-12-01T23-58-19.232.log", "audit.log"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn intervals_end_at_release_takeover_or_expiry() {
        let i = ownership(&handover());
        assert_eq!(
            i,
            vec![
                Interval { shard: 0, holder: "a".into(), from: 1_000, until: 10 * S },
                Interval { shard: 0, holder: "b".into(), from: 11 * S + 1_000, until: 19 * S },
            ]
        );
        // A holder that stops renewing loses the shard a lease duration after its last
        // renewal, and a late renewal that still succeeds starts a new interval.
        let late = vec![lease(1, "a", Some("a"), 0), lease(1, "a", Some("a"), 9 * S)];
        assert_eq!(
            ownership(&late),
            vec![
                Interval { shard: 1, holder: "a".into(), from: 1_000, until: 6 * S },
                Interval { shard: 1, holder: "a".into(), from: 9 * S + 1_000, until: 15 * S },
            ]
        );
        // Taken over after expiry: the old interval ends at expiry, not at the takeover.
        let taken = vec![lease(2, "a", Some("a"), 0), lease(2, "b", Some("b"), 8 * S)];
        assert_eq!(ownership(&taken)[0].until, 6 * S);
    }

    #[test]
    fn a_clean_history_has_no_violation() {
        let writes = vec![
            write("a", 0, S, 200),
            write("a", 0, 9 * S, 200),
            write("b", 0, 12 * S, 201),
            write("b", 0, 18 * S, 200),
        ];
        let f = check(&handover(), &writes);
        assert_eq!(f.violations, vec![]);
        assert_eq!((f.writes_checked, f.writes_refused, f.lease_writes, f.intervals), (4, 0, 7, 2));
    }

    #[test]
    fn a_write_inside_another_holders_interval_is_an_overlap_and_stale() {
        // a, released at 10 s, writes at 12 s while b holds the shard.
        let f = check(&handover(), &[write("a", 0, 12 * S, 200)]);
        let kinds: Vec<(Kind, Option<String>)> = f.violations.iter().map(|v| (v.kind, v.other.clone())).collect();
        assert_eq!(kinds, vec![(Kind::Overlap, Some("b".into())), (Kind::Stale, None)]);
        assert_eq!(f.violating_writes(), 1);
    }

    #[test]
    fn a_write_after_the_last_renewal_expired_is_stale() {
        // a renews 6.5 s after taking the shard (too late: a new interval from then); a write
        // just past that renewal plus the lease duration is stale, one before it is not.
        let leases = vec![lease(3, "a", Some("a"), 0), lease(3, "a", Some("a"), 6 * S + S / 2)];
        let f = check(&leases, &[write("a", 3, 12 * S + S / 2 + 1, 200), write("a", 3, 12 * S, 200)]);
        assert_eq!(f.violations.len(), 1);
        assert_eq!((f.violations[0].kind, f.violations[0].write.received), (Kind::Stale, 12 * S + S / 2 + 1));
        // a, released at 10 s, writes at 10.5 s before b takes the shard at 11 s.
        let f = check(&handover(), &[write("a", 0, 10 * S + S / 2, 200)]);
        assert_eq!(f.count(Kind::Stale), 1);
        assert_eq!(f.count(Kind::Overlap), 0);
    }

    #[test]
    fn a_write_that_never_held_the_shard_is_stale() {
        let f = check(&handover(), &[write("c", 0, 3 * S, 200), write("a", 7, 3 * S, 200)]);
        assert_eq!(f.count(Kind::Stale), 2);
        assert_eq!(f.count(Kind::Overlap), 1, "c wrote while a held shard 0");
    }

    #[test]
    fn a_refused_write_is_counted_not_blamed() {
        let f = check(&handover(), &[write("a", 0, 12 * S, 409), write("b", 0, 12 * S, 409)]);
        assert_eq!(f.violations, vec![]);
        assert_eq!((f.writes_checked, f.writes_refused, f.stale_refused), (0, 2, 1));
    }

    fn event(agent: &str, verb: &str, uri_object: Value, body: Value, received: &str, code: i64) -> String {
        serde_json::json!({
            "kind": "Event", "stage": "ResponseComplete", "verb": verb, "userAgent": agent,
            "objectRef": uri_object, "responseStatus": {"code": code}, "requestObject": body,
            "requestReceivedTimestamp": received, "stageTimestamp": received,
        })
        .to_string()
    }

    #[test]
    fn parses_lease_writes_and_namespace_writes_from_audit_lines() {
        let lease_ref =
            serde_json::json!({"resource": "leases", "namespace": "flotilla-system", "name": "flotilla-shard-5"});
        let text = [
            event(
                "flotilla/0.1.0 (r-1)",
                "update",
                lease_ref.clone(),
                serde_json::json!({"spec": {"holderIdentity": "r-1", "leaseDurationSeconds": 6}}),
                "2026-12-01T04:00:00.000000Z",
                200,
            ),
            event(
                "flotilla/0.1.0 (r-1)",
                "update",
                lease_ref.clone(),
                serde_json::json!({"spec": {"leaseDurationSeconds": 6}}),
                "2026-12-01T04:00:01.000000Z",
                200,
            ),
            // A lost compare-and-swap does not make anyone holder.
            event(
                "flotilla/0.1.0 (r-2)",
                "update",
                lease_ref,
                serde_json::json!({"spec": {"holderIdentity": "r-2"}}),
                "2026-12-01T04:00:01.500000Z",
                409,
            ),
            event(
                "flotilla/0.1.0 (r-1)",
                "patch",
                serde_json::json!({"resource": "apps", "subresource": "status", "namespace": "t-1", "name": "web"}),
                Value::Null,
                "2026-12-01T04:00:02.000000Z",
                200,
            ),
            event(
                "flotilla/0.1.0 (r-1)",
                "create",
                serde_json::json!({"resource": "events", "namespace": "t-1"}),
                Value::Null,
                "2026-12-01T04:00:02.000000Z",
                201,
            ),
            event(
                "kubectl/v1.36",
                "patch",
                serde_json::json!({"resource": "apps", "namespace": "t-1", "name": "web"}),
                Value::Null,
                "2026-12-01T04:00:02.000000Z",
                200,
            ),
            "not json".to_string(),
        ]
        .join("\n");
        let p = parse(&text, 0, "flotilla-system", |_| 5).expect("parsed");
        assert_eq!(p.leases.len(), 2);
        assert_eq!(p.leases[0].holder.as_deref(), Some("r-1"));
        assert_eq!(p.leases[0].duration, LEASE);
        assert_eq!(p.leases[1].holder, None, "a write without holder is a release");
        assert_eq!(p.writes.len(), 1);
        assert_eq!((p.writes[0].resource.as_str(), p.writes[0].shard), ("apps/status", 5));
        assert_eq!(p.ignored.get("events"), Some(&1));
        // Everything before `since` is left out: here, everything.
        let after = p.leases[0].completed + 10 * S;
        assert!(matches!(parse(&text, after, "flotilla-system", |_| 0), Err(AuditError::Empty { .. })));
    }

    #[test]
    fn a_log_that_cannot_prove_anything_is_an_error() {
        assert!(matches!(
            read(Path::new("/nonexistent/audit.log"), 0, "flotilla-system", |_| 0),
            Err(AuditError::Unreadable { .. })
        ));
        let lease_ref =
            serde_json::json!({"resource": "leases", "namespace": "flotilla-system", "name": "flotilla-shard-0"});
        let metadata_only = event("flotilla/0.1.0 (r)", "update", lease_ref, Value::Null, "2026-12-01T04:00:00Z", 200);
        assert_eq!(
            parse(&metadata_only, 0, "flotilla-system", |_| 0).err(),
            Some(AuditError::LeaseWithoutBody { line: 1 })
        );
        let no_leases = event(
            "flotilla/0.1.0 (r)",
            "patch",
            serde_json::json!({"resource": "apps", "namespace": "t"}),
            Value::Null,
            "2026-12-01T04:00:00Z",
            200,
        );
        assert_eq!(parse(&no_leases, 0, "flotilla-system", |_| 0).err(), Some(AuditError::NoLeaseWrites));
    }

    #[test]
    fn replica_ids_come_from_the_user_agent() {
        assert_eq!(replica_of("flotilla/0.1.0 (chaos-a-3)"), Some("chaos-a-3"));
        assert_eq!(replica_of("flotilla/0.1.0 (pod (x))"), Some("pod (x)"));
        assert_eq!(replica_of("kubectl/v1.36.3 (linux/amd64)"), None);
    }
}
