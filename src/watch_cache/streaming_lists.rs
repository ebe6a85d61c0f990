//! Whether the apiserver streams a watch's initial state (`sendInitialEvents`, the WatchList
//! feature: on by default since Kubernetes 1.34), so that caches of objects whose writers
//! choose their size can read them one at a time instead of in pages.
//!
//! A page is read whole as text before any of it is parsed, and copied once on the way in
//! (inside kube), so a page of Apps costs up to twice its length however little of it is
//! kept: 20 Apps of 1.5 MiB are 60 MiB at once, in each namespace's cache that lists at once.
//! Streamed, the initial state arrives as watch events, one object at a time.
//!
//! Older apiservers, or ones with the feature off, refuse such a watch; the caches then list
//! in pages, as before. Asked once, at start, with a watch of no object.

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, WatchParams};
use kube::core::WatchEvent;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::time::Duration;
use tracing::{info, warn};

/// How long the probe waits for the apiserver's first answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a probe's first answer says: streamed (any event, the end of the initial state
/// first), or not (the apiserver refused the watch, or could not be asked).
pub fn answer<K>(first: Option<Result<WatchEvent<K>, kube::Error>>) -> bool {
    matches!(first, Some(Ok(_)))
}

/// Whether `api`'s apiserver streams initial states: a watch of the objects named by a name
/// no object has, asked to send its initial state (nothing, then a bookmark saying so).
/// False when it refuses, or does not answer within `PROBE_TIMEOUT`: pages always work.
pub async fn supported<K>(api: &Api<K>) -> bool
where
    K: Clone + DeserializeOwned + Debug + kube::Resource,
{
    let params = WatchParams::streaming_lists().fields("metadata.name=flotilla.dev-streaming-lists-probe").timeout(5);
    let first = tokio::time::timeout(PROBE_TIMEOUT, async {
        match api.watch(&params, "").await {
            Ok(stream) => stream.boxed().try_next().await.transpose(),
            Err(e) => Some(Err(e)),
        }
    })
    .await;
    let streamed = match first {
        Ok(first) => {
            if let Some(Err(e)) = &first {
                info!(error = %e, "the apiserver does not stream initial states (WatchList); Apps are listed in pages");
            }
            answer(first)
        }
        Err(_) => {
            warn!("the apiserver did not answer a streamed watch within 10 s; Apps are listed in pages");
            false
        }
    };
    if streamed {
        info!("the apiserver streams initial states (WatchList): Apps are read one at a time");
    }
    streamed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_event_means_streamed() {
        let status = kube::core::Status::failure("sendInitialEvents is forbidden", "Invalid").with_code(422);
        assert!(!answer::<()>(Some(Err(kube::Error::Api(status.boxed())))), "refused");
        assert!(!answer::<()>(None), "the watch ended without a word");
        let bookmark: WatchEvent<()> = serde_json::from_value(serde_json::json!({"type": "BOOKMARK",
            "object": {"apiVersion": "flotilla.dev/v1beta1", "kind": "App", "metadata": {"resourceVersion": "9",
                "annotations": {"k8s.io/initial-events-end": "true"}}}}))
        .expect("a bookmark");
        assert!(answer(Some(Ok(bookmark))));
    }
}
