// GPUlayer dashboard: live updates over server-sent events. The pages read without this
// file; it only listens to the stream named by <main data-live> and puts what it says in
// place: "regions" replaces server-rendered (escaped) fragments by element id, "log"
// appends output as text (never as HTML), "end", "deleted" (what the page shows was deleted:
// its message is said as text) and "expired" close the stream.
"use strict";

(function () {
  const main = document.querySelector("main[data-live]");
  if (!main || !("EventSource" in window)) {
    return;
  }
  const status = document.getElementById("live-status");
  const say = function (text) {
    if (status) {
      status.hidden = false;
      status.textContent = text;
    }
  };
  const source = new EventSource(main.dataset.live);

  source.addEventListener("open", function () {
    say("Live: this page updates by itself.");
  });
  source.addEventListener("error", function () {
    say(source.readyState === EventSource.CLOSED
      ? "Live updates stopped; reload the page to see changes."
      : "Reconnecting…");
  });
  source.addEventListener("regions", function (event) {
    const regions = JSON.parse(event.data);
    for (const id of Object.keys(regions)) {
      const element = document.getElementById(id);
      if (element) {
        element.innerHTML = regions[id];
      }
    }
  });
  source.addEventListener("log", function (event) {
    const log = document.getElementById("log");
    if (!log) {
      return;
    }
    const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
    const placeholder = log.querySelector(".placeholder");
    if (placeholder) {
      placeholder.remove();
    }
    for (const [stream, text] of JSON.parse(event.data)) {
      const last = log.lastElementChild;
      if (last && last.className === stream) {
        last.append(text);
      } else {
        const span = document.createElement("span");
        span.className = stream;
        span.textContent = text;
        log.append(span);
      }
    }
    if (atBottom) {
      log.scrollTop = log.scrollHeight;
    }
  });
  source.addEventListener("end", function () {
    source.close();
    say("The job has ended; nothing more will change.");
  });
  source.addEventListener("deleted", function (event) {
    source.close();
    say(JSON.parse(event.data).message);
  });
  source.addEventListener("expired", function () {
    source.close();
    const here = location.pathname + location.search;
    location.assign(document.body.dataset.root + "/login?next=" + encodeURIComponent(here));
  });
})();
