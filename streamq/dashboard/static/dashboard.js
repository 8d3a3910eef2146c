// streamq dashboard: live values over Server-Sent Events (one stream per tab, closed while the
// tab is hidden). Elements with data-live="<key>" show the value of that key. A frame carries
// "cells" (counts, states) and "info" (ages, rates). When the job a page shows changes state,
// "sq:changed" fires on <body> and htmx re-reads the page's live regions; when only counts
// change, lists are not re-read (that would cost Redis work per tab): a "refresh" button
// appears instead.
(function () {
  "use strict";
  var src = document.body.getAttribute("data-stream");
  var dot = document.getElementById("live-dot");
  var es = null;
  var last = {};
  var has = function (o, k) { return Object.prototype.hasOwnProperty.call(o, k); };

  function show(values) {
    document.querySelectorAll("[data-live]").forEach(function (el) {
      var k = el.getAttribute("data-live");
      if (has(values, k) && el.textContent !== values[k]) {
        el.textContent = values[k];
        el.setAttribute("data-value", values[k]);
      }
    });
  }

  function apply(frame) {
    var cells = frame.cells || {};
    var jobChanged = false;
    var countsChanged = false;
    Object.keys(cells).forEach(function (k) {
      if (last[k] !== cells[k]) {
        if (has(last, k)) {
          if (k.indexOf("job:") === 0) { jobChanged = true; } else { countsChanged = true; }
        }
        last[k] = cells[k];
      }
    });
    show(cells);
    show(frame.info || {});
    if (jobChanged) {
      document.body.dispatchEvent(new CustomEvent("sq:changed", { bubbles: true }));
    } else if (countsChanged) {
      var stale = document.getElementById("stale");
      if (stale) { stale.hidden = false; }
    }
  }

  function open() {
    if (es || !src) { return; }
    es = new EventSource(src);
    es.onopen = function () { if (dot) { dot.className = "live-dot on"; } };
    es.onerror = function () { if (dot) { dot.className = "live-dot"; } };
    es.onmessage = function (m) {
      try { apply(JSON.parse(m.data)); } catch (e) { /* ignore a bad frame */ }
    };
  }

  function close() {
    if (es) { es.close(); es = null; }
    if (dot) { dot.className = "live-dot"; }
  }

  document.body.addEventListener("htmx:afterSwap", function () {
    var stale = document.getElementById("stale");
    if (stale) { stale.hidden = true; }
  });
  document.addEventListener("visibilitychange", function () {
    if (document.hidden) { close(); } else { open(); }
  });
  window.addEventListener("pagehide", close);
  if (!document.hidden) { open(); }
}());
