// fleetd console: the only script. A page whose <body> has
// data-refresh="SECONDS" reloads itself that often (pending device-flow
// requests appear without a click), unless the owner is typing in a form.
// A reload asks for the page with auto=1, which the console does not count
// as use of the session (the idle timeout still ends it); the marker is
// then taken out of the address bar, so a link or a manual reload is use.
"use strict";
(function () {
  var here = new URL(window.location.href);
  if (here.searchParams.has("auto")) {
    here.searchParams.delete("auto");
    window.history.replaceState(null, "", here.toString());
  }
  var seconds = Number(document.body && document.body.dataset.refresh);
  if (!seconds || seconds < 2) {
    return;
  }
  var touched = false;
  document.addEventListener("input", function () { touched = true; });
  window.setInterval(function () {
    var active = document.activeElement;
    // A focused field counts once it holds text (/device focuses its
    // empty code field on load, which must not stop the reloads).
    var typing = active && (active.tagName === "INPUT" || active.tagName === "TEXTAREA") &&
      active.value !== "";
    if (!touched && !typing) {
      var next = new URL(window.location.href);
      next.searchParams.set("auto", "1");
      window.location.replace(next.toString());
    }
  }, seconds * 1000);
})();
