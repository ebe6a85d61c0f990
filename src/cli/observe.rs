//! Reading one App for `flotilla status`: once, or again every time it changes (`--watch`).

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::ResourceExt;
use kube::api::Api;
use kube::core::Status;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_app};
use std::io::{IsTerminal, Write};

use super::status::render;
use crate::app::lenient::LenientApp;

/// Clears a terminal and moves the cursor to its top left corner.
const CLEAR_SCREEN: &str = "\x1b[2J\x1b[H";

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("App {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error("you lack the rights to {verb} Apps in namespace {namespace} (the apiserver said: {message})")]
    Forbidden { verb: &'static str, namespace: String, message: String },
    #[error("reading App {namespace}/{name}: {source}")]
    Read {
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("writing to standard output: {0}")]
    Output(#[source] std::io::Error),
    #[error("listening for Ctrl-C: {0}")]
    Signal(#[source] std::io::Error),
}

/// Prints the status of `namespace/name`; with `watch`, prints it again whenever the App
/// changes, until Ctrl-C (which ends it without error).
pub async fn show(client: Client, namespace: &str, name: &str, watch: bool) -> Result<(), StatusError> {
    // Read on its own (`LenientApp`): an App that does not read as one is shown with why.
    let apps: Api<LenientApp> = Api::namespaced(client, namespace);
    let mut screen = Screen::for_stdout(watch);
    if !watch {
        let app = get(&apps, namespace, name).await?;
        return screen.show(&render(&app, Timestamp::now())).map(|_| ());
    }
    tokio::select! {
        biased;
        signal = tokio::signal::ctrl_c() => signal.map_err(StatusError::Signal),
        result = follow(&apps, namespace, name, &mut screen) => result,
    }
}

async fn get(apps: &Api<LenientApp>, namespace: &str, name: &str) -> Result<LenientApp, StatusError> {
    match apps.get(name).await {
        Ok(app) => Ok(app),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            Err(StatusError::NotFound { namespace: namespace.into(), name: name.into() })
        }
        Err(kube::Error::Api(s)) if s.code == 403 => {
            Err(StatusError::Forbidden { verb: "get", namespace: namespace.into(), message: s.message.clone() })
        }
        Err(source) => {
            Err(StatusError::Read { namespace: namespace.into(), name: name.into(), source: Box::new(source) })
        }
    }
}

/// Shows the App now, then each time its resourceVersion changes.
async fn follow(apps: &Api<LenientApp>, namespace: &str, name: &str, screen: &mut Screen) -> Result<(), StatusError> {
    let app = get(apps, namespace, name).await?;
    if !screen.show(&render(&app, Timestamp::now()))? {
        return Ok(());
    }
    let mut shown = app.resource_version();
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watch_app(apps.clone(), config).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Apply(app) | Event::InitApply(app)) => {
                if app.resource_version() != shown {
                    shown = app.resource_version();
                    if !screen.show(&render(&app, Timestamp::now()))? {
                        return Ok(());
                    }
                }
            }
            Ok(Event::Delete(_)) => {
                shown = None;
                if !screen.show(&format!("App {namespace}/{name} was deleted; waiting for it to come back\n"))? {
                    return Ok(());
                }
            }
            Ok(Event::Init | Event::InitDone) => {}
            Err(e) => match api_status(&e) {
                Some(s) if s.code == 403 => {
                    return Err(StatusError::Forbidden {
                        verb: "list and watch",
                        namespace: namespace.into(),
                        message: s.message.clone(),
                    });
                }
                // The watcher backs off and starts again by itself.
                _ => eprintln!("warning: watching App {namespace}/{name}: {e}; retrying"),
            },
        }
    }
    Ok(())
}

fn api_status(e: &watcher::Error) -> Option<&Status> {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s))
        | watcher::Error::WatchError(s) => Some(s),
        _ => None,
    }
}

/// Standard output. When watching, a terminal is cleared before each view; anything else gets
/// the views one after the other, a blank line apart.
struct Screen {
    clear: bool,
    views: usize,
}

impl Screen {
    fn for_stdout(watch: bool) -> Self {
        Self { clear: watch && std::io::stdout().is_terminal(), views: 0 }
    }

    /// Writes `text`. `Ok(false)`: the reader went away (`| head`), nothing more is worth showing.
    fn show(&mut self, text: &str) -> Result<bool, StatusError> {
        let separator = match (self.clear, self.views) {
            (true, _) => CLEAR_SCREEN,
            (false, 0) => "",
            (false, _) => "\n",
        };
        self.views += 1;
        let mut out = std::io::stdout().lock();
        match out
            .write_all(separator.as_bytes())
            .and_then(|()| out.write_all(text.as_bytes()))
            .and_then(|()| out.flush())
        {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
            Err(e) => Err(StatusError::Output(e)),
        }
    }
}
