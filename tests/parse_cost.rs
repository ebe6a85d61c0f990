//! What a replica's memory pays to read a page of Apps shaped by whoever wrote them (no
//! cluster: the page is the text the apiserver would send).
//!
//! An App may be as large as the apiserver stores (about 1.5 MiB), and its writer chooses its
//! shape. Made of many small parts (list entries, labels, annotations, owner references), it
//! takes some 50 times its length as a tree of JSON values, and a list page holds many. The
//! guard reads every App of the cluster on every replica, and a namespace's App cache reads
//! each of its Apps; both must pay about an App's length to read it, whatever its shape. The
//! same of the ConfigMaps of a namespace where an App reads one: a few bytes each; and of the
//! conversion webhook, which anyone who reads Apps as v1alpha1 makes convert them.
//!
//! The bytes are counted by this binary's allocator: the most held at once while a page is
//! read (`peak`), and what the read page holds (`kept`), both beyond what was held before.

use flotilla::api::App;
use flotilla::api::conversion::{RawObject, convert_text};
use flotilla::app::config_map_key::ConfigMapKey;
use flotilla::app::light::GuardedApp;
use flotilla::watch_cache::Compact;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Resource;
use kube::api::DynamicObject;
use kube::core::ObjectList;
use kube::core::PartialObjectMeta;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

// Counted per thread: the tests of this binary run side by side, and each reads what it
// alone allocated (a block freed on another thread counts there).
thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn grew(by: usize) {
    let by = isize::try_from(by).unwrap_or(isize::MAX);
    let _ = LIVE.try_with(|live| {
        let now = live.get().saturating_add(by);
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

fn shrank(by: usize) {
    let by = isize::try_from(by).unwrap_or(isize::MAX);
    let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(by)));
}

// SAFETY: every call is passed to the system allocator unchanged; only sizes are counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            shrank(layout.size());
            grew(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes (most held at once, held after) that reading `text` as `T` took.
fn cost<T>(text: &str, read: impl FnOnce(&str) -> T) -> (usize, usize, T) {
    held(|| read(text))
}

/// Bytes (most held at once, held after) that `work` took on this thread.
fn held<T>(work: impl FnOnce() -> T) -> (usize, usize, T) {
    let before = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(before));
    let value = work();
    let beyond = |n: isize| usize::try_from(n.saturating_sub(before)).unwrap_or(0);
    (beyond(PEAK.with(Cell::get)), beyond(LIVE.with(Cell::get)), value)
}

/// A page of `apps` Apps of about `bytes` each, of one hostile shape: `part(i)` is the i-th of
/// many small parts, placed by `wrap` (which gets them joined by commas).
fn page(apps: usize, bytes: usize, part: impl Fn(usize) -> String, wrap: impl Fn(&str) -> String) -> String {
    let app = wrap(&parts(bytes, part));
    let items: Vec<String> =
        (0..apps).map(|n| app.replace("\"name\":\"big\"", &format!("\"name\":\"big-{n}\""))).collect();
    format!(
        r#"{{"apiVersion":"flotilla.dev/v1beta1","kind":"AppList","metadata":{{"resourceVersion":"9"}},"items":[{}]}}"#,
        items.join(",")
    )
}

/// An App with `metadata_extra` in its metadata and `env` as its main container's
/// environment, and managed fields as the apiserver writes them (one entry per field set):
/// read as a tree of values, they are one more tree.
fn app(metadata_extra: &str, env: &str) -> String {
    let fields: Vec<String> = (0..200).map(|i| format!(r#""f:e{i}":{{}}"#)).collect();
    let managed = format!(
        r#","managedFields":[{{"manager":"kubectl","operation":"Apply","apiVersion":"flotilla.dev/v1beta1","fieldsType":"FieldsV1","fieldsV1":{{"f:spec":{{{}}}}}}}]"#,
        fields.join(",")
    );
    format!(
        r#"{{"apiVersion":"flotilla.dev/v1beta1","kind":"App","metadata":{{"name":"big","namespace":"shop","uid":"u","resourceVersion":"7","generation":1{metadata_extra}{managed}}},"spec":{{"image":"registry.example.com/web","version":"1","template":{{"spec":{{"containers":[{{"name":"app","env":[{env}]}}]}}}}}},"status":{{"currentVersion":"1","phase":"Healthy"}}}}"#
    )
}

const APP_BYTES: usize = 1400 * 1024;
const APPS: usize = 4;

#[test]
fn a_page_of_tenant_objects_costs_about_its_length_whatever_their_shape() {
    let shapes: [(&str, String); 4] = [
        ("env entries", page(APPS, APP_BYTES, |_| r#"{"name":"a"}"#.into(), |env| app("", env))),
        ("labels", page(APPS, APP_BYTES, |i| format!(r#""l{i}":"""#), |l| app(&format!(r#","labels":{{{l}}}"#), ""))),
        (
            "annotations",
            page(APPS, APP_BYTES, |i| format!(r#""a{i}":"""#), |a| app(&format!(r#","annotations":{{{a}}}"#), "")),
        ),
        (
            "owner references",
            page(
                APPS,
                APP_BYTES,
                |i| format!(r#"{{"apiVersion":"v1","kind":"A","name":"a","uid":"{i}"}}"#),
                |o| app(&format!(r#","ownerReferences":[{o}]"#), ""),
            ),
        ),
    ];
    for (shape, text) in &shapes {
        let len = text.len();
        // The shape is the attack: one App of it as a tree of values takes many times its length.
        let (tree_peak, _, tree) =
            cost(text, |t| serde_json::from_str::<ObjectList<DynamicObject>>(t).expect("a page of dynamic objects"));
        drop(tree);
        assert!(tree_peak > 2 * len, "{shape}: not hostile: a tree of it takes {tree_peak} bytes for {len}");

        let (peak, kept, cached) =
            cost(text, |t| serde_json::from_str::<ObjectList<Compact<App>>>(t).expect("a page of cached Apps"));
        assert_eq!(cached.items.len(), APPS);
        assert!(cached.items.iter().all(|a| a.meta().name.as_deref().is_some_and(|n| n.starts_with("big-"))));
        drop(cached);
        let (guard_peak, guard_kept, guarded) =
            cost(text, |t| serde_json::from_str::<ObjectList<GuardedApp>>(t).expect("a page of guarded Apps"));
        assert_eq!(guarded.items.len(), APPS);
        drop(guarded);
        println!(
            "{shape}: a page of {APPS} Apps, {len} bytes: as a tree {tree_peak} at most ({:.1}x); \
             cached {peak} at most ({:.2}x), {kept} kept; guarded {guard_peak} at most, {guard_kept} kept",
            tree_peak as f64 / len as f64,
            peak as f64 / len as f64,
        );
        // Measured: 1.5x at most (a text buffer grows by doubling), 1.0x kept.
        assert!(peak < 2 * len, "{shape}: the App cache took {peak} bytes at once to read {len}");
        assert!(kept < len + len / 10, "{shape}: the App cache keeps {kept} bytes of a {len}-byte page");
        // Measured: a few KiB (keys, status).
        assert!(guard_peak < len / 100, "{shape}: the guard took {guard_peak} bytes at once to read {len}");
        assert!(guard_kept < len / 100, "{shape}: the guard keeps {guard_kept} bytes of a {len}-byte page");
    }

    // The conversion webhook: such an App read as v1alpha1 (converted down, its template
    // moved into an annotation as text).
    let text = app("", &parts(APP_BYTES, |_| r#"{"name":"a"}"#.into()));
    let len = text.len();
    let (tree_peak, _, tree) = cost(&text, |t| serde_json::from_str::<serde_json::Value>(t).expect("an App"));
    drop(tree);
    let (peak, _, converted) = cost(&text, |t| {
        let fields: RawObject = serde_json::from_str(t).expect("an object");
        convert_text(0, fields, "flotilla.dev/v1alpha1").expect("converted")
    });
    assert!(converted.get().contains("flotilla.dev/v1beta1-fields"), "the template kept in the annotation");
    drop(converted);
    println!(
        "conversion of one App, {len} bytes: as a tree {tree_peak} at most ({:.1}x); as text {peak} at most ({:.1}x)",
        tree_peak as f64 / len as f64,
        peak as f64 / len as f64
    );
    // Measured: 7.2x (52x as a tree): the template is copied as text a few times (the
    // object's fields, the spec's, the annotation's string, escaped, the answer).
    assert!(peak < 10 * len, "converting an App of {len} bytes took {peak} at once");

    // ConfigMaps, which a tenant may create as freely: many labels, or many tiny data keys
    // (each also in the managed fields, as the apiserver records them).
    let config_map = |labels: &str, data: &str, managed: &str| {
        format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"big","namespace":"shop","uid":"u","resourceVersion":"7","labels":{{{labels}}},"managedFields":[{{"manager":"kubectl","operation":"Apply","apiVersion":"v1","fieldsType":"FieldsV1","fieldsV1":{{"f:data":{{{managed}}}}}}}]}},"data":{{{data}}}}}"#
        )
    };
    let config_pages: [(&str, String); 2] = [
        ("labels", list_of(APPS, &config_map(&parts(APP_BYTES, |i| format!(r#""l{i}":"""#)), "", ""))),
        (
            "data keys",
            list_of(
                APPS,
                &config_map(
                    "",
                    &parts(APP_BYTES / 2, |i| format!(r#""k{i:07}":"""#)),
                    &parts(APP_BYTES / 2, |i| format!(r#""f:k{i:07}":{{}}"#)),
                ),
            ),
        ),
    ];
    for (shape, text) in &config_pages {
        let len = text.len();
        let (typed_peak, _, typed) = cost(text, |t| {
            serde_json::from_str::<ObjectList<PartialObjectMeta<ConfigMap>>>(t).expect("a page of ConfigMap metadata")
        });
        drop(typed);
        let (peak, kept, read) =
            cost(text, |t| serde_json::from_str::<ObjectList<ConfigMapKey>>(t).expect("a page of ConfigMap keys"));
        assert_eq!(read.items.len(), APPS);
        drop(read);
        println!(
            "ConfigMaps of {shape}: a page of {APPS}, {len} bytes: as typed metadata {typed_peak} at most ({:.1}x); \
             as keys {peak} at most, {kept} kept",
            typed_peak as f64 / len as f64
        );
        assert!(typed_peak > len, "{shape}: not hostile: typed metadata of it takes {typed_peak} bytes for {len}");
        // Measured: a few KiB.
        assert!(peak < len / 100, "{shape}: the ConfigMap cache took {peak} bytes at once to read {len}");
        assert!(kept < len / 100, "{shape}: the ConfigMap cache keeps {kept} bytes of a {len}-byte page");
    }
}

/// Small parts joined by commas, `bytes` long or a little more.
fn parts(bytes: usize, part: impl Fn(usize) -> String) -> String {
    let mut out = String::new();
    let mut i = 0;
    while out.len() < bytes {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&part(i));
        i += 1;
    }
    out
}

/// A list of `n` copies of the object `item` (named big-0, big-1, ...).
fn list_of(n: usize, item: &str) -> String {
    let items: Vec<String> =
        (0..n).map(|i| item.replacen("\"name\":\"big\"", &format!("\"name\":\"big-{i}\""), 1)).collect();
    format!(r#"{{"apiVersion":"v1","kind":"List","metadata":{{"resourceVersion":"9"}},"items":[{}]}}"#, items.join(","))
}

/// Apps served (`replicas: 0`, in one namespace's cache) whose status keeps a stable template
/// of `env_bytes` of environment entries, the shape that takes the most as a typed pod spec.
fn served_apps(count: usize, env_bytes: usize) -> kube::runtime::reflector::Store<Compact<App>> {
    use kube::runtime::{reflector::store::Writer, watcher};
    let env = format!("[{}]", parts(env_bytes, |_| r#"{"name":"a"}"#.into()));
    let template: serde_json::Value =
        serde_json::from_str(&format!(r#"{{"spec":{{"containers":[{{"name":"app","env":{env}}}]}}}}"#))
            .expect("a template");
    let mut writer = Writer::<Compact<App>>::default();
    for i in 0..count {
        let mut status = serde_json::json!({"phase": "Healthy", "currentVersion": "1",
            "analysis": {"failures": 0, "measurements": [{"name": "errors", "result": "Pass", "value": 0.1, "max": 1.0}]}});
        if env_bytes > 0 {
            status["stableTemplate"] = template.clone();
        }
        let obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1beta1", "kind": "App",
            "metadata": {"name": format!("app-{i}"), "namespace": "shop", "uid": format!("u-{i}"), "resourceVersion": "1"},
            "spec": {"image": "registry.example.com/web", "version": "1", "replicas": 0, "template": template},
            "status": status,
        }))
        .expect("an App");
        writer.apply_watcher_event(&watcher::Event::Apply(Compact::of(obj)));
    }
    writer.as_reader()
}

/// Apps whose status keeps a large stable template cost a scrape of the per-App series no more
/// than Apps without one: the series read the phase, the canary's weight and the measurements,
/// and skip the rest of each App as its text is read, one App at a time.
#[test]
fn a_scrape_of_the_app_series_skips_what_they_do_not_read() {
    use prometheus::core::Collector;
    const SCRAPED: usize = 20;
    const TEMPLATE_BYTES: usize = 44 * 1024;
    let scrape = |store| {
        let index = flotilla::telemetry::apps::AppIndex::default();
        let _registration = index.register("shop", store, Default::default());
        let collector = flotilla::telemetry::apps::AppCollector::new(index).expect("a collector");
        let (peak, _, families) = held(|| collector.collect());
        let series: usize = families.iter().map(|f| f.get_metric().len()).sum();
        (peak, series)
    };
    let (plain_peak, plain_series) = scrape(served_apps(SCRAPED, 0));
    let (peak, series) = scrape(served_apps(SCRAPED, TEMPLATE_BYTES));
    assert_eq!(series, plain_series, "the same series");
    assert_eq!(series, 5 + SCRAPED * 3, "5 phases, and a phase, a value and a bound per App");
    println!(
        "a scrape of {SCRAPED} Apps: {peak} bytes at most with stable templates of {TEMPLATE_BYTES} bytes, \
         {plain_peak} without"
    );
    // The same (the series' own labels and values); each App's typed template would be some
    // 30 times its length, all of them held at once.
    assert!(
        peak < plain_peak + TEMPLATE_BYTES / 4,
        "a scrape took {peak} bytes at once, {plain_peak} without templates"
    );
}

/// An HTTPRoute of the largest rules of short entries the Gateway API's schema admits, one of
/// which sends to App `web`'s two Services: 16 rules of 8 matches (16 headers and 16 query
/// parameters each) and of 16 backendRefs (the first rule 2), each backend with request and
/// response header modifiers of 16 entries a list.
fn largest_route() -> String {
    let list = |n: usize, item: &dyn Fn(usize) -> String| (0..n).map(item).collect::<Vec<_>>().join(",");
    let header = |i: usize| format!(r#"{{"type":"Exact","name":"x-h-{i:02}","value":"v"}}"#);
    let query = |i: usize| format!(r#"{{"type":"Exact","name":"q-{i:02}","value":"v"}}"#);
    let matched = format!(
        r#"{{"path":{{"type":"PathPrefix","value":"/"}},"headers":[{}],"queryParams":[{}]}}"#,
        list(16, &header),
        list(16, &query)
    );
    let pair = |i: usize| format!(r#"{{"name":"x-m-{i:02}","value":"v"}}"#);
    let modifier = format!(
        r#"{{"set":[{}],"add":[{}],"remove":[{}]}}"#,
        list(16, &pair),
        list(16, &pair),
        list(16, &|i| format!(r#""x-r-{i:02}""#))
    );
    let filters = format!(
        r#"[{{"type":"RequestHeaderModifier","requestHeaderModifier":{modifier}}},{{"type":"ResponseHeaderModifier","responseHeaderModifier":{modifier}}}]"#
    );
    let backend = |name: &str| format!(r#"{{"name":"{name}","port":80,"weight":1,"filters":{filters}}}"#);
    let rule = |r: usize| {
        let backends = match r {
            0 => [backend("web"), backend("web-canary")].join(","),
            _ => list(16, &|b| backend(&format!("other-{r:02}-{b:02}"))),
        };
        format!(r#"{{"matches":[{}],"backendRefs":[{backends}]}}"#, list(8, &|_| matched.clone()))
    };
    format!(
        r#"{{"apiVersion":"gateway.networking.k8s.io/v1","kind":"HTTPRoute","metadata":{{"name":"shop","namespace":"shop","resourceVersion":"7"}},"spec":{{"parentRefs":[{{"name":"gw"}}],"rules":[{}]}}}}"#,
        list(16, &rule)
    )
}

/// A reconcile of a routed canary reads its HTTPRoute (and the route the weights' patch sends
/// back): of its rules, only what says which Services the backends are and their weights.
#[test]
fn a_route_costs_its_backends_references_not_its_rules() {
    use flotilla::app::route::{RouteView, rule_pairs};
    let text = largest_route();
    let len = text.len();
    let (tree_peak, _, tree) = cost(&text, |t| serde_json::from_str::<serde_json::Value>(t).expect("a route"));
    drop(tree);
    let (peak, kept, (route, pairs)) = cost(&text, |t| {
        let route = serde_json::from_str::<RouteView>(t).expect("a route");
        let pairs = rule_pairs(&route, "shop", "web");
        (route, pairs)
    });
    assert_eq!(pairs.map(|p| p.len()), Ok(1), "the first rule sends to the App");
    drop(route);
    println!(
        "an HTTPRoute of {len} bytes: as a tree {tree_peak} at most ({:.1}x); as read {peak} at most, {kept} kept",
        tree_peak as f64 / len as f64
    );
    assert!(tree_peak > 10 * len, "not hostile: a tree of it takes {tree_peak} bytes for {len}");
    // Measured: some 30 KB (242 backends' names and weights).
    assert!(peak < len / 10, "reading a route of {len} bytes took {peak} at once");
}

/// An App of `env_bytes` of environment entries in its main container (named `app`), reading
/// ConfigMap `reads` if any.
fn app_reading(name: &str, env_bytes: usize, reads: Option<&str>) -> Compact<App> {
    let env = parts(env_bytes, |_| r#"{"name":"a"}"#.into());
    let env_from = reads.map(|cm| format!(r#","envFrom":[{{"configMapRef":{{"name":"{cm}"}}}}]"#)).unwrap_or_default();
    let text = format!(
        r#"{{"apiVersion":"flotilla.dev/v1beta1","kind":"App","metadata":{{"name":"{name}","namespace":"shop","uid":"{name}","resourceVersion":"1"}},"spec":{{"image":"registry.example.com/web","version":"1","replicas":0,"template":{{"spec":{{"containers":[{{"name":"app","env":[{env}]{env_from}}}]}}}}}}}}"#
    );
    serde_json::from_str(&text).expect("an App")
}

/// A ConfigMap named `app` (a string in the JSON of every App whose main container is named
/// so) changes: the Apps it rolls are looked up, none is read; and an App that changes is read
/// for the ConfigMaps it names, the rest of it skipped.
#[test]
fn a_config_map_change_reads_no_app() {
    use flotilla::app::config_readers::ConfigMapReaders;
    use kube::runtime::watcher::Event;
    const APPS: usize = 20;
    const ENV_BYTES: usize = 44 * 1024;
    let readers = ConfigMapReaders::default();
    readers.observe(&Event::Init);
    for i in 0..APPS {
        let reads = (i < 2).then_some("app");
        readers.observe(&Event::InitApply(app_reading(&format!("app-{i}"), ENV_BYTES, reads)));
    }
    readers.observe(&Event::InitDone);
    let config_map: ConfigMapKey =
        serde_json::from_str(r#"{"metadata":{"name":"app","namespace":"shop"}}"#).expect("a ConfigMap");
    let (peak, _, rolled) = held(|| readers.apps_reading(&config_map));
    let mut rolled: Vec<String> = rolled.into_iter().map(|r| r.name).collect();
    rolled.sort();
    assert_eq!(rolled, ["app-0", "app-1"]);
    let changed = app_reading("app-7", ENV_BYTES, None);
    let (read_peak, _, ()) = held(|| readers.observe(&Event::Apply(changed)));
    let reader = app_reading("app-0", ENV_BYTES, Some("app"));
    let (parsed_peak, _, ()) = held(|| readers.observe(&Event::Apply(reader)));
    println!(
        "a change of ConfigMap app among {APPS} Apps of {ENV_BYTES} bytes of env entries: {peak} bytes at most; \
         a change of an App that reads none: {read_peak}; of one that reads it (parsed once): {parsed_peak}"
    );
    // Measured: a few hundred bytes (the two Apps' references). Parsing each App whose JSON
    // holds "app" takes some 30 times its length, one at a time.
    assert!(peak < 4096, "a ConfigMap's change took {peak} bytes at once");
    assert!(read_peak < ENV_BYTES / 10, "reading a changed App for its ConfigMaps took {read_peak} bytes");
}
