//! Pod annotations a tenant may not set: those that switch off or reconfigure a control the
//! platform runs on every pod (a mesh sidecar and its traffic capture, AppArmor and seccomp
//! profiles), that hold up node maintenance, or that Flotilla keeps for itself. An App that
//! asks for one is refused as a whole: nothing of it is applied, and its status names the
//! annotations. Pure.

/// The prefixes refused unless the operator is given others (`--denied-pod-annotation-prefixes`).
/// Each matches annotation keys that start with it.
pub const DEFAULT_DENIED_PREFIXES: &[&str] = &[
    // Istio: `sidecar.istio.io/inject: "false"` runs the pod outside the mesh (no mTLS, no
    // authorization policy); `traffic.sidecar.istio.io/excludeOutboundIPRanges` and the like
    // let its traffic bypass the sidecar; `proxy.istio.io/config` rewrites the proxy's.
    "sidecar.istio.io/",
    "traffic.sidecar.istio.io/",
    "proxy.istio.io/",
    "status.sidecar.istio.io/",
    "inject.istio.io/",
    "ambient.istio.io/",
    // The pod label `istio.io/dataplane-mode: none` takes a pod out of the ambient mesh;
    // `istio.io/rev` picks another control plane's injection.
    "istio.io/",
    // Linkerd: the same, for its proxy (`linkerd.io/inject: disabled`,
    // `config.linkerd.io/skip-outbound-ports`).
    "linkerd.io/",
    "config.linkerd.io/",
    "config.alpha.linkerd.io/",
    // Per-container AppArmor and legacy seccomp profiles (`unconfined`).
    "container.apparmor.security.beta.kubernetes.io/",
    "seccomp.security.alpha.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
    // Extra or chosen networks and addresses, around NetworkPolicy (Multus, Calico).
    "k8s.v1.cni.cncf.io/",
    "v1.multus-cni.io/",
    "cni.projectcalico.org/",
    // Pods that block node scale-down and drains (`safe-to-evict: "false"`, `do-not-disrupt`).
    "cluster-autoscaler.kubernetes.io/",
    "karpenter.sh/",
    // Flotilla's own.
    "flotilla.dev/",
];

/// Refused whatever the operator is given: the marker of the Deployment cache's projections
/// (`app::projection`). A template that carried it would read as a projection, and every
/// write of the App would be refused.
pub const ALWAYS_DENIED_PREFIXES: &[&str] = &["cache.flotilla.dev/"];

/// The operator's rule for pod annotations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodPolicy {
    denied_prefixes: Vec<String>,
}

impl Default for PodPolicy {
    fn default() -> Self {
        Self::new(DEFAULT_DENIED_PREFIXES.iter().copied())
    }
}

impl PodPolicy {
    /// Refuses annotation keys that start with any of `prefixes` (compared in lower case;
    /// empty ones are ignored, so that an empty list refuses nothing).
    pub fn new<S: AsRef<str>>(prefixes: impl IntoIterator<Item = S>) -> Self {
        let mut denied_prefixes: Vec<String> =
            prefixes.into_iter().map(|p| p.as_ref().trim().to_ascii_lowercase()).filter(|p| !p.is_empty()).collect();
        denied_prefixes.sort();
        denied_prefixes.dedup();
        Self { denied_prefixes }
    }

    pub fn denied_prefixes(&self) -> &[String] {
        &self.denied_prefixes
    }

    /// The keys among `keys` this policy refuses, in order, each once.
    pub fn denied<'a>(&self, keys: impl IntoIterator<Item = &'a String>) -> Vec<String> {
        let mut out: Vec<String> = keys
            .into_iter()
            .filter(|k| {
                let k = k.to_ascii_lowercase();
                self.denied_prefixes.iter().any(|p| k.starts_with(p.as_str()))
                    || ALWAYS_DENIED_PREFIXES.iter().any(|p| k.starts_with(p))
            })
            .cloned()
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Why an App with these denied annotation keys is refused (for status and Events).
    pub fn message(field: &str, denied: &[String]) -> String {
        format!(
            "{field}: {} may not be set by a tenant (the operator refuses annotations starting with a prefix of --denied-pod-annotation-prefixes); remove {} and the App is reconciled again. Nothing of this App's spec was applied.",
            denied.join(", "),
            if denied.len() == 1 { "it" } else { "them" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(k: &[&str]) -> Vec<String> {
        k.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_defaults_refuse_mesh_opt_outs_unconfined_profiles_and_flotillas_own() {
        let p = PodPolicy::default();
        let asked = keys(&[
            "sidecar.istio.io/inject",
            "traffic.sidecar.istio.io/excludeOutboundIPRanges",
            "linkerd.io/inject",
            "config.linkerd.io/skip-outbound-ports",
            "container.apparmor.security.beta.kubernetes.io/app",
            "seccomp.security.alpha.kubernetes.io/pod",
            "container.seccomp.security.alpha.kubernetes.io/app",
            "k8s.v1.cni.cncf.io/networks",
            "cni.projectcalico.org/ipAddrs",
            "inject.istio.io/templates",
            "cluster-autoscaler.kubernetes.io/safe-to-evict",
            "flotilla.dev/version",
            "prometheus.io/scrape",
            "example.com/team",
            "istio.io/rev",
            "istio.io/dataplane-mode",
            "prometheus.istio.io/merge-metrics",
        ]);
        assert_eq!(
            p.denied(&asked),
            keys(&[
                "cluster-autoscaler.kubernetes.io/safe-to-evict",
                "cni.projectcalico.org/ipAddrs",
                "config.linkerd.io/skip-outbound-ports",
                "container.apparmor.security.beta.kubernetes.io/app",
                "container.seccomp.security.alpha.kubernetes.io/app",
                "flotilla.dev/version",
                "inject.istio.io/templates",
                "istio.io/dataplane-mode",
                "istio.io/rev",
                "k8s.v1.cni.cncf.io/networks",
                "linkerd.io/inject",
                "seccomp.security.alpha.kubernetes.io/pod",
                "sidecar.istio.io/inject",
                "traffic.sidecar.istio.io/excludeOutboundIPRanges",
            ])
        );
    }

    #[test]
    fn case_does_not_get_a_key_past_the_list() {
        let p = PodPolicy::default();
        assert_eq!(p.denied(&keys(&["Sidecar.Istio.io/inject"])), keys(&["Sidecar.Istio.io/inject"]));
    }

    #[test]
    fn an_empty_list_refuses_nothing_and_blank_entries_are_ignored() {
        let p = PodPolicy::new(["", "  "]);
        assert!(p.denied_prefixes().is_empty());
        assert!(p.denied(&keys(&["sidecar.istio.io/inject"])).is_empty());
    }

    #[test]
    fn the_cache_marker_is_refused_whatever_the_list() {
        let marker = keys(&[crate::app::projection::ANNOTATION_PROJECTED]);
        assert_eq!(PodPolicy::new([""]).denied(&marker), marker);
        assert_eq!(PodPolicy::default().denied(&keys(&["Cache.Flotilla.dev/Projected"])).len(), 1);
    }

    #[test]
    fn the_message_names_the_field_and_every_key() {
        let m = PodPolicy::message("spec.podAnnotations", &keys(&["a.io/x", "b.io/y"]));
        assert!(m.starts_with("spec.podAnnotations: a.io/x, b.io/y may not be set"), "{m}");
    }
}
