// Live updates of the Flotilla dashboard: the server announces what changed (server-sent
// events); when it concerns this page, the page's content is fetched again and replaced.
// Without JavaScript every page still works; it just does not update by itself.
(function () {
  "use strict";
  var topic = document.body.dataset.live;
  var status = document.getElementById("live");
  if (!topic || topic === "none" || !window.EventSource) return;

  function wanted(changed) {
    if (changed === "*") return true;
    if (topic === "overview") return changed.indexOf("app:") === 0 || changed.indexOf("tenant:") === 0;
    if (topic === "shards") return changed.indexOf("lease:") === 0;
    return changed === topic;
  }

  var timer = null, busy = false, again = false;
  function schedule() {
    if (timer === null) timer = setTimeout(function () { timer = null; refresh(); }, 150);
  }
  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch(location.href, { headers: { "X-Flotilla-Fragment": "1" }, credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null) return;
        var main = document.querySelector("main");
        // Keep a choice being made in the filter form.
        if (main.contains(document.activeElement) && document.activeElement.tagName === "SELECT") return;
        main.innerHTML = html;
        document.body.dataset.updates = String(Number(document.body.dataset.updates || "0") + 1);
      })
      .catch(function () {})
      .then(function () {
        busy = false;
        if (again) { again = false; schedule(); }
      });
  }

  var source = new EventSource("/live");
  source.addEventListener("change", function (e) { if (wanted(e.data)) schedule(); });
  source.onopen = function () { if (status) status.textContent = "live"; schedule(); };
  source.onerror = function () { if (status) status.textContent = "reconnecting…"; };
})();
