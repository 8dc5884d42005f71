// firedrill: the page's server-sent event stream, turned into htmx fragment refreshes.
// Each live section listens for "fd-update" on <body> and re-fetches itself; events are
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
  function refresh() {
    timer = null;
    document.body.dispatchEvent(new CustomEvent("fd-update"));
    if (live) { live.textContent = "live: " + seen + " update" + (seen === 1 ? "" : "s"); }
  }
  var stream = new EventSource(src, { withCredentials: true });
  stream.onmessage = function () {
    seen += 1;
    if (timer === null) { timer = window.setTimeout(refresh, wait); }
  };
  stream.onopen = function () { document.body.setAttribute("data-live", "open"); };
  stream.onerror = function () { document.body.setAttribute("data-live", "reconnecting"); };
})();
