// firedrill: the page's server-sent event stream, turned into htmx fragment refreshes.
// Each live section ([data-live]) listens for "fd-update" and re-fetches itself; events are
// coalesced (at most one refresh per data-coalesce-ms: 500 ms on an incident page, 2 s on the
// board), so a burst of 100 updates per second costs a refresh or two a second, not a hundred.
// Without JavaScript the pages still work: reload.
(function () {
  "use strict";
  var src = document.body.getAttribute("data-events");
  if (!src || !window.EventSource) { return; }
  var live = document.getElementById("live");
  var wait = parseInt(document.body.getAttribute("data-coalesce-ms") || "500", 10);
  var timer = null;
  var seen = 0;
  // A section the person is typing in is not replaced under their hands: it is refreshed at
  // the next event after they leave it (or by the response to their own post).
  function busy(section) {
    var active = document.activeElement;
    if (active && section.contains(active) && active.matches("input, textarea, select")) {
      return true;
    }
    var fields = section.querySelectorAll("input:not([type=hidden]), textarea");
    for (var i = 0; i < fields.length; i += 1) {
      if (fields[i].value !== fields[i].defaultValue) { return true; }
    }
    return false;
  }
  function refresh() {
    timer = null;
    var sections = document.querySelectorAll("[data-live]");
    for (var i = 0; i < sections.length; i += 1) {
      if (!busy(sections[i])) { sections[i].dispatchEvent(new CustomEvent("fd-update")); }
    }
    if (live) { live.textContent = "live: " + seen + " update" + (seen === 1 ? "" : "s"); }
  }
  // A refresh already on its way when the person started typing is dropped on arrival: the
  // section is refreshed again once they leave it.
  document.body.addEventListener("htmx:beforeSwap", function (evt) {
    var target = evt.detail.target;
    var cause = evt.detail.requestConfig && evt.detail.requestConfig.triggeringEvent;
    if (target && target.hasAttribute && target.hasAttribute("data-live") &&
        cause && cause.type === "fd-update" && busy(target)) {
      evt.detail.shouldSwap = false;
    }
  });
  var stream = new EventSource(src, { withCredentials: true });
  stream.onmessage = function () {
    seen += 1;
    if (timer === null) { timer = window.setTimeout(refresh, wait); }
  };
  stream.onopen = function () { document.body.setAttribute("data-stream", "open"); };
  stream.onerror = function () { document.body.setAttribute("data-stream", "reconnecting"); };
})();
