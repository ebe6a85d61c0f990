//! A real browser for the dashboard's test: Debian's headless Chromium driven through
//! chromedriver (W3C WebDriver), and `flotilla dashboard` processes to point it at.
#![allow(dead_code)]

use fantoccini::{Client as Browser, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::wait_for;

/// chromedriver in a process group of its own: dropping it kills the group, so that no
/// Chromium outlives a failed test.
pub struct Driver {
    child: std::process::Child,
    pub url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) with a negative pid signals the process group we created.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

impl Driver {
    pub async fn start() -> Driver {
        let port = free_port();
        let child = std::process::Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("starting chromedriver: {e}; install Debian's chromium and chromium-driver (bash hack/prerequisites.sh does)")
            });
        let driver = Driver { child, url: format!("http://127.0.0.1:{port}") };
        wait_for(Duration::from_secs(20), "chromedriver listening", || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok().map(|_| ())
        })
        .await;
        driver
    }

    /// A new headless browser window of laptop size.
    pub async fn browser(&self) -> Browser {
        let serde_json::Value::Object(caps) = serde_json::json!({
            "goog:chromeOptions": {"args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--window-size=1280,1000"]}
        }) else {
            unreachable!("a JSON object")
        };
        ClientBuilder::new(HttpConnector::new())
            .capabilities(caps)
            .connect(&self.url)
            .await
            .expect("a Chromium session through chromedriver")
    }
}

/// Waits up to `timeout` for an element matching the XPath `xpath`.
pub async fn wait_xpath(b: &Browser, timeout: Duration, xpath: &str) -> fantoccini::elements::Element {
    match b.wait().at_most(timeout).for_element(Locator::XPath(xpath)).await {
        Ok(e) => e,
        Err(e) => {
            let html = b.source().await.unwrap_or_default();
            panic!("no element {xpath} within {timeout:?}: {e}\npage:\n{html}")
        }
    }
}

/// Whether an element matching `xpath` is on the page now.
pub async fn has_xpath(b: &Browser, xpath: &str) -> bool {
    b.find(Locator::XPath(xpath)).await.is_ok()
}

/// Saves a screenshot under the test's temp dir (and returns the path).
pub async fn screenshot(b: &Browser, name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    let path = dir.join(format!("{name}.png"));
    let png = b.screenshot().await.expect("screenshot");
    std::fs::write(&path, png).expect("writing screenshot");
    eprintln!("screenshot: {}", path.display());
    path
}

/// A `flotilla dashboard` process with a kubeconfig; killed when dropped.
pub struct Dashboard {
    pub child: Child,
    /// `http://127.0.0.1:<port>`, without the trailing slash.
    pub url: String,
    /// The URL printed, which opens a session (`.../login?key=...`).
    pub login: String,
    /// The session's key, and the cookie it goes in.
    pub key: String,
    pub cookie: String,
    pub banner: String,
}

impl Dashboard {
    pub async fn start(kubeconfig: &Path, args: &[&str]) -> Dashboard {
        let mut child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .arg("dashboard")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--port", "0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("starting flotilla dashboard");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let banner = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the dashboard prints its URL within 60 s")
            .expect("reading the dashboard's output")
            .expect("the dashboard printed a line");
        let login = banner
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no URL in {banner:?}"))
            .to_string();
        let (url, key) = login.split_once("/login?key=").unwrap_or_else(|| panic!("no session key in {login:?}"));
        let port = url.rsplit(':').next().unwrap_or_default();
        let (url, key, cookie) = (url.to_string(), key.to_string(), format!("flotilla-dashboard-{port}"));
        // Keep reading so that the pipe never fills.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Dashboard { child, url, login, key, cookie, banner }
    }
}

/// Clicks the element matching `css`, finding it again when a live update replaced it
/// between finding and clicking.
pub async fn click(b: &Browser, css: &str) {
    let mut last = String::new();
    for _ in 0..10 {
        match b.find(Locator::Css(css)).await {
            Ok(e) => match e.click().await {
                Ok(()) => return,
                Err(err) => last = err.to_string(),
            },
            Err(err) => last = err.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("could not click {css}: {last}");
}
