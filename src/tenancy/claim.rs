//! Which namespaces a Tenant may claim. Pure: no I/O.
//!
//! - A namespace that does not exist is created by Flotilla, labelled `flotilla.dev/tenant`
//!   with the Tenant's name.
//! - The `flotilla.dev/tenant` label names the owner. A namespace labelled for one Tenant is
//!   never taken by another: ownership does not move once a namespace is onboarded (a cluster
//!   admin may change the label by hand).
//! - A namespace that exists without that label (Flotilla did not create it) is onboarded only
//!   when a cluster admin marked it adoptable: label `flotilla.dev/adoptable` set to `true`
//!   (any Tenant may adopt it) or to one Tenant's name. Adopting labels it for the Tenant.
//! - Protected namespaces are never claimed: the operator's own, the names and prefixes of
//!   `--protected-namespaces` (default `kube-*`, `default`) and namespaces carrying a label of
//!   `--protected-namespace-labels` (default `flotilla.dev/protected`).

use std::collections::BTreeMap;

use crate::api::{NamespaceState, NamespaceStatus};

/// Label on a namespace naming the tenant that owns it.
pub const LABEL_TENANT: &str = "flotilla.dev/tenant";
/// Label a cluster admin sets on an existing namespace so that a Tenant may adopt it: `true`
/// (any Tenant) or the name of the one Tenant that may.
pub const LABEL_ADOPTABLE: &str = "flotilla.dev/adoptable";
/// Names and prefixes (ending in `*`) no Tenant may claim, unless the operator is told otherwise.
pub const DEFAULT_PROTECTED_NAMESPACES: [&str; 2] = ["kube-*", "default"];
/// Labels (`key` or `key=value`) that protect a namespace, unless the operator is told otherwise.
pub const DEFAULT_PROTECTED_LABELS: [&str; 1] = ["flotilla.dev/protected"];

/// Namespaces no Tenant may ever claim (besides the operator's own).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Protection {
    /// Exact names, or prefixes written with a trailing `*`.
    pub names: Vec<String>,
    /// `key` (the label is present, whatever its value) or `key=value`.
    pub labels: Vec<String>,
}

impl Default for Protection {
    fn default() -> Self {
        Self {
            names: DEFAULT_PROTECTED_NAMESPACES.iter().map(|s| s.to_string()).collect(),
            labels: DEFAULT_PROTECTED_LABELS.iter().map(|s| s.to_string()).collect(),
        }
    }
}

impl Protection {
    /// The pattern of `--protected-namespaces` that matches `namespace`, if one does.
    pub fn name_match(&self, namespace: &str) -> Option<&str> {
        self.names
            .iter()
            .find(|p| match p.strip_suffix('*') {
                Some(prefix) => namespace.starts_with(prefix),
                None => p.as_str() == namespace,
            })
            .map(String::as_str)
    }

    /// The label of `--protected-namespace-labels` that `labels` carry, if one is.
    pub fn label_match(&self, labels: &BTreeMap<String, String>) -> Option<&str> {
        self.labels
            .iter()
            .find(|l| match l.split_once('=') {
                Some((key, value)) => labels.get(key).is_some_and(|v| v == value),
                None => labels.contains_key(l.as_str()),
            })
            .map(String::as_str)
    }
}

/// What onboarding may do with one namespace a Tenant lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// It does not exist: create it, labelled for the Tenant.
    Create,
    /// It exists unlabelled and a cluster admin marked it adoptable: label it for the Tenant.
    Adopt,
    /// It is labelled for this Tenant already.
    Owned,
    /// It may not be onboarded; the state and message to report.
    Refused(NamespaceStatus),
}

/// The owner a namespace's labels name (an empty value names nobody).
pub fn labelled_owner(labels: &BTreeMap<String, String>) -> Option<&str> {
    labels.get(LABEL_TENANT).map(String::as_str).filter(|t| !t.is_empty())
}

fn refused(namespace: &str, state: NamespaceState, message: String) -> Decision {
    Decision::Refused(NamespaceStatus { name: namespace.into(), state, message })
}

/// Why `namespace` is protected, if it is: it never belongs to a tenant, and is never touched
/// when a tenant gives it up. `labels` are the namespace's, when it exists.
pub fn protected(
    namespace: &str,
    labels: Option<&BTreeMap<String, String>>,
    operator_namespace: &str,
    protection: &Protection,
) -> Option<String> {
    if namespace == operator_namespace {
        return Some(format!("{namespace} is the operator's own namespace and cannot belong to a tenant"));
    }
    if let Some(pattern) = protection.name_match(namespace) {
        return Some(format!(
            "{namespace} is a protected namespace (it matches {pattern:?} of --protected-namespaces) and cannot belong to a tenant"
        ));
    }
    if let Some(label) = labels.and_then(|l| protection.label_match(l)) {
        return Some(format!(
            "{namespace} is a protected namespace (it is labelled {label}, see --protected-namespace-labels) and cannot belong to a tenant"
        ));
    }
    None
}

/// Whether `tenant` may onboard `namespace`, given the namespace's labels (`None`: it does not
/// exist).
pub fn decide(
    namespace: &str,
    tenant: &str,
    labels: Option<&BTreeMap<String, String>>,
    operator_namespace: &str,
    protection: &Protection,
) -> Decision {
    if let Some(why) = protected(namespace, labels, operator_namespace, protection) {
        return refused(namespace, NamespaceState::Error, why);
    }
    let Some(labels) = labels else {
        return Decision::Create;
    };
    match labelled_owner(labels) {
        Some(owner) if owner == tenant => return Decision::Owned,
        Some(owner) => {
            return refused(
                namespace,
                NamespaceState::Conflict,
                format!(
                    "namespace {namespace} already belongs to tenant {owner} (label {LABEL_TENANT}); a namespace never moves between tenants unless a cluster admin relabels it"
                ),
            );
        }
        None => {}
    }
    match labels.get(LABEL_ADOPTABLE).map(String::as_str) {
        Some("true") => Decision::Adopt,
        Some(only) if only == tenant => Decision::Adopt,
        Some(only) => refused(
            namespace,
            NamespaceState::NotAdoptable,
            format!(
                "namespace {namespace} exists, was not created by Flotilla and may be adopted only by tenant {only} (label {LABEL_ADOPTABLE})"
            ),
        ),
        None => refused(
            namespace,
            NamespaceState::NotAdoptable,
            format!(
                "namespace {namespace} exists and was not created by Flotilla; a cluster admin may let this tenant adopt it with the label {LABEL_ADOPTABLE}={tenant} (or =true for any tenant)"
            ),
        ),
    }
}

/// Whether `tenant`, giving `namespace` up, may remove its access there: not when the namespace
/// is protected, nor when its label names another tenant, nor when it is unlabelled and this
/// tenant never onboarded it (a namespace it was refused: what is there is not its own).
/// `onboarded`: the tenant's status says it onboarded the namespace. `None`: it may; otherwise
/// why not.
pub fn offboard_refusal(
    namespace: &str,
    tenant: &str,
    labels: &BTreeMap<String, String>,
    onboarded: bool,
    operator_namespace: &str,
    protection: &Protection,
) -> Option<String> {
    if let Some(why) = protected(namespace, Some(labels), operator_namespace, protection) {
        return Some(format!("left alone: {why}"));
    }
    match labelled_owner(labels) {
        Some(owner) if owner != tenant => Some(format!("belongs to tenant {owner}; its access was left in place")),
        Some(_) => None,
        None if onboarded => None,
        None => Some(format!("left alone: {namespace} was never onboarded by tenant {tenant}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn kind(d: &Decision) -> String {
        match d {
            Decision::Refused(s) => format!("{:?}", s.state),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn claim_table() {
        let p = Protection::default();
        let none: &[(&str, &str)] = &[];
        type Labels<'a> = Option<&'a [(&'a str, &'a str)]>;
        let cases: [(&str, &str, Labels, &str); 17] = [
            ("missing namespace is created", "shop-dev", None, "Create"),
            ("created for this tenant", "shop-dev", Some(&[(LABEL_TENANT, "shop")]), "Owned"),
            (
                "another tenant's, even when this tenant is older",
                "shop-dev",
                Some(&[(LABEL_TENANT, "blog")]),
                "Conflict",
            ),
            ("foreign namespace", "ingress-nginx", Some(none), "NotAdoptable"),
            ("foreign namespace with other labels", "monitoring", Some(&[("team", "sre")]), "NotAdoptable"),
            ("adoptable by anyone", "legacy", Some(&[(LABEL_ADOPTABLE, "true")]), "Adopt"),
            ("adoptable by this tenant", "legacy", Some(&[(LABEL_ADOPTABLE, "shop")]), "Adopt"),
            ("adoptable by another tenant only", "legacy", Some(&[(LABEL_ADOPTABLE, "blog")]), "NotAdoptable"),
            (
                "adoptable but already owned",
                "legacy",
                Some(&[(LABEL_ADOPTABLE, "true"), (LABEL_TENANT, "blog")]),
                "Conflict",
            ),
            ("empty owner label names nobody", "legacy", Some(&[(LABEL_TENANT, "")]), "NotAdoptable"),
            ("adoptable=false is not adoptable", "legacy", Some(&[(LABEL_ADOPTABLE, "false")]), "NotAdoptable"),
            ("kube- prefix, missing", "kube-flannel", None, "Error"),
            ("kube- prefix, even adoptable", "kube-system", Some(&[(LABEL_ADOPTABLE, "true")]), "Error"),
            ("default, even labelled for the tenant", "default", Some(&[(LABEL_TENANT, "shop")]), "Error"),
            ("operator's own", "flotilla-system", None, "Error"),
            (
                "protected by label",
                "cert-manager",
                Some(&[("flotilla.dev/protected", ""), (LABEL_ADOPTABLE, "true")]),
                "Error",
            ),
            ("kube is not kube-*", "kube", None, "Create"),
        ];
        for (what, ns, l, want) in cases {
            let l = l.map(labels);
            let got = decide(ns, "shop", l.as_ref(), "flotilla-system", &p);
            assert_eq!(kind(&got), want, "{what}: {got:?}");
            if let Decision::Refused(s) = got {
                assert_eq!(s.name, ns);
                assert!(s.message.contains(ns), "{what}: message names the namespace: {}", s.message);
            }
        }
    }

    #[test]
    fn messages_say_what_to_do() {
        let p = Protection::default();
        let Decision::Refused(s) = decide("monitoring", "shop", Some(&labels(&[])), "flotilla-system", &p) else {
            panic!("refused")
        };
        assert!(s.message.contains("flotilla.dev/adoptable=shop"), "{}", s.message);
        let Decision::Refused(s) = decide("x", "shop", Some(&labels(&[(LABEL_TENANT, "blog")])), "op", &p) else {
            panic!("refused")
        };
        assert!(s.message.contains("tenant blog"), "{}", s.message);
    }

    #[test]
    fn configured_protection() {
        let p = Protection { names: vec!["team-*".into(), "shared".into()], labels: vec!["tier=system".into()] };
        let adoptable = labels(&[(LABEL_ADOPTABLE, "true")]);
        assert_eq!(kind(&decide("team-a", "t", None, "op", &p)), "Error");
        assert_eq!(kind(&decide("shared", "t", None, "op", &p)), "Error");
        assert_eq!(kind(&decide("shared-2", "t", None, "op", &p)), "Create");
        assert_eq!(kind(&decide("kube-system", "t", None, "op", &p)), "Create", "only what is configured");
        let system = labels(&[("tier", "system"), (LABEL_ADOPTABLE, "true")]);
        assert_eq!(kind(&decide("x", "t", Some(&system), "op", &p)), "Error");
        let other_tier = labels(&[("tier", "apps"), (LABEL_ADOPTABLE, "true")]);
        assert_eq!(kind(&decide("x", "t", Some(&other_tier), "op", &p)), "Adopt");
        assert_eq!(kind(&decide("x", "t", Some(&adoptable), "op", &p)), "Adopt");
    }

    #[test]
    fn offboarding_table() {
        let p = Protection::default();
        let cases = [
            ("mine", labels(&[(LABEL_TENANT, "shop")]), true, true),
            ("mine, status lost", labels(&[(LABEL_TENANT, "shop")]), false, true),
            ("onboarded, then unlabelled by hand", labels(&[]), true, true),
            ("never onboarded (NotAdoptable)", labels(&[]), false, false),
            ("another tenant's", labels(&[(LABEL_TENANT, "blog")]), true, false),
        ];
        for (what, l, onboarded, allowed) in cases {
            assert_eq!(offboard_refusal("ns", "shop", &l, onboarded, "op", &p).is_none(), allowed, "{what}");
        }
        let mine = labels(&[(LABEL_TENANT, "shop")]);
        assert!(offboard_refusal("kube-system", "shop", &mine, true, "op", &p).is_some());
        assert!(offboard_refusal("op", "shop", &mine, true, "op", &p).is_some());
    }
}
