//! A canary's Gateway API HTTPRoute (`spec.rollout.strategy.canary.trafficRouting`): whether
//! it sends the App's requests to the App's two Services, and the JSON patch that sets only
//! their two weights.
//!
//! The route is the tenant's: Flotilla never creates, deletes or rewrites it. Its `rules` and
//! each rule's `backendRefs` are atomic lists in the Gateway API schema, so a server-side
//! apply of two weights would take ownership of (and overwrite) every rule; a JSON patch
//! instead sets the two weights at their paths, and carries the resourceVersion that was
//! read: any edit between the read and the patch makes it fail with a conflict (409), and
//! the next look starts over from the route as it is then.

use kube::api::{Api, ApiResource, Patch, PatchParams};
use serde_json::{Value, json};

use super::desired::Difference;
use super::error::{ReconcileError, shorten};
use crate::api::names;

/// The field manager of the weights Flotilla sets on a route.
pub const ROUTE_FIELD_MANAGER: &str = "flotilla-route-weights";

/// gateway.networking.k8s.io/v1 HTTPRoute, read as a dynamic object (only two weights of it
/// are ever written, and no Gateway API types are needed for that).
pub fn http_route_resource() -> ApiResource {
    ApiResource {
        group: "gateway.networking.k8s.io".into(),
        version: "v1".into(),
        api_version: "gateway.networking.k8s.io/v1".into(),
        kind: "HTTPRoute".into(),
        plural: "httproutes".into(),
    }
}

/// One rule of the route that sends requests to the App: where its two backendRefs are, and
/// their weights now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RulePair {
    pub rule: usize,
    pub stable: usize,
    pub canary: usize,
    pub stable_weight: i64,
    pub canary_weight: i64,
}

/// The route as read for one reconcile: the rules that send to the App, or why it cannot be used.
#[derive(Clone, Debug)]
pub struct ObservedRoute {
    pub name: String,
    pub resource_version: Option<String>,
    pub pairs: Result<Vec<RulePair>, String>,
    /// The route cannot send the App anything: it does not exist, or no rule names the App's
    /// Services (as opposed to one that cannot be read, or names them beside others).
    pub sends_nothing: bool,
}

impl ObservedRoute {
    /// What the planner needs to know: the canary's weight on the route now (`None` when its
    /// rules disagree), or why the route cannot be used.
    pub fn state(&self) -> Result<Option<i32>, String> {
        let pairs = self.pairs.as_ref().map_err(Clone::clone)?;
        let first = pairs.first().map(|p| (p.stable_weight, p.canary_weight));
        let agreed = pairs.iter().all(|p| Some((p.stable_weight, p.canary_weight)) == first);
        Ok(first.filter(|(s, c)| agreed && s.checked_add(*c) == Some(100)).and_then(|(_, c)| i32::try_from(c).ok()))
    }
}

/// How a route that names neither of the App's Services is described.
const NO_RULE: &str = "has no rule that sends requests";

/// The most of a problem's text kept in status, Events and conditions.
const PROBLEM_LIMIT: usize = 400;

fn bounded(mut text: String) -> String {
    if shorten(&mut text, PROBLEM_LIMIT) {
        text.push_str("...");
    }
    text
}

impl BackendRef {
    /// The name of the Service of `namespace` this refers to, if it is one.
    fn service_of(&self, namespace: &str) -> Option<&str> {
        let kind = self.kind.as_deref().unwrap_or("Service");
        let group = self.group.as_deref().unwrap_or("");
        let ns = self.namespace.as_deref().unwrap_or(namespace);
        (kind == "Service" && group.is_empty() && ns == namespace).then(|| self.name.as_deref().unwrap_or_default())
    }

    fn describe(&self) -> String {
        let name = self.name.as_deref().unwrap_or("?");
        match &self.namespace {
            Some(ns) => format!("{ns}/{name}"),
            None => name.to_string(),
        }
    }
}

/// The rules of `route` that send to App `app`'s Services, each naming exactly the two
/// (`<app>`, the stable version, and `<app>-canary`): with a third backend the canary's share
/// would not be the step's weight. At least one such rule must exist.
pub fn rule_pairs(route: &RouteView, namespace: &str, app: &str) -> Result<Vec<RulePair>, String> {
    let route_name = route.metadata.name.as_deref().unwrap_or_default();
    let (stable, canary) = (names::service_name(app), names::canary_service_name(app));
    let mut pairs = Vec::new();
    for (i, rule) in route.rules.iter().enumerate() {
        let backends = rule.backend_refs.as_deref().unwrap_or_default();
        let ours = |want: &str| {
            backends.iter().enumerate().filter(|(_, b)| b.service_of(namespace) == Some(want)).collect::<Vec<_>>()
        };
        let (s, c) = (ours(&stable), ours(&canary));
        if s.is_empty() && c.is_empty() {
            continue;
        }
        match (s.as_slice(), c.as_slice()) {
            ([(si, sb)], [(ci, cb)]) if backends.len() == 2 => pairs.push(RulePair {
                rule: i,
                stable: *si,
                canary: *ci,
                stable_weight: sb.weight.unwrap_or(1),
                canary_weight: cb.weight.unwrap_or(1),
            }),
            _ => {
                return Err(format!(
                    "rule {} of HTTPRoute {route_name} must name exactly two backendRefs, the Services {stable} and {canary}; it names {}",
                    i + 1,
                    listed(backends)
                ));
            }
        }
    }
    if pairs.is_empty() {
        return Err(format!(
            "HTTPRoute {route_name} {NO_RULE} to the Services {stable} and {canary}: add their two backendRefs to the rule that serves the App"
        ));
    }
    Ok(pairs)
}

/// The first four of `backends`, and how many more.
fn listed(backends: &[BackendRef]) -> String {
    let mut listed = backends.iter().take(4).map(BackendRef::describe).collect::<Vec<_>>().join(", ");
    if backends.len() > 4 {
        listed.push_str(&format!(" and {} more", backends.len() - 4));
    }
    listed
}

/// The weights to write on a route: the JSON patch, what changes (for the Event), and whether
/// the canary's share goes down anywhere (its pods then drain before they may go).
#[derive(Clone, Debug, PartialEq)]
pub struct WeightPatch {
    pub patch: Value,
    pub diffs: Vec<Difference>,
    pub lowered: bool,
}

/// The JSON patch that gives the canary `canary_weight` percent of each rule (the stable
/// Service the rest), valid only for the route at `resource_version` (a conflict otherwise);
/// `None` when the weights already are so.
pub fn weight_patch(pairs: &[RulePair], resource_version: Option<&str>, canary_weight: i32) -> Option<WeightPatch> {
    let canary_weight = i64::from(canary_weight.clamp(0, 100));
    let stable_weight = 100 - canary_weight;
    let mut ops = Vec::new();
    let mut diffs = Vec::new();
    let mut lowered = false;
    if let Some(rv) = resource_version {
        // A patch that sets the resourceVersion is refused (409) unless it is the stored one.
        ops.push(json!({"op": "replace", "path": "/metadata/resourceVersion", "value": rv}));
    }
    for p in pairs.iter().filter(|p| p.stable_weight != stable_weight || p.canary_weight != canary_weight) {
        let at = |i: usize| format!("/spec/rules/{}/backendRefs/{i}/weight", p.rule);
        lowered |= p.canary_weight > canary_weight;
        ops.push(json!({"op": "add", "path": at(p.stable), "value": stable_weight}));
        ops.push(json!({"op": "add", "path": at(p.canary), "value": canary_weight}));
        diffs.push(Difference {
            field: "backendRefs weights (stable/canary)",
            observed: format!("{}/{} in rule {}", p.stable_weight, p.canary_weight, p.rule + 1),
            desired: format!("{stable_weight}/{canary_weight}"),
        });
    }
    (!diffs.is_empty()).then_some(WeightPatch { patch: Value::Array(ops), diffs, lowered })
}

/// What a reconcile reads of an HTTPRoute: its name, namespace and resourceVersion, and of
/// each rule the backendRefs' name, namespace, kind, group and weight (their places in the
/// lists are the JSON patch's paths). The tenant writes the route: its labels, annotations
/// and managed fields can be as large as the apiserver stores, and its rules' matches and
/// filters (16 rules of 16 backends with header modifiers, 8 matches of 16 headers and 16
/// query parameters each: 748 KB of short entries) take some 20 times their length as a
/// tree of JSON values. All of that is skipped as the text is read (serde's `IgnoredAny`).
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(from = "RouteWire")]
pub struct RouteView {
    metadata: kube::api::ObjectMeta,
    rules: Vec<RouteRule>,
}

/// One rule of a route, as read: its backendRefs (`None`: it has none).
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct RouteRule {
    #[serde(default)]
    backend_refs: Option<Vec<BackendRef>>,
}

/// One backendRef of a rule, as read: what says which Service it is, and its weight.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
struct BackendRef {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    group: Option<String>,
    #[serde(default)]
    weight: Option<i64>,
}

#[derive(serde::Deserialize)]
struct RouteWire {
    #[serde(default)]
    metadata: RouteMeta,
    #[serde(default)]
    spec: RouteSpec,
}

#[derive(Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct RouteMeta {
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
}

#[derive(Default, serde::Deserialize)]
struct RouteSpec {
    #[serde(default)]
    rules: Option<Vec<RouteRule>>,
}

impl From<RouteWire> for RouteView {
    fn from(wire: RouteWire) -> Self {
        let RouteMeta { name, namespace, resource_version } = wire.metadata;
        let metadata = kube::api::ObjectMeta { name, namespace, resource_version, ..Default::default() };
        RouteView { metadata, rules: wire.spec.rules.unwrap_or_default() }
    }
}

impl kube::Resource for RouteView {
    type DynamicType = ApiResource;
    type Scope = kube::core::DynamicResourceScope;

    fn kind(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.kind.as_str().into()
    }
    fn group(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.group.as_str().into()
    }
    fn version(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.version.as_str().into()
    }
    fn api_version(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.api_version.as_str().into()
    }
    fn plural(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.plural.as_str().into()
    }
    fn meta(&self) -> &kube::api::ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut kube::api::ObjectMeta {
        &mut self.metadata
    }
}

/// Reads the HTTPRoute `name` of `namespace`. A route that does not exist (or a cluster without
/// the Gateway API) and a refusal to read it are reported as why the route cannot be used; other
/// errors end the reconcile, to be retried.
pub async fn observe(
    client: &kube::Client,
    namespace: &str,
    app: &str,
    name: &str,
) -> Result<ObservedRoute, ReconcileError> {
    let api: Api<RouteView> = Api::namespaced_with(client.clone(), namespace, &http_route_resource());
    let found = match api.get_opt(name).await {
        Ok(found) => found,
        Err(kube::Error::Api(s)) if s.code == 404 => None,
        Err(kube::Error::Api(s)) if s.code == 403 => {
            let why =
                bounded(format!("the operator may not read HTTPRoute {name} in namespace {namespace}: {}", s.message));
            return Ok(ObservedRoute {
                name: name.to_string(),
                resource_version: None,
                pairs: Err(why),
                sends_nothing: false,
            });
        }
        Err(source) => {
            return Err(ReconcileError::Read {
                kind: "HTTPRoute",
                namespace: namespace.to_string(),
                name: name.to_string(),
                source,
            });
        }
    };
    let resource_version = found.as_ref().and_then(|r| r.metadata.resource_version.clone());
    let mut sends_nothing = found.is_none();
    let pairs = match found {
        None => Err(format!(
            "HTTPRoute {name} does not exist in namespace {namespace} (Flotilla never creates it; is the Gateway API installed?)"
        )),
        Some(route) => {
            let pairs = rule_pairs(&route, namespace, app);
            sends_nothing = pairs.as_ref().is_err_and(|why| why.contains(NO_RULE));
            pairs.map_err(bounded)
        }
    };
    Ok(ObservedRoute { name: name.to_string(), resource_version, pairs, sends_nothing })
}

/// Sets the two weights of every rule of `route` that sends to the App, when they differ.
pub async fn set_weights(
    client: &kube::Client,
    namespace: &str,
    route: &ObservedRoute,
    patch: &Value,
) -> Result<(), ReconcileError> {
    // The route sent back is read as a `RouteView` too.
    let api: Api<RouteView> = Api::namespaced_with(client.clone(), namespace, &http_route_resource());
    let params = PatchParams { field_manager: Some(ROUTE_FIELD_MANAGER.into()), ..PatchParams::default() };
    let ops: json_patch::Patch = serde_json::from_value(patch.clone()).map_err(|e| ReconcileError::Apply {
        kind: "HTTPRoute",
        namespace: namespace.to_string(),
        name: route.name.clone(),
        source: kube::Error::SerdeError(e),
    })?;
    api.patch(&route.name, &params, &Patch::<()>::Json(ops)).await.map(|_| ()).map_err(|source| ReconcileError::Apply {
        kind: "HTTPRoute",
        namespace: namespace.to_string(),
        name: route.name.clone(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(rules: Value) -> Value {
        json!({"metadata": {"name": "shop"}, "spec": {"parentRefs": [{"name": "gw"}], "rules": rules}})
    }

    /// `route` read as a reconcile reads it.
    fn view(route: &Value) -> RouteView {
        serde_json::from_str(&route.to_string()).expect("a route")
    }

    #[test]
    fn a_route_is_read_as_its_key_and_rules_only() {
        let mut whole = route(json!([
            {"backendRefs": [{"name": "web-canary", "port": 80, "weight": 0}, {"name": "web", "port": 80, "weight": 100}]},
        ]));
        whole["metadata"]["resourceVersion"] = json!("12");
        whole["metadata"]["labels"] = json!({"a": "b"});
        whole["metadata"]["managedFields"] = json!([{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]);
        let view = view(&whole);
        assert_eq!(view.metadata.resource_version.as_deref(), Some("12"));
        assert_eq!(view.metadata.name.as_deref(), Some("shop"));
        assert!(view.metadata.labels.is_none() && view.metadata.managed_fields.is_none());
        let pairs = rule_pairs(&view, "ns", "web").expect("usable");
        assert_eq!(pairs, [RulePair { rule: 0, stable: 1, canary: 0, stable_weight: 100, canary_weight: 0 }]);
    }

    #[test]
    fn of_the_rules_only_the_backends_references_and_weights_are_read() {
        let r = route(json!([
            {"matches": [{"headers": [{"name": "h", "value": "v"}], "queryParams": [{"name": "q", "value": "v"}]}],
             "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "h", "value": "v"}]}}],
             "timeouts": {"request": "10s"},
             "backendRefs": [
                {"name": "web", "port": 80, "weight": 90, "filters": [{"type": "RequestHeaderModifier"}]},
                {"name": "web-canary", "namespace": "ns", "kind": "Service", "group": "", "port": 80, "weight": 10}]},
            {"matches": [{"path": {"value": "/none"}}], "backendRefs": null},
            {"filters": [{"type": "RequestRedirect"}]},
        ]));
        let read = view(&r);
        let backend =
            |name: &str, weight| BackendRef { name: Some(name.into()), weight: Some(weight), ..Default::default() };
        let canary = BackendRef {
            namespace: Some("ns".into()),
            kind: Some("Service".into()),
            group: Some("".into()),
            ..backend("web-canary", 10)
        };
        assert_eq!(
            read.rules,
            [
                RouteRule { backend_refs: Some(vec![backend("web", 90), canary]) },
                RouteRule::default(),
                RouteRule::default()
            ]
        );
        let pairs = rule_pairs(&read, "ns", "web").expect("usable");
        assert_eq!(pairs, [RulePair { rule: 0, stable: 0, canary: 1, stable_weight: 90, canary_weight: 10 }]);
        // A route without rules, or with `rules: null`, sends nothing.
        for spec in [json!({}), json!({"rules": null})] {
            let read = view(&json!({"metadata": {"name": "shop"}, "spec": spec}));
            assert!(rule_pairs(&read, "ns", "web").is_err_and(|e| e.contains(NO_RULE)));
        }
    }

    #[test]
    fn a_rule_naming_both_services_is_used_and_others_are_left_alone() {
        let r = route(json!([
            {"matches": [{"path": {"value": "/admin"}}], "backendRefs": [{"name": "admin", "port": 80}]},
            {"backendRefs": [{"name": "web-canary", "port": 80, "weight": 0}, {"name": "web", "port": 80, "weight": 100}]},
        ]));
        let pairs = rule_pairs(&view(&r), "ns", "web").expect("usable");
        assert_eq!(pairs, [RulePair { rule: 1, stable: 1, canary: 0, stable_weight: 100, canary_weight: 0 }]);
        let up = weight_patch(&pairs, Some("42"), 20).expect("weights differ");
        assert_eq!(
            up.patch,
            json!([
                {"op": "replace", "path": "/metadata/resourceVersion", "value": "42"},
                {"op": "add", "path": "/spec/rules/1/backendRefs/1/weight", "value": 80},
                {"op": "add", "path": "/spec/rules/1/backendRefs/0/weight", "value": 20},
            ])
        );
        assert_eq!((up.diffs.len(), up.lowered), (1, false));
        let at_20 = [RulePair { stable_weight: 80, canary_weight: 20, ..pairs[0].clone() }];
        assert!(weight_patch(&at_20, Some("43"), 20).is_none());
        assert!(weight_patch(&at_20, Some("43"), 0).is_some_and(|p| p.lowered), "a lower share drains");
    }

    #[test]
    fn the_patch_applies_to_the_route_and_changes_nothing_else() {
        let mut r = route(json!([
            {"filters": [{"type": "RequestHeaderModifier"}], "backendRefs": [{"name": "web", "port": 80}, {"name": "web-canary", "port": 80}]},
        ]));
        let before = r.clone();
        let pairs = rule_pairs(&view(&r), "ns", "web").expect("usable");
        // A missing weight counts as the API's default, 1.
        assert_eq!((pairs[0].stable_weight, pairs[0].canary_weight), (1, 1));
        let patch = weight_patch(&pairs, None, 5).expect("weights differ").patch;
        let ops: json_patch::Patch = serde_json::from_value(patch).expect("a JSON patch");
        json_patch::patch(&mut r, &ops).expect("applies");
        assert_eq!(r["spec"]["rules"][0]["backendRefs"][0]["weight"], 95);
        assert_eq!(r["spec"]["rules"][0]["backendRefs"][1]["weight"], 5);
        r["spec"]["rules"][0]["backendRefs"][0].as_object_mut().map(|b| b.remove("weight"));
        r["spec"]["rules"][0]["backendRefs"][1].as_object_mut().map(|b| b.remove("weight"));
        assert_eq!(r, before);
    }

    #[test]
    fn a_route_that_does_not_send_exactly_to_the_two_services_is_refused() {
        let cases = [
            (json!([{"backendRefs": [{"name": "other"}]}]), "has no rule that sends requests"),
            (json!([]), "has no rule"),
            (json!([{"backendRefs": [{"name": "web"}]}]), "must name exactly two backendRefs"),
            (
                json!([{"backendRefs": [{"name": "web"}, {"name": "web-canary"}, {"name": "other"}]}]),
                "it names web, web-canary, other",
            ),
            (json!([{"backendRefs": [{"name": "web"}, {"name": "web"}]}]), "must name exactly"),
            // Another namespace's Services of the same names are not the App's.
            (
                json!([{"backendRefs": [{"name": "web", "namespace": "other"}, {"name": "web-canary", "namespace": "other"}]}]),
                "has no rule",
            ),
            (
                json!([{"backendRefs": [{"name": "web"}, {"name": "web-canary", "namespace": "other"}]}]),
                "other/web-canary",
            ),
            // A ServiceImport of that name is not the Service.
            (
                json!([{"backendRefs": [{"name": "web"}, {"name": "web-canary", "kind": "ServiceImport", "group": "multicluster.x-k8s.io"}]}]),
                "must name exactly",
            ),
        ];
        for (rules, want) in cases {
            let err = rule_pairs(&view(&route(rules.clone())), "ns", "web").expect_err(&rules.to_string());
            assert!(err.contains(want), "{rules}: {err}");
        }
        // The namespace spelled out is the App's own: fine.
        let ok = json!([{"backendRefs": [{"name": "web", "namespace": "ns"}, {"name": "web-canary", "namespace": "ns", "kind": "Service", "group": ""}]}]);
        assert!(rule_pairs(&view(&route(ok)), "ns", "web").is_ok());
    }
}
