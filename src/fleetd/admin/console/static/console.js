// fleetd console: the only script. A page whose <body> has
// data-refresh="SECONDS" reloads itself that often (pending device-flow
// requests appear without a click), unless the owner is typing in a form.
"use strict";
(function () {
  var seconds = Number(document.body && document.body.dataset.refresh);
  if (!seconds || seconds < 2) {
    return;
  }
  var touched = false;
  document.addEventListener("input", function () { touched = true; });
  window.setInterval(function () {
    var active = document.activeElement;
    var typing = active && (active.tagName === "INPUT" || active.tagName === "TEXTAREA");
    if (!touched && !typing) {
      window.location.reload();
    }
  }, seconds * 1000);
})();
