//! How much the conversion webhook accepts, and for how long: bounds chosen from what the
//! apiserver really sends, so that no request (from the apiserver or from any pod that can
//! reach port 9443) makes a replica hold more than a known amount of memory or a conversion
//! slot for long. docs/security.md ("Conversion webhook") has the reasoning and the figures.
//!
//! What the apiserver sends (k8s.io/apiextensions-apiserver, `pkg/apiserver/conversion`):
//! `webhookConverter.Convert` puts every object of one call into one ConversionReview, and
//! the CRD storage calls it with one object (a get, a watch event, a write, the field sets of a
//! server-side apply) or with one whole list response: every item of the page that is not at
//! the desired version, in one review. It never splits a list. So a review holds one object
//! of at most etcd's limit (`--max-request-bytes`, 1.5 MiB by default), or one list page:
//! 500 objects from kubectl (`--chunk-size`) and from client-go's and kube-rs' pagers, and
//! the whole collection for a client that does not page.

use std::time::Duration;

/// Largest object accepted in a review, as sent: etcd's default object limit (1.5 MiB), plus
/// room for a cluster that raised it a little and for the annotation the down-conversion adds.
/// A bigger object cannot be stored, so a review carrying one is not from the apiserver (a
/// write of one would fail in etcd anyway).
pub const OBJECT_LIMIT: usize = 2 * 1024 * 1024;

/// Largest request body. Room for eight objects at [`OBJECT_LIMIT`], or for a list page of
/// 500 objects of 32 KiB each (an App as the operator and kubectl write it is 1-3 KiB, so
/// about ten times the real size). An unpaged list of more than about 5,000 Apps no longer
/// fits and fails with 413 (kubectl and the operator page).
pub const BODY_LIMIT: usize = 16 * 1024 * 1024;

/// Most objects converted in one review: twenty pages of 500. Any more and the review is not a
/// list page the apiserver would send with a paging client; refused with 413.
pub const MAX_OBJECTS: usize = 10_000;

/// Request bodies read at once per replica; further requests wait (within
/// [`REQUEST_TIMEOUT`]). Reading is apart from converting, so that slow senders cannot hold
/// the conversion slots; with [`BODY_LIMIT`] this bounds the bodies held to 4 x 16 MiB, so
/// that the worst case of a flood (docs/security.md) stays under the manifests' 256 Mi.
pub const MAX_BODIES_IN_FLIGHT: usize = 4;

/// Reviews converted at once per replica (the CPU work, off the runtime's workers); a body
/// that has been read waits for a slot. Each holds its body, its answer (about the body's
/// size) and one object as a JSON tree.
pub const MAX_CONCURRENT_REVIEWS: usize = 2;

/// Time a client has to send a request's headers (HTTP/1.1), counted from the first byte.
/// The apiserver sends them in one write.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Time a request may take from its headers to its answer: waiting for a slot, reading the
/// body, converting. The apiserver sends 16 MiB over a cluster network in well under a second
/// and the conversion of 16 MiB takes about 0.2 s; a slow sender (slow-loris) is cut off with
/// 408 here. (The apiserver itself waits 30 s for a conversion.)
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Read buffer per connection (hyper's default grows to about 400 KiB): bodies are streamed
/// through it, so a small buffer costs nothing but bounds what an idle connection holds.
pub const READ_BUFFER: usize = 64 * 1024;
