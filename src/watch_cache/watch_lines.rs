//! A watch request's events, read from the response body a line at a time without a buffer
//! kept between events.
//!
//! kube's `Client::request_events` reads a watch through a `FramedRead`, whose buffer starts at
//! 8 KiB and grows to the longest event seen, and is kept for as long as the watch runs (290 s,
//! and again after each resume): 999 watches of a replica serving a third of 10,000 Apps held
//! 7.8 MiB in those buffers with nothing to read (docs/measurements.md), and one App of
//! 1.5 MiB in each of a tenant's namespaces pinned 1.5 MiB or more per namespace. Here a line
//! that arrives whole in one chunk of the body is parsed where it lies, and only the start of a
//! line split across chunks is copied, into a buffer given back once that line is complete. An
//! idle watch holds none.
//!
//! What each line becomes is what kube makes of it: a watch event, the apiserver's `Status`
//! (an error answer, which arrives as the body of the watch), or a parse error; an incomplete
//! line at the end of the body is dropped, and a body that breaks off with the chunked
//! decoder's unexpected EOF simply ends.

use bytes::Bytes;
use futures::{Stream, StreamExt, stream::BoxStream};
use http_body_util::BodyExt;
use kube::core::{Status, WatchEvent};
use serde::de::DeserializeOwned;
use tracing::warn;

/// A watch's events as they arrive.
pub type Events<K> = BoxStream<'static, kube::Result<WatchEvent<K>>>;

/// Sends `request` (a watch) and reads its events.
pub async fn watch<K>(client: &kube::Client, request: http::Request<Vec<u8>>) -> kube::Result<Events<K>>
where
    K: DeserializeOwned + Send + 'static,
{
    let response = client.send(request.map(kube::client::Body::from)).await?;
    Ok(events(response.into_body().into_data_stream()).boxed())
}

/// The events of a body read as `chunks`.
pub fn events<K, S>(chunks: S) -> impl Stream<Item = kube::Result<WatchEvent<K>>> + Send + 'static
where
    K: DeserializeOwned + Send + 'static,
    S: Stream<Item = kube::Result<Bytes>> + Send + Unpin + 'static,
{
    lines(chunks).filter_map(|line| {
        std::future::ready(match line {
            Ok(line) => parse(&line),
            Err(e) => Some(Err(e)),
        })
    })
}

/// Lines cut out of a body's chunks, one at a time: a line within one chunk is a slice of it;
/// the start of one that goes on in the next chunk is copied into `partial`, which is taken
/// (and its memory given back) once the line ends. Only the unread rest of the last chunk is
/// kept, and none of it once read.
#[derive(Debug, Default)]
pub struct Splitter {
    rest: Bytes,
    partial: Vec<u8>,
}

impl Splitter {
    /// Takes the next chunk; call only once `next_line` has nothing more.
    pub fn push(&mut self, chunk: Bytes) {
        debug_assert!(self.rest.is_empty(), "a chunk pushed before the last was read");
        self.rest = chunk;
    }

    /// The next whole line, without its `\n` (nor a `\r` before it); `None` once what is
    /// left is the start of a line that a later chunk ends.
    pub fn next_line(&mut self) -> Option<Bytes> {
        let Some(at) = self.rest.iter().position(|b| *b == b'\n') else {
            self.partial.extend_from_slice(&std::mem::take(&mut self.rest));
            return None;
        };
        let head = self.rest.split_to(at + 1);
        if self.rest.is_empty() {
            // An empty slice still holds the chunk.
            self.rest = Bytes::new();
        }
        let line = if self.partial.is_empty() {
            head.slice(..at)
        } else {
            self.partial.extend_from_slice(&head[..at]);
            Bytes::from(std::mem::take(&mut self.partial))
        };
        Some(without_carriage_return(line))
    }

    /// What is left when the body ends: a last line without its newline, if any.
    pub fn finish(&mut self) -> Option<Bytes> {
        let rest = std::mem::take(&mut self.rest);
        self.partial.extend_from_slice(&rest);
        (!self.partial.is_empty()).then(|| without_carriage_return(Bytes::from(std::mem::take(&mut self.partial))))
    }

    /// How many bytes the splitter holds between lines.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.rest.len() + self.partial.capacity()
    }
}

fn without_carriage_return(line: Bytes) -> Bytes {
    match line.last() {
        Some(b'\r') => line.slice(..line.len() - 1),
        _ => line,
    }
}

/// The lines of a body, and an error that ends it (then nothing more).
fn lines<S>(chunks: S) -> impl Stream<Item = kube::Result<Bytes>> + Send + 'static
where
    S: Stream<Item = kube::Result<Bytes>> + Send + Unpin + 'static,
{
    let state = (Some(chunks), Splitter::default());
    futures::stream::unfold(state, |(mut chunks, mut splitter)| async move {
        loop {
            if let Some(line) = splitter.next_line() {
                return Some((Ok(line), (chunks, splitter)));
            }
            match chunks.as_mut()?.next().await {
                Some(Ok(chunk)) => splitter.push(chunk),
                None => {
                    let last = splitter.finish()?;
                    return Some((Ok(last), (None, splitter)));
                }
                Some(Err(e)) => {
                    // Tends to happen when a watch has run for minutes: not an error.
                    if e.to_string().contains("unexpected EOF during chunk") {
                        warn!(error = %e, "a watch's body ended early");
                        return None;
                    }
                    return Some((Err(kube::Error::ReadEvents(std::io::Error::other(e))), (None, Splitter::default())));
                }
            }
        }
    })
}

/// What one line of a watch's body is: an event, the apiserver's error answer, or a parse
/// error; nothing for an empty or cut-short line.
pub fn parse<K: DeserializeOwned>(line: &[u8]) -> Option<kube::Result<WatchEvent<K>>> {
    match serde_json::from_slice::<WatchEvent<K>>(line) {
        Ok(event) => Some(Ok(event)),
        Err(e) if e.is_eof() => None,
        Err(e) => match serde_json::from_slice::<Status>(line) {
            Ok(status) => Some(Err(kube::Error::Api(status.boxed()))),
            Err(_) => Some(Err(kube::Error::SerdeError(e))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn split(chunks: &[&str]) -> (Vec<String>, Splitter) {
        let mut s = Splitter::default();
        let mut lines = Vec::new();
        for c in chunks {
            s.push(Bytes::copy_from_slice(c.as_bytes()));
            while let Some(l) = s.next_line() {
                lines.push(String::from_utf8_lossy(&l).into_owned());
            }
        }
        (lines, s)
    }

    #[test]
    fn lines_are_split_across_and_within_chunks() {
        let (lines, mut s) = split(&["a\nb", "c\r\n", "\nd", "e"]);
        assert_eq!(lines, ["a", "bc", "",]);
        assert_eq!(s.finish().as_deref(), Some(&b"de"[..]));
        assert_eq!(s.finish(), None);
    }

    #[test]
    fn nothing_is_held_between_whole_lines_once_a_split_one_is_done() {
        let long = "x".repeat(1 << 20);
        let (lines, s) = split(&[&long[..1000], &long[1000..], "\n{}\n"]);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].len(), 1 << 20);
        assert_eq!(s.held(), 0, "the buffer of the split line is given back");
    }

    #[test]
    fn a_chunk_of_many_lines_is_held_only_until_its_last_is_read() {
        let mut s = Splitter::default();
        s.push(Bytes::from("\n".repeat(100_000)));
        let mut read = 0;
        while s.next_line().is_some() {
            read += 1;
        }
        assert_eq!(read, 100_000);
        assert_eq!(s.held(), 0);
    }

    #[tokio::test]
    async fn a_body_cut_short_by_the_chunked_decoder_just_ends() {
        let chunks: Vec<kube::Result<Bytes>> = vec![
            Ok(Bytes::from(format!("{}\n", event_line("a")))),
            Err(kube::Error::Service("unexpected EOF during chunk size line".into())),
        ];
        let read: Vec<_> = events::<ConfigMap, _>(futures::stream::iter(chunks)).collect().await;
        assert_eq!(read.len(), 1, "{read:?}");
        assert!(matches!(&read[0], Ok(WatchEvent::Added(_))));
    }

    fn event_line(name: &str) -> String {
        format!(
            r#"{{"type":"ADDED","object":{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","resourceVersion":"1"}}}}}}"#
        )
    }

    #[tokio::test]
    async fn a_body_reads_as_kube_reads_it() {
        let status = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"forbidden","reason":"Forbidden","code":403}"#;
        let body =
            format!("{}\n\n{}\n{status}\nnot json\n{}", event_line("a"), event_line("b"), &event_line("c")[..20]);
        // In chunks of 7 bytes, so that every line but the blank one is split.
        let chunks: Vec<kube::Result<Bytes>> =
            body.as_bytes().chunks(7).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
        let read: Vec<_> = events::<ConfigMap, _>(futures::stream::iter(chunks)).collect().await;
        assert_eq!(read.len(), 4, "{read:?}");
        assert!(matches!(&read[0], Ok(WatchEvent::Added(c)) if c.metadata.name.as_deref() == Some("a")));
        assert!(matches!(&read[1], Ok(WatchEvent::Added(c)) if c.metadata.name.as_deref() == Some("b")));
        assert!(matches!(&read[2], Err(kube::Error::Api(s)) if s.code == 403));
        assert!(matches!(&read[3], Err(kube::Error::SerdeError(_))));
    }

    #[tokio::test]
    async fn a_broken_body_ends_after_its_error() {
        let chunks: Vec<kube::Result<Bytes>> = vec![
            Ok(Bytes::from(format!("{}\n{{\"type\"", event_line("a")))),
            Err(kube::Error::LinesCodecMaxLineLengthExceeded),
            Ok(Bytes::from(format!("{}\n", event_line("b")))),
        ];
        let read: Vec<_> = events::<ConfigMap, _>(futures::stream::iter(chunks)).collect().await;
        assert_eq!(read.len(), 2, "{read:?}");
        assert!(matches!(&read[0], Ok(WatchEvent::Added(_))));
        assert!(matches!(&read[1], Err(kube::Error::ReadEvents(_))));
    }
}
