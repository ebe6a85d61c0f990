//! The ConfigMaps an App's pods read, and the stamp that makes a change of one a new
//! revision. Pure: the ConfigMaps' state comes in as a lookup.
//!
//! A pod reads a ConfigMap when it starts (env, envFrom) or through a volume. Editing the
//! ConfigMap changes nothing in the Deployment, so without help the new config reaches pods
//! only as they happen to restart, with no canary and no analysis. Flotilla stamps the state
//! of every ConfigMap the template references (a fingerprint of its data, computed as the
//! ConfigMap is read from the watch: `config_map_key`) into the pod template's annotations
//! before planning: a change of a referenced
//! ConfigMap is a change of the template, hence a new revision, and goes through the App's
//! strategy like any other. The stable Deployment keeps the stamp of the config it was
//! started with, so its pods are not restarted until the new revision is promoted.
//!
//! What a rollback cannot do: the ConfigMap is edited in place, so a rolled-back App's
//! stable pods keep the old values only as long as they run (env is read at start; a
//! mounted file follows the ConfigMap within the kubelet's sync period). docs/apps.md says
//! so and shows how to roll a config with a new ConfigMap name instead.
//!
//! Secrets are not tracked: the operator would need list and watch on every Secret of every
//! tenant namespace (RBAC cannot grant metadata only), and a stolen operator token would
//! then read them all.

use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec};
use std::collections::BTreeSet;

use crate::api::fingerprint::hex_fingerprint;

use crate::api::template::{PodTemplate, TemplateMetadata};

/// Pod annotation holding the stamp of the referenced ConfigMaps.
pub const ANNOTATION_CONFIG: &str = "flotilla.dev/config";
/// ConfigMap annotation that leaves it out of the stamp: set to `"false"`, a change of that
/// ConfigMap does not roll the Apps that read it.
pub const ANNOTATION_TRACKING: &str = "flotilla.dev/rollout-on-change";

/// What the stamp needs to know of one ConfigMap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigState {
    /// Not found (an optional reference, or one not created yet).
    Absent,
    /// Present, with the fingerprint of its data (`data_fingerprint`).
    Present(String),
    /// Present, and annotated not to roll the Apps that read it.
    Untracked,
}

fn container_refs(c: &Container, out: &mut BTreeSet<String>) {
    for e in c.env.iter().flatten() {
        if let Some(r) = e.value_from.as_ref().and_then(|v| v.config_map_key_ref.as_ref()) {
            out.insert(r.name.clone());
        }
    }
    for e in c.env_from.iter().flatten() {
        if let Some(r) = &e.config_map_ref {
            out.insert(r.name.clone());
        }
    }
}

fn spec_refs(spec: &PodSpec) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for c in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
        container_refs(c, &mut out);
    }
    for v in spec.volumes.iter().flatten() {
        if let Some(cm) = &v.config_map {
            out.insert(cm.name.clone());
        }
        for source in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(cm) = &source.config_map {
                out.insert(cm.name.clone());
            }
        }
    }
    out.retain(|n| !n.is_empty());
    out
}

/// A fingerprint of what a pod reads from a ConfigMap: its `data` and `binaryData` (maps,
/// so serialized in key order), not its labels or annotations.
pub fn data_fingerprint(config_map: &ConfigMap) -> String {
    hex_fingerprint(&serde_json::to_vec(&(&config_map.data, &config_map.binary_data)).unwrap_or_default())
}

/// The names of the ConfigMaps a template's pods read: env `configMapKeyRef`, `envFrom`
/// `configMapRef` (containers and init containers), `configMap` and projected volumes.
pub fn config_maps_of(template: &PodTemplate) -> BTreeSet<String> {
    template.spec.as_ref().map(spec_refs).unwrap_or_default()
}

/// The stamp of the referenced ConfigMaps' states, or `None` when the template references
/// none (its revision is then what it was before ConfigMaps were tracked).
pub fn stamp(names: &BTreeSet<String>, state: impl Fn(&str) -> ConfigState) -> Option<String> {
    if names.is_empty() {
        return None;
    }
    let text: Vec<String> = names
        .iter()
        .map(|name| match state(name) {
            ConfigState::Absent => format!("{name}=-"),
            ConfigState::Present(version) => format!("{name}={version}"),
            ConfigState::Untracked => format!("{name}=untracked"),
        })
        .collect();
    Some(hex_fingerprint(text.join(",").as_bytes()))
}

/// `template` with the stamp of its ConfigMaps in its pod annotations (replacing any the
/// tenant wrote there), or unchanged when it references none.
pub fn stamped(mut template: PodTemplate, state: impl Fn(&str) -> ConfigState) -> PodTemplate {
    let names = config_maps_of(&template);
    match stamp(&names, state) {
        Some(value) => {
            let metadata = template.metadata.get_or_insert_with(TemplateMetadata::default);
            metadata.annotations.get_or_insert_with(Default::default).insert(ANNOTATION_CONFIG.to_string(), value);
        }
        None => {
            if let Some(a) = template.metadata.as_mut().and_then(|m| m.annotations.as_mut()) {
                a.remove(ANNOTATION_CONFIG);
            }
        }
    }
    template
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template(spec: serde_json::Value) -> PodTemplate {
        serde_json::from_value(json!({"spec": spec})).expect("template")
    }

    fn referencing_all_kinds() -> PodTemplate {
        template(json!({
            "containers": [
                {"name": "app", "env": [
                    {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "env-key", "key": "a"}}},
                    {"name": "B", "value": "plain"},
                    {"name": "C", "valueFrom": {"secretKeyRef": {"name": "a-secret", "key": "c"}}}
                ]},
                {"name": "side", "image": "x", "envFrom": [{"configMapRef": {"name": "env-from"}}, {"secretRef": {"name": "s"}}]}
            ],
            "initContainers": [{"name": "init", "image": "x", "envFrom": [{"configMapRef": {"name": "init-from"}}]}],
            "volumes": [
                {"name": "v1", "configMap": {"name": "mounted"}},
                {"name": "v2", "projected": {"sources": [{"configMap": {"name": "projected"}}, {"secret": {"name": "s2"}}]}},
                {"name": "v3", "emptyDir": {}}
            ]
        }))
    }

    #[test]
    fn every_way_a_pod_reads_a_config_map_is_found_and_secrets_are_not() {
        let names: Vec<String> = config_maps_of(&referencing_all_kinds()).into_iter().collect();
        assert_eq!(names, ["env-from", "env-key", "init-from", "mounted", "projected"]);
        assert!(config_maps_of(&template(json!({"containers": [{"name": "app"}]}))).is_empty());
        assert!(config_maps_of(&PodTemplate::default()).is_empty());
    }

    #[test]
    fn the_stamp_follows_each_config_map_and_nothing_else() {
        let t = referencing_all_kinds();
        let at =
            |v: &'static str| move |name: &str| ConfigState::Present(if name == "mounted" { v } else { "1" }.into());
        let before = stamped(t.clone(), at("10"));
        let again = stamped(t.clone(), at("10"));
        let after = stamped(t.clone(), at("11"));
        let annotation = |t: &PodTemplate| t.metadata.as_ref()?.annotations.as_ref()?.get(ANNOTATION_CONFIG).cloned();
        assert!(annotation(&before).is_some());
        assert_eq!(annotation(&before), annotation(&again), "same states, same stamp");
        assert_ne!(annotation(&before), annotation(&after), "a changed ConfigMap changes the stamp");
        // A ConfigMap created later, or one annotated not to roll, changes it once.
        let absent =
            stamped(
                t.clone(),
                |name: &str| {
                    if name == "mounted" { ConfigState::Absent } else { ConfigState::Present("1".into()) }
                },
            );
        let untracked = |_: &str| ConfigState::Untracked;
        assert_ne!(annotation(&absent), annotation(&before));
        assert_eq!(annotation(&stamped(t.clone(), untracked)), annotation(&stamped(t, untracked)));
    }

    #[test]
    fn the_fingerprint_is_the_data_not_the_metadata() {
        let cm = |data: serde_json::Value, labels: serde_json::Value| -> ConfigMap {
            serde_json::from_value(json!({"metadata": {"name": "c", "labels": labels}, "data": data})).expect("cm")
        };
        let a = data_fingerprint(&cm(json!({"A": "1", "B": "2"}), json!({})));
        assert_eq!(a, data_fingerprint(&cm(json!({"B": "2", "A": "1"}), json!({"team": "x"}))), "order and labels");
        assert_ne!(a, data_fingerprint(&cm(json!({"A": "1", "B": "3"}), json!({}))), "a changed value");
        let binary: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": "c"}, "data": {"A": "1", "B": "2"}, "binaryData": {"K": "AAE="}}),
        )
        .expect("cm");
        assert_ne!(a, data_fingerprint(&binary), "binaryData counts");
    }

    #[test]
    fn the_stamp_is_the_operators_and_absent_without_config_maps() {
        let mut t = template(json!({"containers": [{"name": "app"}]}));
        t.metadata = Some(TemplateMetadata {
            annotations: Some([(ANNOTATION_CONFIG.to_string(), "forged".to_string())].into()),
            ..Default::default()
        });
        let out = stamped(t, |_| ConfigState::Present("1".into()));
        assert_eq!(out.metadata.and_then(|m| m.annotations).and_then(|a| a.get(ANNOTATION_CONFIG).cloned()), None);
        let mut t = referencing_all_kinds();
        t.metadata = Some(TemplateMetadata {
            annotations: Some([(ANNOTATION_CONFIG.to_string(), "forged".to_string())].into()),
            ..Default::default()
        });
        let out = stamped(t, |_| ConfigState::Present("1".into()));
        let value = out.metadata.and_then(|m| m.annotations).and_then(|a| a.get(ANNOTATION_CONFIG).cloned());
        assert_ne!(value.as_deref(), Some("forged"));
    }
}
