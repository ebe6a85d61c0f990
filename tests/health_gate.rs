//! End to end: a canary whose pods never become Ready is rolled back by the health gate,
//! with no metric configured. The pods cannot start because every node is cordoned while
//! the new version rolls out; this binary runs alone (cargo runs test binaries one at a
//! time), so no other test schedules pods meanwhile.

mod support;

use flotilla::api::AppPhase;
use serde_json::json;
use std::time::Duration;
use support::rollout::{Rig, condition, image_of};
use support::{kubectl_ok, wait_for};

/// Uncordons every node when dropped, even when the test fails.
struct Cordoned;

impl Cordoned {
    fn all() -> Self {
        for node in nodes() {
            kubectl_ok(&["cordon", &node]);
        }
        Cordoned
    }
}

fn nodes() -> Vec<String> {
    kubectl_ok(&["get", "nodes", "-o", "name"]).lines().map(str::to_string).collect()
}

impl Drop for Cordoned {
    fn drop(&mut self) {
        for node in nodes() {
            let _ = support::kubectl_try(&["uncordon", &node]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_that_never_becomes_ready_is_rolled_back() {
    let rig = Rig::start("ro-gate").await;
    rig.create(
        "web",
        json!({"replicas": 2, "rollout": {"progressDeadline": "10s",
               "strategy": {"type": "Canary", "canary": {"steps": [{"weight": 50}]}}}}),
    )
    .await;
    let cordoned = Cordoned::all();
    rig.set_version("web", "2").await;
    let app = rig.wait_phase("web", AppPhase::RolledBack).await;
    drop(cordoned);
    let (_, reason, message) = condition(&app, "Progressing");
    assert_eq!(reason, "ProgressDeadlineExceeded");
    assert!(message.contains("web-canary") && message.contains("0/1"), "{message}");
    wait_for(Duration::from_secs(20), "canary removed", || async {
        rig.deployment("web-canary").await.is_none().then_some(())
    })
    .await;
    assert_eq!(image_of(&rig.deployment("web").await.expect("stable")), "registry.example.com/tests/web:1");
    let s = rig.app("web").await.status.expect("status");
    assert_eq!(s.current_version.as_deref(), Some("1"));
    rig.wait_events("web", &["RolledBack"]).await;
}
