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

  // A burst of changes (every App of a namespace at once) makes one fetch, and fetches are at
  // least half a second apart: at most 150 ms + 500 ms after a change.
  var timer = null, busy = false, again = false, last = 0;
  function schedule() {
    if (timer !== null) return;
    var wait = Math.max(150, last + 500 - Date.now());
    timer = setTimeout(function () { timer = null; refresh(); }, wait);
  }
  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    last = Date.now();
    fetch(location.href, { headers: { "X-Flotilla-Fragment": "1" }, credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null) return;
        var main = document.querySelector("main");
        // Never swap the buttons under the pointer (or the keyboard): try again shortly.
        if (main.querySelector(".actions:hover") || (document.activeElement && document.activeElement.closest(".actions"))) {
          again = true;
          return;
        }
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

  // Actions that cannot be taken back ask first.
  document.addEventListener("submit", function (e) {
    var question = e.target.dataset && e.target.dataset.confirm;
    if (question && !window.confirm(question)) e.preventDefault();
  });

  var source = new EventSource("/live");
  source.addEventListener("change", function (e) { if (wanted(e.data)) schedule(); });
  source.onopen = function () { if (status) status.textContent = "live"; schedule(); };
  source.onerror = function () { if (status) status.textContent = "reconnecting…"; };
})();
